"""The agent's decision rules, as functions of the state they read: one copy of each.

``powerd.agent.core.AgentCore`` calls them for its one node; the fleet simulator
(``powerd.fleet.model.FleetModel``) calls the same functions for each of its
thousands of nodes, so the two cannot drift apart (docs/PROTOCOL.md):

- a valid command is refused in local mode and without a live controller
  (``refusal``); liveness is by receipt: a live heartbeat keeps the controller
  live ``failsafe_after_s`` past its arrival (``live_until``, ``controller_live``);
- commands are applied in ``(epoch, seq)`` order (``is_stale``); the first live
  heartbeat of an epoch floors that order at its ``seq`` (``order_after_live``), and a
  deposed epoch followed starts it afresh (``order_after_new_epoch``);
- failsafe is make before break (``failsafe_cap_w``, ``failsafe_raise_at``);
- an ack's result and its errors (``applied_result``, ``unknown_gpu_error``, ``make_ack``);
- clock policies: a job's ``communication`` locks the clocks its policy names, any other
  phase unlocks them (``phase_locks``); a command that replaces a GPU's policy keeps the
  lock an announcement made only for the same job, at the new policy's clock
  (``lock_stays``), and a command's own clock makes the lock the command's;
- power smoothing: the profile written, and whether its floor was clamped
  (``smoothing_to_write``).

Which controller is followed, heartbeat by heartbeat, is ``powerd.agent.following``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from powerd.gpu.base import SmoothingProfile, SmoothingRange
from powerd.protocol import Ack, AckError, AckResult, GpuAck, Mode
from powerd.vocabulary import PROTOCOL_VERSION

# (epoch, seq): the order commands are applied in; NO_ORDER is before every command
Order = tuple[int, int]
NO_ORDER: Order = (-1, -1)

REFUSED_LOCAL = "agent runs in local mode and takes no commands"
REFUSED_NOT_LIVE = "no live controller heartbeat: agent is in failsafe"

# In failsafe, a GPU below its failsafe cap rises this share of failsafe_after_s after the
# others came down: longer than any two agents' deadlines for the same heartbeats differ
# by (their sample period and the broker's jitter).
FAILSAFE_RAISE_SHARE = 0.5
# a cap this close under its failsafe cap counts as at it (comes to it at once)
FAILSAFE_BELOW_MARGIN_W = 0.5

MAX_ACK_ERRORS = 32  # keeps an ack well inside the 64 KiB payload limit

LOCKING_PHASE = "communication"  # the phase a clock policy locks its GPUs' clocks in

# a clock policy's job: (its name, the owner level of its topic; None: the unowned topic)
PolicyJob = tuple[str, str | None]


def controller_live(mode: Mode, now_mono: float, deadline_mono: float) -> bool:
    """Whether a controller is live: the node follows one and heard it live recently."""
    return mode == "controlled" and now_mono <= deadline_mono


def live_until(deadline_mono: float, now_mono: float, failsafe_after_s: float) -> float:
    """The liveness deadline after a live heartbeat received at ``now_mono``."""
    return max(deadline_mono, now_mono + failsafe_after_s)


def refusal(mode: Mode, live: bool) -> str | None:
    """Why a valid, signed command is refused (``rejected``); None if it is not."""
    if mode == "local":
        return REFUSED_LOCAL
    if not live:
        return REFUSED_NOT_LIVE
    return None


def is_stale(epoch: int, seq: int, newest_epoch: int, last_applied: Order) -> bool:
    """A command of an epoch older than the newest seen, or not after the last applied."""
    return epoch < newest_epoch or (epoch, seq) <= last_applied


def order_after_live(last_applied: Order, floor: Order | None) -> Order:
    """The order's floor after a live heartbeat that sets ``floor`` (None: sets none): what
    the leader sent before a node heard it live is a replay there."""
    return last_applied if floor is None else max(last_applied, floor)


def order_after_new_epoch(last_applied: Order, epoch: int) -> Order:
    """The order's floor once ``epoch`` is followed: an older one (a deposed epoch taken
    over) starts the order afresh."""
    return (epoch, -1) if epoch < last_applied[0] else last_applied


def failsafe_cap_w(held_w: float, failsafe_w: float) -> tuple[float, bool]:
    """One GPU entering failsafe: the cap to hold now, and whether it is left below its
    failsafe cap to rise later. Make before break: a cap above comes down at once."""
    below = held_w < failsafe_w - FAILSAFE_BELOW_MARGIN_W
    return (held_w if below else failsafe_w), below


def failsafe_raise_at(now_mono: float, failsafe_after_s: float, any_below: bool) -> float | None:
    """When the GPUs left below their failsafe caps rise to them (None: none is below)."""
    return now_mono + FAILSAFE_RAISE_SHARE * failsafe_after_s if any_below else None


def applied_result(errors: Sequence[object]) -> AckResult:
    """An applied command's result: ``partial`` if anything failed."""
    return "partial" if errors else "applied"


def unknown_gpu_error(index: int, known: Iterable[int]) -> AckError:
    return AckError(
        index=index, message=f"unknown GPU index {index}; this node has {sorted(known)}"
    )


def make_ack(
    node: str,
    epoch: int,
    seq: int,
    ts: float,
    result: AckResult,
    gpus: list[GpuAck],
    errors: list[AckError],
) -> Ack:
    """The ack of one command; past ``MAX_ACK_ERRORS`` errors, the rest are counted."""
    if len(errors) > MAX_ACK_ERRORS:
        more = len(errors) - (MAX_ACK_ERRORS - 1)
        errors = [
            *errors[: MAX_ACK_ERRORS - 1],
            AckError(index=None, message=f"{more} more errors"),
        ]
    return Ack(
        v=PROTOCOL_VERSION,
        node=node,
        epoch=epoch,
        seq=seq,
        ts=ts,
        result=result,
        gpus=gpus,
        errors=errors,
    )


def phase_locks(phase: str) -> bool:
    """Whether an announcement of ``phase`` by a job a GPU holds a clock policy for locks
    the GPU's clock (at the policy's) or, any other phase, unlocks it."""
    return phase == LOCKING_PHASE


def lock_stays(phase_locked: bool, old: PolicyJob | None, new: PolicyJob | None) -> bool:
    """Whether a lock an announcement made stays (at the new policy's clock) when an
    applied command replaces the GPU's policy: only for the same job; otherwise it ends."""
    return phase_locked and old is not None and new is not None and old == new


def smoothing_to_write(
    active: SmoothingProfile, wanted: SmoothingProfile, device: SmoothingRange
) -> tuple[SmoothingProfile | None, bool]:
    """A command's smoothing profile on a GPU whose active one is ``active``: the profile
    to write (its floor clamped into the device's range; None when the active one is
    already that), and whether the floor was clamped."""
    target = device.clamp(wanted)
    write = None if active.close_to(target) else target
    return write, target.floor_percent != wanted.floor_percent
