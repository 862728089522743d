"""The shipped workload curves reproduce the measured Zeus power-limit sweeps.

For every workload of every sweep, on the GPU model of its file, the curve of
``powerd/data/workload_curves.json`` predicts ``time_per_epoch`` and
``average_power`` at each measured cap. Re-fitting reproduces the shipped file.
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from powerd.gpu import calibrate
from powerd.gpu.models import gpu_model
from powerd.gpu.simulated import WORKLOAD_ALIASES
from powerd.gpu.workload_model import Device, WorkloadCurve, predict
from tests.support.paths import TEST_DATA

SWEEPS = TEST_DATA / "zeus-power-limit"
FILES = {
    "A40": "summary_power_a40.csv",
    "V100": "summary_power_v100.csv",
    "P100": "summary_power_p100.csv",
}

TIME_MEDIAN_LIMIT = 0.10  # per workload, across its caps
POWER_MEDIAN_LIMIT = 0.10
# Per GPU, the median over workloads of those medians (measured: time 1.2-2.5 %,
# power 0.5-2.9 %): a worse model or fit shows here first.
TIME_TYPICAL_LIMIT = 0.04
POWER_TYPICAL_LIMIT = 0.04


@cache
def shipped() -> dict[str, Any]:
    text = resources.files("powerd").joinpath("data/workload_curves.json").read_text()
    return json.loads(text)


@cache
def sweeps() -> list[tuple[str, str, pd.DataFrame]]:
    """(workload name, GPU key, its rows sorted by cap) for every workload of every file."""
    out = []
    for key, file in FILES.items():
        frame = pd.read_csv(SWEEPS / file)
        for (dataset, network, batch, optimizer), rows in frame.groupby(
            list(calibrate.KEY_COLUMNS)
        ):
            name = calibrate.workload_name(key, dataset, network, int(batch), optimizer)
            out.append((name, key, rows.sort_values("power_limit")))
    return out


def errors(name: str, key: str, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    curve = WorkloadCurve.from_dict(shipped()["workloads"][name]["curve"])
    device = Device.of(gpu_model(key))
    t_pred, p_pred = predict(curve, device, rows["power_limit"].to_numpy(float))
    t_err = np.abs(t_pred / rows["time_per_epoch"].to_numpy() - 1)
    p_err = np.abs(p_pred / rows["average_power"].to_numpy() - 1)
    return t_err, p_err


def test_every_measured_workload_has_a_curve_from_its_own_file() -> None:
    names = {name for name, _, _ in sweeps()}
    assert len(names) == len(sweeps()) == 166
    assert set(shipped()["workloads"]) == names
    for name, key, rows in sweeps():
        entry = shipped()["workloads"][name]
        assert entry["gpu_model"] == key
        assert entry["file"] == FILES[key]
        assert entry["fit_error"]["n_points"] == len(rows)


@pytest.mark.parametrize(("name", "key", "rows"), sweeps(), ids=[s[0] for s in sweeps()])
def test_the_curve_predicts_the_measured_sweep(name: str, key: str, rows: pd.DataFrame) -> None:
    t_err, p_err = errors(name, key, rows)
    assert np.median(t_err) <= TIME_MEDIAN_LIMIT, f"time errors {np.round(t_err, 3)}"
    assert np.median(p_err) <= POWER_MEDIAN_LIMIT, f"power errors {np.round(p_err, 3)}"
    # the JSON reports what the curve does
    recorded = shipped()["workloads"][name]["fit_error"]
    assert recorded["time_median"] == pytest.approx(np.median(t_err), rel=1e-2, abs=1e-4)
    assert recorded["power_max"] == pytest.approx(np.max(p_err), rel=1e-2, abs=1e-4)


@pytest.mark.parametrize("key", FILES)
def test_typical_error_per_gpu(key: str, record_property: Any) -> None:
    t_med, p_med, t_max, p_max = [], [], [], []
    for name, k, rows in sweeps():
        if k == key:
            t_err, p_err = errors(name, k, rows)
            t_med.append(np.median(t_err))
            p_med.append(np.median(p_err))
            t_max.append(np.max(t_err))
            p_max.append(np.max(p_err))
    report = (
        f"{key}: time median {np.median(t_med):.1%} (worst workload {max(t_med):.1%}, "
        f"worst point {max(t_max):.1%}); power median {np.median(p_med):.1%} "
        f"(worst workload {max(p_med):.1%}, worst point {max(p_max):.1%})"
    )
    record_property("calibration", report)
    print(report)
    assert np.median(t_med) <= TIME_TYPICAL_LIMIT, report
    assert np.median(p_med) <= POWER_TYPICAL_LIMIT, report


def test_the_a40_draws_more_than_its_floor_limit_but_the_model_never_does() -> None:
    """What the data shows at the A40's 100 W floor, and what the model chooses instead."""
    frame = pd.read_csv(SWEEPS / FILES["A40"])
    at_floor = frame[frame["power_limit"] == 100]
    assert at_floor["average_power"].max() > 115  # measured: up to 121 W under a 100 W limit
    device = Device.of(gpu_model("A40"))
    for entry in shipped()["workloads"].values():
        if entry["gpu_model"] == "A40":
            _, power = predict(WorkloadCurve.from_dict(entry["curve"]), device, [100.0])
            assert power[0] <= 100.0


def test_shipped_curves_are_physical() -> None:
    for name, entry in shipped()["workloads"].items():
        curve = WorkloadCurve.from_dict(entry["curve"])
        device = Device.of(gpu_model(entry["gpu_model"]))
        assert 1.0 <= curve.alpha <= 4.0, name
        assert curve.p_static >= device.p_idle - 1e-6, name
        assert curve.busy_frac <= calibrate.P_BUSY_MAX + 1e-6, name
        assert device.p_idle - 1e-6 <= curve.p_wait <= curve.busy_frac + 1e-6, name


def test_the_aliases_name_high_power_fitted_curves() -> None:
    for alias, target in WORKLOAD_ALIASES.items():
        assert target in shipped()["workloads"], alias
    llm = WorkloadCurve.from_dict(shipped()["workloads"][WORKLOAD_ALIASES["llm-train"]]["curve"])
    assert llm.demand_frac > 0.85


# A spread of workloads, every GPU and family, and the aliases: about a second to re-fit.
REFIT = sorted({s[0] for s in sweeps()[::12]} | set(WORKLOAD_ALIASES.values()))


def test_refitting_reproduces_the_shipped_curves() -> None:
    fitted = calibrate.fit_sweeps(SWEEPS, only=REFIT)
    assert sorted(f.name for f in fitted) == REFIT
    rows_by_name = {name: (key, rows) for name, key, rows in sweeps()}
    for f in fitted:
        entry = shipped()["workloads"][f.name]
        curve = WorkloadCurve.from_dict(entry["curve"])
        for field, value in curve.to_dict().items():
            assert getattr(f.curve, field) == pytest.approx(value, rel=1e-3, abs=1e-4), (
                f.name,
                field,
            )
        key, rows = rows_by_name[f.name]
        device = Device.of(gpu_model(key))
        caps = rows["power_limit"].to_numpy(float)
        for new, old in zip(
            predict(f.curve, device, caps), predict(curve, device, caps), strict=True
        ):
            np.testing.assert_allclose(new, old, rtol=1e-3)


def test_the_cli_writes_curves_and_their_errors(tmp_path: Path) -> None:
    source = tmp_path / "sweeps"
    source.mkdir()
    frame = pd.read_csv(SWEEPS / FILES["P100"])
    picked = (frame["network"] == "resnet50") & frame["batch_size"].isin([8, 16])
    frame[picked].to_csv(source / "summary_power_p100.csv", index=False)
    out = tmp_path / "curves.json"
    assert calibrate.main([str(source), "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["format"] == calibrate.FORMAT_VERSION
    names = set(document["workloads"])
    assert names == {"p100/imagenet/resnet50/bs8/adadelta", "p100/imagenet/resnet50/bs16/adadelta"}
    for name, entry in document["workloads"].items():
        assert entry["gpu_model"] == "P100" and entry["file"] == "summary_power_p100.csv"
        assert entry["fit_error"]["time_median"] < 0.05
        assert WorkloadCurve.from_dict(entry["curve"]).t_min_s > 0, name


def test_the_cli_refuses_files_it_cannot_place(tmp_path: Path) -> None:
    shutil.copy(SWEEPS / FILES["P100"], tmp_path / "summary_power_x999.csv")
    with pytest.raises(KeyError, match="x999"):
        calibrate.main([str(tmp_path)])
    with pytest.raises(FileNotFoundError):
        calibrate.main([str(tmp_path / "empty")])
