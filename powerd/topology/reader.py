"""Reading one value of one budgets-file table with its type and range: every error names
the file, the tree node and the number at fault."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from powerd.configfile import finite, shown
from powerd.topology.model import BudgetError
from powerd.topology.units import SPELLINGS, ZERO_OK, Written


@dataclass(frozen=True)
class Reader:
    """Typed reads of one table's keys; every error names the file and the tree node."""

    source: str

    def fail(self, node: str, problem: str) -> BudgetError:
        return BudgetError(self.source, node, problem)

    def check_keys(self, table: dict[str, Any], known: set[str], node: str) -> None:
        unknown = sorted(set(table) - known)
        if unknown:
            raise self.fail(
                node,
                f"unknown key(s) {unknown} (a typo?); known: {', '.join(sorted(known))}",
            )

    def number(self, table: dict[str, Any], key: str, node: str, *, zero_ok: bool = False) -> float:
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(node, f"{key} must be a number, got {value!r}")
        if finite(value) is None:
            raise self.fail(node, f"{key} = {shown(value)} must be a finite number")
        if value < 0 or (value == 0 and not zero_ok):
            sign = "negative" if value < 0 else "zero"
            need = "≥ 0" if zero_ok else "> 0"
            raise self.fail(node, f"{key} = {value:g} is {sign}; it must be {need}")
        return float(value)

    def integer(self, table: dict[str, Any], key: str, node: str, lo: int, hi: int) -> int:
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(node, f"{key} must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise self.fail(node, f"{key} = {shown(value)} is outside {lo}..{hi}")
        return value

    def watts(
        self, table: dict[str, Any], quantity: str, node: str, *, required: bool = False
    ) -> Written | None:
        """A power or ramp in whichever unit the key names (``limit_kw``, ``ramp_w_per_s``)."""
        given = [k for k in SPELLINGS[quantity] if k in table]
        if len(given) > 1:
            raise self.fail(node, f"give {quantity} once, not as {' and '.join(given)}")
        if not given:
            if required:
                spellings = " / ".join(SPELLINGS[quantity])
                raise self.fail(node, f"{quantity} is required ({spellings})")
            return None
        key = given[0]
        value = self.number(table, key, node, zero_ok=quantity in ZERO_OK)
        return Written(key, value, SPELLINGS[quantity][key])

    def fraction(self, table: dict[str, Any], key: str, node: str) -> float | None:
        if key not in table:
            return None
        value = self.number(table, key, node)
        if value > 1:
            hint = f"; a percentage? write {value / 100:g}" if 50 <= value <= 100 else ""
            raise self.fail(node, f"{key} = {value:g} must be a fraction of budget in (0, 1]{hint}")
        return value
