"""``[site.grid]``: the grid's limits on measured site power, read into ``Topology.grid``;
every fault names the file, ``[site.grid]`` and the number."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from powerd.topology import BudgetError, load_budgets, parse_budgets
from powerd.topology.grid import GridSpec

BASE = """\
[site]
name = "lab"
limit_kw = 40
budget_kw = 36
ramp_kw_per_s = 10
{grid}
[[rows]]
name = "r1"
limit_kw = 39
budget_kw = 35

[[rows.racks]]
name = "r1-k1"
limit_w = 20000
budget_w = 18000
nodes = {{ count = 4, name = "{{rack}}-n{{i}}", gpus = 4, model = "H100" }}
"""

FULL = """
[site.grid]
ramp_up_kw_per_s = 2
ramp_down_w_per_s = 1500
window_s = 0.5
floor_fraction = 0.8
floor_window_s = 30
oscillation_band_hz = [0.2, 10]
oscillation_max_share = 0.05
oscillation_window_s = 20
"""


def parse(grid: str):
    return parse_budgets(BASE.format(grid=grid), source="lab.toml")


def example(name: str) -> Path:
    return Path(str(resources.files("powerd") / "data" / "budgets" / f"{name}.toml"))


def test_no_grid_table_is_no_grid_limits():
    assert parse("").grid is None
    assert load_budgets(example("tiny")).grid is None


def test_every_key_read_in_watts_and_seconds():
    assert parse(FULL).grid == GridSpec(
        ramp_up_w_per_s=2000.0,
        ramp_down_w_per_s=1500.0,
        window_s=0.5,
        floor_fraction=0.8,
        floor_window_s=30.0,
        oscillation_band_hz=(0.2, 10.0),
        oscillation_max_share=0.05,
        oscillation_window_s=20.0,
    )


def test_each_key_is_optional_and_an_empty_table_measures_only():
    empty = parse("[site.grid]\n").grid
    assert empty == GridSpec()
    assert math.isinf(empty.ramp_up_w_per_s) and empty.oscillation_max_share is None
    assert empty.describe() == "no limits (measured only)"
    up = parse("[site.grid]\nramp_up_kw_per_s = 3\n").grid
    assert up.ramp_up_w_per_s == 3000.0 and math.isinf(up.ramp_down_w_per_s)
    assert up.describe() == "ramp +3 kW/s, -no limit over 1 s"


def test_units_mean_the_same():
    watts = [
        parse(f"[site.grid]\nramp_down{unit} = {value}\n").grid.ramp_down_w_per_s
        for unit, value in (("_w_per_s", 2000), ("_kw_per_s", 2), ("_mw_per_s", 0.002))
    ]
    assert watts == pytest.approx([2000.0] * 3)


def test_the_shipped_files():
    site = load_budgets(example("site-150mw")).grid
    assert site is not None
    assert (site.ramp_up_w_per_s, site.ramp_down_w_per_s, site.window_s) == (1e6, 1e6, 1.0)
    assert site.oscillation_band_hz == (0.1, 20.0) and site.oscillation_max_share == 0.2
    assert site.floor_fraction == 0.8
    demo_top = load_budgets(example("demo"))
    demo = demo_top.grid
    assert demo is not None
    # the demo's grid asks of measured power what its site asks of the sum of caps
    assert demo.ramp_up_w_per_s == demo.ramp_down_w_per_s == demo_top.ramp_w_per_s[0] == 20e3
    assert demo.describe().startswith("ramp +20 kW/s, -20 kW/s over 1 s")


def test_a_row_has_no_grid():
    text = BASE.format(grid="").replace('name = "r1"\n', 'name = "r1"\ngrid = {}\n')
    with pytest.raises(BudgetError, match=r"row 'r1': unknown key\(s\) \['grid'\]"):
        parse_budgets(text, source="lab.toml")


CASES = [
    # (the [site.grid] lines, what the message must contain)
    ("ramp_up_w_per_s = 2", ("ramp_up_w_per_s = 2 W/s", "implausible", "ramp_up_kw_per_s = 2")),
    (
        "ramp_up_mw_per_s = 20",
        ("ramp_up_mw_per_s = 20 (2e+07 W/s)", "did you mean ramp_up_kw_per_s"),
    ),
    ("ramp_down_kw_per_s = -1", ("ramp_down_kw_per_s = -1", "negative")),
    ("ramp_down_kw_per_s = 0", ("ramp_down_kw_per_s = 0", "zero")),
    ("ramp_up_kw_per_s = inf", ("ramp_up_kw_per_s = inf", "finite")),
    ("ramp_up_kw_per_s = nan", ("ramp_up_kw_per_s = nan", "finite")),
    ('ramp_up_kw_per_s = "2"', ("ramp_up_kw_per_s must be a number", "'2'")),
    ("ramp_up_kw_per_s = 2\nramp_up_w_per_s = 2000", ("give ramp_up once",)),
    ("ramp_kw_per_s = 2", ("unknown key(s) ['ramp_kw_per_s']", "ramp_up_kw_per_s")),
    ("window_s = 0", ("window_s = 0", "zero")),
    ("window_s = 5000", ("window_s = 5000 s is implausible", "in milliseconds? 5000 ms is 5 s")),
    ("floor_fraction = 80", ("floor_fraction = 80", "(0, 1)", "a percentage? write 0.8")),
    ("floor_fraction = 1", ("floor_fraction = 1", "(0, 1)")),
    ("floor_window_s = 60", ("floor_window_s = 60 s is given but floor_fraction is not",)),
    ("oscillation_max_share = 5", ("oscillation_max_share = 5", "(0, 1]", "write 0.05")),
    ("oscillation_band_hz = [20, 0.1]", ("oscillation_band_hz = [20, 0.1]", "low edge")),
    ("oscillation_band_hz = [0, 20]", ("oscillation_band_hz[0] = 0", "zero")),
    ("oscillation_band_hz = 20", ("oscillation_band_hz must be [low, high]", "got 20")),
    ("oscillation_band_hz = [0.1, 2, 20]", ("oscillation_band_hz must be [low, high]",)),
    ("oscillation_band_hz = [0.1, true]", ("oscillation_band_hz[1] must be a number",)),
    (
        "oscillation_band_hz = [100, 20000]",
        ("[100, 20000] Hz is implausible", "in mHz? [100, 20000] mHz is [0.1, 20] Hz"),
    ),
    (
        "oscillation_window_s = 5",
        ("oscillation_window_s = 5 s", "0.1 Hz: 10 s", "oscillation_window_s ≥ 10"),
    ),
]


@pytest.mark.parametrize(("lines", "expect"), CASES, ids=[c[0].split("\n")[0] for c in CASES])
def test_a_bad_grid_is_named(lines: str, expect: tuple[str, ...]):
    with pytest.raises(BudgetError) as caught:
        parse(f"[site.grid]\n{lines}\n")
    message = str(caught.value)
    assert message.startswith("lab.toml: [site.grid]: "), message
    for fragment in expect:
        assert fragment in message, message


def test_grid_must_be_a_table():
    text = BASE.format(grid="").replace("ramp_kw_per_s = 10\n", "ramp_kw_per_s = 10\ngrid = 3\n")
    with pytest.raises(BudgetError, match=r"lab.toml: \[site.grid\]: must be a table"):
        parse_budgets(text, source="lab.toml")


def test_a_grid_spec_built_in_code_is_checked_too():
    with pytest.raises(ValueError, match="ramp_up_w_per_s"):
        GridSpec(ramp_up_w_per_s=0.0)
    with pytest.raises(ValueError, match="oscillation_band_hz"):
        GridSpec(oscillation_band_hz=(1.0, 1.0))
    with pytest.raises(ValueError, match="floor_fraction"):
        GridSpec(floor_fraction=1.0)
    with pytest.raises(ValueError, match="window_s"):
        GridSpec(window_s=math.nan)


def test_the_report_gives_the_least_floor_that_meets_the_ramp_limits():
    """A 10 W site that drops to 2 W for two 1 s steps, ramps limited to 2 W/s down and 4 W/s
    up: the least floor holds 8 W and 6 W (6 W above the dip, then 4), 10 J of 100 J."""
    from powerd.topology.grid import grid_report

    site_w = np.array([10, 10, 10, 2, 2, 10, 10, 10, 10, 10], dtype=float)
    spec = GridSpec(ramp_up_w_per_s=4.0, ramp_down_w_per_s=2.0, window_s=1.0)
    report = grid_report(site_w, 1.0, spec, energy_j=100.0)
    assert report["floor_least_kwh"] == pytest.approx(10.0 / 3.6e6)
    assert report["floor_least_share_of_jobs"] == pytest.approx(0.1)
    # burnt by smoothing: the bound is taken on the draw without it, when that is known
    assert "floor_least_kwh" not in grid_report(site_w, 1.0, spec, 100.0, smoothing_j=5.0)
    lifted = grid_report(np.full(10, 10.0), 1.0, spec, 100.0, smoothing_j=5.0, demand_w=site_w)
    assert lifted["floor_least_kwh"] == report["floor_least_kwh"]
    # no ramp limit, nothing a floor must hold
    assert "floor_least_kwh" not in grid_report(site_w, 1.0, GridSpec(), 100.0)


def test_the_report_gives_the_work_lost_to_the_grid_and_its_bound():
    """Demand 0, 10, 10 W at 1 s steps, rises ≤ 4 W/s (policies.grid_frontier's hand case:
    holding h W at the first step loses 8 - 2h J for h ≤ 2). The site drew 2, 6, 8 W,
    burning 2 J: it lost 4 + 2 = 6 J where 4 J is the least at 2 J burnt (ratio 1.5). The
    least causal floor on it burns 6 J (6, 10, 10: ready for the rise from the start),
    so the 2 J burnt are 1/3 of it."""
    from powerd.topology.grid import grid_report

    need_w = np.array([0.0, 10.0, 10.0])
    site_w = np.array([2.0, 6.0, 8.0])
    spec = GridSpec(ramp_up_w_per_s=4.0, window_s=1.0)
    report = grid_report(
        site_w, 1.0, spec, 100.0, smoothing_j=2.0, demand_w=need_w, resume_w=need_w, need_w=need_w
    )
    assert report["lost_work_kwh"] == pytest.approx(6.0 / 3.6e6)
    assert report["lost_least_kwh"] == pytest.approx(4.0 / 3.6e6)
    assert report["lost_ratio_to_bound"] == pytest.approx(1.5)
    assert report["floor_ready_kwh"] == pytest.approx(6.0 / 3.6e6)
    assert report["floor_ratio_to_causal"] == pytest.approx(1 / 3)
    # given each job's part (here one job, all the GPUs), the bound for fixed shares
    # is the causal bound itself
    parts = [(need_w, need_w, 1.0)]
    shared = grid_report(
        site_w,
        1.0,
        spec,
        100.0,
        smoothing_j=2.0,
        demand_w=need_w,
        resume_w=need_w,
        need_w=need_w,
        job_parts=parts,
    )
    assert shared["floor_shared_kwh"] == pytest.approx(6.0 / 3.6e6)
    assert shared["floor_ratio_to_shared"] == pytest.approx(1 / 3)
    assert "floor_shared_kwh" not in report
    # nothing said burnt: what the site drew above the demand (2 J here) is
    plain = grid_report(site_w, 1.0, spec, 100.0, need_w=need_w)
    assert plain["lost_least_kwh"] == pytest.approx(4.0 / 3.6e6)
    assert plain["floor_ratio_to_causal"] is None
    # no ramp limit, no bound
    assert "lost_work_kwh" not in grid_report(site_w, 1.0, GridSpec(), 100.0, need_w=need_w)


def test_the_report_says_where_the_causal_bound_breaks_the_oscillation_limit():
    """A job waits 1.5 s of every 4.5 s (100 kW computing, 50 kW waiting) for 150 s under
    the demo's spec (±20 kW/s over 1 s; ≤ 20 % of a 60 s window's variance in 0.1-20 Hz
    once it passes 2 kW RMS). The least causal floor falls 20 kW in every wait: a 0.22 Hz
    swing of some 9 kW RMS, outside the oscillation limit in every window, so that bound
    is one no schedule within the whole spec meets. A site with no waits: 0 s."""
    from powerd.topology.grid import grid_report

    step_s = 0.1
    t = np.arange(0.0, 150.0, step_s)
    waiting = (t % 4.5) >= 3.0
    demand_w = np.where(waiting, 50e3, 100e3)
    resume_w = np.full_like(t, 100e3)
    spec = load_budgets(Path(str(resources.files("powerd.data") / "budgets/demo.toml"))).grid
    assert spec is not None and spec.ramp_up_w_per_s == 20e3 and spec.oscillation_min_rms_w == 2e3
    held = grid_report(
        resume_w, step_s, spec, 1e9, smoothing_j=1.0, demand_w=demand_w, resume_w=resume_w
    )
    assert held["s_outside_oscillation"] == 0.0  # holding every wait whole: no swing
    assert held["floor_ready_s_outside_oscillation"] == pytest.approx(150.0, abs=0.1)
    steady = grid_report(resume_w, step_s, spec, 1e9, demand_w=resume_w, resume_w=resume_w)
    assert steady["floor_ready_s_outside_oscillation"] == 0.0
