"""``Reader`` on its own: one value of one table, its type and range, and an error that
names the file and the tree node (the budgets-file tests cover it inside whole files)."""

from __future__ import annotations

import math

import pytest

from powerd.topology import BudgetError
from powerd.topology.reader import Reader

READER = Reader("site.toml")


def fails(match: str) -> pytest.RaisesExc[BudgetError]:
    return pytest.raises(BudgetError, match=match)


def test_an_error_names_the_file_and_the_tree_node() -> None:
    with fails("site.toml") as caught:
        READER.number({"limit_w": "40"}, "limit_w", "row r1")
    assert "row r1" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("40", "must be a number"),
        (True, "must be a number"),
        (math.inf, "finite"),
        (math.nan, "finite"),
        (-1, "negative"),
        (0, "zero"),
    ],
)
def test_a_number_must_be_a_positive_finite_number(value: object, match: str) -> None:
    with fails(match):
        READER.number({"k": value}, "k", "site")


def test_zero_is_a_number_only_where_zero_is_allowed() -> None:
    assert READER.number({"k": 0}, "k", "site", zero_ok=True) == 0.0
    assert READER.number({"k": 3}, "k", "site") == 3.0


def test_an_integer_is_an_integer_within_its_range() -> None:
    assert READER.integer({"gpus": 8}, "gpus", "node", 1, 1024) == 8
    with fails("must be an integer"):
        READER.integer({"gpus": 8.0}, "gpus", "node", 1, 1024)
    with fails("outside 1..1024"):
        READER.integer({"gpus": 2000}, "gpus", "node", 1, 1024)


def test_watts_are_read_in_the_unit_the_key_names() -> None:
    written = READER.watts({"limit_kw": 40}, "limit", "site")
    assert written is not None and written.watts == 40_000.0
    assert READER.watts({}, "limit", "site") is None
    with fails("limit is required"):
        READER.watts({}, "limit", "site", required=True)
    with fails("give limit once"):
        READER.watts({"limit_kw": 40, "limit_w": 40_000}, "limit", "site")


def test_a_fraction_is_of_the_budget_with_a_hint_for_a_percentage() -> None:
    assert READER.fraction({}, "cap_target", "site") is None
    assert READER.fraction({"cap_target": 0.95}, "cap_target", "site") == 0.95
    with fails("a percentage"):
        READER.fraction({"cap_target": 95}, "cap_target", "site")


def test_unknown_keys_are_named_with_the_known_ones() -> None:
    with fails(r"unknown key\(s\) \['limt_kw'\]"):
        READER.check_keys({"limt_kw": 1}, {"limit_kw"}, "site")
