"""Phases of a PyTorch DDP job announced by a communication hook: no phase calls in the loop.

    model = DistributedDataParallel(net)
    phases = attach_ddp(model)     # "startup" now; "shutdown" at exit (or phases.close())
    for batch in loader:           # a plain training loop
        loss_fn(model(batch)).backward()
        optimizer.step()

``attach_ddp`` registers a DDP communication hook that wraps the all-reduce
(``allreduce_hook`` by default, or the job's own hook) and watches each backward's
*exposed* communication: from the moment its last gradient bucket is handed to the
all-reduce (every gradient of the backward is computed then) until every bucket's
all-reduce has completed. Buckets handed over earlier overlap the backward's compute;
the GPUs are busy then, so that is ``compute``. The rule (``CommIntervals``):

* ``compute`` at the first backward (training has begun; ``startup`` came at attach);
* ``communication`` once an exposed all-reduce has lasted ``min_comm_s`` (1 s; a thread
  looks every quarter of it, so up to 1.25 s): a straggling rank, a slow or congested
  network, a stalled collective; shorter ones are never announced (the controller acts on
  sections of a second or more);
* ``compute`` when that all-reduce completes;
* ``compute`` again at the end of a backward when nothing was announced for
  ``keepalive_s`` (60 s), so the controller's ``announced_live_s`` (120 s) never lapses.

So a job announces at most two phases per ``min_comm_s`` (``min_comm_s`` >= 0.5: at most
4 a second, under the controller's 5 a second per job, ``JobLimits``), however fast it
steps. On GPU tensors the two ends are taken when the GPU reaches them (events that a
thread of this module waits on), not when the CPU queued the work.

``import torch`` happens in ``attach_ddp`` only: importing ``powerd.jobhook`` never
imports it (the agent's and controller's installs have no torch; ``powerd[torch]``).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects
# (a string "GradBucket" is refused), so the hook made in `_tracking_hook` keeps real ones.

import atexit
import math
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from powerd.jobhook.reporter import PhaseReporter

if TYPE_CHECKING:
    import torch
    from torch import Tensor
    from torch._C._distributed_c10d import GradBucket
    from torch.futures import Future
    from torch.nn.parallel import DistributedDataParallel

    CommHook = Callable[[Any, GradBucket], Future[Tensor]]

__all__ = ["MIN_COMM_FLOOR_S", "CommIntervals", "DdpPhases", "attach_ddp"]

DEFAULT_MIN_COMM_S = 1.0
# two announcements per min_comm_s at most: 4 a second, under JobLimits' 5 a second per job
MIN_COMM_FLOOR_S = 0.5
DEFAULT_KEEPALIVE_S = 60.0  # half the controller's announced_live_s
WATCH_SHARE = 0.25  # the watcher thread looks every this share of min_comm_s


class CommIntervals:
    """The rule of the module docstring, fed the marks of the hook; thread-safe.

    ``launched()``: a bucket was handed to the all-reduce; ``exposed(at_s)``: the last
    bucket of a backward was; ``done(at_s)``: a bucket's all-reduce completed.
    ``check(now_s)`` announces ``communication`` when it is due and returns the seconds
    until it would be (None: nothing open); ``start()`` runs a thread that calls it.
    ``announce`` is called under this object's lock, in the order of the decisions.
    """

    def __init__(
        self,
        announce: Callable[[str], None],
        min_comm_s: float = DEFAULT_MIN_COMM_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_rule(min_comm_s, keepalive_s)
        self.min_comm_s = float(min_comm_s)
        self.keepalive_s = float(keepalive_s)
        self._announce_to = announce
        self.clock = clock
        self._cond = threading.Condition()
        self._pending = 0  # buckets handed to the all-reduce, not yet completed
        self._exposed_since_s: float | None = None  # the open exposed all-reduce's start
        self._in_comm = False  # `communication` announced for it
        self._started = False
        self._last_announced_s = -math.inf
        self._closed = False
        self._thread: threading.Thread | None = None

    def launched(self) -> None:
        with self._cond:
            if not self._started:
                self._started = True
                self._announce("compute", self.clock())
            self._pending += 1

    def exposed(self, at_s: float) -> None:
        with self._cond:  # no wake-up: the watcher looks every WATCH_SHARE of min_comm_s
            self._exposed_since_s = at_s

    def done(self, at_s: float) -> None:
        with self._cond:
            self._pending = max(0, self._pending - 1)
            if self._pending or self._exposed_since_s is None:
                return  # buckets still out, or overlapped with the backward's compute
            self._exposed_since_s = None
            if self._in_comm:
                self._in_comm = False
                self._announce("compute", at_s)
            elif at_s - self._last_announced_s >= self.keepalive_s:
                self._announce("compute", at_s)

    def check(self, now_s: float) -> float | None:
        with self._cond:
            since = self._exposed_since_s
            if since is None or self._in_comm:
                return None
            left_s = since + self.min_comm_s - now_s
            if left_s > 0:
                return left_s
            self._in_comm = True
            self._announce("communication", now_s)
            return None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="powerd-ddp-phases", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        """Polls: woken on every backward, this thread took the GIL from training twice
        a step (bench/RESULTS.md, the DDP hook); so ``communication`` comes between
        ``min_comm_s`` and (1 + WATCH_SHARE) x ``min_comm_s`` after the all-reduce began."""
        poll_s = WATCH_SHARE * self.min_comm_s
        with self._cond:
            while not self._closed:
                left_s = self.check(self.clock())
                self._cond.wait(poll_s if left_s is None else min(left_s, poll_s))

    def _announce(self, phase: str, at_s: float) -> None:
        if self._closed:  # a callback after close(): shutdown is (being) announced
            return
        self._last_announced_s = at_s
        self._announce_to(phase)


def _check_rule(min_comm_s: float, keepalive_s: float) -> None:
    """ValueError unless the rule's two durations are numbers of seconds it can keep."""
    for value, what in ((min_comm_s, "min_comm_s"), (keepalive_s, "keepalive_s")):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    if not (math.isfinite(min_comm_s) and min_comm_s >= MIN_COMM_FLOOR_S):
        raise ValueError(
            f"min_comm_s must be at least {MIN_COMM_FLOOR_S} s, not {min_comm_s!r}: two "
            "announcements per min_comm_s stay under the controller's 5 a second per job"
        )
    if not (math.isfinite(keepalive_s) and keepalive_s > 0):
        raise ValueError(f"keepalive_s must be a finite number of seconds > 0, not {keepalive_s!r}")


class _GpuMarks:
    """Hands the hook's marks on GPU tensors to ``CommIntervals`` when the GPU reaches
    them: one thread synchronises each mark's event, in the order the marks were made.
    ``failed`` is told what went wrong with a mark (it is then dropped)."""

    def __init__(
        self,
        intervals: CommIntervals,
        clock: Callable[[], float],
        failed: Callable[[Exception], None] = lambda exc: None,
    ) -> None:
        self._intervals = intervals
        self._clock = clock
        self._failed = failed
        self._marks: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="powerd-ddp-gpu", daemon=True)
        self._thread.start()

    def put(self, kind: str, event: Any) -> None:
        """``kind``: launched, exposed or done; ``event``: a recorded ``torch.Event``
        (anything with ``synchronize()``), or None: at once."""
        self._marks.put((kind, event))

    def close(self) -> None:
        self._marks.put(None)
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while (mark := self._marks.get()) is not None:
            kind, event = mark
            try:
                if event is not None:
                    event.synchronize()  # this thread waits for the GPU; training does not
                if kind == "launched":
                    self._intervals.launched()
                elif kind == "exposed":
                    self._intervals.exposed(self._clock())
                else:
                    self._intervals.done(self._clock())
            except Exception as exc:
                self._failed(exc)


class DdpPhases:
    """What ``attach_ddp`` returns: its ``reporter`` (``with phases.reporter.phase(
    "checkpoint"):``) and ``close()``, which announces ``shutdown`` (run at exit too)."""

    def __init__(self, reporter: PhaseReporter, intervals: CommIntervals | None) -> None:
        self.reporter = reporter
        self.intervals = intervals
        self._gpu_marks: _GpuMarks | None = None
        self._lock = threading.Lock()
        self._closed = False

    def close(self, timeout_s: float | None = None) -> None:
        """Stop watching, announce ``shutdown`` and close the reporter (once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            gpu_marks = self._gpu_marks
        if gpu_marks is not None:
            gpu_marks.close()
        if self.intervals is not None:
            self.intervals.close()
        self.reporter.shutdown(timeout_s)

    def _mark(self, kind: str, device: "torch.device | None") -> None:
        """One mark of the hook (launched, exposed, done) for the rule; never raises."""
        intervals = self.intervals
        if intervals is None:
            return
        try:
            if device is None:  # the CPU: done when the call is
                if kind == "launched":
                    intervals.launched()
                elif kind == "exposed":
                    intervals.exposed(intervals.clock())
                else:
                    intervals.done(intervals.clock())
                return
            import torch

            event: Any = None  # torch.cuda.Event, or torch.Event on other accelerators
            if kind != "launched":
                if device.type == "cuda":  # blocking: its waiter sleeps instead of spinning
                    event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
                else:
                    event = torch.Event(device)
                event.record()  # on the current stream: reached once the work queued is done
            with self._lock:
                if self._closed:
                    return
                if self._gpu_marks is None:
                    self._gpu_marks = _GpuMarks(intervals, intervals.clock, self._failed)
                self._gpu_marks.put(kind, event)
        except Exception as exc:  # never into the training loop
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.reporter._warn("ddp-hook", "DDP phase hook of job %s: %r", self.reporter.job, exc)


def attach_ddp(
    model: "DistributedDataParallel",
    reporter: PhaseReporter | None = None,
    *,
    min_comm_s: float = DEFAULT_MIN_COMM_S,
    keepalive_s: float = DEFAULT_KEEPALIVE_S,
    hook: "CommHook | None" = None,
    hook_state: object = None,
) -> DdpPhases:
    """Announce ``model``'s phases from a communication hook; ``startup`` now.

    ``reporter``: default ``PhaseReporter.from_env`` (``POWERD_BROKER``, ``POWERD_JOB``,
    ...: docs/JOBHOOK.md), publishing on global rank 0 only. ``hook``, ``hook_state``:
    the job's own DDP communication hook and its state, which this one wraps (default:
    ``allreduce_hook`` on the model's process group); every rank registers it, as it is
    on the ranks that do not publish. A model takes one hook: call this instead of
    ``model.register_comm_hook``. ``shutdown`` comes with ``close()`` or at exit.
    """
    try:
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel
    except ImportError as exc:
        raise ImportError(
            f"powerd.jobhook.attach_ddp needs PyTorch ({exc}): run it in the job's "
            "environment, or pip install 'powerd[torch]'"
        ) from None
    if not isinstance(model, DistributedDataParallel):
        raise ValueError(
            "attach_ddp needs a torch.nn.parallel.DistributedDataParallel model, "
            f"not {type(model).__name__}"
        )
    _check_rule(min_comm_s, keepalive_s)
    made = reporter is None
    if reporter is None:
        reporter = PhaseReporter.from_env(enabled=dist.get_rank() == 0)
    inner: CommHook = allreduce_hook if hook is None else hook
    state = model.process_group if hook is None else hook_state
    intervals = None
    if reporter.enabled:
        intervals = CommIntervals(reporter.set_phase, min_comm_s, keepalive_s)
    phases = DdpPhases(reporter, intervals)
    try:  # DDP refuses a second hook (RuntimeError) and a hook it cannot check
        model.register_comm_hook(
            state, inner if intervals is None else _tracking_hook(inner, phases)
        )
    except BaseException:
        if made:
            reporter.close()
        raise
    if intervals is not None:
        intervals.start()
    reporter.startup()
    atexit.register(phases.close)
    return phases


def _tracking_hook(inner: "CommHook", phases: DdpPhases) -> "CommHook":
    """``inner``, marking for ``phases``' rule when each bucket is launched and done."""
    from torch import Tensor

    # torch.distributed.GradBucket (what DDP compares the annotation with), from where
    # its type is declared: torch.distributed re-exports it implicitly
    from torch._C._distributed_c10d import GradBucket
    from torch.futures import Future

    def hook(state: object, bucket: GradBucket) -> Future[Tensor]:
        device = bucket.buffer().device
        gpu = None if device.type == "cpu" else device
        phases._mark("launched", gpu)
        if bucket.is_last():  # every gradient of this backward is computed
            phases._mark("exposed", gpu)
        try:
            future = inner(state, bucket)
        except BaseException:
            phases._mark("done", gpu)
            raise
        # on GPU tensors the callback runs on streams that wait for the all-reduce
        future.add_done_callback(lambda _: phases._mark("done", gpu))
        return future

    return hook
