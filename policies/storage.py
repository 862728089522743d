"""Rack energy storage: what the grid would see if storage took up the site's swings.

A specification. NVIDIA's GB300 NVL72 puts energy storage in its power
supplies ("also coming to GB200", docs/DOMAIN.md): the third mitigation of
"Power Stabilization for AI Training Datacenters" (arXiv 2508.14318), next to
a power floor and GPU ramp limits (``policies.smoothing``). This module
dispatches such storage over a site's demand series ``demand_w`` (one value
every ``dt_s``) and says what the grid then draws and what it costs.

Assumptions
-----------
- **One pool.** Every rack's storage is dispatched together, as one site-level
  store of ``capacity_j`` and ``power_w``: the grid sees only the site, so how
  the charge is spread over the racks does not change what it sees. (Racks
  dispatched apart would need more: a rack cannot lend its charge to another.)
- **Round trip.** A joule put in and taken out comes back as ``round_trip``
  joules (default 0.9, assumed: no vendor figure in docs/DOMAIN.md), split
  evenly: ``eta = sqrt(round_trip)`` each way. Charging at ``c`` W from the
  bus stores ``eta c``; delivering ``d`` W to the bus takes ``d / eta`` from
  the store. ``power_w`` bounds ``c`` and ``d``; the charge stays in
  ``[0, capacity_j]``. Nothing about ageing, self-discharge or cost.
- It starts at the **reference** charge (``reference`` × capacity, default
  half full), with the grid drawing the first step's demand.

Dispatch (causal: step ``t`` sees the demand up to ``t`` only)
-------------------------------------------------------------
1. A slow target: the trailing mean of the demand over ``horizon_s``, plus
   ``(reference charge - charge) / horizon_s``, which pulls the charge back
   to the reference over about a horizon.
2. The grid draw ``G`` moves from the last step's towards the target, at most
   ``ramp_up_w_per_s × dt_s`` up and ``ramp_down_w_per_s × dt_s`` down a step:
   then the change over any window of whole steps is within the limits
   (``policies.grid.ramp_rates``). While the demand is above the grid draw
   (the store is giving), the draw does not fall: falling would only deepen
   what the store must give (a trailing mean lags a demand coming back).
3. ``G - D > 0``: the store charges what it can (power, room); the rest is
   **burnt** (a floor: the GPUs do busy work), so the grid draw holds.
4. ``G - D < 0``: the store gives what it can (power, charge); the rest is
   **held back**: the GPUs are capped to what the grid and the store supply.
   The other choice, letting the grid draw rise faster than the limit, breaks
   the spec the storage is there to meet; holding back keeps it, and costs
   throughput, which the dispatch reports as energy held back (the work is
   not replayed later: the demand series is taken as given).

Energy balance, exact by construction: grid energy = demand energy + burnt
+ conversion losses + change of stored energy - held back.

With no storage (``capacity_j = 0`` or ``power_w = 0``) the grid draw is the
target, ramp-limited: what it holds above the demand is burnt (a causal
floor: with a one-step horizon and rises within the limit, the lowest series
above the demand that falls no faster than the limit), what it lacks is held
back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from policies.grid import as_series, check_ramp_limit, window_steps

DEFAULT_ROUND_TRIP = 0.9  # assumed: a joule stored and given back returns 0.9 J
DEFAULT_REFERENCE = 0.5  # the charge it starts at and is pulled back to, of capacity
# Two periods of 0.1 Hz, the lower edge of the oscillation band (docs/DOMAIN.md): a target
# averaged over it swings too slowly to be in the band, and lags a lasting change by ~20 s.
DEFAULT_HORIZON_S = 20.0


@dataclass(frozen=True)
class Storage:
    """One site-level pool of storage (module docstring)."""

    capacity_j: float
    power_w: float  # charge and discharge, at the bus
    round_trip: float = DEFAULT_ROUND_TRIP
    reference: float = DEFAULT_REFERENCE  # of capacity

    def __post_init__(self) -> None:
        for name in ("capacity_j", "power_w"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number ≥ 0, not {value}")
        if not (math.isfinite(self.round_trip) and 0 < self.round_trip <= 1):
            raise ValueError(f"round_trip must be in (0, 1], not {self.round_trip}")
        if not (math.isfinite(self.reference) and 0 <= self.reference <= 1):
            raise ValueError(f"reference must be in [0, 1], not {self.reference}")

    @property
    def one_way(self) -> float:
        """Efficiency of charging, and of discharging: the round trip split evenly."""
        return math.sqrt(self.round_trip)

    @property
    def reference_j(self) -> float:
        return self.reference * self.capacity_j


@dataclass(frozen=True)
class Dispatch:
    """What the grid draws with the storage, and where the energy went, per step."""

    dt_s: float
    grid_w: np.ndarray  # what the grid supplies
    charge_j: np.ndarray  # stored energy at the end of each step
    initial_charge_j: float
    burnt_w: np.ndarray  # above the demand, the store full or at its power limit
    loss_w: np.ndarray  # lost in conversion, charging and discharging
    held_w: np.ndarray  # demand not served: GPUs capped to the grid draw and the store

    @property
    def burnt_j(self) -> float:
        return float(self.burnt_w.sum()) * self.dt_s

    @property
    def conversion_loss_j(self) -> float:
        return float(self.loss_w.sum()) * self.dt_s

    @property
    def held_back_j(self) -> float:
        return float(self.held_w.sum()) * self.dt_s

    @property
    def stored_change_j(self) -> float:
        return float(self.charge_j[-1]) - self.initial_charge_j if len(self.charge_j) else 0.0

    @property
    def charge_min_j(self) -> float:
        return float(min(self.initial_charge_j, self.charge_j.min(initial=math.inf)))

    @property
    def charge_max_j(self) -> float:
        return float(max(self.initial_charge_j, self.charge_j.max(initial=-math.inf)))


def _check_limits(dt_s: float, up_w_per_s: float, down_w_per_s: float, horizon_s: float) -> None:
    if not (math.isfinite(dt_s) and dt_s > 0):
        raise ValueError(f"dt_s must be a positive number, not {dt_s}")
    check_ramp_limit("ramp_up_w_per_s", up_w_per_s)
    check_ramp_limit("ramp_down_w_per_s", down_w_per_s)
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be a positive number of seconds, not {horizon_s}")


def trailing_mean(demand_w: np.ndarray, dt_s: float, horizon_s: float) -> np.ndarray:
    """Mean of the last ``horizon_s`` (this step included; fewer steps at the start)."""
    d = as_series(demand_w, "demand_w")
    w = window_steps(dt_s, horizon_s)
    total = np.concatenate([[0.0], np.cumsum(d)])
    t = np.arange(len(d))
    start = np.maximum(t + 1 - w, 0)
    mean: np.ndarray = (total[t + 1] - total[start]) / (t + 1 - start)
    return mean


def dispatch(
    demand_w: np.ndarray,
    dt_s: float,
    storage: Storage,
    ramp_up_w_per_s: float,
    ramp_down_w_per_s: float,
    horizon_s: float = DEFAULT_HORIZON_S,
) -> Dispatch:
    """The grid draw, step by step, with ``storage`` taking up the difference (module
    docstring); ``inf`` ramp: no limit that way."""
    _check_limits(dt_s, ramp_up_w_per_s, ramp_down_w_per_s, horizon_s)
    d = as_series(demand_w, "demand_w")
    n = len(d)
    grid_w, charge_j = np.empty(n), np.empty(n)
    burnt_w, loss_w, held_w = np.zeros(n), np.zeros(n), np.zeros(n)
    target = trailing_mean(d, dt_s, horizon_s).tolist()
    rise_w, fall_w = ramp_up_w_per_s * dt_s, ramp_down_w_per_s * dt_s
    eta, cap_j, pull_j = storage.one_way, storage.capacity_j, storage.reference_j
    max_w = storage.power_w
    e = storage.reference_j
    g_prev = float(d[0]) if n else 0.0
    for t, demand in enumerate(d.tolist()):
        want = target[t] + (pull_j - e) / horizon_s
        low = g_prev if demand > g_prev else g_prev - fall_w
        g = min(max(want, low), g_prev + rise_w)
        surplus = g - demand
        if surplus >= 0:  # charge what fits, burn the rest
            c = min(surplus, max_w, (cap_j - e) / (eta * dt_s))
            e = min(e + eta * c * dt_s, cap_j)
            loss_w[t] = (1.0 - eta) * c
            burnt_w[t] = surplus - c
        else:  # give what it holds, hold the rest back
            x = min(-surplus, max_w, e * eta / dt_s)
            e = max(e - x * dt_s / eta, 0.0)
            loss_w[t] = (1.0 / eta - 1.0) * x
            held_w[t] = -surplus - x
        grid_w[t], charge_j[t] = g, e
        g_prev = g
    return Dispatch(dt_s, grid_w, charge_j, storage.reference_j, burnt_w, loss_w, held_w)
