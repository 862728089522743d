"""Capped samples are censored data: estimate the demand a cap hid, or refuse to plan from it.

A GPU held at a cap below its maximum draws what the cap lets it, not what its workload
wants: its sample says only *demand >= draw*. Planning from such draws understates demand.
Pure functions on the profile table (:mod:`planner.profile_table`); the commands
(``powerplan profiles``, ``powerplan size``) call :func:`resolve`.

Specification
-------------
Per sample (one row of the table):

- **highest cap** ``H``: ``cap_max_w`` where known, else the highest ``cap_w`` the same GPU
  (node, gpu) reports in the table (*inferred*: a GPU capped all along looks uncapped).
- **capped**: ``cap_w`` known and ``cap_w < H - NEGLIGIBLE_W``.
- **censored**: capped and ``power_w >= (1 - tolerance) * cap_w``, ``tolerance`` =
  :data:`TOLERANCE` (0.10) by default: held at its cap. A GPU held at a cap averages
  91-99 % of it over a sample, not 100 %: the part of each step its SMs are not
  power-limited (memory, host, waits) draws less (the Zeus-fitted workload model,
  powerd/gpu/workload_model.py (3)-(4), gives 91.5-99.4 % for its LLM and vision curves
  at 40-90 % caps). A sample under its cap by more than that is not held: its draw is
  its demand. Misjudging an unheld sample as censored errs high, never low.
- every other sample is **uncensored**: its draw is its demand.

Estimate (``mode = "estimate"``), per group of one workload, one phase (an unknown phase
is a group of its own) and one highest cap:

1. ``S(t)``, the product-limit (Kaplan-Meier) estimate of P(demand > t) from the group's
   draws, a censored draw ``x`` counted as *demand > x* (at equal draws, uncensored first).
2. A censored sample with draw ``x`` gets a demand drawn from ``S`` conditioned on
   demand > ``x``: each uncensored draw ``t > x`` with probability (the drop of ``S`` at
   ``t``) / ``S(x)``. Independent draws, one seeded generator (``seed``, default 0),
   groups in order: the same table gives the same estimate.
3. The mass ``S`` leaves above the group's largest uncensored draw (all of it where no
   uncensored draw lies above ``x``) goes to the **fallback**, the sample's highest cap
   ``H`` (at least ``x``): no GPU averages more than its highest cap over a sample, so
   the fallback may overstate demand, never understate it.

Uncensored samples keep their draw. ``"as-is"`` keeps every draw (and understates demand
where samples are censored); ``"refuse"`` raises :class:`CensoredError` when any sample
is censored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

#: A GPU held at its cap draws at least this share of it below the cap ((1 - TOLERANCE) * cap).
TOLERANCE = 0.10
#: A cap within this of the highest cap is the highest cap (caps read back in whole mW).
NEGLIGIBLE_W = 1.0
#: The modes: estimate the hidden demand (default), refuse such profiles, take the draw.
MODES: tuple[str, ...] = ("estimate", "refuse", "as-is")
DEFAULT_MODE = "estimate"
MODE_HELP = (
    "Samples held at a cap below the GPU's maximum (draw within 10% of the cap) only say "
    "demand >= draw. estimate: their demand from the uncensored samples of the same "
    "workload and phase, else the GPU's highest cap (docs/PLANNER.md, 'Capped samples'); "
    "refuse: exit 1 if there are any; as-is: take the draw (understates demand)."
)
#: Where each sample's demand comes from (``DemandEstimate.source``).
DRAW, DATA, FALLBACK = 0, 1, 2


class CensoredError(ValueError):
    """Censored samples where the mode is ``refuse``; the text says what to do."""


@dataclass(frozen=True)
class Censoring:
    """Per row of the table: capped, censored, the highest cap and whether it was inferred."""

    capped: np.ndarray  # bool
    censored: np.ndarray  # bool
    highest_cap_w: np.ndarray  # float; NaN where no cap is known
    inferred: np.ndarray  # bool: the highest cap is the GPU's highest cap_w, not cap_max_w


@dataclass(frozen=True)
class DemandEstimate:
    """The table with ``power_w`` the estimated demand, and where each row's came from."""

    table: pd.DataFrame
    source: np.ndarray  # int8 per row: DRAW, DATA or FALLBACK


@dataclass(frozen=True)
class Resolved:
    """What a command plans from: the table, the per-workload shares and the warnings."""

    table: pd.DataFrame
    shares: pd.DataFrame  # censoring_summary
    warnings: list[str]


def classify(table: pd.DataFrame, tolerance: float = TOLERANCE) -> Censoring:
    """Which rows are capped and which censored (the module's definitions)."""
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), not {tolerance}")
    power = table["power_w"].to_numpy(dtype=float)
    cap = _column(table, "cap_w")
    cap_max = _column(table, "cap_max_w")
    seen_max = (
        pd.Series(cap).groupby([table["node"].to_numpy(), table["gpu"].to_numpy()]).transform("max")
    ).to_numpy(dtype=float)
    inferred = np.isnan(cap_max) & ~np.isnan(seen_max)
    highest = np.where(np.isnan(cap_max), seen_max, cap_max)
    with np.errstate(invalid="ignore"):
        capped = ~np.isnan(cap) & (cap < highest - NEGLIGIBLE_W)
        censored = capped & (power >= (1.0 - tolerance) * cap)
    return Censoring(capped, censored, highest, inferred & capped)


def _column(table: pd.DataFrame, name: str) -> np.ndarray:
    """A float column, all NaN where the table has none."""
    if name not in table.columns:
        return np.full(len(table), np.nan)
    values: np.ndarray = table[name].to_numpy(dtype=float, na_value=np.nan)
    return values


def estimate_demand(
    table: pd.DataFrame, censoring: Censoring | None = None, *, seed: int = 0
) -> DemandEstimate:
    """The table with each censored sample's ``power_w`` replaced by its estimated demand."""
    cens = classify(table) if censoring is None else censoring
    power = table["power_w"].to_numpy(dtype=float)
    demand = power.copy()
    source = np.full(len(table), DRAW, dtype=np.int8)
    if cens.censored.any():
        rng = np.random.default_rng(seed)
        phase = table["phase"].astype("string").fillna("") if "phase" in table else ""
        keys = pd.DataFrame(
            {"w": table["workload"].to_numpy(), "p": phase, "h": np.nan_to_num(cens.highest_cap_w)}
        )
        for rows in keys.groupby(["w", "p", "h"], sort=True).indices.values():
            if not cens.censored[rows].any():
                continue
            hidden = rows[cens.censored[rows]]
            values, from_data = _impute(
                power[rows], cens.censored[rows], cens.highest_cap_w[rows], rng
            )
            demand[hidden] = values
            source[hidden] = np.where(from_data, DATA, FALLBACK)
    out = table.copy()
    out["power_w"] = demand
    return DemandEstimate(out, source)


def product_limit(values: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan-Meier: the uncensored values in ascending order and S just after each.

    ``S(t)`` = P(demand > t); a censored value ``x`` means demand > ``x``; at equal values
    the uncensored come first. ``S`` ends at 0 when the largest value is uncensored."""
    order = np.lexsort((censored, values))
    ordered_censored = censored[order]
    at_risk = len(values) - np.arange(len(values), dtype=float)
    factors = np.where(ordered_censored, 1.0, 1.0 - 1.0 / at_risk)
    survival = np.cumprod(factors)
    events = ~ordered_censored
    return values[order][events], survival[events]


def _impute(
    power: np.ndarray, censored: np.ndarray, fallback_w: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One group's censored rows: their demand, and whether each came from data (not the
    fallback)."""
    times, survival = product_limit(power, censored)
    lower = power[censored]
    before = np.searchsorted(times, lower, side="right")  # events at or below each draw
    s_at = np.where(before > 0, survival[np.maximum(before - 1, 0)], 1.0) if len(times) else 1.0
    target = s_at * rng.random(len(lower))  # S(x) * (1 - u), u uniform in (0, 1]
    # the first event whose S is at or below the target (S is non-increasing): after x
    pick = np.searchsorted(-survival, -target, side="left")
    from_data = pick < len(times)
    chosen = times[np.minimum(pick, len(times) - 1)] if len(times) else lower
    fallback = np.maximum(fallback_w[censored], lower)  # censored rows have a highest cap
    return np.where(from_data, chosen, fallback), from_data


def censoring_summary(
    table: pd.DataFrame, censoring: Censoring, source: np.ndarray | None = None
) -> pd.DataFrame:
    """Per workload: samples, capped and censored shares, and (with ``source``) how many
    censored samples the estimate took from data and from the fallback."""
    frame = pd.DataFrame(
        {
            "workload": table["workload"].to_numpy(),
            "capped": censoring.capped,
            "censored": censoring.censored,
            "inferred": censoring.inferred,
            "data": np.zeros(len(table), bool) if source is None else source == DATA,
            "fallback": np.zeros(len(table), bool) if source is None else source == FALLBACK,
            "fallback_w": np.where(
                np.zeros(len(table), bool) if source is None else source == FALLBACK,
                censoring.highest_cap_w,
                np.nan,
            ),
        }
    )
    grouped = frame.groupby("workload", sort=True)
    out = pd.DataFrame(
        {
            "samples": grouped.size(),
            "capped_share": grouped["capped"].mean(),
            "censored_share": grouped["censored"].mean(),
            "censored": grouped["censored"].sum(),
            "from_data": grouped["data"].sum(),
            "from_fallback": grouped["fallback"].sum(),
            "fallback_max_w": grouped["fallback_w"].max(),
            "cap_max_inferred": grouped["inferred"].any(),
        }
    )
    return out.reset_index()


def resolve(
    table: pd.DataFrame, mode: str = DEFAULT_MODE, *, tolerance: float = TOLERANCE, seed: int = 0
) -> Resolved:
    """The table to plan from under ``mode`` (:data:`MODES`), the per-workload shares, and a
    warning per workload with censored samples. ``refuse``: CensoredError if any."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    censoring = classify(table, tolerance)
    source = None
    if censoring.censored.any():
        if mode == "refuse":
            raise CensoredError(refusal(censoring_summary(table, censoring), tolerance))
        if mode == "estimate":
            estimate = estimate_demand(table, censoring, seed=seed)
            table, source = estimate.table, estimate.source
    shares = censoring_summary(table, censoring, source)
    return Resolved(table, shares, censored_warnings(shares, mode, tolerance))


def censored_warnings(shares: pd.DataFrame, mode: str, tolerance: float = TOLERANCE) -> list[str]:
    """One line per workload with censored samples: how many, and what was made of them."""
    out = []
    for row in shares[shares["censored"] > 0].itertuples(index=False):
        said = (
            f"{row.workload}: {row.capped_share:.0%} of its {row.samples:,} samples capped"
            f" below the GPU's maximum, {row.censored_share:.0%} held at the cap (draw within"
            f" {tolerance:.0%} of it: demand >= draw); "
        )
        if mode == "estimate":
            fallback = (
                f", {row.from_fallback:,} at the GPU's highest cap"
                f" ({row.fallback_max_w:,.0f} W: no uncensored sample above them)"
                if row.from_fallback
                else ""
            )
            said += (
                f"their demand estimated, {row.from_data:,} from uncensored samples of the"
                f" same phase{fallback}"
            )
        else:
            said += (
                "their draw is taken as demand and understates it (powerplan profiles and"
                " size estimate it: --capped-demand estimate)"
            )
        if row.cap_max_inferred:
            said += "; no cap_max_w: each GPU's highest cap_w taken as its maximum"
        out.append(said)
    return out


def refusal(shares: pd.DataFrame, tolerance: float = TOLERANCE) -> str:
    """What ``refuse`` says: which workloads, how much, and what to do."""
    held = shares[shares["censored"] > 0]
    each = ", ".join(
        f"{r.workload} {r.censored:,} of {r.samples:,} ({r.censored_share:.0%})"
        for r in held.itertuples(index=False)
    )
    return (
        f"samples held at a cap below the GPU's maximum (draw within {tolerance:.0%} of the"
        f" cap): {each}; their draw only says demand >= draw, so planning from it"
        " understates demand. Profile these workloads with their GPUs at their maximum cap,"
        " or pass --capped-demand estimate (the default) to estimate their demand from the"
        " uncensored samples (docs/PLANNER.md, 'Capped samples'), or --capped-demand as-is"
        " to plan from the capped draw"
    )
