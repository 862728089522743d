"""`powerd gpus`: what the agent would read, as a table or JSON lines; bad input is an error."""

from __future__ import annotations

import json

from click.testing import CliRunner

from powerd.cli import main


def test_the_table_lists_every_simulated_gpu() -> None:
    result = CliRunner().invoke(main, ["gpus", "--simulate", "2xH100"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "NVIDIA H100 80GB HBM3"
    rows = [line.split() for line in lines[2:]]
    assert [(row[0], row[4], row[5], row[6]) for row in rows] == [
        ("0", "700", "200", "700"),
        ("1", "700", "200", "700"),
    ]


def test_json_lines_carry_power_and_limits() -> None:
    result = CliRunner().invoke(main, ["gpus", "--simulate", "3xA100", "--json"])
    assert result.exit_code == 0, result.output
    gpus = [json.loads(line) for line in result.output.splitlines()]
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert all(g["power_w"] >= 0 for g in gpus)


def test_a_spec_that_does_not_parse_is_an_error_not_a_traceback() -> None:
    result = CliRunner().invoke(main, ["gpus", "--simulate", "2xFOO"])
    assert result.exit_code == 1
    assert "unknown model 'FOO'" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
