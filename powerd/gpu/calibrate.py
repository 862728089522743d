"""Fit a ``WorkloadCurve`` to every workload of the Zeus power-limit sweeps.

Usage::

    python -m powerd.gpu.calibrate tests/data/zeus-power-limit -o powerd/data/workload_curves.json

Each ``summary_power_<gpu>.csv`` holds, per workload (dataset, network,
batch_size, optimizer) and power limit, the measured ``time_per_epoch`` and
``average_power``. For each workload this fits the five shape parameters of
``powerd.gpu.workload_model`` by least squares on the relative errors of time
and power across the caps (``t_min`` is solved in closed form), with weak priors
that keep the parameters a flat curve cannot identify at plausible values.
The JSON records each curve, the GPU model and file it came from, and its fit
errors.

Bounds keep the curves physical: ``alpha`` in [1, 4], ``p_static`` at least
the GPU's idle power, the busy power ``p_static + p_dyn`` at most
``P_BUSY_MAX`` times the max limit, ``p_wait`` between idle and busy. The
A40's compute-heavy workloads end up at that busy bound: at 300 W they are
still power-bound (average power ~0.9 x the limit and rising with it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray
from scipy.optimize import least_squares

from powerd.gpu.models import gpu_model
from powerd.gpu.workload_model import Device, WorkloadCurve, predict

FORMAT_VERSION = 1
KEY_COLUMNS = ("dataset", "network", "batch_size", "optimizer")
FILE_PREFIX = "summary_power_"

# The fit works on x = (p_static, dyn_share, alpha, beta, wait_share), where
#   p_dyn  = dyn_share * (P_BUSY_MAX - p_static)    the SMs draw at most P_BUSY_MAX
#   p_wait = p_idle + wait_share * (p_busy - p_idle)  waiting draws between idle and busy
# so that box bounds keep every curve physical.
P_BUSY_MAX = 1.3  # fraction of cap_max_w: some GPUs are power-bound at their max limit
_UPPER = np.array([1.0, 1.0, 4.0, 1.0, 1.0])
_ALPHA_MIN = 1.0  # dynamic power grows at least linearly with the clock
# Weak priors (centre, scale) for what a flat sweep cannot identify.
_ALPHA_PRIOR = (2.0, 1.0)
_BETA_PRIOR = (0.8, 0.5)
_WAIT_SCALE = 0.5  # p_wait - p_static, pulled towards 0
_PRIOR_WEIGHT = 0.03
# Where to start: (alpha, beta, busy power / top measured power, wait_share). The last
# starts with bursts above every cap, for sweeps whose average stays under all of them
# but that still speed up with the cap (P100 deepspeech2).
_STARTS = ((1.5, 0.9, 1.0, 0.5), (3.0, 0.6, 1.2, 0.5), (2.0, 0.98, 1.0, 0.5), (2.0, 0.3, 2.5, 0.2))


@dataclass(frozen=True, slots=True)
class FitError:
    """Relative errors of a fitted curve against its measurements."""

    n_points: int
    time_median: float
    time_max: float
    power_median: float
    power_max: float

    def to_dict(self) -> dict[str, float | int]:
        return {
            "n_points": self.n_points,
            "time_median": self.time_median,
            "time_max": self.time_max,
            "power_median": self.power_median,
            "power_max": self.power_max,
        }


@dataclass(frozen=True, slots=True)
class FittedWorkload:
    name: str
    gpu_model: str
    file: str
    dataset: str
    network: str
    batch_size: int
    optimizer: str
    curve: WorkloadCurve
    error: FitError


def workload_name(gpu_key: str, dataset: str, network: str, batch_size: int, optimizer: str) -> str:
    """The name a fitted curve goes by: ``a40/squad/bert_base_uncased/bs32/adamw``."""
    return f"{gpu_key.lower()}/{dataset}/{network}/bs{batch_size}/{optimizer}"


def gpu_key_of(path: Path) -> str:
    """``summary_power_a40.csv`` -> ``A40`` (the key of ``powerd.gpu.models``)."""
    stem = path.stem
    if not stem.startswith(FILE_PREFIX):
        raise ValueError(f"{path.name}: expected a file named {FILE_PREFIX}<gpu>.csv")
    return gpu_model(stem.removeprefix(FILE_PREFIX)).key


def relative_errors(
    curve: WorkloadCurve,
    device: Device,
    caps_w: NDArray[np.float64],
    time_s: NDArray[np.float64],
    power_w: NDArray[np.float64],
) -> FitError:
    t_pred, p_pred = predict(curve, device, caps_w)
    t_err = np.abs(t_pred / time_s - 1.0)
    p_err = np.abs(p_pred / power_w - 1.0)
    return FitError(
        n_points=len(caps_w),
        time_median=float(np.median(t_err)),
        time_max=float(np.max(t_err)),
        power_median=float(np.median(p_err)),
        power_max=float(np.max(p_err)),
    )


def fit_curve(
    device: Device,
    caps_w: Sequence[float] | NDArray[np.float64],
    time_s: Sequence[float] | NDArray[np.float64],
    power_w: Sequence[float] | NDArray[np.float64],
) -> WorkloadCurve:
    """Least-squares fit of one workload's sweep (at least 3 caps) on ``device``."""
    caps = np.asarray(caps_w, dtype=np.float64)
    t_meas = np.asarray(time_s, dtype=np.float64)
    p_meas = np.asarray(power_w, dtype=np.float64)
    if not (len(caps) == len(t_meas) == len(p_meas)) or len(caps) < 3:
        raise ValueError("need time and power at 3 caps or more")
    if np.any(t_meas <= 0) or np.any(p_meas <= 0):
        raise ValueError("times and powers must be > 0")
    log_t = np.log(t_meas)
    p_idle = device.p_idle
    lower = np.array([p_idle, 0.0, _ALPHA_MIN, 0.0, 0.0])
    p_top = float(np.max(p_meas)) / device.cap_max_w

    def curve_of(x: NDArray[np.float64], t_min_s: float = 1.0) -> WorkloadCurve:
        p_static, dyn_share, alpha, beta, wait_share = (float(v) for v in x)
        p_dyn = dyn_share * max(P_BUSY_MAX - p_static, 0.0)
        p_wait = p_idle + wait_share * max(p_static + p_dyn - p_idle, 0.0)
        return WorkloadCurve(p_static, p_dyn, alpha, beta, p_wait, t_min_s=t_min_s)

    def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
        curve = curve_of(x)
        tau, p_pred = predict(curve, device, caps)
        log_tau = np.log(tau)
        log_t_min = float(np.mean(log_t - log_tau))  # the best t_min, in closed form
        priors = _PRIOR_WEIGHT * np.array(
            [
                (x[2] - _ALPHA_PRIOR[0]) / _ALPHA_PRIOR[1],
                (x[3] - _BETA_PRIOR[0]) / _BETA_PRIOR[1],
                (curve.p_wait - curve.p_static) / _WAIT_SCALE,
            ]
        )
        return np.concatenate([log_tau + log_t_min - log_t, p_pred / p_meas - 1.0, priors])

    best: Any = None
    for alpha0, beta0, busy0, wait0 in _STARTS:
        p_static0 = max(p_idle, 0.5 * p_top)
        dyn0 = (busy0 * p_top - p_static0) / max(P_BUSY_MAX - p_static0, 1e-3)
        x0 = np.clip([p_static0, dyn0, alpha0, beta0, wait0], lower + 1e-6, _UPPER - 1e-6)
        result = least_squares(residuals, x0, bounds=(lower, _UPPER), x_scale="jac", xtol=1e-8)
        if best is None or result.cost < best.cost - 1e-12:
            best = result
    x = best.x
    tau, _ = predict(curve_of(x), device, caps)
    t_min_s = math.exp(float(np.mean(log_t - np.log(tau))))
    return curve_of(x, t_min_s)


def load_sweeps(directory: Path) -> Iterable[tuple[Path, pd.DataFrame]]:
    files = sorted(directory.glob(f"{FILE_PREFIX}*.csv"))
    if not files:
        raise FileNotFoundError(f"no {FILE_PREFIX}*.csv in {directory}")
    for path in files:
        frame = pd.read_csv(path)
        missing = {*KEY_COLUMNS, "power_limit", "time_per_epoch", "average_power"} - set(
            frame.columns
        )
        if missing:
            raise ValueError(f"{path.name}: missing columns {sorted(missing)}")
        yield path, frame


def fit_sweeps(directory: Path, only: Iterable[str] | None = None) -> list[FittedWorkload]:
    """Fit every workload of every sweep in ``directory`` (or only those named in ``only``)."""
    wanted = None if only is None else set(only)
    fitted: list[FittedWorkload] = []
    for path, frame in load_sweeps(directory):
        key = gpu_key_of(path)
        device = Device.of(gpu_model(key))
        for (dataset, network, batch, optimizer), rows in frame.groupby(
            list(KEY_COLUMNS), sort=True
        ):
            name = workload_name(key, dataset, network, int(batch), optimizer)
            if wanted is not None and name not in wanted:
                continue
            rows = rows.sort_values("power_limit")
            caps = rows["power_limit"].to_numpy(dtype=np.float64)
            t_meas = rows["time_per_epoch"].to_numpy(dtype=np.float64)
            p_meas = rows["average_power"].to_numpy(dtype=np.float64)
            curve = fit_curve(device, caps, t_meas, p_meas)
            fitted.append(
                FittedWorkload(
                    name=name,
                    gpu_model=key,
                    file=path.name,
                    dataset=str(dataset),
                    network=str(network),
                    batch_size=int(batch),
                    optimizer=str(optimizer),
                    curve=curve,
                    error=relative_errors(curve, device, caps, t_meas, p_meas),
                )
            )
    return fitted


def _round(value: float, digits: int = 6) -> float:
    return float(f"{value:.{digits}g}")


def to_json(fitted: Sequence[FittedWorkload], source: str) -> dict[str, Any]:
    """The package-data document: curves by name, rounded to 6 significant digits."""
    return {
        "format": FORMAT_VERSION,
        "source": source,
        "attribution": "Zeus (NSDI '23) power-limit sweeps, Apache License 2.0",
        "model": "powerd.gpu.workload_model: powers are fractions of the GPU's cap_max_w",
        "workloads": {
            f.name: {
                "gpu_model": f.gpu_model,
                "file": f.file,
                "dataset": f.dataset,
                "network": f.network,
                "batch_size": f.batch_size,
                "optimizer": f.optimizer,
                "curve": {k: _round(v) for k, v in f.curve.to_dict().items()},
                "fit_error": {
                    k: (v if isinstance(v, int) else _round(v, 4))
                    for k, v in f.error.to_dict().items()
                },
            }
            for f in fitted
        },
    }


def dumps(document: dict[str, Any]) -> str:
    """JSON with one line per workload: small, and diffs show which curves moved."""
    head = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in document.items() if k != "workloads"]
    body = ",\n".join(
        f"  {json.dumps(name)}: {json.dumps(entry, separators=(',', ':'))}"
        for name, entry in document["workloads"].items()
    )
    return "\n".join(["{", *head, ' "workloads": {', body, " }", "}", ""])


def summary(fitted: Sequence[FittedWorkload]) -> str:
    """Per GPU, over its workloads: median and max of each workload's errors across caps."""
    lines = []
    for key in sorted({f.gpu_model for f in fitted}):
        errs = [f.error for f in fitted if f.gpu_model == key]
        t_med = np.array([e.time_median for e in errs])
        p_med = np.array([e.power_median for e in errs])
        t_max = max(e.time_max for e in errs)
        p_max = max(e.power_max for e in errs)
        lines.append(
            f"{key}: {len(errs)} workloads; median relative error across caps, over workloads: "
            f"time median {np.median(t_med):.1%} max {np.max(t_med):.1%}, "
            f"power median {np.median(p_med):.1%} max {np.max(p_med):.1%}; "
            f"worst single point: time {t_max:.1%}, power {p_max:.1%}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m powerd.gpu.calibrate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("directory", type=Path, help="folder holding summary_power_<gpu>.csv")
    parser.add_argument("-o", "--output", type=Path, help="JSON file to write (default: stdout)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    fitted = fit_sweeps(args.directory)
    document = dumps(to_json(fitted, args.directory.as_posix()))
    if args.output is None:
        sys.stdout.write(document)
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(document)
    print(summary(fitted), file=sys.stderr)
    print(f"{len(fitted)} curves in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
