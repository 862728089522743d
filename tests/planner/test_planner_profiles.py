"""`powerplan profiles` and planner.profiles: readers, normalisation, the per-workload summary."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

import planner.profiles as profiles
from planner.cli import main
from planner.errors import ProfileError
from planner.profile_table import COLUMNS
from planner.profiles import (
    aggregate_power,
    flux_records_frame,
    read_influx,
    read_profiles,
    summarise,
)
from tests.support.paths import TEST_DATA
from tests.support.tsdb import InfluxDB1

DATA = TEST_DATA / "profiles"
TRAIN = DATA / "train.csv"
VENDOR = DATA / "vendor.csv"
LP = DATA / "telemetry.lp"
T0 = 1767225600.0  # 2026-01-01T00:00:00Z, the fixtures' start
VENDOR_MAP = {"time_s": "timestamp", "node": "host", "gpu": "gpu_index", "power_w": "gpu_power"}

DTYPES = {
    "time_s": "float64",
    "node": "string",
    "gpu": "int64",
    "workload": "string",
    "power_w": "float64",
    "cap_w": "float64",
    "cap_max_w": "float64",
    "clock_mhz": "float64",
    "phase": "string",
    "throughput": "float64",
}


def _check_form(table: pd.DataFrame) -> None:
    assert list(table.columns) == list(COLUMNS)
    assert {c: str(t) for c, t in table.dtypes.items()} == DTYPES
    key = table[["workload", "node", "gpu", "time_s"]]
    assert key.equals(key.sort_values(list(key.columns), ignore_index=True))


# --- readers -------------------------------------------------------------------------


def test_csv_with_every_column() -> None:
    table = read_profiles([TRAIN])
    _check_form(table)
    assert len(table) == 80
    assert set(table["workload"]) == {"llm-7b"}
    assert table.groupby(["node", "gpu"]).size().tolist() == [20, 20, 20, 20]
    assert table["time_s"].min() == T0
    assert table["cap_w"].eq(700).all()
    assert set(table["phase"]) == {"compute", "communication", "checkpoint"}
    assert table.loc[table["phase"] == "communication", "clock_mhz"].eq(1410).all()


def test_column_mapping_iso_time_and_workload() -> None:
    table = read_profiles([VENDOR], columns=VENDOR_MAP, workload="vendor")
    _check_form(table)
    gpu0 = table[table["gpu"] == 0]
    assert gpu0["time_s"].tolist() == [T0 + i for i in range(10)]
    assert set(table["workload"]) == {"vendor"}
    assert table["cap_w"].isna().all() and table["phase"].isna().all()


def test_line_protocol_reads_gpu_points_only() -> None:
    table = read_profiles([LP], workload="idle")
    _check_form(table)
    # 10 samples x 8 GPUs; the tree, decision and phase_event points are skipped
    assert len(table) == 80
    assert table.groupby("workload").size().to_dict() == {"bert": 40, "idle": 20, "resnet": 20}
    assert table["clock_mhz"].eq(1980).all()  # sm_clock_mhz
    assert table.loc[table["workload"] == "idle", "phase"].isna().all()
    first = table[(table["node"] == "a1") & (table["gpu"] == 1)].iloc[0]
    assert first["time_s"] == pytest.approx(T0 + 0.004)


def test_line_protocol_matches_what_powerd_writes(tmp_path: Path) -> None:
    from powerd.telemetry_schema import gpu_line

    lines = [
        gpu_line(
            T0 + i,
            cluster="c",
            node="n 1",  # escaped in the tag
            gpu=3,
            job="job,x",
            phase="checkpoint",
            power_w=500.0 + i,
            cap_w=600.0,
        )
        for i in range(3)
    ]
    path = tmp_path / "rec.line"
    path.write_text("\n".join(line for line in lines if line) + "\n")
    table = read_profiles([path])
    assert table["node"].tolist() == ["n 1"] * 3
    assert table["workload"].tolist() == ["job,x"] * 3
    assert table["gpu"].tolist() == [3, 3, 3]
    assert table["power_w"].tolist() == [500.0, 501.0, 502.0]


def test_parquet_reads_like_csv(tmp_path: Path) -> None:
    csv_table = read_profiles([TRAIN])
    raw = pd.read_csv(TRAIN)
    raw["time_s"] = pd.to_datetime(raw["time_s"], unit="s")  # a datetime column is fine too
    raw = raw.rename(columns={"power_w": "watts"})
    path = tmp_path / "train.pq"
    raw.to_parquet(path)
    table = read_profiles([path], columns={"power_w": "watts"})
    pd.testing.assert_frame_equal(table, csv_table, atol=1e-6)


def test_several_files_one_sorted_table() -> None:
    # one mapping for all files: the line protocol and the CSV use the normalised names
    table = read_profiles([LP, TRAIN], workload="other")
    _check_form(table)
    assert set(table["workload"]) == {"bert", "resnet", "other", "llm-7b"}
    assert len(table) == 160


def test_unknown_mapping_name_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown column name"):
        read_profiles([TRAIN], columns={"watts": "power_w"})


# --- InfluxDB ------------------------------------------------------------------------


def test_influxql_recorded_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """A response recorded from InfluxDB 1.6 (GROUP BY tags: tags per series, time in ns)."""
    doc = json.loads((DATA / "influxql_resnet.json").read_text())
    seen: dict[str, object] = {}

    def fake_get(url: str, query: str, **kwargs: object) -> dict:
        seen.update(kwargs, url=url, query=query)
        return doc

    monkeypatch.setattr(profiles, "_influxql_get", fake_get)
    table = read_influx("http://influx:8086", "SELECT ...", database="powerd", token="t")
    _check_form(table)
    assert seen["database"] == "powerd" and seen["token"] == "t"
    expected = read_profiles([LP], workload="idle")
    expected = expected[expected["workload"] == "resnet"].reset_index(drop=True)
    expected["cap_max_w"] = np.nan  # the recorded query's columns: no cap_max_w
    pd.testing.assert_frame_equal(table, expected)


def test_influxql_statement_error_names_the_server() -> None:
    with pytest.raises(ProfileError, match="http://x:8086: query failed: boom"):
        profiles.influxql_frame("http://x:8086", {"results": [{"error": "boom"}]})


def test_flux_records_are_pivoted() -> None:
    stamp = pd.Timestamp(T0, unit="s", tz="UTC")
    records = [
        {
            "result": "_result",
            "table": 0,
            "_time": stamp + pd.Timedelta(seconds=i),
            "node": "n",
            "gpu": "0",
            "job": "j",
            "_field": field,
            "_value": value,
        }
        for i in range(3)
        for field, value in (("power_w", 300.0 + i), ("cap_w", 700.0))
    ]
    raw = flux_records_frame(records)
    assert sorted(raw.columns) == ["_time", "cap_w", "gpu", "job", "node", "power_w"]
    assert raw["power_w"].tolist() == [300.0, 301.0, 302.0]


@pytest.fixture
def influxd(tmp_path: Path) -> Iterator[str]:
    """A real InfluxDB 1.x (Debian's `influxdb`) on a free port, with the LP fixture written."""
    server = InfluxDB1(tmp_path)
    server.start()
    try:
        server.create_database("powerd")
        server.write("powerd", LP.read_bytes())
        yield server.url
    finally:
        server.stop()


def test_influxql_against_a_real_server(influxd: str) -> None:
    table = read_influx(influxd, "SELECT * FROM gpu", database="powerd", workload="idle")
    pd.testing.assert_frame_equal(table, read_profiles([LP], workload="idle"))
    mean = read_influx(
        influxd,
        "SELECT mean(power_w) FROM gpu WHERE time >= '2026-01-01T00:00:00Z'"
        " AND time < '2026-01-01T00:00:10Z' AND job =~ /./"
        " GROUP BY time(2s), node, gpu, job fill(none)",
        database="powerd",
        columns={"power_w": "mean"},
    )
    assert len(mean) == 6 * 5  # GPUs with a job x 2 s bins
    with pytest.raises(ProfileError, match="HTTP 400: error parsing query"):
        read_influx(influxd, "SELEC 1", database="powerd")
    with pytest.raises(ProfileError, match="returned no rows"):
        read_influx(influxd, "SELECT * FROM nothing", database="powerd")


# --- summary -------------------------------------------------------------------------


def _table(rows: list[tuple]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["time_s", "node", "gpu", "workload", "power_w", "phase"])
    for name in ("cap_w", "cap_max_w", "clock_mhz", "throughput"):
        frame[name] = np.nan
    return frame[list(COLUMNS)].astype(DTYPES)


def test_summary_numbers() -> None:
    # two GPUs in step: 400 W for 6 s, 100 W for 2 s (a checkpoint), 400 W for 2 s
    rows: list[tuple[float, str, int, str, float, str | None]] = []
    for gpu in (0, 1):
        for i in range(10):
            low = i in (6, 7)
            rows.append(
                (
                    float(i),
                    "n",
                    gpu,
                    "w",
                    100.0 if low else 400.0,
                    "checkpoint" if low else "compute",
                )
            )
    rows += [(float(i), "m", 0, "flat", 300.0, None) for i in range(5)]
    summary = summarise(_table(rows)).set_index("workload")
    w = summary.loc["w"]
    assert (w["gpus"], w["nodes"], w["samples"]) == (2, 1, 20)
    assert w["duration_s"] == 9.0 and w["step_s"] == 1.0
    assert w["mean_w"] == pytest.approx(340.0)
    assert w["p50_w"] == 400.0 and w["max_w"] == 400.0
    assert w["agg_mean_w"] == pytest.approx(680.0)
    assert w["peak_to_mean"] == pytest.approx(800.0 / 680.0)
    # 800 -> 200 and 200 -> 800: two moves of 600 W > 30% of 680 W
    assert w["swings"] == 2
    assert w["max_swing_w_per_s"] == pytest.approx(600.0)
    assert w["share_compute"] == pytest.approx(0.8)
    assert w["share_checkpoint"] == pytest.approx(0.2)
    flat = summary.loc["flat"]
    assert flat["swings"] == 0 and flat["peak_to_mean"] == 1.0
    assert np.isnan(flat["share_compute"])


def test_aggregate_tolerates_clock_offsets_and_jitter() -> None:
    # node b samples 0.4 s after node a, with ±0.1 s jitter: no false swings from binning
    rng = np.random.default_rng(1)
    rows = []
    for node, offset in (("a", 0.0), ("b", 0.4)):
        for i in range(60):
            t = i + offset + rng.uniform(-0.1, 0.1)
            rows.append((t, node, 0, "w", 500.0, "compute"))
    table = _table(rows)
    agg = aggregate_power(table)
    assert agg.attrs["step_s"] == pytest.approx(1.0, abs=0.1)
    assert len(agg) >= 55
    assert np.allclose(agg.to_numpy(), 1000.0)
    assert summarise(table)["swings"].item() == 0


def test_aggregate_fills_one_missed_step_only() -> None:
    # GPU b: two samples in step 3, none in step 4 (kept from step 3); none in 7-8 (7 kept from 6, 8 left out)
    rows = [(float(i), "a", 0, "w", 300.0, None) for i in range(10)]
    b_times = [0, 1, 2, 3.2, 3.4, 5, 6, 9]
    rows += [(float(t), "b", 0, "w", 200.0, None) for t in b_times]
    agg = aggregate_power(_table(rows), step_s=1.0)
    assert agg.index.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0]
    assert np.allclose(agg.to_numpy(), 500.0)


def test_summary_of_the_fixtures() -> None:
    summary = summarise(read_profiles([TRAIN])).set_index("workload").loc["llm-7b"]
    # 4 GPUs; the communication (8-9 s) and checkpoint (16-17 s) dips each swing down and up
    assert summary["gpus"] == 4 and summary["nodes"] == 2
    assert summary["swings"] == 4
    assert summary["share_communication"] == pytest.approx(0.1)


# --- the command ---------------------------------------------------------------------


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["profiles", *args])
    return result.exit_code, result.output


def test_cli_json() -> None:
    code, out = _run(str(LP), str(TRAIN), "--workload", "idle", "--format", "json")
    assert code == 0, out
    doc = json.loads(out)
    assert [row["workload"] for row in doc["profiles"]] == ["bert", "idle", "llm-7b", "resnet"]
    assert doc["samples"] == 160
    bert = doc["profiles"][0]
    assert bert["gpus"] == 4 and bert["share_communication"] == pytest.approx(0.4)


def test_cli_table_and_csv() -> None:
    code, out = _run(str(TRAIN))
    assert code == 0 and "llm-7b" in out and "peak_to" in out
    code, out = _run(str(TRAIN), "--format", "csv")
    assert code == 0
    assert out.splitlines()[0].startswith("workload,gpus,nodes,samples,duration_s")


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_cli_normalised_out(tmp_path: Path, suffix: str) -> None:
    out_path = tmp_path / f"norm{suffix}"
    args = [str(VENDOR), "--workload", "v", "--normalised-out", str(out_path)]
    for name, column in VENDOR_MAP.items():
        args += ["--column", f"{name}={column}"]
    code, out = _run(*args)
    assert code == 0, out
    assert read_profiles([out_path]).equals(
        read_profiles([VENDOR], columns=VENDOR_MAP, workload="v")
    )


def test_cli_help_explains_the_method() -> None:
    code, out = _run("--help")
    assert code == 0
    for words in ("--column NAME=COLUMN", "peak_to_mean", "30%", "mW", "--influx", "--format"):
        assert words in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give profile FILEs"),
        (("--influx", "http://x"), "together"),
        ((str(TRAIN), "--column", "watts"), "NAME=COLUMN"),
        ((str(TRAIN), "--normalised-out", "x.txt"), ".parquet, .pq or .csv"),
    ],
)
def test_cli_usage_errors(args: tuple[str, ...], message: str) -> None:
    code, out = _run(*args)
    assert code == 2 and message in out
