"""`powerd demo`'s options (issue 15, point 8): --duration-s, named for its unit as every other
option is; the old --duration still works, hidden, with a note on stderr. The values here stop
the demo before it starts anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from powerd.cli import main


def test_the_help_names_duration_s_and_hides_the_old_spelling():
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert result.exit_code == 0
    assert "--duration-s SECONDS" in result.output
    assert "--duration " not in result.output


def test_duration_s_written_with_a_unit_gets_the_number_to_write():
    result = CliRunner().invoke(main, ["demo", "--duration-s", "1m"])
    assert result.exit_code == 2
    assert "Error: --duration-s takes seconds as a number: write 60 for 1m" in result.output


def test_the_old_duration_still_reaches_duration_s_with_a_note():
    """5 s is below the demo's least: refused as --duration-s, so the value got there."""
    result = CliRunner().invoke(main, ["demo", "--duration", "5", "--no-live"])
    assert result.exit_code == 2
    assert result.stderr.startswith("note: --duration is now --duration-s")
    assert "Invalid value for --duration-s: at least 20 s" in result.stderr


def test_duration_s_given_too_wins_over_the_old_spelling():
    result = CliRunner().invoke(main, ["demo", "--duration", "30", "--duration-s", "5"])
    assert result.exit_code == 2
    assert "Invalid value for --duration-s: at least 20 s" in result.output


def test_the_jobs_rhythm_is_checked_before_anything_starts():
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert "--compute-s SECONDS" in result.output and "--comm-s SECONDS" in result.output
    result = CliRunner().invoke(main, ["demo", "--compute-s", "9.5", "--comm-s", "0.5"])
    assert result.exit_code == 2  # a 10.5 s step (the low-priority job's) in the default 40 s
    assert "Invalid value for --compute-s/--comm-s: a step of 10.5 s" in result.output
    assert "needs a run of at least 42 s" in result.output
    result = CliRunner().invoke(main, ["demo", "--comm-s", "0"])
    assert result.exit_code == 2
    assert "communication per step must be 0.1 to 60 s, not 0" in result.output


def test_the_checkpoint_s_length_is_checked_before_anything_starts():
    """--checkpoint-s: within 0.5-600 s, and one that a job could not take (it begins after
    half the run and needs a second to come back) is refused, naming a run that fits it."""
    result = CliRunner().invoke(main, ["demo", "--help"])
    assert "--checkpoint-s SECONDS" in result.output
    result = CliRunner().invoke(main, ["demo", "--checkpoint-s", "30"])
    assert result.exit_code == 2  # the default 40 s run: 30 s do not fit after half of it
    assert "Invalid value for --checkpoint-s: a checkpoint of 30 s" in result.output
    assert "does not fit in llm-high, llm-low in a 40 s run" in result.output
    assert "a run of 78 s always fits it" in result.output
    result = CliRunner().invoke(main, ["demo", "--checkpoint-s", "0.1"])
    assert result.exit_code == 2
    assert "a checkpoint must take 0.5 to 600 s, not 0.1" in result.output


def test_safety_is_caps_by_default_and_the_bands_on_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--safety picks the controller's policy (DemoOptions.safety_by_caps): safety by caps
    unless --safety bands. The run itself is stood in for: nothing starts."""
    import powerd.demo.console
    from powerd.demo import DemoOptions

    seen: list[bool] = []

    def no_run(options: DemoOptions, console: object, live: object) -> None:
        seen.append(options.safety_by_caps)
        raise SystemExit(0)

    monkeypatch.setattr(powerd.demo.console, "run_in_console", no_run)
    for args in ([], ["--safety", "caps"], ["--safety", "bands"]):
        result = CliRunner().invoke(main, ["demo", "--no-live", *args])
        assert result.exit_code == 0, result.output
    assert seen == [True, True, False]
    help_text = CliRunner().invoke(main, ["demo", "--help"]).output
    assert "--safety [caps|bands]" in help_text and "--safety-by-caps" not in help_text
    refused = CliRunner().invoke(main, ["demo", "--safety", "neither"])
    assert refused.exit_code == 2
