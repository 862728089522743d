"""Cross-checks between the planner's inputs, and the report's words against its code (issue 15).

- a cap sweep of GPUs the site does not have gives no cap for the site (report), and a
  sweep whose caps fall outside its label's cap range is flagged (caps, report);
- `powerplan size` refuses to write budgets under which a node's demand at the sizing
  quantile is above its limit, unless --allow-over-limit;
- a budgets file out of proportion is named by every command that loads one;
- the report says what its code does: numbers formatted from the constants they describe,
  capping as a percentage of steps in every table, no literal backticks in its HTML, wide
  tables in a box of their own.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner, Result

from planner import report as report_module
from planner.cli import main
from planner.mix import load_mix, place
from planner.output import cell_text
from planner.profiles import SWING_SHARE, read_profiles
from planner.report_doc import TABLE_BOX_CLASS
from planner.sizing import SizingSettings, size, traces_from_profiles
from planner.sweep import foreign_sweeps
from planner.whatif import WhatifSettings, replay
from powerd.topology import load_budgets
from tests.planner.test_planner_report import A40, DEMO, a40_site
from tests.planner.test_planner_report import write_inputs as report_inputs
from tests.planner.test_planner_sizing import GOOD_MIX
from tests.planner.test_planner_sizing import write_inputs as size_inputs

SAMPLES = "500"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def tables(markdown: str) -> list[pd.DataFrame]:
    """Every pipe table of a Markdown text, as strings."""
    found = []
    for block in re.findall(r"(?m)(?:^\|.*\|\n)+", markdown):
        lines = block.splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
        found.append(pd.DataFrame(rows, columns=header))
    return found


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return report_inputs(tmp_path_factory.mktemp("crosscheck-inputs"))


@pytest.fixture(scope="module")
def demo_report(inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """demo.toml (H100) reviewed with the A40 sweep, as Markdown and as HTML."""
    profiles, mix = inputs
    out = tmp_path_factory.mktemp("crosscheck-report")
    common = (str(DEMO), str(profiles), "--mix", str(mix), "--samples", SAMPLES)
    runs = {}
    for kind, flags in (("md", ()), ("html", ("--html",))):
        result = invoke(
            "report",
            *common,
            *("-o", str(out / kind), "--whatif-s", "30", "--sweep", str(A40), *flags),
            *("--overhead-w", "150"),
        )
        assert result.exit_code == 0, result.output
        runs[kind] = result
    return {
        "md": (out / "md" / "report.md").read_text(),
        "html": (out / "html" / "report.html").read_text(),
        "stderr": runs["md"].stderr,
    }


# --- the sweep against the site ------------------------------------------------------------


def test_a_sweep_of_another_gpu_gives_no_cap_for_the_site(demo_report: dict):
    said = (
        "the sweep 'a40' was measured on A40 GPUs; this site's GPUs are H100: its cap is"
        " not this site's, and none is recommended from it (measure a sweep on H100)"
    )
    assert f"warning: {said}" in demo_report["stderr"]
    text = demo_report["md"]
    summary = text.split("\n## Summary\n", 1)[1].split("\n## ", 1)[0]
    assert f"- Warning: {said}" in summary
    assert "a40: cap" not in text  # no recommendation, in the summary or anywhere
    mix = next(t for t in tables(text) if "site_has_gpu" in t.columns)
    assert mix["site_has_gpu"].tolist() == [cell_text(False)]


def test_a_sweep_of_the_sites_gpus_gives_its_cap(inputs: tuple[Path, Path], tmp_path: Path):
    profiles, mix = inputs
    out = tmp_path / "report"
    result = invoke(
        *("report", str(a40_site(tmp_path)), str(profiles), "--mix", str(mix)),
        *("-o", str(out), "--samples", SAMPLES, "--whatif-s", "0", "--sweep", str(A40)),
        *("--overhead-w", "150"),
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    text = (out / "report.md").read_text()
    assert "Warning:" not in text and "\n- a40: cap 200 W of 300 W gives" in text
    mix_table = next(t for t in tables(text) if "site_has_gpu" in t.columns)
    assert mix_table["site_has_gpu"].tolist() == [cell_text(True)]


def test_which_sweeps_are_not_the_sites():
    why = foreign_sweeps(["h100", "A40", "lab-rig"], ["H100"])
    assert set(why) == {"A40", "lab-rig"}  # labels match models case-insensitively
    assert "measured on A40 GPUs; this site's GPUs are H100" in why["A40"]
    assert "'lab-rig' names no known GPU model" in why["lab-rig"]
    assert "no cap is recommended from it" in why["lab-rig"]


def test_caps_flags_a_sweep_whose_caps_its_gpu_cannot_take():
    """The A40 sweep (100-300 W) labelled H100 (200-700 W): not an H100's caps."""
    result = invoke("caps", str(A40), "--overhead-w", "150", "--gpu-label", "H100")
    assert result.exit_code == 0, result.output
    assert (
        "warning: the sweep 'H100' has caps 100-300 W, outside the H100's cap range"
        " 200-700 W: is it of another GPU?"
    ) in result.stderr
    right = invoke("caps", str(A40), "--overhead-w", "150")
    assert "cap range" not in right.stderr


# --- size: demand above a limit ------------------------------------------------------------


def test_size_refuses_demand_above_a_limit_unless_allowed(tmp_path: Path):
    """demo.toml is tight on purpose: with GOOD_MIX row1 and its racks are over at p99.9."""
    profiles, mix = size_inputs(tmp_path, GOOD_MIX)
    out = tmp_path / "sized.toml"
    args = ("size", str(DEMO), str(profiles), "--mix", str(mix), "-o", str(out))
    refused = invoke(*args, "--samples", "5000")
    assert refused.exit_code != 0
    assert not out.exists() and not list(tmp_path.glob("sized.agent-*"))
    allowed = invoke(*args, "--samples", "5000", "--format", "json", "--allow-over-limit")
    assert allowed.exit_code == 0, allowed.output
    nodes = json.loads(allowed.stdout)["nodes"]
    over = [n for n in nodes if n["demand_q_w"] > n["limit_w"]]
    assert {n["level"] for n in over} == {"row", "rack"}  # the case is what it says
    by_share = sorted(over, key=lambda n: -(n["demand_q_w"] - n["limit_w"]) / n["limit_w"])
    assert json.loads(allowed.stdout)["over_limit"] == [n["name"] for n in by_share]
    assert load_budgets(out).n_gpus == 256  # written, and it loads
    for result, what in ((refused, "not written"), (allowed, "written anyway")):
        said = " ".join(result.stderr.split())
        assert f"{len(over)} node(s) with p99.9 demand above their limit" in said
        worst = by_share[0]
        by = worst["demand_q_w"] - worst["limit_w"]
        assert (
            f"{worst['level']} {worst['name']!r} {worst['demand_q_w']:,.0f} W >"
            f" {worst['limit_w']:,.0f} W (+{by:,.0f} W, +{100 * by / worst['limit_w']:.1f} %)"
        ) in said
        assert f"The budgets file is {what}" in said
    assert "--allow-over-limit to write it anyway" in refused.stderr
    assert allowed.stderr.startswith(f"warning: {DEMO}: ")


def test_size_is_quiet_when_demand_is_within_every_limit(tmp_path: Path):
    profiles, mix = size_inputs(tmp_path, GOOD_MIX)
    out = tmp_path / "sized.toml"
    tree3 = DEMO.with_name("tree-3rows.toml")
    result = invoke("size", str(tree3), str(profiles), "--mix", str(mix), "-o", str(out))
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert out.exists()


# --- the budgets file: out of proportion -----------------------------------------------------


@pytest.mark.parametrize("command", ["size", "whatif", "report"])
def test_every_command_that_loads_budgets_names_a_limit_out_of_proportion(
    command: str, inputs: tuple[Path, Path], tmp_path: Path
):
    slipped = tmp_path / "slipped.toml"
    slipped.write_text(DEMO.read_text().replace("limit_kw = 215 ", "limit_kw = 215000 ", 1))
    profiles, mix = inputs
    extra = {
        "size": ("-o", str(tmp_path / "sized.toml"), "--samples", SAMPLES, "--allow-over-limit"),
        "whatif": ("--duration-s", "5"),
        "report": ("-o", str(tmp_path / "review"), "--samples", SAMPLES, "--whatif-s", "0"),
    }[command]
    result = invoke(command, str(slipped), str(profiles), "--mix", str(mix), *extra)
    assert result.exit_code == 0, result.output
    said = f"warning: {slipped}: site 'demo': limit_w = 215,000,000 W is 861 ×"
    assert said in result.stderr
    if command == "report":
        text = (tmp_path / "review" / "report.md").read_text()
        assert f"- Warning: {slipped}: site 'demo': limit_w = 215,000,000 W" in text


# --- the report's words against its code -----------------------------------------------------


def test_the_swing_rule_is_the_constant_the_profiles_count_with(
    demo_report: dict, inputs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    assert f"more than {SWING_SHARE * 100:g} % of its mean" in demo_report["md"]
    assert "a tenth" not in demo_report["md"]
    monkeypatch.setattr(report_module, "SWING_SHARE", 0.125)  # the text follows the constant
    profiles, mix = inputs
    out = tmp_path / "again"
    result = invoke(
        *("report", str(DEMO), str(profiles), "--mix", str(mix), "-o", str(out)),
        *("--samples", SAMPLES, "--whatif-s", "0"),
    )
    assert result.exit_code == 0, result.output
    assert "more than 12.5 % of its mean" in (out / "report.md").read_text()


def test_the_report_gives_the_samples_the_sizing_drew(demo_report: dict, inputs: tuple[Path, Path]):
    profiles, mix = inputs
    top = load_budgets(DEMO)
    placement = place(top, load_mix(mix))
    traces = traces_from_profiles(read_profiles([profiles]), 1.0)
    sized = size(top, placement, traces, settings=SizingSettings(samples=int(SAMPLES)))
    drawn = int(sized.info["samples_per_node"])  # type: ignore[call-overload]
    assert drawn != int(SAMPLES)  # whole windows of the 300 s profiles: the case matters
    assert f"{drawn:,} Monte Carlo samples per node" in demo_report["md"]


def test_capping_is_a_percentage_of_steps_in_every_table_and_the_summary(
    demo_report: dict, inputs: tuple[Path, Path]
):
    text = demo_report["md"]
    found = tables(text)
    for table in found:
        for column in table.columns:
            assert "share" not in column or column.startswith("share_"), column  # phases only
            if any(word in column for word in ("capping", "held", "lost")):
                assert "_pct" in column, column
    levels = next(t for t in found if "capping_pct_of_steps_mean" in t.columns)
    profiles, mix = inputs
    top = load_budgets(DEMO)
    placement = place(top, load_mix(mix))
    traces = traces_from_profiles(read_profiles([profiles]), 1.0)
    replayed = replay(top, placement, traces, WhatifSettings(duration_s=30.0)).levels
    for shown, share in zip(
        levels.itertuples(index=False), replayed.itertuples(index=False), strict=True
    ):
        assert shown.capping_pct_of_steps_mean == cell_text(100 * share.capping_share_mean)
        assert shown.capping_pct_of_steps_max == cell_text(100 * share.capping_share_max)
    site = levels.set_index("level").loc["site", "capping_pct_of_steps_mean"]
    assert f"steps capping (mean node) site {site} % of steps" in text


def test_the_html_has_no_backticks_and_boxes_every_table(demo_report: dict):
    page = demo_report["html"]
    assert "`" not in page
    assert "<code>powerplan size</code>" in page

    class Boxes(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.stack: list[tuple[str, str]] = []
            self.tables = 0
            self.boxed = 0

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables += 1
                self.boxed += self.stack[-1] == ("div", TABLE_BOX_CLASS)
            if tag not in ("meta", "img"):
                self.stack.append((tag, dict(attrs).get("class") or ""))

        def handle_endtag(self, tag):
            self.stack.pop()

    boxes = Boxes()
    boxes.feed(page)
    assert boxes.tables >= 6 and boxes.boxed == boxes.tables
    style = page.split("<style>", 1)[1].split("</style>", 1)[0]
    assert re.search(rf"\.{TABLE_BOX_CLASS}\{{[^}}]*overflow-x:auto", style)
