"""The help and the hints of both command lines, `powerplan` and `powerd` (issue 15, point 8):
every command listed by its group, an Examples section at the end of every command's help
(powerplan's run as written), every default shown, options named for their unit, plain-words
hints for a unit or a percentage where a number is wanted and for swapped arguments, and a
progress bar on a long replay that never reaches a pipe."""

from __future__ import annotations

import glob
import inspect
import io
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from planner.cli import main as powerplan
from planner.commands import progress
from planner.commands.progress import step_progress
from planner.mix import Placement, parse_mix, place
from planner.profiles import read_profiles
from planner.sizing import WorkloadTrace, traces_from_profiles
from planner.whatif import WhatifSettings, replay
from powerd.cli import main as powerd
from powerd.click_types import Quantity
from powerd.topology import Topology, load_budgets
from powerd.units import UNITS
from tests.support.paths import REPO, TEST_DATA

GROUPS = {"powerd": powerd, "powerplan": powerplan}
TINY = REPO / "powerd" / "data" / "budgets" / "tiny.toml"
TRAIN = TEST_DATA / "profiles" / "train.csv"
ZEUS_A40 = TEST_DATA / "zeus-power-limit" / "summary_power_a40.csv"
UNIT_SUFFIXES = {"-w": "W", "-s": "s", "-kw": "kW", "-kj": "kJ"}  # before any -per-THING
UNSET = getattr(click.core, "UNSET", None)  # click >= 8.3: an option given no default


def commands() -> Iterator[tuple[str, click.Command]]:
    """Every command and group of both command lines, as ("powerd limit set", command)."""

    def walk(path: str, command: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield path, command
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                yield from walk(f"{path} {name}", sub)

    for name, group in GROUPS.items():
        yield from walk(name, group)


ALL = dict(commands())


def context(path: str) -> click.Context:
    """The context a command's help is written in: under its group's, as when run."""
    words = path.split()
    ctx = click.Context(GROUPS[words[0]], info_name=words[0], **GROUPS[words[0]].context_settings)
    for depth in range(1, len(words)):
        ctx = click.Context(ALL[" ".join(words[: depth + 1])], info_name=words[depth], parent=ctx)
    return ctx


def help_of(path: str, width: int = 100) -> str:
    words = path.split()
    result = CliRunner().invoke(GROUPS[words[0]], [*words[1:], "--help"], terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


def options() -> Iterator[tuple[str, click.Option]]:
    for path, command in ALL.items():
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                yield path, param


def invoke(group: click.Group, *args: object) -> Result:
    return CliRunner().invoke(group, [str(a) for a in args])


# --- what the groups list ------------------------------------------------------------------


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("path", [p for p, c in ALL.items() if isinstance(c, click.Group)])
def test_a_group_lists_every_command_with_its_whole_summary(path: str, width: int):
    """Derived from the group (click's Commands section, each command's short_help): a new
    command cannot be left out, and no summary is cut short with '...' in a terminal."""
    text = help_of(path, width)
    listing = text.split("\nCommands:\n", 1)[1]
    names = re.findall(r"^  (\S+)\s", listing, re.M)
    group = ALL[path]
    assert isinstance(group, click.Group)
    shown = [name for name, command in group.commands.items() if not command.hidden]
    assert sorted(names) == sorted(shown), listing  # hidden: the maintainers' `reference`
    assert "..." not in listing, listing


# --- examples ------------------------------------------------------------------------------


def examples(command: click.Command) -> list[str]:
    """The command lines of the last paragraph of its help, which must be its Examples."""
    paragraphs = inspect.cleandoc(command.help or "").split("\n\n")
    lines = paragraphs[-1].split("\n")
    assert lines[:2] == ["\b", "Examples:"], f"the help ends with: {paragraphs[-1]!r}"
    joined = "\n".join(line.strip() for line in lines[2:]).replace("\\\n", " ")
    return [line for line in joined.split("\n") if line and not line.startswith("#")]


@pytest.mark.parametrize("path", list(ALL))
def test_every_command_ends_its_help_with_examples(path: str):
    lines = examples(ALL[path])
    assert lines and all(line.startswith(path.split()[0]) for line in lines[:1]), lines
    assert "Examples:" in help_of(path)


def shipped_tree(tmp_path: Path) -> Path:
    """A working directory with the repository's shipped inputs, read-only, as in examples."""
    for top in ("powerd", "tests", "examples"):
        (tmp_path / top).symlink_to(REPO / top)
    return tmp_path


@pytest.mark.parametrize("path", [p for p in ALL if p.startswith("powerplan")])
def test_the_planner_examples_run_as_written_from_the_repository_root(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(shipped_tree(tmp_path))
    for line in examples(ALL[path]):
        words = shlex.split(line, comments=True)
        assert words[0] == "powerplan", line
        if "--influx" in words:
            continue  # reads from a server
        args = [match for w in words[1:] for match in (sorted(glob.glob(w)) or [w])]
        result = CliRunner().invoke(powerplan, args)
        assert result.exit_code == 0, f"{line}\n{result.output}"


# --- defaults and names --------------------------------------------------------------------


@pytest.mark.parametrize(("path", "option"), list(options()), ids=lambda x: str(x))
def test_every_default_is_shown(path: str, option: click.Option):
    ctx = context(path)
    default = option.get_default(ctx, call=False)
    if default in (None, UNSET, ()) or (option.is_flag and not option.secondary_opts):
        return  # nothing to show (a flag's default is off)
    record = option.get_help_record(ctx)
    assert record is not None and "default:" in record[1], (path, option.opts, record)


def test_the_agent_shows_what_on_exit_does_by_default():
    assert "[default: keep]" in " ".join(help_of("powerd agent").split())


@pytest.mark.parametrize(("path", "option"), list(options()), ids=lambda x: str(x))
def test_a_quantity_is_named_for_its_unit_and_its_unit_for_it(path: str, option: click.Option):
    """--duration-s takes seconds, --overhead-w watts; an option named so takes a number in
    that unit (with the hints of powerd.click_types.Quantity)."""
    long = [re.sub(r"-per-[a-z]+$", "", o) for o in option.opts if o.startswith("--")]
    suffix = next((s for s in UNIT_SUFFIXES if long and long[0].endswith(s)), None)
    if isinstance(option.type, Quantity):
        assert suffix is not None and UNIT_SUFFIXES[suffix] == option.type.unit, (path, long)
    else:
        assert suffix is None, f"{path} {long}: named for a unit, but no Quantity"


def test_overhead_w_has_no_default_in_any_command():
    """It decides the best cap: caps requires it, report requires it with --sweep."""
    found = {
        path: option
        for path, option in options()
        if "--overhead-w" in option.opts and path.startswith("powerplan")
    }
    assert set(found) == {"powerplan caps", "powerplan report"}
    assert all(option.default in (None, UNSET) for option in found.values())
    assert found["powerplan caps"].required


def test_report_with_a_sweep_asks_for_the_overhead(tmp_path: Path):
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n')
    result = invoke(
        powerplan, "report", TINY, TRAIN, "--mix", mix, "-o", tmp_path / "r", "--sweep", ZEUS_A40
    )
    assert result.exit_code == 2
    assert "--sweep needs --overhead-w" in result.output
    assert not (tmp_path / "r").exists()


# --- hints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "args", "hint"),
    [
        (powerplan, ["caps", ZEUS_A40, "--overhead-w", "1.2kW"], "write 1200 for 1.2kW"),
        (powerplan, ["caps", ZEUS_A40, "--overhead-w", "150 W"], "write 150 for 150 W"),
        (powerplan, ["whatif", TINY, TRAIN, "--mix", "m.toml", "--duration-s", "1h"], "3600"),
        (powerplan, ["size", TINY, TRAIN, "--mix", "m", "-o", "o", "--node-w", "1.5kW"], "1500"),
        (powerplan, ["rhythm", "r.csv", "--run-s", "10m"], "write 600 for 10m"),
        (
            powerplan,
            ["whatif", TINY, TRAIN, "--mix", "m", "--storage-kj-per-rack", "0.5MJ"],
            "takes kilojoules as a number: write 500 for 0.5MJ",
        ),
        (
            powerplan,
            ["whatif", TINY, TRAIN, "--mix", "m", "--storage-kw-per-rack", "5000W"],
            "takes kilowatts as a number: write 5 for 5000W",
        ),
        (powerd, ["agent", "--period-s", "500ms"], "write 0.5 for 500ms"),
        (powerd, ["fleet", "--budgets", TINY, "--trust", TINY, "--duration-s", "2min"], "120"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_a_quantity_written_with_a_unit_gets_the_number_to_write(
    group: click.Group, args: list[str], hint: str
):
    result = invoke(group, *args)
    assert result.exit_code == 2
    flag = str(args[-2])  # each case ends with the option and its value
    suffix = max(
        (x for x in UNIT_SUFFIXES if re.sub(r"-per-[a-z]+$", "", flag).endswith(x)), key=len
    )
    words = UNITS[UNIT_SUFFIXES[suffix]][0]
    assert f"Error: {flag} takes {words} as a number: write" in result.output
    assert hint in result.output
    assert "valid float" not in result.output


def test_a_quantity_that_is_no_number_says_so_plainly():
    result = invoke(powerplan, "caps", ZEUS_A40, "--overhead-w", "lots")
    assert result.exit_code == 2
    assert "--overhead-w takes watts as a number, not 'lots'" in result.output


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["--quantile", "99.9"], "--quantile is a fraction, not a percentage: write 0.999"),
        (["--quantile", "99.9%"], "write 0.999 for 99.9%"),
        (["--max-budget-fraction", "95"], "write 0.95 for 95 %"),
        (["--cooling-fraction", "27"], "write 0.27"),
    ],
)
def test_a_percentage_where_a_fraction_goes_gets_the_fraction(args: list[str], hint: str):
    result = invoke(powerplan, "size", TINY, TRAIN, "--mix", "m.toml", "-o", "o.toml", *args)
    assert result.exit_code == 2
    assert hint in result.output


def test_a_fraction_in_its_range_is_taken_as_given(tmp_path: Path):
    """0.99 is no percentage: the run goes on (to the missing mix file)."""
    result = invoke(powerplan, "size", TINY, TRAIN, "--mix", tmp_path / "none.toml", "-o",
                    tmp_path / "o.toml", "--quantile", "0.99")  # fmt: skip
    assert "percentage" not in result.output and "cannot read the mix" in result.output


@pytest.mark.parametrize(
    ("command", "first"), [("whatif", "BUDGETS"), ("size", "TOPOLOGY"), ("report", "BUDGETS")]
)
def test_swapped_budgets_and_profiles_get_the_order(command: str, first: str, tmp_path: Path):
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n')
    out = ["-o", tmp_path / "out"] if command != "whatif" else []
    result = invoke(powerplan, command, TRAIN, TINY, "--mix", mix, *out)
    assert result.exit_code == 2
    order = f"powerplan {command} {first} PROFILES...: the budgets file comes first"
    assert order in result.output
    assert "train.csv is a profile" in result.output
    assert "TOML" not in result.output.split("Error:")[1].split("(")[0]  # no parser error


def test_a_mix_given_as_a_profile_is_pointed_to_mix(tmp_path: Path):
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n')
    result = invoke(powerplan, "whatif", TINY, mix, "--mix", mix)
    assert result.exit_code == 2
    assert "the budgets file comes first" in result.output
    assert "mix.toml is TOML" in result.output and "a mix goes after --mix" in result.output


# --- progress ------------------------------------------------------------------------------


def tiny_replay_inputs() -> tuple[Topology, Placement, dict[str, WorkloadTrace]]:
    top = load_budgets(TINY)
    placement = place(top, parse_mix('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n'))
    traces = traces_from_profiles(read_profiles([TRAIN]), 1.0)
    return top, placement, traces


def test_replay_reports_every_step_with_the_total() -> None:
    calls: list[tuple[int, int]] = []
    result = replay(
        *tiny_replay_inputs(),
        WhatifSettings(duration_s=37),
        on_step=lambda done, total: calls.append((done, total)),
    )
    steps = result.info["steps"]
    assert steps == 37
    assert calls == [(k, steps) for k in range(1, steps + 1)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_draws_on_a_terminal_and_not_on_a_pipe():
    terminal, pipe = Terminal(), io.StringIO()
    with step_progress("replaying", stream=terminal, show_after_s=0) as on_step:
        assert on_step is not None
        for done in range(1, 11):
            on_step(done, 10)
    assert "replaying" in terminal.getvalue() and "10/10" in terminal.getvalue()
    with step_progress("replaying", stream=pipe, show_after_s=0) as on_step:
        assert on_step is None
    assert pipe.getvalue() == ""


def test_whatif_writes_nothing_on_a_piped_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Even a bar shown at once: --format json output stays clean, and stderr empty."""
    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)
    mix = tmp_path / "mix.toml"
    mix.write_text('[[jobs]]\nworkload = "llm-7b"\nshare = 0.5\n')
    args = ["whatif", TINY, TRAIN, "--mix", mix, "--duration-s", "300", "--format", "json"]
    result = invoke(powerplan, *args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert json.loads(result.stdout)["steps"] == 300
