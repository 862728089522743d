"""The workload mix: parsing, its errors, and placing jobs on whole nodes in topology order."""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import ProfileError
from planner.mix import check_workloads, load_mix, parse_mix, place
from powerd.topology import parse_budgets


def topology(rows: int = 1, racks: int = 4, nodes: int = 4, gpus: int = 4):
    return parse_budgets(
        f"""
[site]
name = "s"
limit_kw = 1000
budget_kw = 900
[rows]
count = {rows}
name = "r{{i}}"
limit_kw = 500
budget_kw = 450
[rows.racks]
count = {racks}
name = "{{row}}-k{{i}}"
limit_kw = 60
budget_kw = 50
[rows.racks.nodes]
count = {nodes}
name = "{{rack}}-n{{i}}"
gpus = {gpus}
model = "H100"
""",
        source="test.toml",
    )


def test_parse_expands_count_and_reads_priority():
    mix = parse_mix(
        """
[[jobs]]
workload = "llama"
share = 0.5
count = 2
priority = "high"
[[jobs]]
workload = "bert"
gpus = 8
priority = "low"
[[jobs]]
workload = "bert"
name = "bert-eval"
share = 0.1
"""
    )
    assert [j.name for j in mix.jobs] == ["llama-1", "llama-2", "bert", "bert-eval"]
    assert [j.share for j in mix.jobs] == [0.25, 0.25, None, 0.1]
    assert mix.jobs[2].gpus == 8
    assert [j.priority for j in mix.jobs] == ["high", "high", "low", "normal"]
    assert mix.workloads == ("llama", "bert")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("jobs = [", "not valid TOML"),
        ("", "no jobs"),
        ("[[jobs]]\nshare = 0.5", "workload"),
        ('[[jobs]]\nworkload = "a"', "exactly one of share"),
        ('[[jobs]]\nworkload = "a"\nshare = 0.5\ngpus = 4', "exactly one of share"),
        ('[[jobs]]\nworkload = "a"\nshare = 40', "percentage? write 0.4"),
        ('[[jobs]]\nworkload = "a"\nshare = 0', "(0, 1]"),
        ('[[jobs]]\nworkload = "a"\nshare = "half"', "must be a number"),
        ('[[jobs]]\nworkload = "a"\ngpus = 0', "gpus = 0"),
        ('[[jobs]]\nworkload = "a"\ngpus = 6\ncount = 4', "do not split into 4 jobs"),
        ('[[jobs]]\nworkload = "a"\nshare = 0.5\npriority = "urgent"', "priority = 'urgent'"),
        ('[[jobs]]\nworkload = "a"\nshare = 0.5\nshares = 1', "unknown key(s) ['shares']"),
        ('[[jobs]]\nworkload = "a"\nshare = 0.5\ncount = 0', "count = 0"),
        (
            '[[jobs]]\nworkload = "a"\nshare = 0.6\n[[jobs]]\nworkload = "b"\nshare = 0.5',
            "sum to 1.1",
        ),
        ('[[jobs]]\nworkload = "a"\nshare = 0.5\n[[jobs]]\nworkload = "a"\nshare = 0.1', "twice"),
        ('top = 1\n[[jobs]]\nworkload = "a"\nshare = 0.5', "unknown key(s) ['top']"),
    ],
)
def test_bad_mix_is_named(text: str, words: str):
    with pytest.raises(ProfileError) as err:
        parse_mix(text, "mix.toml")
    assert str(err.value).startswith("mix.toml: ")
    assert words in str(err.value)


def test_load_mix_names_a_missing_file(tmp_path):
    with pytest.raises(ProfileError, match=r"nope\.toml: cannot read the mix"):
        load_mix(tmp_path / "nope.toml")


def test_unknown_workloads_are_listed():
    mix = parse_mix('[[jobs]]\nworkload = "gpt"\nshare = 0.5', "mix.toml")
    with pytest.raises(ProfileError, match=r"mix.toml: workload\(s\) \['gpt'\] not in p.csv"):
        check_workloads(mix, ["bert", "llama"], "p.csv")
    check_workloads(mix, ["gpt"])


def test_place_fills_whole_nodes_in_order_and_jobs_are_contiguous():
    top = topology(racks=4, nodes=4, gpus=4)  # 64 GPUs, 16 nodes
    mix = parse_mix(
        '[[jobs]]\nworkload = "a"\nshare = 0.5\n'
        '[[jobs]]\nworkload = "b"\ngpus = 12\n'
        '[[jobs]]\nworkload = "c"\nshare = 0.1\n'
    )
    p = place(top, mix)
    assert p.server_job.tolist() == [0] * 8 + [1] * 3 + [2] * 2 + [-1] * 3
    assert p.job_gpus.tolist() == [32, 12, 8]  # 6.4 GPUs of "c" round to 2 nodes
    assert p.job_servers.tolist() == [[0, 8], [8, 11], [11, 13]]
    gpu_job = p.gpu_job(top)
    assert len(gpu_job) == 64 and (gpu_job[:32] == 0).all() and (gpu_job[-12:] == -1).all()


def test_shares_that_sum_to_one_fill_the_site_exactly():
    top = topology(racks=3, nodes=5, gpus=4)  # 15 nodes: thirds that do not divide
    mix = parse_mix("\n".join(f'[[jobs]]\nworkload = "w{k}"\nshare = {1 / 7!r}' for k in range(7)))
    p = place(top, mix)
    assert (p.server_job >= 0).all()
    assert p.job_gpus.sum() == 60
    assert np.all(np.diff(p.server_job) >= 0)


def test_place_refuses_a_mix_larger_than_the_site_and_a_job_too_small():
    top = topology(racks=1, nodes=2, gpus=4)
    with pytest.raises(ProfileError, match=r"asks for 12 GPUs; test\.toml has 8"):
        place(top, parse_mix('[[jobs]]\nworkload = "a"\ngpus = 12', "mix.toml"))
    with pytest.raises(ProfileError, match="get no node"):
        place(top, parse_mix('[[jobs]]\nworkload = "a"\ngpus = 1', "mix.toml"))
