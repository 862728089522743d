"""``FillFollower``: the training process's side of software power smoothing.

Where a GPU has no hardware power smoothing, the agent of its node
(``agent.software_smoothing``) publishes, every sample, each GPU's draw, the
floor to hold while the job runs, and how fast and after how long its draw
may fall (``FillRequest`` on ``nodes/{node}/fill``;
``powerd.gpu.software_smoothing``). A ``FillFollower`` in the job's process on
that node turns them into the power each GPU should be held at, and hands it
to the training loop's callback, which keeps the GPU busy up to that power (a
matmul loop on a side stream: ``examples/fill_during_waits.py``). The job
tells it when it waits and works, because only the job knows:

    follower = FillFollower(broker, ["node7"], on_fill=fill_gpus, cluster="prod")
    follower.start()
    follower.starting()      # loading the model: raise the draw slowly to the cap
    follower.waiting(2.0)    # a collective, a checkpoint (2 s expected, if known): let
                             # the draw fall slowly, ready to resume, back when it should end
    follower.fill_back_up(timeout_s=60.0, after_checkpoint=checkpointed)  # if it fell far
    follower.working()       # compute again: nothing to fill above the floor
    follower.stopping()      # the last step is done: fall slowly at once, no floor
    follower.wait_ramped(done_w=100.0, timeout_s=120.0)   # fill down the ramp, then exit
    follower.close()

The target of a GPU, with ``H`` where the GPU stood when the job entered its state (the
draw last sampled while it worked, or where work found it before any sample, when it leaves
work; its target then, otherwise: so a change of state never raises a target at once):
starting since ``t_s``, ``min(cap, max(floor, H + ramp_up × (t - t_s)))``, so that the
first step of compute does not jump from a starting GPU's draw to its cap; working, its
floor; waiting since ``t_w``, ``max(floor, H - ramp_down × (t - t_w), min(H - ramp_down ×
max(0, t - t_w - hysteresis), Q))`` with ``Q = min(H, R - ramp_up × hysteresis)``: it falls
at once, but stays ready for compute to step it up by no more than its share of one
window's rise (the causal floor of ``policies.grid.least_ready_floor``) for as long as a
fall held through the hysteresis would; and, when the job said how long it expects to wait
(``waiting(expected_s)``, ending at ``T``), at least ``min(R - ramp_up × (T - t), H +
ramp_up × (t - t_w))`` with ``R`` where compute will put it (below), a cap handed back
during a collective included (counted by the controller as drawn when it came), in a
``checkpoint`` as it was when the wait began (its staged cap climbs with the fill): back
there when the wait should end, never rising faster than the ramp-up save by such a cap
(past ``T``, ``R`` held through the hysteresis, then falling); stopping since ``t_e``,
``max(0, H - ramp_down × (t - t_e))``: no floor, and no hysteresis, which only guards
against a wait ending at once (a job that stops will not resume, and only the job knows
it). Compute that resumes steps each GPU at once from its target up to where compute puts
it, ``min(cap, the draw last sampled at work)``, or the cap if that draw was held at the
cap it had then (``resume_levels``): after a wait shorter than two hysteresis windows that
is what its fall took within the last window, but after a long one (a checkpoint: its draw
fell to the checkpoint's, and an H100's staged cap cannot go below 200 W) more than the
GPU's share of one window's rise (``ramp_up × hysteresis``), which no cap can slow.
``must_rise_first()`` says so, and the job then fills back up first, at the ramp-up rate
(``starting()`` and ``wait_risen()``, both in ``fill_back_up()``), before it computes;
after a checkpoint it always does, up to where compute would have put it as the checkpoint
began (the staged cap climbs with the fill, a headroom over it, counted by the controller
as drawn when compute begins). The controller counts a GPU in a staged phase (``startup``,
``checkpoint``) as rising on its own at its share (rule 4 of ``policies/capping.py``) until
compute is announced, so a job that announces its checkpoint until it has filled back up
shares the site's ramp with the caps handed back elsewhere, and a step at once after it
would not; a collective longer than the hysteresis is counted the same way while it lasts,
and its step for one window after. When no request has come for ``stale_after_s`` (the
agent stopped, switched smoothing off or lost the broker), the follower lets the draw fall
from where it was, after what is left of the hysteresis, at the last rate and without the
floor, rather than fill for ever on an order nobody repeats. The callback, ``on_fill(node,
{gpu index: watts})``, is called at every sample, at every change of state, and every
``refresh_s`` while the job starts, waits or stops (the target moves with time, between the
agent's samples too).

Guarantees: it never raises into the training loop after construction (a bad
message is counted and dropped; a callback that raises is logged); it only
reads. A fill target never exceeds the GPU's cap (the agent clamps it), so a
forged target can waste energy but cannot move a GPU outside its limits; the
broker's ACL gives only the node's agent write access to its fill topic
(docs/BROKERS.md).
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from powerd.jobhook.publisher import connect_async
from powerd.mqtt.url import BrokerSettings, parse_broker_url
from powerd.protocol import FillRequest, ProtocolError, Topics, check_name, decode
from powerd.ratelimit import LogOncePer

__all__ = ["FillFollower"]

log = logging.getLogger("powerd.jobhook")

OnFill = Callable[[str, dict[int, float]], None]  # (node, {gpu index: watts to hold})


# A target this close under where compute will put its GPU has risen (float rounding, and
# the few watts the last refresh left).
RISEN_WITHIN_W = 1.0
# A GPU that worked within this share of its cap then was held at it: it wanted more, so
# compute resumed takes whatever cap it has now, a cap raised while it waited included (the
# policy's held-at-cap test uses 5 % of the range, rule 3b of policies/capping.py).
HELD_AT_CAP_SHARE = 0.05


class _Gpu:
    """One GPU's newest sample and the profile it came with."""

    __slots__ = (
        "cap_w",
        "floor_w",
        "held_w",
        "hysteresis_s",
        "power_w",
        "rate_w_per_s",
        "resume_at_start_w",
        "resume_at_wait_w",
        "up_w_per_s",
        "worked_cap_w",
        "worked_w",
    )

    def __init__(self) -> None:
        self.power_w = self.worked_w = self.held_w = self.floor_w = self.cap_w = 0.0
        self.worked_cap_w = self.resume_at_start_w = 0.0
        self.resume_at_wait_w = math.inf  # no wait yet: nothing to hold a refill under
        self.rate_w_per_s = self.up_w_per_s = self.hysteresis_s = 0.0


def _resume_w(g: _Gpu) -> float:
    """Where compute puts a GPU when it resumes: its cap, or its draw at work if lower; its
    cap whatever it drew if it worked held at the cap it had then. Found by ``powerd demo
    --smoothing --comm-s 3``: caps handed back just before a collective were never drawn,
    so the draw at work was the old cap, and compute resumed stepped up by the raise on top
    of the fall (99 W a GPU, 12.5 kW for a job, against a 70 W window's share)."""
    if g.worked_w >= g.worked_cap_w * (1.0 - HELD_AT_CAP_SHARE):
        return g.cap_w
    return min(g.cap_w, g.worked_w)


class FillFollower:
    """Follows the agent's fill requests for the GPUs of ``nodes`` (module docstring)."""

    def __init__(
        self,
        broker: str,
        nodes: Iterable[str],
        on_fill: OnFill,
        *,
        cluster: str = "default",
        settings: BrokerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = 0.1,
        stale_after_s: float = 10.0,
    ) -> None:
        if not refresh_s > 0:
            raise ValueError(f"refresh_s must be > 0, not {refresh_s}")
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, not {stale_after_s}")
        self.refresh_s = refresh_s
        self.stale_after_s = stale_after_s
        self._last_request_s: float | None = None
        topics = Topics(check_name(cluster, "cluster"))
        self.nodes = [check_name(n, "node") for n in nodes]
        if not self.nodes:
            raise ValueError("a fill follower needs at least one node")
        self._topics = {topics.fill(n): n for n in self.nodes}
        self._on_fill = on_fill
        self._settings = parse_broker_url(broker, settings or BrokerSettings("localhost", 1883))
        self._clock = clock
        self._cond = threading.Condition()
        self._gpus: dict[str, dict[int, _Gpu]] = {n: {} for n in self.nodes}
        self._state = "working"  # working, starting, waiting, stopping
        self._since = clock()  # when the job entered its state
        self._ends: float | None = None  # when a wait is expected to end, if announced
        self._checkpoint = False  # the wait is a checkpoint, or the refill follows one
        self.received = 0
        self.rejected = 0
        self._logs = LogOncePer(log, 60.0)
        self._client: mqtt.Client | None = None
        self._subscribed = threading.Event()
        self._closed = False
        self._refresher: threading.Thread | None = None

    def start(self) -> None:
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"powerd-fill-{secrets.token_hex(4)}",
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        connect_async(client, self._settings)
        client.loop_start()
        self._client = client
        self._refresher = threading.Thread(
            target=self._refresh, name="powerd-fill-refresh", daemon=True
        )
        self._refresher.start()

    def wait_subscribed(self, timeout_s: float) -> bool:
        """Block until the broker has acknowledged the subscription (False on timeout)."""
        return self._subscribed.wait(timeout_s)

    def starting(self) -> None:
        """The job starts (loading, compiling): raise each GPU's draw from where it was, no
        faster than the ramp-up rate, up to its cap."""
        self._enter("starting")

    def waiting(self, expected_s: float | None = None, *, checkpoint: bool = False) -> None:
        """The job waits (a collective, a checkpoint): let each GPU's draw fall at once, no
        faster than the rate, and no lower than ready to resume within one window's share
        for the hysteresis and on (module docstring). ``expected_s``: how long the
        job expects the wait to last, if it knows (what it announces): each GPU's target
        then also climbs at the ramp-up rate to be back where compute puts it when the wait
        is expected to end, so compute resumes with no step and nothing to fill first;
        a cap handed back during a collective included, but not during a ``checkpoint``,
        whose staged cap climbs with the fill (``fill_back_up``)."""
        ends = None
        if expected_s is not None and math.isfinite(expected_s) and expected_s > 0:
            ends = expected_s
        self._enter("waiting", ends, checkpoint=checkpoint)

    def working(self) -> None:
        """The job works again: nothing to fill above the floor."""
        self._enter("working")

    def stopping(self) -> None:
        """The job's work is done: fall at the rate from where each GPU is, at once (no
        hysteresis: the job will not resume) and without the floor."""
        self._enter("stopping")

    def targets(self, node: str) -> dict[int, float]:
        """Each GPU's target on ``node`` now, W."""
        with self._cond:
            return self._targets(node, self._clock())

    def must_rise_first(self) -> bool:
        """Whether compute resumed now would step some GPU up at once, from where it stands
        (its target, or its draw last sampled if higher), by more than its share of one
        window's rise (``ramp_up × hysteresis``): then fill back up first
        (``starting()``, then ``wait_risen()``). False while the job works, starts or stops,
        and when no request came or the requests went stale (nothing is smoothed)."""
        with self._cond:
            now = self._clock()
            if self._state != "waiting" or self._last_request_s is None or self._stale(now):
                return False
            for node, gpus in self._gpus.items():
                targets = self._targets(node, now)
                for index, g in gpus.items():  # from where it stands: its target or its draw
                    stands_w = max(targets[index], g.power_w)
                    step_w = g.up_w_per_s * g.hysteresis_s + RISEN_WITHIN_W
                    if _resume_w(g) - stands_w > step_w:
                        return True
            return False

    def fill_back_up(self, timeout_s: float, after_checkpoint: bool = False) -> bool:
        """Before compute resumes: after a checkpoint, or when ``must_rise_first()``, raise
        the targets at the ramp-up rate (``starting()``) and wait until they have risen
        (``wait_risen``); otherwise nothing. False only on timeout. The job keeps its wait
        announced until this returns (module docstring)."""
        if not (after_checkpoint or self.must_rise_first()):
            return True
        self._enter("starting", checkpoint=after_checkpoint)
        return self.wait_risen(timeout_s)

    def resume_levels(self, node: str) -> dict[int, float]:
        """Where compute will put each GPU on ``node`` when it resumes, W: its cap, or the
        draw last sampled at work if lower and not held at the cap it had then (what
        ``wait_risen`` waits for)."""
        with self._cond:
            return {index: self._refill_w(g) for index, g in self._gpus[node].items()}

    def _refill_w(self, g: _Gpu) -> float:
        """Where ``wait_risen`` fills a GPU back up to: where compute puts it; after a
        checkpoint, no higher than that was as the checkpoint began. A staged phase's cap
        stands a headroom over the fill and climbs with it, counted by the controller as
        drawn when compute begins: a GPU held at its cap before the checkpoint chased it,
        filling for the whole headroom (95 W, 1.4 s at 70 W/s) while compute waited, and
        compute then stepped up to the new one all the same."""
        if self._state == "starting" and self._checkpoint:
            return min(_resume_w(g), g.resume_at_wait_w)
        return _resume_w(g)

    def wait_risen(self, timeout_s: float) -> bool:
        """Wait until every GPU's target has reached where compute will put it
        (``resume_levels``); False on timeout. True at once when no
        request came, and as soon as the requests go stale (nothing is smoothed)."""

        def rising_for_s(now: float) -> float:
            """How long the targets, rising at their rates, take to reach where compute
            will put them (less the RISEN_WITHIN_W allowed): 0 once every one has, inf
            while one short of it does not rise; each node's targets taken once."""
            if self._last_request_s is None or self._stale(now):
                return 0.0
            left_s = [0.0]
            for n, gpus in self._gpus.items():
                targets = self._targets(n, now)
                for i, g in gpus.items():
                    gap_w = self._refill_w(g) - RISEN_WITHIN_W - targets[i]
                    if gap_w > 0:
                        left_s.append(gap_w / g.up_w_per_s if g.up_w_per_s > 0 else math.inf)
            return max(left_s)

        return self._wait_until(rising_for_s, timeout_s)

    def wait_ramped(self, done_w: float, timeout_s: float) -> bool:
        """Wait until every GPU's target is at most ``done_w`` (its draw without the busy
        work: its idle power, say); False on timeout. True at once when no request came
        at all (no software smoothing on these nodes)."""

        def ramped_in_s(now: float) -> float:
            ramped = all(w <= done_w for n in self.nodes for w in self._targets(n, now).values())
            return 0.0 if ramped else math.inf

        return self._wait_until(ramped_in_s, timeout_s)

    def _wait_until(self, left_s: Callable[[float], float], timeout_s: float) -> bool:
        """Until ``left_s(now)`` (called holding the lock: the seconds it expects to take,
        inf if it cannot tell) is 0, or False at the timeout: looked at again on every
        request and change of state, every 0.1 s (targets move with time, too), and when
        it should be done, if sooner."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                now = self._clock()
                left = left_s(now)
                if left <= 0:
                    return True
                if now >= deadline:
                    return False
                self._cond.wait(min(deadline - now, 0.1, max(left, 0.001)))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        client, self._client = self._client, None
        if client is not None:
            client.disconnect()
            client.loop_stop()
        refresher, self._refresher = self._refresher, None
        if refresher is not None and refresher is not threading.current_thread():
            refresher.join(timeout=1.0)

    def _refresh(self) -> None:
        """While the job starts, waits or stops (or the requests went stale), hand the
        moving targets over every refresh_s."""
        while True:
            with self._cond:
                self._cond.wait(self.refresh_s)
                if self._closed:
                    return
                if self._state == "working" and not self._stale(self._clock()):
                    continue
                now = self._clock()
                calls = [(n, self._targets(n, now)) for n in self.nodes if self._gpus[n]]
            for node, targets in calls:
                self._call(node, targets)

    def _enter(
        self, state: str, ends_after_s: float | None = None, checkpoint: bool = False
    ) -> None:
        with self._cond:
            now = self._clock()
            ends = None if ends_after_s is None else now + ends_after_s
            # the same state again is nothing, but a wait announced during a wait (a
            # checkpoint after a collective): a wait that begins now, from where each GPU is
            if state == self._state and not (state == "waiting" and ends is not None):
                return
            worked = self._state == "working" and not self._stale(now)
            for node, gpus in self._gpus.items():  # go on from where each GPU is: no jump up
                held = self._targets(node, now)
                for index, g in gpus.items():  # leaving work: its last draw sampled at work
                    g.held_w = g.worked_w if worked else held[index]
                    g.resume_at_start_w = _resume_w(g)
                    if state == "waiting":
                        g.resume_at_wait_w = g.resume_at_start_w
                    if state == "starting":  # a target fallen below the GPU's own draw
                        g.held_w = max(g.held_w, g.power_w)  # rises from the draw
                    if state == "working" and not worked:  # until a sample at work comes,
                        # it stands where work found it, not at an earlier work's draw (a
                        # stop 20 ms into work fell at once from its fill to that draw)
                        g.worked_w, g.worked_cap_w = max(held[index], g.power_w), g.cap_w
            self._state, self._since, self._ends = state, now, ends
            self._checkpoint = checkpoint
            self._cond.notify_all()
            calls = [(n, self._targets(n, now)) for n in self.nodes if self._gpus[n]]
        for node, targets in calls:
            self._call(node, targets)

    def _targets(self, node: str, now: float) -> dict[int, float]:
        state, since, ends = self._state, self._since, self._ends
        last = self._last_request_s
        stale_at = None if last is None or not self._stale(now) else last + self.stale_after_s
        out = {}
        for index, g in self._gpus[node].items():
            if stale_at is None:
                out[index] = self._level(g, state, since, now, ends, self._checkpoint)
                continue
            # nobody repeats the order: fall from where it was, no floor, at the last rate
            if state == "working":
                top, pause_s = g.worked_w, g.hysteresis_s
            elif state == "starting":
                top, pause_s = self._level(g, state, since, stale_at), g.hysteresis_s
            elif state == "waiting":  # what is left of its hysteresis, if any
                top = self._level(g, state, since, stale_at, ends, self._checkpoint)
                pause_s = max(0.0, since + g.hysteresis_s - stale_at)
            else:  # stopping: already falling
                top, pause_s = self._level(g, state, since, stale_at), 0.0
            out[index] = self._fallen(g, top, stale_at + pause_s, now)
        return out

    @staticmethod
    def _level(
        g: _Gpu,
        state: str,
        since: float,
        now: float,
        ends: float | None = None,
        checkpoint: bool = False,
    ) -> float:
        """The target in ``state``, entered at ``since`` holding ``g.held_w``; ``ends``:
        when a wait is expected to end (None: unknown); ``checkpoint``: the wait is one."""
        if state == "working":
            return g.floor_w
        if state == "starting":
            return min(g.cap_w, max(g.floor_w, g.held_w + g.up_w_per_s * max(0.0, now - since)))
        if state == "waiting":
            # it may end at any moment: it falls at once, but no lower than ready (compute
            # resumed steps it up by one window's share at most) for as long as a fall held
            # through the hysteresis would have stayed so
            resume_w = min(_resume_w(g), g.resume_at_start_w)  # a cap raised meanwhile: no
            ready_w = min(g.held_w, resume_w - g.up_w_per_s * g.hysteresis_s)  # step at once
            fallen = max(
                FillFollower._fallen(g, g.held_w, since, now),
                min(FillFollower._fallen(g, g.held_w, since + g.hysteresis_s, now), ready_w),
            )
            if ends is not None:  # and back where compute puts it when it should end,
                # never climbing faster than the ramp-up from where it stood; past that,
                # held there through the hysteresis
                # a cap handed back during a collective was counted as drawn when it came
                # (rule 4), and compute resumed takes it: the plan goes there; a checkpoint's
                # staged cap climbs a headroom over the fill, the plan would chase it
                end_w = resume_w if checkpoint else _resume_w(g)
                if now <= ends:
                    planned_w = end_w - g.up_w_per_s * (ends - now)
                else:
                    planned_w = FillFollower._fallen(g, end_w, ends + g.hysteresis_s, now)
                climbed_w = g.held_w + g.up_w_per_s * max(0.0, now - since)
                fallen = max(fallen, min(planned_w, climbed_w))
            return max(g.floor_w, fallen)
        return FillFollower._fallen(g, g.held_w, since, now)  # stopping: it will not resume

    @staticmethod
    def _fallen(g: _Gpu, top_w: float, from_s: float, now: float) -> float:
        return max(0.0, top_w - g.rate_w_per_s * max(0.0, now - from_s))

    def _stale(self, now: float) -> bool:
        last = self._last_request_s
        return last is not None and now - last > self.stale_after_s

    def _call(self, node: str, targets: dict[int, float]) -> None:
        try:
            self._on_fill(node, targets)
        except Exception as exc:  # the training loop's callback: never into paho's thread
            self._logs.warning("callback", time.monotonic(), "fill callback raised: %r", exc)

    def take(self, node: str, request: FillRequest) -> None:
        """Take in one decoded request for ``node`` (one of ``nodes``) and hand the new
        targets to the callback: what every message from the agent comes to."""
        if node not in self._gpus:
            raise ValueError(f"{node!r} is not a node this follower follows")
        with self._cond:
            self.received += 1
            self._last_request_s = self._clock()
            gpus = self._gpus[node]
            for f in request.gpus:
                g = gpus.get(f.index)
                if g is None:
                    g = gpus[f.index] = _Gpu()
                    g.worked_w = g.held_w = f.power_w
                    g.worked_cap_w = f.cap_w
                g.power_w, g.floor_w, g.cap_w = f.power_w, f.floor_w, f.cap_w
                g.rate_w_per_s, g.hysteresis_s = f.ramp_down_w_per_s, f.hysteresis_s
                g.up_w_per_s = f.ramp_up_w_per_s
                if self._state == "working":
                    g.worked_w, g.worked_cap_w = f.power_w, f.cap_w
            targets = self._targets(node, self._clock())
            self._cond.notify_all()
        self._call(node, targets)

    # --- paho's network thread --------------------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self._logs.warning(
                "connect", time.monotonic(), "fill follower: broker refused: %s", reason
            )
            return
        client.subscribe([(topic, 0) for topic in self._topics])

    def _on_subscribe(self, client: Any, userdata: Any, mid: Any, reasons: Any, props: Any) -> None:
        self._subscribed.set()

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        node = self._topics.get(message.topic)
        try:
            if node is None:
                raise ProtocolError(f"not a topic this follower asked for: {message.topic}")
            request = decode(FillRequest, message.payload, node)
        except ProtocolError as exc:
            self.rejected += 1
            self._logs.warning("payload", time.monotonic(), "fill follower: dropped: %s", exc)
            return
        self.take(node, request)
