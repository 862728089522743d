"""--input-format: nvidia-smi, dcgm-exporter and Zeus files read as the tools write them.

The samples are tests/data/formats/ (its README says which command wrote each and where
the format is documented). The tests named ``test_why_*`` are the issue's complaints:
each fails on the code before planner/formats existed.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from planner import formats
from planner.cli import main as powerplan
from planner.errors import ProfileError
from planner.profiles import read_profiles
from tests.support.paths import REPO, TEST_DATA

DATA = TEST_DATA / "formats"
SMI = DATA / "gpu-node07.csv"  # --format=csv: header, units
SMI_BARE = DATA / "gpu-node08.csv"  # --format=csv,noheader,nounits
SMI_FIELDS = "timestamp,index,power.draw,power.limit,enforced.power.limit,clocks.sm"
DCGM = DATA / "gpu-node09.prom"  # curl scrapes, '# scrape at' before each
DCGM_FEDERATED = DATA / "gpu-node10.prom"  # Prometheus /federate: a timestamp per sample
ZEUS_CSV = DATA / "gpu-node11.csv"  # PowerMonitor(power_csv_path=...)
ZEUS_LOG = DATA / "gpu-node12.log"  # python -m zeus.monitor power
T0 = datetime(2024, 5, 14, 10, 0, tzinfo=UTC).timestamp()  # the samples' start
PROFILE_COMMANDS = ("profiles", "size", "whatif", "evaluate", "report", "frontier")


def run(*args: str | Path) -> dict:
    result = CliRunner().invoke(powerplan, ["profiles", *map(str, args), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def failure(*args: str | Path) -> str:
    result = CliRunner().invoke(powerplan, ["profiles", *map(str, args)])
    assert result.exit_code != 0, result.output
    return " ".join(result.output.split())


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- one flag each ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "flag", "gpus", "samples"),
    [
        (SMI, "nvidia-smi", 2, 32),
        (SMI_BARE, f"nvidia-smi:{SMI_FIELDS}", 2, 32),
        (DCGM, "dcgm", 2, 16),
        (DCGM_FEDERATED, "dcgm", 2, 16),
        (ZEUS_CSV, "zeus", 4, 160),
        (ZEUS_LOG, "zeus", 8, 80),
    ],
    ids=lambda x: str(getattr(x, "name", x)),
)
def test_each_tool_is_read_with_one_flag(path: Path, flag: str, gpus: int, samples: int):
    doc = run(path, "--input-format", flag)
    (row,) = doc["profiles"]
    assert (row["workload"], row["gpus"], row["nodes"], doc["samples"]) == (
        path.stem,
        gpus,
        1,
        samples,
    )
    assert 250 < row["mean_w"] < 560


def test_nvidia_smi_values_units_and_times():
    table = read_profiles([SMI], input_format="nvidia-smi")
    first = table.iloc[0]
    assert first["time_s"] == pytest.approx(T0 + 0.012)  # 2024/05/14 10:00:00.012, as UTC
    assert (first["node"], first["gpu"], first["power_w"]) == ("gpu-node07", 0, 520.0)
    assert (first["cap_w"], first["clock_mhz"]) == (700.0, 1755.0)  # enforced.power.limit
    assert table[table["gpu"] == 1]["power_w"].iloc[0] == 529.24


def test_nvidia_smi_without_header_is_the_same_reading_as_with_it(tmp_path: Path):
    with_header = write(tmp_path, "n.csv", SMI.read_text().splitlines()[0] + "\n")
    with_header.write_text(with_header.read_text() + SMI_BARE.read_text())
    a = read_profiles([with_header], input_format="nvidia-smi", node="n8")
    b = read_profiles([SMI_BARE], input_format=f"nvidia-smi:{SMI_FIELDS}", node="n8")
    assert a.drop(columns="workload").equals(b.drop(columns="workload"))


def test_dcgm_scrape_times_labels_and_limit():
    marked = read_profiles([DCGM])
    federated = read_profiles([DCGM_FEDERATED])
    # '# scrape at 1715680800.000' .. one a second; /federate: ms after each value
    assert marked[marked["gpu"] == 0]["time_s"].iloc[:2].tolist() == [T0, T0 + 1.037]
    assert federated[federated["gpu"] == 0]["time_s"].iloc[0] == pytest.approx(T0 + 0.012)
    assert set(marked["node"]) == {"gpu-node09"} and set(federated["node"]) == {"gpu-node10"}
    assert marked["power_w"].tolist() == federated["power_w"].tolist()
    assert (marked["cap_w"] == 700.0).all()  # DCGM_FI_DEV_POWER_MGMT_LIMIT
    assert set(marked["clock_mhz"]) == {1755.0, 1980.0}


def test_zeus_csv_and_log_values():
    csv_table = read_profiles([ZEUS_CSV], input_format="zeus")
    row = csv_table.iloc[1]  # GPU 0's second poll: 1715680800.100123,640.37,...
    assert (row["time_s"], row["gpu"], row["power_w"]) == (1715680800.100123, 0, 520.37)
    renamed = read_profiles([ZEUS_CSV], input_format="zeus:4,5,6,7")
    assert sorted(renamed["gpu"].unique()) == [4, 5, 6, 7]
    log = read_profiles([ZEUS_LOG])
    assert sorted(log["gpu"].unique()) == list(range(8))
    first = log[log["gpu"] == 7].iloc[0]  # 2024-05-14 10:00:01.003127 {..., 'GPU7': 546.496}
    assert first["time_s"] == pytest.approx(T0 + 1.003127)
    assert first["power_w"] == 546.496


# --- the complaints, each failing before ---------------------------------------


def test_why_nvidia_smi_csv_is_read_without_hand_edits_or_a_column_mapping():
    doc = run(SMI)
    assert [r["workload"] for r in doc["profiles"]] == ["gpu-node07"]


def test_why_the_suggested_mapping_names_each_column_once_and_quotes_it(tmp_path: Path):
    path = write(tmp_path, "own.csv", "timestamp,index,power.draw [W] sum\n1,0,300\n")
    message = failure(path, "--workload", "w")
    assert "--column time_s=timestamp --column gpu=index" in message
    assert "--column 'power_w=power.draw [W] sum'" in message
    assert "node=index" not in message


def test_why_a_value_with_its_unit_is_a_number(tmp_path: Path):
    header = "timestamp, index, power.draw [W], clocks.sm [MHz]"
    rows = [
        "2024/05/14 10:00:00.012, 0, 312.45 W, 1980 MHz",
        "2024/05/14 10:00:01.013, 0, 318 W, 1980 MHz",
    ]
    table = read_profiles([write(tmp_path, "n1.csv", "\n".join([header, *rows, ""]))])
    assert table["power_w"].tolist() == [312.45, 318.0]
    assert table["clock_mhz"].tolist() == [1980.0, 1980.0]


def test_nvidia_smi_max_limit_tells_the_capped_samples(tmp_path: Path):
    header = "timestamp, index, power.draw [W], power.limit [W], power.max_limit [W]"
    rows = [
        "2024/05/14 10:00:00.012, 0, 498.00 W, 500.00 W, 700.00 W",  # held at a 500 W cap
        "2024/05/14 10:00:00.012, 1, 620.00 W, 700.00 W, 700.00 W",
    ]
    path = write(tmp_path, "n1.csv", "\n".join([header, *rows, ""]))
    table = read_profiles([path], workload="llm")
    assert table["cap_max_w"].tolist() == [700.0, 700.0]
    result = CliRunner().invoke(powerplan, ["profiles", str(path), "--workload", "llm"])
    assert result.exit_code == 0, result.output
    assert "50% held at the cap" in result.output


def test_why_the_node_comes_from_node_else_the_file_stem():
    assert set(read_profiles([SMI])["node"]) == {"gpu-node07"}
    assert run(SMI, "--node", "rack3-n7")["profiles"][0]["nodes"] == 1
    named = read_profiles([SMI], node="rack3-n7", workload="llm")
    assert set(named["node"]) == {"rack3-n7"} and set(named["workload"]) == {"llm"}


def test_why_a_dcgm_exporter_scrape_is_read():
    doc = run(DCGM)
    assert doc["profiles"][0]["workload"] == "gpu-node09"


def test_why_zeus_power_monitor_logs_are_read():
    assert run(ZEUS_CSV, "--input-format", "zeus")["samples"] == 160
    assert run(ZEUS_LOG)["samples"] == 80


# --- nvidia-smi's details -------------------------------------------------------------


def test_not_available_values(tmp_path: Path):
    text = (
        "timestamp, index, power.draw [W], power.limit [W], clocks.sm [MHz]\n"
        "2024/05/14 10:00:00.012, 0, 300.00 W, [N/A], [Not Supported]\n"
        "2024/05/14 10:00:00.512, 0, [N/A], 700.00 W, 1980 MHz\n"
        "2024/05/14 10:00:01.012, 0, 310.00 W, 700.00 W, 1980 MHz\n"
    )
    table = read_profiles([write(tmp_path, "n.csv", text)])
    assert table["power_w"].tolist() == [300.0, 310.0]  # the sample without power left out
    assert np.isnan(table["cap_w"].iloc[0]) and np.isnan(table["clock_mhz"].iloc[0])


def test_a_gpu_without_any_power_is_named_with_its_line(tmp_path: Path):
    text = (
        "timestamp, index, power.draw [W]\n"
        "2024/05/14 10:00:00.012, 0, 300.00 W\n"
        "2024/05/14 10:00:00.012, 1, [Not Supported]\n"
    )
    message = failure(write(tmp_path, "n.csv", text))
    assert "n.csv:3: power.draw of GPU 1 is '[Not Supported]'" in message


def test_a_repeated_header_is_skipped_and_a_wrong_unit_refused(tmp_path: Path):
    text = SMI.read_text()
    twice = write(tmp_path, "n.csv", text + text.replace("2024/05/14 10:00", "2024/05/14 10:05"))
    assert len(read_profiles([twice])) == 64
    lines = text.splitlines()
    lines[3] = lines[3].replace(" W,", " kW,", 1)
    message = failure(write(tmp_path, "kw.csv", "\n".join(lines) + "\n"))
    assert "kw.csv:4: power.draw is '" in message and "need a number in W" in message


def test_the_power_field_is_chosen_by_column(tmp_path: Path):
    text = (
        "timestamp, index, power.draw [W], power.draw.instant [W]\n"
        "2024/05/14 10:00:00.012, 0, 300.00 W, 350.00 W\n"
    )
    path = write(tmp_path, "n.csv", text)
    assert read_profiles([path])["power_w"].tolist() == [300.0]
    chosen = read_profiles([path], columns={"power_w": "power.draw.instant"})
    assert chosen["power_w"].tolist() == [350.0]


def test_noheader_needs_its_fields_and_a_header_needs_none():
    message = failure(SMI_BARE)
    assert "gpu-node08.csv:1: nvidia-smi rows without a header" in message
    assert "6 fields" in message and "--input-format nvidia-smi:" in message
    message = failure(SMI, "--input-format", f"nvidia-smi:{SMI_FIELDS}")
    assert "gpu-node07.csv:1: this line is a header" in message
    message = failure(SMI_BARE, "--input-format", "nvidia-smi:timestamp,index,power.draw")
    assert "gpu-node08.csv:1: 6 fields where --input-format gives 3" in message


def test_no_index_says_what_to_query(tmp_path: Path):
    path = write(tmp_path, "n.csv", "timestamp, power.draw [W]\n2024/05/14 10:00:00.012, 1 W\n")
    message = failure(path, "--input-format", "nvidia-smi")
    assert "n.csv:1: no index field" in message and "--query-gpu=timestamp,index" in message


# --- DCGM's details -------------------------------------------------------------------

LABELS = 'gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100 80GB HBM3"'


def test_scrapes_without_a_time_are_refused_with_the_convention(tmp_path: Path):
    text = (
        "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} 300\n"
    )
    message = failure(write(tmp_path, "n.prom", text))
    assert "n.prom:2: a sample without a time" in message
    assert "# scrape at UNIX_S" in message and "/federate" in message


def test_two_scrapes_under_one_marker_are_named(tmp_path: Path):
    line = f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} 300"
    text = f"# scrape at 2024-05-14T10:00:00Z\n{line}\n{line}\n"
    message = failure(write(tmp_path, "n.prom", text))
    assert "n.prom:3: DCGM_FI_DEV_POWER_USAGE of GPU 0 again at the same time as line 2" in message


def test_power_from_the_energy_counter_and_the_enforced_limit_first(tmp_path: Path):
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    text = "".join(
        f"# scrape at {T0 + k * 2}\n{energy}{{{LABELS}}} {1_000_000 + k * 800_000}\n"
        f"DCGM_FI_DEV_POWER_MGMT_LIMIT{{{LABELS}}} 700\n"
        f"DCGM_FI_DEV_ENFORCED_POWER_LIMIT{{{LABELS}}} 650\n"
        f"DCGM_FI_DEV_POWER_MGMT_LIMIT_MAX{{{LABELS}}} 700\n"
        for k in range(3)
    )
    table = read_profiles([write(tmp_path, "n.prom", text)], node="n1")
    assert table["power_w"].tolist() == [400.0, 400.0]  # 800 J in 2 s; the first has none
    assert table["time_s"].tolist() == [T0 + 2, T0 + 4]
    assert set(table["cap_w"]) == {650.0} and set(table["node"]) == {"n1"}
    assert set(table["cap_max_w"]) == {700.0}  # capped 50 W below the GPU's maximum


def test_a_mig_instance_and_other_metrics_are_left_out(tmp_path: Path):
    text = (
        "# scrape at 1715680800\n"
        f"DCGM_FI_DEV_POWER_USAGE{{{LABELS}}} 300\n"
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{LABELS},GPU_I_ID="1"}} 0.5\n'
        "go_goroutines 12\n"
    )
    table = read_profiles([write(tmp_path, "n.prom", text)])
    assert len(table) == 1 and table["power_w"].iloc[0] == 300.0


# --- Zeus's details -------------------------------------------------------------------


def test_zeus_csv_header_names_the_gpus_and_a_short_row_is_named(tmp_path: Path):
    path = write(tmp_path, "z.csv", "time,power2,power3\n1715680800.1,300.5,301.0\n")
    assert read_profiles([path], input_format="zeus")["gpu"].tolist() == [2, 3]
    path = write(tmp_path, "short.csv", "1715680800.1,300.5,301.0\n1715680800.2,300.5\n")
    assert "short.csv:2: 2 fields where the first row has 3" in failure(
        path, "--input-format", "zeus"
    )
    assert "GPUs given" in failure(path, "--input-format", "zeus:0")


def test_a_headerless_zeus_csv_asks_for_the_flag():
    message = failure(ZEUS_CSV)
    assert "gpu-node11.csv:1: numbers without a header" in message
    assert "--input-format zeus" in message


# --- the wrong format: file:line, what is wrong, which flag ------------------------------


@pytest.mark.parametrize(
    ("path", "flag", "expected"),
    [
        (SMI, "dcgm", "it looks like nvidia-smi: give --input-format nvidia-smi"),
        (DCGM, "zeus", "it looks like dcgm: give --input-format dcgm"),
        (ZEUS_LOG, "nvidia-smi", "it looks like zeus: give --input-format zeus"),
    ],
    ids=["smi-as-dcgm", "dcgm-as-zeus", "zeus-as-smi"],
)
def test_the_wrong_flag_names_the_right_one(path: Path, flag: str, expected: str):
    assert expected in failure(path, "--input-format", flag)


def test_an_unknown_file_type_names_the_flag(tmp_path: Path):
    message = failure(write(tmp_path, "power.out", "something else\n"))
    assert "unknown file type '.out'" in message and "--input-format" in message


def test_an_unknown_preset_is_refused_by_the_option():
    message = failure(SMI, "--input-format", "rocm-smi")
    assert "'rocm-smi': give one of nvidia-smi[:FIELDS]|dcgm|zeus[:GPUS]" in message


# --- every command that reads profiles ---------------------------------------------------


@pytest.mark.parametrize("command", PROFILE_COMMANDS)
def test_every_profile_command_takes_the_options(command: str):
    text = " ".join(CliRunner().invoke(powerplan, [command, "--help"]).output.split())
    assert "--input-format nvidia-smi[:FIELDS]|dcgm|zeus[:GPUS]" in text
    assert "--node NAME" in text and "[default: the file's stem; dcgm: its Hostname" in text


def test_size_reads_a_preset_through_the_shared_option(tmp_path: Path):
    mix = write(tmp_path, "mix.toml", '[[jobs]]\nworkload = "train"\nshare = 1.0\n')
    args = ["size", str(REPO / "powerd/data/budgets/demo.toml")]
    args += [str(SMI_BARE), "--input-format", f"nvidia-smi:{SMI_FIELDS}", "--workload", "train"]
    args += ["--mix", str(mix), "-o", str(tmp_path / "sized.toml"), "--allow-over-limit"]
    result = CliRunner().invoke(powerplan, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sized.toml").is_file()
    assert formats.chosen() == (None, None)  # the command's choice ends with it


def test_a_profile_table_beside_a_tools_files_is_read_as_a_table():
    train = TEST_DATA / "profiles" / "train.csv"
    table = read_profiles([train, ZEUS_CSV], input_format="zeus")
    assert set(table["workload"]) == {"llm-7b", "gpu-node11"}


def test_a_library_reader_outside_a_command_detects_or_is_told(tmp_path: Path):
    with pytest.raises(ProfileError, match=r"gpu-node08\.csv:1: nvidia-smi rows"):
        read_profiles([SMI_BARE])
    with formats.reading(formats.parse_format(f"nvidia-smi:{SMI_FIELDS}"), "n8"):
        assert set(read_profiles([SMI_BARE])["node"]) == {"n8"}


def test_the_documented_commands_run_as_written(monkeypatch: pytest.MonkeyPatch):
    text = (REPO / "docs" / "PLANNER.md").read_text(encoding="utf-8")
    block = re.compile(r"```sh\n(.*?)```", re.S).search(text, text.index("**Tool output**"))
    assert block is not None
    monkeypatch.chdir(REPO)
    lines = block.group(1).splitlines()
    for line in lines:
        words = shlex.split(line, comments=True)
        result = CliRunner().invoke(powerplan, [*words[1:], "--format", "json"])
        assert result.exit_code == 0, f"{line}\n{result.output}"
        assert json.loads(result.output)["samples"] > 0
    assert len(lines) == 4
