"""`powerplan report`: Markdown and HTML with PNG plots, built from size, whatif and caps."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from planner.cli import main
from planner.mix import load_mix, place
from planner.output import cell_text
from planner.profiles import read_profiles
from planner.report_doc import Document, to_html, to_markdown
from planner.sizing import SizingSettings, size, traces_from_profiles
from planner.whatif import WhatifSettings, replay
from policies.causes import largest_causes
from powerd.topology import load_budgets
from tests.planner.test_planner_whatif import square_wave_frames
from tests.support.paths import REPO

ROOT = REPO
DEMO = ROOT / "powerd" / "data" / "budgets" / "demo.toml"
A40 = ROOT / "tests" / "data" / "zeus-power-limit" / "summary_power_a40.csv"
SAMPLES = 2000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_inputs(tmp_path: Path) -> tuple[Path, Path]:
    """Two workloads on 4 GPUs each: a 20 s compute/communication square wave and a flat one."""
    t = np.arange(300.0)
    frames = square_wave_frames()
    for g in range(4):
        frames.append(
            pd.DataFrame(
                {
                    "time_s": 1.7e9 + t,
                    "node": "p-n1",
                    "gpu": g,
                    "workload": "serve",
                    "power_w": 400.0 + 10 * np.sin(t / 7),
                    "phase": "compute",
                }
            )
        )
    profiles = tmp_path / "p.csv"
    pd.concat(frames).to_csv(profiles, index=False)
    mix = tmp_path / "mix.toml"
    mix.write_text(
        '[[jobs]]\nworkload = "train"\nshare = 0.6\ncount = 2\n'
        '[[jobs]]\nworkload = "serve"\nshare = 0.3\npriority = "high"\n'
    )
    return profiles, mix


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["report", *args])
    return result.exit_code, result.output


def a40_site(tmp_path: Path) -> Path:
    """demo.toml with A40 GPUs (100-300 W) in place of its H100s: the site of the A40 sweep."""
    text = DEMO.read_text().replace('model = "H100"', 'model = "A40"')
    text = text.replace("[models.H100]", "[models.A40]").replace(
        "failsafe_cap_w = 500", "failsafe_cap_w = 250"
    )
    # no clock table ships for the A40: its communication clock is left unset
    text = re.sub(r"\ncomm_max_slowdown = .*", "", text)
    path = tmp_path / "a40-site.toml"
    path.write_text(text)
    return path


def md_table(text: str, caption: str) -> pd.DataFrame:
    """The pipe table after ``*caption*`` in a Markdown report, as strings."""
    block = text.split(f"*{caption}*\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block[2:]]
    return pd.DataFrame(rows, columns=header)


def md_table_after(text: str, heading: str) -> pd.DataFrame:
    """The first pipe table under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)[1]
    block = section[section.index("\n|") + 1 :].split("\n\n", 1)[0].splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in block[2:]]
    return pd.DataFrame(rows, columns=header)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_inputs(tmp_path_factory.mktemp("report-inputs"))


def test_markdown_report_has_every_plot_and_the_sizing_numbers(
    inputs: tuple[Path, Path], tmp_path: Path
):
    profiles, mix = inputs
    out = tmp_path / "report"
    code, output = run(
        *(str(DEMO), str(profiles), "--mix", str(mix), "-o", str(out)),
        *(
            "--samples",
            str(SAMPLES),
            "--whatif-s",
            "60",
            "--sweep",
            str(A40),
            "--overhead-w",
            "150",
        ),
    )
    assert code == 0, output
    text = (out / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(images) == sorted(
        ["power_distributions.png", "budget_vs_demand.png", "capping.png", "cap_curves.png"]
    )
    for image in images:
        assert (out / image).read_bytes()[:8] == PNG_MAGIC
        pixels = matplotlib.image.imread(out / image)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400
        assert pixels.std() > 0.01  # something is drawn, not a blank canvas
    for heading in ("Summary", "Workloads", "Budgets against demand", "How often capping bites"):
        assert f"\n## {heading}\n" in text
    assert "\n## Cap curves\n" in text

    # the demand and sized budgets are exactly those of planner.sizing.size on the same inputs
    top = load_budgets(DEMO)
    placement = place(top, load_mix(mix))
    traces = traces_from_profiles(read_profiles([profiles]), 1.0)
    sized = size(top, placement, traces, settings=SizingSettings(quantile=0.999, samples=SAMPLES))
    expected = sized.table.set_index("name")
    racks = md_table(text, "racks")
    rows = md_table(text, "rows")
    site = md_table(text, "site")
    assert len(racks) == len(top.racks) and len(rows) == len(top.rows) and len(site) == 1
    for table in (site, rows, racks):
        for row in table.itertuples(index=False):
            node = expected.loc[row.name]
            assert row.demand_q_w == cell_text(float(node["demand_q_w"]))
            assert row.sized_budget_w == cell_text(float(node["budget_w"]))
            assert row.budget_w == cell_text(float(top.budget_w[top.node_index(row.name)]))
    assert site["budget_w"].iat[0] == "180,000"  # the file's budget, not the sized one

    # the site as the grid sees it: the same measurement as `powerplan whatif` on this replay
    assert "\n## The site as the grid sees it\n" in text
    assert "ramp +20 kW/s, -20 kW/s over 1 s" in text  # demo.toml's [site.grid]
    whatif = replay(top, placement, traces, WhatifSettings(duration_s=60.0))
    grid = whatif.info["grid"]
    assert isinstance(grid, dict)
    table = md_table_after(text, "The site as the grid sees it")
    up = table[table["what"] == "ramp up, max over 1 s"].iloc[0]
    assert up["unit"] == "kW/s"  # the site's scale (215 kW), as its grid spec's line
    assert up["value"] == cell_text(grid["ramp_up_max_w_per_s"] / 1e3)
    assert up["limit"] == cell_text(20.0)
    assert up["s_outside"] == cell_text(grid["s_outside_ramp_up"])

    # what lost throughput, by cause: each job's row and the summary are the replay's own
    # figures, as percentages, and the causes add up to the loss
    jobs = md_table(text, "jobs").set_index("job")
    lost_columns = [c for c in jobs.columns if c.startswith("lost_") and c.endswith("_pct")]
    assert lost_columns and "throughput_lost_pct" in jobs.columns
    for row in whatif.jobs.itertuples(index=False):
        shown = jobs.loc[row.job]
        assert shown["throughput_lost_pct"] == cell_text(100 * row.throughput_lost)
        for column in lost_columns:
            assert shown[column] == cell_text(100 * getattr(row, column.removesuffix("_pct")))
        causes = [getattr(row, c.removesuffix("_pct")) for c in lost_columns]
        assert sum(causes) == pytest.approx(row.throughput_lost, abs=1e-9)
    site_lost = float(str(whatif.info["throughput_lost_site"]))
    by_cause = whatif.info["throughput_lost_site_by_cause"]
    assert isinstance(by_cause, dict) and sum(by_cause.values()) == pytest.approx(site_lost)
    said = ", ".join(f"{c} {v * 100:.3g} %" for c, v in largest_causes(by_cause))
    assert f"throughput lost site-wide {site_lost * 100:.3g} % ({said});" in text


def test_cap_curve_summary_is_the_brute_force_optimum_of_the_sweep(
    inputs: tuple[Path, Path], tmp_path: Path
):
    profiles, mix = inputs
    out = tmp_path / "report"
    code, output = run(
        *(str(a40_site(tmp_path)), str(profiles), "--mix", str(mix), "-o", str(out)),
        *("--samples", "500", "--whatif-s", "0", "--sweep", str(A40), "--overhead-w", "150"),
    )
    assert code == 0, output
    assert "warning" not in output.lower()  # the sweep's GPUs are the site's
    raw = pd.read_csv(A40)
    raw["workload"] = (
        raw[["dataset", "network", "batch_size", "optimizer"]].astype(str).agg("/".join, axis=1)
    )
    raw["thr"] = 1.0 / raw["time_per_epoch"]
    at_max = raw.loc[raw.groupby("workload")["power_limit"].idxmax()].set_index("workload")
    raw["rel"] = raw["thr"] / raw["workload"].map(at_max["thr"])
    n = raw["workload"].nunique()
    per_cap = raw.groupby("power_limit").agg(k=("workload", "nunique"), rel=("rel", "sum"))
    per_cap = per_cap[per_cap["k"] == n]  # caps every workload was measured at
    score = per_cap["rel"] / n * 1e6 / (per_cap.index + 150.0)  # max-cap GPU equivalents / MW
    top_cap = float(per_cap.index.max())
    best_cap = float(score.idxmax())
    text = (out / "report.md").read_text()
    assert f"- a40: cap {best_cap:g} W of {top_cap:g} W gives" in text
    assert "capping.png" not in text and not (out / "capping.png").exists()
    assert "## How often capping bites" not in text


def test_html_report_is_well_formed_and_links_its_plots(inputs: tuple[Path, Path], tmp_path: Path):
    profiles, mix = inputs
    out = tmp_path / "html"
    code, output = run(
        *(str(DEMO), str(profiles), "--mix", str(mix), "-o", str(out), "--html"),
        *("--samples", "500", "--whatif-s", "30"),
    )
    assert code == 0, output
    assert not (out / "report.md").exists()

    class Checker(HTMLParser):
        VOID = frozenset({"meta", "img", "br"})

        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []
            self.images: list[str] = []
            self.tables = 0

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.images.append(dict(attrs)["src"])
            if tag == "table":
                self.tables += 1
            if tag not in self.VOID:
                self.stack.append(tag)

        def handle_endtag(self, tag):
            assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
            self.stack.pop()

    checker = Checker()
    checker.feed((out / "report.html").read_text())
    assert checker.stack == []
    assert sorted(checker.images) == [
        "budget_vs_demand.png",
        "capping.png",
        "power_distributions.png",
    ]
    assert all((out / image).read_bytes()[:8] == PNG_MAGIC for image in checker.images)
    assert checker.tables >= 6  # workloads, site, rows, racks, failsafe, levels, jobs


def test_bad_profiles_name_the_file_and_line_and_leave_the_directory_alone(
    inputs: tuple[Path, Path], tmp_path: Path
):
    profiles, mix = inputs
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.md").write_text("the last good report\n")
    bad = tmp_path / "bad.csv"
    lines = profiles.read_text().splitlines()
    fields = lines[5].split(",")
    fields[4] = "-3"  # power_w
    lines[5] = ",".join(fields)
    bad.write_text("\n".join(lines) + "\n")
    code, output = run(str(DEMO), str(bad), "--mix", str(mix), "-o", str(out), "--samples", "500")
    assert code != 0
    assert f"{bad}:6" in output and "negative" in output
    assert sorted(p.name for p in out.iterdir()) == ["report.md"]
    assert (out / "report.md").read_text() == "the last good report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "report"]  # no staging left


def test_bad_budgets_and_a_missing_parent_are_refused(inputs: tuple[Path, Path], tmp_path: Path):
    profiles, mix = inputs
    broken = tmp_path / "broken.toml"
    broken.write_text("[site\n")
    code, output = run(str(broken), str(profiles), "--mix", str(mix), "-o", str(tmp_path / "o"))
    assert code != 0 and str(broken) in output
    assert not (tmp_path / "o").exists()
    code, output = run(
        str(DEMO), str(profiles), "--mix", str(mix), "-o", str(tmp_path / "no" / "such")
    )
    assert code != 0 and "no such directory" in output


def test_documents_escape_what_they_show():
    doc = Document("a <title>")
    doc.table(pd.DataFrame({"name": ["a|b", "<script>"], "w": [1500.0, 2.5]}), "t")
    md = to_markdown(doc)
    assert "| a\\|b | 1,500 |" in md and "|:---|---:|" in md
    page = to_html(doc)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert '<td class="n">1,500</td>' in page
