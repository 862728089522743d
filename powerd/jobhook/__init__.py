"""Phase announcements from a training job to the powerd controller.

A training loop tells the controller what it is doing (``compute``,
``checkpoint``, ``eval``, ...) on ``powerd/v1/{cluster}/jobs/{job}/phase``
(see ``docs/PROTOCOL.md`` and ``docs/JOBHOOK.md``)::

    reporter = PhaseReporter("mqtt://broker:1883", job="llama-70b-pretrain",
                             nodes=["r01-n03", "r01-n04"], priority="high",
                             enabled=(rank == 0))
    reporter.startup()
    with reporter.phase("checkpoint", expected_s=45):
        save()
    reporter.shutdown()

or, configured from the environment (``POWERD_BROKER``, ``POWERD_JOB``, ...)::

    from powerd.jobhook import phase
    with phase("checkpoint"):
        save()

Guarantees, whatever the broker does (down, slow, unreachable, wrong URL):

* No call blocks on the network: a call validates its arguments, encodes one
  payload and appends it to a small bounded queue; a background thread hands
  queued payloads to paho-mqtt's network thread (``loop_start``), which
  connects, reconnects with backoff and publishes (QoS 1).
* When the queue is full (broker unreachable or too slow) the oldest payload
  is dropped and counted (``stats().dropped``); the latest phases survive.
* No exception from the hook reaches the training loop, except ``ValueError``
  for bad arguments (invalid job or node name, unknown phase, invalid
  priority...): that is a programming error, found on the first run. Anything
  else is logged, at most once a minute per kind of trouble. A broker URL that
  does not parse is logged and turns publishing off.
* ``close()`` (and ``shutdown()``) flush what they can within
  ``flush_timeout_s``, and return within about a second more in any case.
* Every method is thread-safe. Payloads are sent in the order the calls were
  made, also across reconnects.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable

from powerd.hostlist import expand_hostlist
from powerd.jobhook.env import ENV_BROKER, ENV_CLUSTER, ENV_JOB, ENV_NODES, ENV_PRIORITY
from powerd.jobhook.fill import FillFollower
from powerd.jobhook.reporter import PhaseBlock, PhaseReporter, ReporterStats, _open_reporters
from powerd.jobhook.torch_ddp import DdpPhases, attach_ddp  # imports torch only when called
from powerd.vocabulary import PRIORITIES

# The package's modules, one job each:
#   reporter.py   PhaseReporter, PhaseBlock, ReporterStats and the argument checks
#   publisher.py  the ordered, bounded queue, the sender thread and paho's client
#   env.py        configuration from the environment (POWERD_*, Slurm, torchrun)
#   hostlist.py   Slurm-style host lists (r01-n[03-05])
#   fill.py       FillFollower: the agent's software-smoothing fill targets, to the job
#   torch_ddp.py  attach_ddp: a PyTorch DDP job's phases from a communication hook

__all__ = [
    "ENV_BROKER",
    "ENV_CLUSTER",
    "ENV_JOB",
    "ENV_NODES",
    "ENV_PRIORITY",
    "PRIORITIES",
    "DdpPhases",
    "FillFollower",
    "PhaseBlock",
    "PhaseReporter",
    "ReporterStats",
    "attach_ddp",
    "expand_hostlist",
    "get_reporter",
    "phase",
    "set_default_reporter",
    "set_phase",
    "shutdown",
    "startup",
]

# --- the module-level reporter: `from powerd.jobhook import phase` ---------------

_default: PhaseReporter | None = None
_default_lock = threading.Lock()


def get_reporter() -> PhaseReporter:
    """The process's default reporter, made from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PhaseReporter.from_env()
        return _default


def set_default_reporter(reporter: PhaseReporter | None) -> PhaseReporter | None:
    """Replace the default reporter (None: made from the environment again on next use).

    Returns the previous one, not closed.
    """
    global _default
    with _default_lock:
        previous, _default = _default, reporter
    return previous


def startup(nodes: Iterable[str] | None = None, expected_s: float | None = None) -> None:
    get_reporter().startup(nodes, expected_s)


def set_phase(phase: str, expected_s: float | None = None) -> None:
    get_reporter().set_phase(phase, expected_s)


def phase(phase: str, expected_s: float | None = None, then: str | None = None) -> PhaseBlock:
    return get_reporter().phase(phase, expected_s, then)


def shutdown(timeout_s: float | None = None) -> None:
    get_reporter().shutdown(timeout_s)


@atexit.register
def _close_all_at_exit() -> None:
    """Flush reporters left open (each within its own flush timeout)."""
    for reporter in list(_open_reporters):
        reporter.close()


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for reporter in list(_open_reporters):
        reporter._after_fork_in_child()
    _open_reporters.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
