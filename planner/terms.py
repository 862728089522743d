"""Non-GPU power: what a node, a rack and the site draw besides their GPUs.

Each term is optional. A term left unset keeps what the topology's budgets
file already says at that level (its ``overhead_w``), so sizing an existing
file changes only the budgets; setting a term replaces those overheads in the
file ``powerplan size`` writes. Typical values, for when a topology has none
(all assumed unless a source is named):

=====================  =======  ==================================================
term                   typical  what
=====================  =======  ==================================================
``node_w``             1000 W   per node (server): CPUs, memory, NICs, fans; a
                                4-GPU GB200 tray (assumed, docs/BUDGETS.md)
``network_fraction``   0.11     back-end network and switches, as a share of the
                                rack's IT power (docs/DOMAIN.md: ≈ 11 %)
``cooling_fraction``   0.27     cooling and power conversion at the site, as a
                                share of the site's IT power (PUE ≈ 1.27, assumed)
``summer_rise``        0.0      extra cooling in summer, a share of the cooling
                                term (docs/DOMAIN.md: cooling rises in summer); size
                                for the hottest season you plan to run
=====================  =======  ==================================================

A terms file (TOML) has the same keys at its top level::

    node_w = 1000
    network_fraction = 0.11
    cooling_fraction = 0.27
    summer_rise = 0.15
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from planner.errors import ProfileError

TYPICAL: dict[str, float] = {
    "node_w": 1000.0,
    "network_fraction": 0.11,
    "cooling_fraction": 0.27,
    "summer_rise": 0.0,
}


@dataclass(frozen=True)
class NonGpuTerms:
    """Non-GPU power terms; ``None``: keep the topology's overhead at that level."""

    node_w: float | None = None  # per node (server): CPUs, memory, NICs, fans
    network_fraction: float | None = None  # switches / back-end network, share of rack IT power
    cooling_fraction: float | None = None  # site cooling + conversion, share of site IT power
    summer_rise: float = 0.0  # cooling grows by this share in summer

    def __post_init__(self) -> None:
        for name, lo, hi in (
            ("node_w", 0.0, 2e5),
            ("network_fraction", 0.0, 0.9),
            ("cooling_fraction", 0.0, 5.0),
            ("summer_rise", 0.0, 5.0),
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} = {value!r} must be a number")
            if not (math.isfinite(value) and lo <= value <= hi):
                hint = " (a fraction, not a percentage)" if "fraction" in name and value > 1 else ""
                raise ValueError(f"{name} = {value!r} must be in {lo:g}..{hi:g}{hint}")

    def merged(self, **overrides: Any) -> NonGpuTerms:
        """These terms with every override that is not None."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def describe(self) -> dict[str, str]:
        """Each term and where it comes from, for the output."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = "from the topology" if value is None else f"{value:g}"
        return out


def load_terms(path: str | Path) -> NonGpuTerms:
    source = str(path)
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(source, f"cannot read the terms: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(source, f"not valid TOML: {exc}") from None
    known = {f.name for f in fields(NonGpuTerms)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ProfileError(source, f"unknown key(s) {unknown}; known: {', '.join(sorted(known))}")
    try:
        return NonGpuTerms(**raw)
    except ValueError as exc:
        raise ProfileError(source, str(exc)) from None
