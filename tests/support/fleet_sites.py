"""Small cuts of the shipped 150 MW site for the fleet's tests."""

from __future__ import annotations

from powerd.fleet.sites import cut_site


def small_site(racks: int = 2) -> str:
    """One row of ``racks`` racks of 18 GB200 nodes (72 GPUs a rack), as shipped."""
    return cut_site(rows=1, racks_per_row=racks)
