"""Budgets files load into a Topology and a consistent policies.tree.Tree.

The three shipped examples, then the format's features one at a time:
generators against explicit listings, inheritance of thresholds and failsafe
caps, units, name templates, default node limits, the per-GPU order.
"""

from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from policies.tree import RACK, ROW, SERVER, SITE, Tree
from powerd.gpu.models import GPU_MODELS
from powerd.topology import (
    DEFAULT_CAP_TARGET,
    DEFAULT_CAP_THRESHOLD,
    DEFAULT_UNCAP_THRESHOLD,
    Topology,
    load_budgets,
    parse_budgets,
)
from tests.support.paths import REPO

BUDGETS = resources.files("powerd.data") / "budgets"


def example(name: str) -> Path:
    path = Path(str(BUDGETS / f"{name}.toml"))
    assert path.is_file(), path
    return path


@pytest.fixture(scope="module")
def site150() -> Topology:
    return load_budgets(example("site-150mw"))


# --- the shipped examples ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rows", "racks", "servers", "gpus"),
    [
        ("tiny", 1, 2, 4, 16),
        ("demo", 2, 8, 64, 256),
        ("site-150mw", 16, 1152, 20736, 82944),
    ],
)
def test_examples_load_with_their_counts(
    name: str, rows: int, racks: int, servers: int, gpus: int
) -> None:
    top = load_budgets(example(name))
    assert top.site == name
    assert (len(top.rows), len(top.racks), len(top.servers), top.n_gpus) == (
        rows,
        racks,
        servers,
        gpus,
    )
    assert top.n_nodes == 1 + rows + racks + servers
    assert top.source == str(example(name))
    tree = top.tree
    assert isinstance(tree, Tree)
    assert (tree.n_nodes, tree.n_gpus) == (top.n_nodes, gpus)


@pytest.mark.parametrize("name", ["tiny", "demo", "site-150mw"])
def test_tree_is_topological_with_one_level_per_step(name: str) -> None:
    top = load_budgets(example(name))
    tree = top.tree
    idx = np.arange(tree.n_nodes)
    assert tree.parent[0] == -1 and tree.level[0] == SITE
    assert np.all(tree.parent[1:] < idx[1:])
    assert np.all(tree.level[1:] == tree.level[tree.parent[1:]] + 1)
    assert np.all(np.diff(tree.level) >= 0)  # level by level
    assert np.all(np.diff(tree.parent[1:]) >= 0)  # siblings grouped, parents in order
    # every server has GPUs, every GPU sits on a server, in server order
    assert np.all(tree.level[tree.gpu_server] == SERVER)
    assert np.all(np.diff(tree.gpu_server) >= 0)
    assert set(np.unique(tree.gpu_server)) == set(np.flatnonzero(tree.level == SERVER))
    # the thresholds are in watts and ordered under every budget and limit
    assert np.all(tree.uncap_threshold_w < tree.cap_target_w)
    assert np.all(tree.cap_target_w < tree.cap_threshold_w)
    assert np.all(tree.cap_threshold_w <= tree.budget_w)
    assert np.all(tree.budget_w <= tree.limit_w)
    assert np.all((tree.cap_min_w <= tree.failsafe_cap_w) & (tree.failsafe_cap_w <= tree.cap_max_w))
    # the failsafe guarantee, recomputed with the Tree's own sums
    failsafe_power = tree.node_sum(tree.failsafe_cap_w) + tree.overhead_below_w
    assert np.all(failsafe_power <= tree.limit_w)
    np.testing.assert_allclose(failsafe_power, top.failsafe_power_w())


def test_gpu_order_is_servers_in_file_order_local_index_ascending() -> None:
    top = load_budgets(example("tiny"))
    expected = [(s, k) for s in ("r1-k1-n1", "r1-k1-n2", "r1-k2-n1", "r1-k2-n2") for k in range(4)]
    assert top.servers == ("r1-k1-n1", "r1-k1-n2", "r1-k2-n1", "r1-k2-n2")
    assert top.gpus == expected
    assert [top.gpu(i) for i in range(top.n_gpus)] == expected
    assert top.server_gpus("r1-k2-n1") == range(8, 12)
    tree = top.tree
    for name in top.servers:
        gpus = top.server_gpus(name)
        assert np.all(tree.gpu_server[gpus.start : gpus.stop] == top.node_index(name))
        assert top.gpu_local[gpus.start : gpus.stop].tolist() == list(range(len(gpus)))
    with pytest.raises(IndexError):
        top.gpu(16)


def test_gpu_ancestors_name_the_servers_rack_row_and_site() -> None:
    top = load_budgets(example("demo"))
    tree = top.tree
    for gpu in (0, 31, 32, 127, 128, 255):
        server_name, local = top.gpu(gpu)
        server = top.server(server_name)
        assert gpu in server.gpu_indices and local == gpu - server.gpu_indices.start
        anc = tree.gpu_ancestor[:, gpu]
        assert top.names[anc[SERVER]] == server_name
        assert top.names[anc[RACK]] == server.rack == top.parent_of(server_name)
        assert top.names[anc[ROW]] == server.row == top.parent_of(server.rack)
        assert top.names[anc[SITE]] == "demo"
    assert top.server("row2-k3-n5") == top.server("row2-k3-n5")._replace(
        row="row2", rack="row2-k3", gpus=4, model="H100", failsafe_cap_w=500.0
    )
    assert top.kind("demo") == "site" and top.kind("row2") == "row"
    assert top.kind("row2-k3") == "rack" and top.kind("row2-k3-n5") == "node"


def test_tiny_numbers_reach_the_tree_in_watts() -> None:
    top = load_budgets(example("tiny"))
    tree = top.tree
    site, row, rack = 0, top.node_index("r1"), top.node_index("r1-k2")
    node = top.node_index("r1-k2-n2")
    assert (tree.limit_w[site], tree.budget_w[site]) == (16_000, 14_000)
    assert (tree.limit_w[row], tree.budget_w[row]) == (16_000, 14_000)
    assert (tree.limit_w[rack], tree.budget_w[rack], tree.overhead_w[rack]) == (8000, 7000, 300)
    # a node without limit_w/budget_w: what it draws at most over its cap threshold
    assert tree.limit_w[node] == tree.budget_w[node] == math.ceil((4 * 700 + 1000) / 0.98)
    assert tree.overhead_w[node] == 1000
    assert tree.cap_threshold_w[rack] == pytest.approx(DEFAULT_CAP_THRESHOLD * 7000)
    assert tree.cap_target_w[rack] == pytest.approx(DEFAULT_CAP_TARGET * 7000)
    assert tree.uncap_threshold_w[rack] == pytest.approx(DEFAULT_UNCAP_THRESHOLD * 7000)
    assert tree.ramp_w_per_s[site] == 5000
    assert np.all(np.isinf(tree.ramp_w_per_s[1:]))  # no ramp limit of their own
    assert top.failsafe_cap_w("r1-k2-n2") == 450  # its own override
    assert top.failsafe_cap_w("r1-k1-n1") == 500  # [models.H100]
    gpus = top.server_gpus("r1-k2-n2")
    assert np.all(tree.failsafe_cap_w[gpus.start : gpus.stop] == 450)
    assert np.all(tree.failsafe_cap_w[: gpus.start] == 500)
    # comm_max_slowdown = 0.05 in the H100's shipped clock table (tests/gpu/test_clock_table.py)
    assert np.all(tree.comm_clock_mhz == 1811)
    assert np.all(tree.cap_min_w == 200) and np.all(tree.cap_max_w == 700)


def test_lookups_refuse_unknown_names_and_non_servers() -> None:
    top = load_budgets(example("tiny"))
    with pytest.raises(KeyError, match="no tree node named 'r9'"):
        top.node_index("r9")
    with pytest.raises(KeyError, match="is a rack, not a node"):
        top.failsafe_cap_w("r1-k1")
    with pytest.raises(KeyError, match="is a site, not a node"):
        top.server_gpus("tiny")


def test_demo_must_cap_under_full_load_and_holds_at_failsafe() -> None:
    tree = load_budgets(example("demo")).tree
    full_load = tree.node_sum(tree.cap_max_w) + tree.overhead_below_w
    failsafe = tree.node_sum(tree.failsafe_cap_w) + tree.overhead_below_w
    racks = tree.level == RACK
    assert racks.sum() == 8
    assert np.all(full_load[racks] > tree.cap_threshold_w[racks])  # capping must happen
    assert np.all(failsafe[racks] <= tree.limit_w[racks])  # every rack holds
    assert np.all(full_load[tree.level <= ROW] > tree.cap_threshold_w[tree.level <= ROW])
    servers = tree.level == SERVER
    assert np.all(full_load[servers] < tree.cap_threshold_w[servers])  # racks cap, not nodes


# --- the 150 MW site ----------------------------------------------------------------


def test_site_150mw_is_the_83k_gpu_site(site150: Topology) -> None:
    top = site150
    assert top.n_gpus == 82_944 == 16 * 72 * 18 * 4
    assert set(top.server_model) == {"GB200"}
    assert top.rows[0] == "row01" and top.racks[-1] == "row16-k72"
    assert top.servers[0] == "row01-k01-n01" and top.servers[-1] == "row16-k72-n18"
    assert top.server_gpus("row16-k72-n18") == range(82_940, 82_944)
    assert top.failsafe_cap_w("row07-k33-n09") == 960  # planned at 960 W (80 % of 1200 W)
    tree = top.tree
    assert tree.limit_w[0] == 150e6 and tree.ramp_w_per_s[0] == 5e6
    assert tree.ramp_w_per_s[top.node_index("row03")] == 500e3
    assert np.all(tree.comm_clock_mhz == 1887)  # comm_max_slowdown = 0.05, GB200's table


def test_site_150mw_failsafe_power_within_every_limit(site150: Topology) -> None:
    tree = site150.tree
    failsafe = site150.failsafe_power_w()
    assert failsafe[0] <= tree.limit_w[0] == 150e6
    assert failsafe[0] == pytest.approx(82_944 * 960 + 20_736 * 1000 + 1152 * 10_800 + 30e6)
    assert np.all(failsafe <= tree.limit_w)
    racks = tree.level == RACK
    # the plan: a rack at 960 W per GPU sits at its capping threshold, not above
    assert np.all(failsafe[racks] <= tree.cap_threshold_w[racks])
    # full TDP does not fit: that is why the site is planned at 960 W
    full = tree.node_sum(tree.cap_max_w) + tree.overhead_below_w
    assert full[0] > tree.limit_w[0]
    # network ≈ 11 % of a rack's planned power (docs/DOMAIN.md)
    rack = site150.node_index("row01-k01")
    assert tree.overhead_w[rack] / failsafe[rack] == pytest.approx(0.11, abs=0.005)


def test_site_150mw_loads_well_under_two_seconds() -> None:
    path = example("site-150mw")
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        tree = load_budgets(path).tree
        best = min(best, time.perf_counter() - t0)
    assert tree.n_gpus == 82_944
    assert best < 1.0, f"load + to_tree took {best:.2f} s"


# --- format features -----------------------------------------------------------------

GENERATED = """
[site]
name = "s"
limit_kw = 40
budget_kw = 36

[rows]
count = 2
name = "{site}-r{i}"
limit_kw = 20
budget_kw = 18

[rows.racks]
count = 2
start = 0
name = "{row}-k{i:02d}"
limit_kw = 10
budget_kw = 9
overhead_w = 200
nodes = { count = 2, name = "{rack}-n{i}", gpus = 2, model = "A100", overhead_w = 500 }
"""


def explicit_listing() -> str:
    parts = ['[site]\nname = "s"\nlimit_kw = 40\nbudget_kw = 36\n']
    for r in (1, 2):
        parts.append(f'[[rows]]\nname = "s-r{r}"\nlimit_kw = 20\nbudget_kw = 18\n')
        for k in (0, 1):
            rack = f"s-r{r}-k{k:02d}"
            parts.append(
                f'[[rows.racks]]\nname = "{rack}"\nlimit_w = 10000\nbudget_w = 9000\n'
                "overhead_w = 200\n"
            )
            for n in (1, 2):
                parts.append(
                    f'[[rows.racks.nodes]]\nname = "{rack}-n{n}"\ngpus = 2\nmodel = "a100"\n'
                    "overhead_w = 500\n"
                )
    return "\n".join(parts)


def test_generators_give_the_same_tree_as_listing_one_by_one() -> None:
    gen = parse_budgets(GENERATED)
    one_by_one = parse_budgets(explicit_listing())
    assert gen.names == one_by_one.names
    assert gen.racks == ("s-r1-k00", "s-r1-k01", "s-r2-k00", "s-r2-k01")
    assert gen.servers[:3] == ("s-r1-k00-n1", "s-r1-k00-n2", "s-r1-k01-n1")
    a, b = gen.tree, one_by_one.tree
    for name in (
        "parent",
        "level",
        "limit_w",
        "budget_w",
        "cap_threshold_w",
        "cap_target_w",
        "uncap_threshold_w",
        "ramp_w_per_s",
        "overhead_w",
        "gpu_server",
        "cap_min_w",
        "cap_max_w",
        "failsafe_cap_w",
        "gpu_ancestor",
    ):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(np.isnan(a.comm_clock_mhz), np.isnan(b.comm_clock_mhz))
    # A100 with no [models.A100]: failsafe 80 % of its 400 W maximum, no comm clock
    assert np.all(a.failsafe_cap_w == 0.8 * GPU_MODELS["A100"].cap_max_w)
    assert np.all(np.isnan(a.comm_clock_mhz))
    assert gen.source == "<string>"


def test_generated_and_listed_entries_mix_in_one_list() -> None:
    text = GENERATED.replace(
        '[rows.racks]\ncount = 2\nstart = 0\nname = "{row}-k{i:02d}"',
        '[[rows.racks]]\nname = "{row}-spare"\nlimit_kw = 10\nbudget_kw = 9\n'
        'nodes = { name = "{rack}-n1", gpus = 1, model = "A100" }\n\n'
        '[[rows.racks]]\ncount = 2\nstart = 0\nname = "{row}-k{i:02d}"',
    )
    top = parse_budgets(text)
    assert top.racks == (
        "s-r1-spare",
        "s-r1-k00",
        "s-r1-k01",
        "s-r2-spare",
        "s-r2-k00",
        "s-r2-k01",
    )
    assert top.servers[0] == "s-r1-spare-n1" and top.server("s-r1-spare-n1").gpus == 1
    assert top.parent_of("s-r2-spare-n1") == "s-r2-spare"


INHERIT = """
[defaults]
cap_threshold = 0.97
uncap_threshold = 0.85

[site]
name = "s"
limit_mw = 0.05
budget_kw = 40
ramp_mw_per_s = 0.01

[models.H100]
failsafe_cap_w = 600

[models.A100]
comm_clock_mhz = 900

[[rows]]
name = "r1"
limit_w = 50000
budget_w = 40000
cap_target = 0.9
uncap_threshold = 0.8
failsafe_cap_w = 400

[[rows.racks]]
name = "k1"
limit_kw = 20
budget_kw = 16
cap_threshold = 0.99
ramp_kw_per_s = 2.5

[[rows.racks.nodes]]
name = "n-row-cap"
gpus = 2
model = "H100"

[[rows.racks.nodes]]
name = "n-own-cap"
gpus = 2
model = "H100"
failsafe_cap_w = 300
uncap_threshold = 0.5

[[rows]]
name = "r2"
limit_kw = 20
budget_kw = 16

[[rows.racks]]
name = "k2"
limit_kw = 20
budget_kw = 16
nodes = [
    { name = "n-model-cap", gpus = 2, model = "H100" },
    { name = "n-default-cap", gpus = 2, model = "A100" },
]
"""


def test_thresholds_inherit_from_defaults_then_each_parent() -> None:
    top = parse_budgets(INHERIT)

    def bands(name: str) -> tuple[float, float, float]:
        i = top.node_index(name)
        return (top.cap_threshold[i], top.cap_target[i], top.uncap_threshold[i])

    assert bands("s") == (0.97, DEFAULT_CAP_TARGET, 0.85)  # [defaults], built-in for the rest
    assert bands("r1") == (0.97, 0.9, 0.8)
    assert bands("k1") == (0.99, 0.9, 0.8)
    assert bands("n-row-cap") == (0.99, 0.9, 0.8)
    assert bands("n-own-cap") == (0.99, 0.9, 0.5)
    assert bands("r2") == bands("k2") == bands("n-model-cap") == (0.97, DEFAULT_CAP_TARGET, 0.85)
    tree = top.tree
    k1 = top.node_index("k1")
    assert tree.cap_threshold_w[k1] == pytest.approx(0.99 * 16_000)
    assert tree.uncap_threshold_w[k1] == pytest.approx(0.8 * 16_000)


def test_failsafe_cap_precedence_node_then_rack_row_then_model_then_default() -> None:
    top = parse_budgets(INHERIT)
    assert top.failsafe_cap_w("n-own-cap") == 300  # its own
    assert top.failsafe_cap_w("n-row-cap") == 400  # row r1's, over [models.H100]
    assert top.failsafe_cap_w("n-model-cap") == 600  # [models.H100]
    assert top.failsafe_cap_w("n-default-cap") == 0.8 * 400  # 80 % of the A100's maximum
    tree = top.tree
    assert tree.failsafe_cap_w.tolist() == [400, 400, 300, 300, 600, 600, 320, 320]
    clocks = tree.comm_clock_mhz
    assert np.isnan(clocks[:6]).all() and clocks[6:].tolist() == [900, 900]


def test_units_are_converted_to_watts() -> None:
    top = parse_budgets(INHERIT)
    site, k1 = 0, top.node_index("k1")
    assert (top.limit_w[site], top.budget_w[site]) == (50_000, 40_000)
    assert top.ramp_w_per_s[site] == 10_000
    assert (top.limit_w[k1], top.budget_w[k1], top.ramp_w_per_s[k1]) == (20_000, 16_000, 2500)


def test_topology_arrays_are_read_only() -> None:
    top = load_budgets(example("tiny"))
    for array in (top.limit_w, top.budget_w, top.parent, top.level, top.server_failsafe_cap_w):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    tree = top.tree
    assert tree is top.tree  # built once, shared by everything that reads the file
    for array in (tree.limit_w, tree.cap_target_w, tree.gpu_server, tree.failsafe_cap_w):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    assert top.limit_w[0] == 16_000


def test_parse_and_load_agree(tmp_path: Path) -> None:
    text = example("demo").read_text(encoding="utf-8")
    path = tmp_path / "copy.toml"
    path.write_text(text, encoding="utf-8")
    a, b = parse_budgets(text, source="x"), load_budgets(path)
    assert a.names == b.names and a.source == "x" and b.source == str(path)
    np.testing.assert_array_equal(a.tree.failsafe_cap_w, b.tree.failsafe_cap_w)


def test_the_example_in_docs_loads() -> None:
    doc = (REPO / "docs" / "BUDGETS.md").read_text("utf-8")
    blocks = doc.split("```toml\n")[1:]
    assert len(blocks) >= 2
    top = parse_budgets(blocks[0].split("```")[0], source="BUDGETS.md")
    assert top.site == "lab" and top.n_gpus == 20
    assert top.servers == ("r1-k1-n1", "r1-k2-n1", "r1-k2-n2", "r1-k2-n3", "r1-k2-n4")
    assert top.failsafe_cap_w("r1-k2-n4") == 500
    assert top.comm_clock_mhz["H100"] == 1811  # comm_max_slowdown = 0.05, as the text says
