"""Small budgets files for a tree of controllers (scoped leaves, the coordinator)."""

from __future__ import annotations


def three_rows() -> str:
    """3 rows r1..r3 of one rack of two 4xH100 nodes; the rows (12 kW each) fill the 36 kW site."""
    return """
version = 1
[site]
name = "s"
limit_kw = 40
budget_kw = 36
ramp_kw_per_s = 12
[models.H100]
failsafe_cap_w = 400
[rows]
count = 3
name = "r{i}"
limit_kw = 14
budget_kw = 12
[rows.racks]
count = 1
name = "{row}-k"
limit_kw = 14
budget_kw = 13
[rows.racks.nodes]
count = 2
name = "{rack}-n{i}"
gpus = 4
model = "H100"
overhead_w = 500
"""
