"""The GPU power cap that maximises cluster throughput inside a fixed site power (pure).

With site power ``P`` fixed and each GPU provisioned at its cap plus an
overhead that does not scale with the cap (its share of CPU, NIC, switches,
cooling), ``N = P / (cap_w + overhead_w)`` GPUs fit and the cluster does
``N * throughput(cap_w)`` work per second. ``P`` is a constant, so the best
cap maximises ``throughput(cap_w) / (cap_w + overhead_w)``: throughput per
provisioned watt. Reported per MW: ``1e6 / (cap_w + overhead_w)`` GPUs.

The cap is chosen among the measured caps (no model between them) unless
``interpolate`` is set: then throughput is first made non-decreasing in the
cap (isotonic regression: a higher cap never slows a GPU, so a dip is noise)
and joined by a monotone cubic (PCHIP) evaluated every ``step_w`` watts
between the lowest and highest measured caps. Ties go to the higher cap
(same cluster throughput from fewer, faster GPUs).

A *mix* runs several workloads on one GPU model under one cap. Weight
``w_i`` is workload ``i``'s share of the GPUs (normalised to sum 1). Each
workload's speed is counted relative to its own speed at its highest
measured cap, so the mix's work is in "max-cap GPU equivalents"; the cap
(chosen among caps every mix workload has) maximises
``sum_i w_i * thr_i(cap) / thr_i(max cap_i) / (cap_w + overhead_w)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

W_PER_MW = 1e6


@dataclass(frozen=True)
class CapsResult:
    """What :func:`recommend` found.

    ``per_workload``: one row per (gpu, workload): ``cap_w`` recommended,
    ``max_cap_w``, ``speed_vs_max`` (per-GPU throughput at ``cap_w`` over that
    at ``max_cap_w``), ``thr_per_mw`` and ``thr_per_mw_max_cap`` (work per
    second per MW of provisioned power), ``gain_pct``, ``avg_power_w`` at
    ``cap_w``, ``gpus_per_mw``, ``gpus_per_mw_max_cap`` and ``at_min_cap``
    (the best is the lowest cap measured: lower, unmeasured caps may beat it).

    ``mix``: one row per GPU with a mix, the same columns for the mix, where
    throughput is in max-cap GPU equivalents (``thr_per_mw`` = how many GPUs
    at their max cap would do the same work, per MW).

    ``curves``: every (gpu, workload, cap_w) evaluated, with ``throughput``,
    ``speed_vs_max``, ``thr_per_mw``, ``measured``; ``mix_curves``: (gpu,
    cap_w, speed_vs_max, thr_per_mw) for the mix.
    """

    overhead_w: float
    per_workload: pd.DataFrame
    mix: pd.DataFrame
    curves: pd.DataFrame
    mix_curves: pd.DataFrame
    warnings: list[str] = field(default_factory=list)


def _isotonic(y: np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in y:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            prev = blocks[-1]
            prev[0] = (prev[0] * prev[1] + mean * count) / (prev[1] + count)
            prev[1] += count
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def _curve(group: pd.DataFrame, interpolate: bool, step_w: float) -> pd.DataFrame:
    caps = group["cap_w"].to_numpy(dtype=float)
    thr = group["throughput"].to_numpy(dtype=float)
    power = group["avg_power_w"].to_numpy(dtype=float)
    if not interpolate:
        return pd.DataFrame(
            {"cap_w": caps, "throughput": thr, "avg_power_w": power, "measured": True}
        )
    from scipy.interpolate import PchipInterpolator

    grid = np.arange(np.ceil(caps[0] / step_w) * step_w, caps[-1], step_w)
    grid = np.union1d(grid, caps)
    fitted = PchipInterpolator(caps, _isotonic(thr))(grid)
    known = ~np.isnan(power)
    grid_power = (
        np.interp(grid, caps[known], power[known]) if known.any() else np.full(grid.shape, np.nan)
    )
    return pd.DataFrame(
        {
            "cap_w": grid,
            "throughput": fitted,
            "avg_power_w": grid_power,
            "measured": np.isin(grid, caps),
        }
    )


def _best(values: np.ndarray, caps: np.ndarray) -> int:
    """Index of the largest value; ties go to the highest cap."""
    top = np.flatnonzero(values == values.max())
    return int(top[np.argmax(caps[top])])


def _summary(curve: pd.DataFrame, value_col: str, overhead_w: float) -> dict[str, float]:
    caps = curve["cap_w"].to_numpy()
    values = curve[value_col].to_numpy()
    i = _best(values, caps)
    j = int(np.argmax(caps))
    return {
        "cap_w": float(caps[i]),
        "max_cap_w": float(caps[j]),
        "speed_vs_max": float(curve["speed_vs_max"].iat[i]),
        "thr_per_mw": float(values[i]),
        "thr_per_mw_max_cap": float(values[j]),
        "gain_pct": float(100.0 * (values[i] / values[j] - 1.0)),
        "avg_power_w": float(curve["avg_power_w"].iat[i]),
        "gpus_per_mw": W_PER_MW / (caps[i] + overhead_w),
        "gpus_per_mw_max_cap": W_PER_MW / (caps[j] + overhead_w),
        "at_min_cap": bool(caps[i] == caps.min()),
    }


def recommend(
    sweep: pd.DataFrame,
    overhead_w: float,
    mix: Mapping[str, float] | None = None,
    *,
    interpolate: bool = False,
    step_w: float = 1.0,
) -> CapsResult:
    """Best cap per (gpu, workload) and per GPU for a weighted mix.

    ``sweep`` is :func:`planner.sweep.load_sweep`'s form (several GPUs may be
    concatenated). ``mix`` maps workload names to weights (shares of GPUs);
    ``None`` weighs every workload of each GPU equally. Mix workloads absent
    from a GPU are left out of that GPU's mix (``weight_covered`` says how
    much weight was found). Raises ``ValueError`` for a negative overhead or
    weight, or a mix workload no GPU has.
    """
    _check_recommend(sweep, overhead_w, mix, step_w)
    all_curves, per_workload = _workload_curves(sweep, overhead_w, interpolate, step_w)
    mix_rows: list[dict[str, object]] = []
    mix_curves: list[pd.DataFrame] = []
    warnings: list[str] = []
    for gpu, gcurves in all_curves.groupby("gpu", sort=True):
        found = _mix_curve(str(gpu), gcurves, mix, overhead_w)
        if isinstance(found, str):
            warnings.append(found)
            continue
        mix_rows.append(found[0])
        mix_curves.append(found[1])
    warnings += _lowest_cap_warnings(per_workload)
    mix_columns = ["gpu", "workloads", "weight_covered", *per_workload.columns[3:]]
    return CapsResult(
        overhead_w=float(overhead_w),
        per_workload=per_workload,
        mix=pd.DataFrame(mix_rows, columns=mix_columns),
        curves=all_curves,
        mix_curves=(
            pd.concat(mix_curves, ignore_index=True)
            if mix_curves
            else pd.DataFrame(columns=["gpu", "cap_w", "speed_vs_max", "avg_power_w", "thr_per_mw"])
        ),
        warnings=warnings,
    )


def _check_recommend(
    sweep: pd.DataFrame, overhead_w: float, mix: Mapping[str, float] | None, step_w: float
) -> None:
    """``recommend``'s ValueErrors: a negative overhead or step, an empty sweep, a mix with
    a negative weight, no weight at all, or a workload no sweep has."""
    if not overhead_w >= 0:
        raise ValueError(f"overhead_w must be >= 0 W, got {overhead_w}")
    if sweep.empty:
        raise ValueError("the sweep has no rows")
    if step_w <= 0:
        raise ValueError(f"step_w must be > 0 W, got {step_w}")
    if mix is not None:
        bad = {k: v for k, v in mix.items() if not v >= 0}
        if bad or not sum(mix.values()) > 0:
            raise ValueError(f"mix weights must be >= 0 with a positive sum, got {dict(mix)}")
        known = set(sweep["workload"].astype(str))
        unknown = sorted(set(mix) - known)
        if unknown:
            raise ValueError(
                f"mix workload(s) {', '.join(unknown)} are in no sweep;"
                f" known: {', '.join(sorted(known)[:5])}{', ...' if len(known) > 5 else ''}"
            )


def _workload_curves(
    sweep: pd.DataFrame, overhead_w: float, interpolate: bool, step_w: float
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every (gpu, workload)'s curve (``CapsResult.curves``) and best cap (``per_workload``)."""
    curves: list[pd.DataFrame] = []
    rows: list[dict[str, object]] = []
    ordered = sweep.sort_values(["gpu", "workload", "cap_w"])
    for (gpu, workload), group in ordered.groupby(["gpu", "workload"], sort=True):
        curve = _curve(group, interpolate, step_w)
        curve["speed_vs_max"] = curve["throughput"] / curve["throughput"].iat[-1]
        curve["thr_per_mw"] = curve["throughput"] * W_PER_MW / (curve["cap_w"] + overhead_w)
        curve.insert(0, "workload", str(workload))
        curve.insert(0, "gpu", str(gpu))
        curves.append(curve)
        rows.append(
            {
                "gpu": str(gpu),
                "workload": str(workload),
                "caps": len(group),
                **_summary(curve, "thr_per_mw", overhead_w),
            }
        )
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows)


def _mix_curve(
    gpu: str, gcurves: pd.DataFrame, mix: Mapping[str, float] | None, overhead_w: float
) -> tuple[dict[str, object], pd.DataFrame] | str:
    """One GPU's mix: its row of ``CapsResult.mix`` and its curve, over the caps measured
    for every mix workload; or a warning saying why it has none."""
    names = sorted(gcurves["workload"].unique())
    weights = {n: 1.0 for n in names} if mix is None else {n: mix[n] for n in names if n in mix}
    weights = {n: w for n, w in weights.items() if w > 0}
    if not weights:
        return f"{gpu}: no mix workload (with a weight above 0) on this GPU"
    total = sum(weights.values())
    covered = total / (sum(mix.values()) if mix is not None else total)
    parts = gcurves[gcurves["workload"].isin(list(weights))]
    common = parts.groupby("cap_w")["workload"].nunique()
    common_caps = common.index[common == len(weights)]
    if len(common_caps) == 0:
        return f"{gpu}: no cap is measured for every mix workload; no mix cap"
    on_grid = parts[parts["cap_w"].isin(common_caps)].copy()
    on_grid["w"] = on_grid["workload"].map(weights) / total
    on_grid["w_speed"] = on_grid["w"] * on_grid["speed_vs_max"]
    on_grid["w_power"] = on_grid["w"] * on_grid["avg_power_w"]
    by_cap = on_grid.groupby("cap_w", sort=True)
    mcurve = pd.DataFrame(
        {
            "speed_vs_max": by_cap["w_speed"].sum(),
            "avg_power_w": by_cap["w_power"].sum(min_count=len(weights)),
        }
    ).reset_index()
    mcurve["thr_per_mw"] = mcurve["speed_vs_max"] * W_PER_MW / (mcurve["cap_w"] + overhead_w)
    mcurve.insert(0, "gpu", gpu)
    row = {
        "gpu": gpu,
        "workloads": len(weights),
        "weight_covered": covered,
        **_summary(mcurve, "thr_per_mw", overhead_w),
    }
    return row, mcurve


def _lowest_cap_warnings(per_workload: pd.DataFrame) -> list[str]:
    """A warning per GPU whose best cap is, for some workloads, the lowest measured."""
    edge = per_workload.groupby("gpu")["at_min_cap"].agg(["sum", "size"])
    return [
        f"{gpu}: for {at_min} of {size} workloads the best cap is the lowest measured;"
        " a lower cap may be better still (measure lower caps)"
        for gpu, (at_min, size) in edge.iterrows()
        if at_min
    ]
