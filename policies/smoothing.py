"""Grid smoothing: share the site's ramp limits among its GPUs, and move a GPU's draw within them.

A specification. Utilities bound how fast a site's *measured* power may rise
and fall (W/s over a window; ``powerd.topology.grid.GridSpec``). A site's
power is its GPUs' draw plus what changes slowly (idle GPUs, hosts, network,
cooling). So if every GPU's draw moves at most ``r_up`` W/s up and ``r_down``
W/s down, the site moves at most ``n × r`` W/s: the limit holds when every one
of the site's ``n`` GPUs is given

    r_up   = margin × ramp_up_w_per_s   / n
    r_down = margin × ramp_down_w_per_s / n

(``gpu_ramps``), with a ramp-down hysteresis of the spec's window: a GPU
starts to fall only once it has wanted to for that long. So a wait shorter
than the window is held whole, and after a longer one the draw has fallen by
at most ``r_down × (wait - window)``, which compute, resuming at once, climbs
back within the window when the wait lasts under two windows and the rates
are equal (the rise a resumption makes is not the GPU's to slow). After a
longer wait a job smoothed in software fills its GPUs back up at ``r_up``
before it resumes, and a checkpoint's GPUs are counted as rising on their
own (rule 4 of ``policies/capping.py``); hardware ramps the rise itself. This
model (``ramp_toward``, the replays) is the hardware's: in software the job's
fill falls at once, no lower than ``r_up × window`` under where compute
resumes for as long as the hysteresis would have held it there
(``powerd.jobhook.fill``), a step the controller counts from the wait's start.

``margin`` (default 0.9) keeps a tenth of the limit for what the model leaves
out: the noise of the draw, the hosts' own swings, and a cap cut, which bites
at once (a breaker comes before the grid). ``n`` is every GPU of the *site*,
running or not, the same in every controller of a tree: the share changes
only when the budgets file does, so a change in the jobs sends no new profile
to anyone. It is conservative: an idle GPU's share goes unused.

How a GPU's draw moves (``ramp_toward``, one step of ``dt_s``): towards what
it wants, no faster than its rates. What it wants is its natural draw
(demand under the cap), raised to the floor while a job runs
(``floor_w = floor_fraction × cap``: NVML's floor is a share of the applied
power ceiling, so a floor is never above the cap); a lower cap bites at once.
Draw above the natural draw is energy burnt to hold the floor or the ramp
(the whatif reports it); draw below it slows the job.

Two mechanisms give this behaviour, by what the GPU has:

- **hardware** (Blackwell-class NVML power smoothing): the GPU enforces the
  rates and the floor itself, from a preset profile (``gpu_profile_values``);
- **software** (the job fills its waits with busy work at the power the
  agent tells it; caps staged up at the ramp-up rate at a job's start): the
  same rates and floor, carried out by the training process.

Limits of the model: the hardware's own minimum rate is not documented (a
share of a 1 MW/s limit over 83k GPUs is 11 W/s a GPU); the draw is modelled
at the step of the series, so a phase shorter than one step is averaged in it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from policies.grid import check_ramp_limit
from policies.settings import PolicySettings
from policies.tree import SITE, Tree

DEFAULT_MARGIN = 0.9  # of the site's ramp limit given to the GPUs; the rest for noise and hosts


@dataclass(frozen=True)
class GpuRamps:
    """What each GPU of a site is given: W/s up and down (``inf``: no limit), floor share."""

    up_w_per_s: float
    down_w_per_s: float
    floor_fraction: float  # of the cap, while a job runs; 0: none
    hysteresis_s: float = 0.0  # wanting to fall this long before falling

    def floor_w(self, cap_w: np.ndarray | float) -> np.ndarray | float:
        """The floor under a cap: never above it."""
        return cap_w * self.floor_fraction

    @property
    def limits_anything(self) -> bool:
        return (
            math.isfinite(self.up_w_per_s)
            or math.isfinite(self.down_w_per_s)
            or self.floor_fraction > 0
        )


NO_SMOOTHING = GpuRamps(math.inf, math.inf, 0.0)


def gpu_ramps(
    ramp_up_w_per_s: float,
    ramp_down_w_per_s: float,
    floor_fraction: float | None,
    site_gpus: int,
    margin: float = DEFAULT_MARGIN,
    hysteresis_s: float = 0.0,
) -> GpuRamps:
    """Each GPU's share of the site's ramp limits (module docstring); ``inf`` stays ``inf``."""
    if site_gpus < 1:
        raise ValueError(f"a site has at least one GPU, not {site_gpus}")
    if not 0 < margin <= 1:
        raise ValueError(f"margin must be in (0, 1], not {margin}")
    check_ramp_limit("ramp_up", ramp_up_w_per_s)
    check_ramp_limit("ramp_down", ramp_down_w_per_s)
    if floor_fraction is not None and not 0 <= floor_fraction < 1:
        raise ValueError(f"floor_fraction must be in [0, 1), not {floor_fraction}")
    if not (math.isfinite(hysteresis_s) and hysteresis_s >= 0):
        raise ValueError(f"hysteresis_s must be ≥ 0 s, not {hysteresis_s}")
    return GpuRamps(
        up_w_per_s=margin * ramp_up_w_per_s / site_gpus,
        down_w_per_s=margin * ramp_down_w_per_s / site_gpus,
        floor_fraction=floor_fraction or 0.0,
        hysteresis_s=hysteresis_s,
    )


def ramp_toward(
    now_w: np.ndarray,
    want_w: np.ndarray,
    cap_w: np.ndarray,
    ramps: GpuRamps,
    dt_s: float,
    falling_s: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The draw after ``dt_s``: a lower cap bites at once (from ``min(now_w, cap_w)``), then
    towards ``want_w`` (floor already applied; never above the cap) no faster than the
    rates, falling only after the hysteresis. ``falling_s``: how long each GPU has wanted
    to fall (zeros when None); returned updated, with the draw. The one ramp rule: the
    simulated GPU and the fleet simulator move their draw by it too."""
    if not (math.isfinite(dt_s) and dt_s > 0):
        raise ValueError(f"dt_s must be a positive number, not {dt_s}")
    wanted_for = np.zeros_like(now_w) if falling_s is None else falling_s
    now_w = np.minimum(now_w, cap_w)
    want_w = np.minimum(want_w, cap_w)
    wants_down = want_w < now_w
    wanted_for = np.where(wants_down, wanted_for + dt_s, 0.0)
    # of this step, the part past the hysteresis may fall
    may_fall_s = np.clip(wanted_for - ramps.hysteresis_s, 0.0, dt_s)
    rise = ramps.up_w_per_s * dt_s
    fall = (
        ramps.down_w_per_s * may_fall_s
        if math.isfinite(ramps.down_w_per_s)
        else np.where(may_fall_s > 0, math.inf, 0.0)
    )
    moved = np.clip(want_w, now_w - fall, now_w + rise)
    drawn: np.ndarray = np.minimum(moved, cap_w)
    return drawn, wanted_for


def wanted_w(
    natural_w: np.ndarray, cap_w: np.ndarray, running: np.ndarray, ramps: GpuRamps
) -> np.ndarray:
    """What a GPU heads for: its natural draw, raised to the floor while its job runs."""
    floor = np.where(running, ramps.floor_w(cap_w), 0.0)
    want: np.ndarray = np.minimum(np.maximum(natural_w, floor), cap_w)
    return want


@dataclass(frozen=True)
class ProfileValues:
    """A hardware preset's values for one GPU model's range (NVML units: %, W/s, ms)."""

    floor_percent: float
    ramp_up_w_per_s: float
    ramp_down_w_per_s: float
    ramp_down_hysteresis_ms: float
    clamped: bool  # the device's range could not hold what the share asked


def gpu_profile_values(
    ramps: GpuRamps,
    floor_min_percent: float,
    floor_max_percent: float,
    max_ramp_w_per_s: float,
) -> ProfileValues:
    """The preset that carries ``ramps`` out on a device with this range: the floor within
    the device's floor range and never above 100 % of the cap; ``inf`` rates become the
    device's most (no limit); the hysteresis in ms."""
    want_floor = ramps.floor_fraction * 100.0
    floor = min(max(want_floor, floor_min_percent), floor_max_percent, 100.0)
    up = min(ramps.up_w_per_s, max_ramp_w_per_s)
    down = min(ramps.down_w_per_s, max_ramp_w_per_s)
    clamped = (
        floor != want_floor
        or (math.isfinite(ramps.up_w_per_s) and up < ramps.up_w_per_s)
        or (math.isfinite(ramps.down_w_per_s) and down < ramps.down_w_per_s)
    )
    return ProfileValues(floor, up, down, ramps.hysteresis_s * 1000.0, clamped)


def grid_policy(policy: PolicySettings) -> PolicySettings:
    """The policy under grid smoothing: hand watts back within the caps (a draw that follows
    its caps slowly would climb into capping and be cut at once); stage a starting job's caps
    just above its draw (a start then rises within the site ramp, not in one jump to the
    staged start cap); and no clock lock in communication: smoothing holds the draw up
    through a wait anyway, so a lock saves nothing and deepens the dip the GPUs must hold."""
    return dataclasses.replace(
        policy, uncap_within_caps=True, startup_cap_fraction=0.0, comm_clock_lock=False
    )


def with_cut_fall(policy: PolicySettings, down_w_per_s: float) -> PolicySettings:
    """``policy`` with its cap cuts, where no limit is passed, no faster than ``down_w_per_s``
    a GPU: each GPU's share of the grid's ramp-down (rule 3 of ``policies.capping``), so
    capping over a budget comes down within the grid's limit. ``inf``: unchanged."""
    if not down_w_per_s < policy.cut_fall_w_per_s:
        return policy
    return dataclasses.replace(policy, cut_fall_w_per_s=down_w_per_s)


def with_grid_ramp(tree: Tree, ramp_up_w_per_s: float, margin: float = DEFAULT_MARGIN) -> Tree:
    """``tree`` with its site's sum-of-caps ramp at most ``margin`` × the grid's ramp-up
    limit: the caps the controller hands back then rise no faster than the grid allows. A
    GPU smoothed in software rises as fast as its cap lets it once its job computes, so the
    caps are its ramp-up (hardware smoothing holds the rate itself; the bound costs it
    nothing). ``inf``: the tree as it is."""
    if not math.isfinite(ramp_up_w_per_s):
        return tree
    ramp = np.array(tree.ramp_w_per_s, dtype=float)
    ramp[SITE] = min(ramp[SITE], margin * ramp_up_w_per_s)
    return dataclasses.replace(tree, ramp_w_per_s=ramp)
