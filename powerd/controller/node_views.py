"""What each node last told the controller, and whether it is believed.

``NodeViews`` owns the per-node and per-GPU arrays that telemetry and statuses fill
(power, caps and clock locks read back, modes, when each node was last heard from,
the failsafe caps it falls back to) and the plausibility checks that decide whether a
node's telemetry is believed: a node whose telemetry says what a GPU cannot do, or
that sends faster than it may, is treated as a node the controller cannot hear:
counted at its caps (at least its failsafe caps), never commanded, so never handed
watts back on its word.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from policies import Tree
from powerd.controller.counters import CycleCounters, Reject
from powerd.controller.inbox import Waiting
from powerd.controller.settings import ControllerSettings
from powerd.protocol import (
    SOFTWARE_MECHANISM,
    GpuSmoothingState,
    ProtocolError,
    Status,
    Telemetry,
    decode,
)
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import MODES, STALE

log = logging.getLogger("powerd.controller")

# A reported failsafe cap this far above the plan's is a disagreement (rounding is not).
FAILSAFE_TOLERANCE_W = 1.0
# Caps a node reads back in a sample taken less than this after its ack may be the old ones: a
# GPU enforces a new power limit ~0.1 s after it is set (an H200 on driver 580: up to 92 ms,
# docs/HARDWARE.md). Such a sample's power counts; its caps are neither taken nor drift.
CAP_SETTLE_S = 0.5
# A jump in an agent's telemetry seq larger than this is a restart (or nonsense), not a loss.
MAX_SEQ_GAP = 3600
# Plausibility of a node's telemetry (issue 12). A node whose telemetry says what a GPU
# cannot do is treated as a node the controller cannot hear: counted at its caps (at
# least its failsafe caps), never commanded, so never handed watts back on its word.
POWER_OVER_CAP_RATIO = 1.15  # power may exceed the cap by this share (limiter lag, noise)
POWER_OVER_CAP_W = 25.0  # and by this many watts
# ... and by more while a load steps up: a GPU's limiter lets the first ~0.1-0.2 s through (an
# H200 read 911 W under its 700 W limit, and 648 W under 476 W, docs/HARDWARE.md). So a draw
# over that bound is doubted once it has lasted this long (by the controller's clock: a
# sample's own ts could be held still), and at once only beyond this multiple of the model's
# maximum cap, which no GPU draws.
POWER_OVER_CAP_FOR_S = 1.0
POWER_ABSURD_RATIO = 2.0
RANGE_TOLERANCE_W = 1.0  # a cap outside [cap_min, cap_max], or a range not the model's
SEQ_RESTART_MAX = 16  # seq back to this or below is an agent that restarted, not a replay
PLAUSIBLE_TO_CLEAR = 5  # consecutive plausible samples before a node is believed again


class Ingested(NamedTuple):
    """A batch taken in: the valid samples, decoded, and the GPUs whose samples reported
    grid smoothing, each with whether it holds the profile the controller wants (a sample
    too old to say counts as holding it)."""

    samples: list[Telemetry]
    smoothing_ids: list[int]
    smoothing_held: list[bool]


class NodeViews:
    def __init__(
        self,
        tree: Tree,
        settings: ControllerSettings,
        monotonic: Callable[[], float],
        log_once: LogOncePer,
        reject: Reject,
    ) -> None:
        self.tree = tree
        self.settings = settings
        self._monotonic = monotonic
        self._log = log_once
        self._reject = reject
        n_gpus, n_servers = tree.n_gpus, tree.n_servers
        # what a node that cannot be heard falls back to: the plan's failsafe caps, or the
        # agent's own where its status reports a higher one (FAILSAFE_TOLERANCE_W)
        self.failsafe_cap_w = tree.failsafe_cap_w.astype(float).copy()
        self.failsafe_over_plan = np.zeros(n_servers, dtype=bool)
        self.period_s = np.full(n_servers, np.inf)  # as each agent's status says; inf: unknown
        # telemetry that says what no GPU can do: per node, since when, and how often
        self.implausible = np.zeros(n_servers, dtype=bool)
        self.implausible_samples = np.zeros(n_servers, dtype=np.int64)
        # over its allowed telemetry rate at the last check: not believed again until not
        self.over_rate = np.zeros(n_servers, dtype=bool)
        # with a site telemetry period: per node, the least time between two samples
        # decoded (a quarter of the period; 0: none), when the last was received, and how
        # many were dropped since (not lost: telemetry_over_rate)
        self._min_gap_s = [0.0] * n_servers
        self._decoded_at = [-math.inf] * n_servers
        self._rate_skipped = [0] * n_servers
        self._plausible_streak = [0] * n_servers
        self._gpu_cap_min = tree.cap_min_w.tolist()  # lists: read per message, per GPU
        self._gpu_cap_max = tree.cap_max_w.tolist()
        # per GPU, when (monotonic) its draw went over the plausibility bound; NaN: it is not
        self._over_cap_since = [math.nan] * n_gpus
        self.power_w = tree.failsafe_cap_w.astype(float).copy()
        self.cap_w = tree.failsafe_cap_w.astype(float).copy()  # read back from the devices
        self.clock_mhz = np.full(n_gpus, np.nan)  # locks in force, read back
        self.last_seen = np.full(n_servers, -math.inf)  # monotonic receipt of last telemetry
        self._last_seq = [-1] * n_servers  # each agent's last telemetry seq (any size)
        self.mode = np.full(n_servers, "unknown", dtype="<U10")  # as each node last reported
        self.offline = np.zeros(n_servers, dtype=bool)
        # the smoothing state each GPU's telemetry last carried (telemetry carries it when it
        # changes and every SMOOTHING_STATE_EVERY_SAMPLES samples): for the records
        self.smoothing_last: list[GpuSmoothingState | None] = [None] * n_gpus
        # and whether it says the GPU's own hardware smooths (ClusterState.ramps_in_hardware)
        self.ramps_in_hardware = np.zeros(n_gpus, dtype=bool)
        # agent clock (ts) of each node's newest decoded telemetry and of its last ack of ours
        self.sample_ts = np.full(n_servers, -math.inf)
        self.acked_ts = np.full(n_servers, -math.inf)

    # --- telemetry ---------------------------------------------------------------

    def ingest(self, batch: Sequence[Waiting], counters: CycleCounters) -> Ingested:
        """Decode and take in telemetry payloads taken from the inbox.

        The controller's hottest path (docs/CONTROLLER.md, "Scale"): per message only
        the decode (every field validated, as everywhere) and list appends; the arrays
        are written once per batch. A payload the protocol refuses is counted and
        logged, and changes nothing. A node's ``last_seen`` is when its payload was
        received, not when it was decoded. Gaps in a node's ``seq`` that the inbox did
        not replace are counted as ``telemetry_lost``: samples that never reached us.
        """
        names, slices, last_seq = self.tree.server_names, self.tree.server_gpus, self._last_seq
        acked_ts, smoothing_last = self.acked_ts, self.smoothing_last
        in_hardware = self.ramps_in_hardware
        gpu_ids: list[int] = []
        held_ids: list[int] = []
        power: list[float] = []
        cap: list[float] = []
        clock: list[float | None] = []
        servers: list[int] = []
        arrivals: list[float] = []
        sampled: list[float] = []
        modes: list[str] = []
        got = Ingested([], [], [])
        samples, smoothing_ids, smoothing_held = got
        wanted = self.settings.smoothing
        min_gap_s, decoded_at, skipped = self._min_gap_s, self._decoded_at, self._rate_skipped
        lost = over_rate = 0
        for server, payload, arrived, replaced in batch:
            node = names[server]
            if arrived - decoded_at[server] < min_gap_s[server]:
                over_rate += 1  # faster than the site's agents send: not even decoded
                skipped[server] += 1 + replaced
                continue
            decoded_at[server] = arrived
            replaced += skipped[server]
            skipped[server] = 0
            try:
                sample = decode(Telemetry, payload, node)
            except ProtocolError as exc:
                self._reject(node, exc)
                continue
            gpus = slices[server]
            start, n_gpus = gpus.start, len(gpus)
            # Caps read back in a sample taken before the node acked our last command are
            # older than the ack's (they come on another connection), and those of one taken
            # just after it may not be enforced yet (CAP_SETTLE_S): power only.
            current = sample.ts >= acked_ts[server] + CAP_SETTLE_S
            doubt = self._doubt(
                sample, start, n_gpus, last_seq[server], settled=current, arrived=arrived
            )
            if doubt is not None:
                self._disbelieve(server, node, doubt)
            elif self.implausible[server] and not self.over_rate[server]:
                self._plausible_again(server, node)
            for g in sample.gpus:
                if g.index >= n_gpus:
                    self._warn_unknown_gpu(node, g.index, n_gpus)
                    continue
                gpu_ids.append(start + g.index)
                power.append(g.power_w)
                if g.smoothing is not None:  # arrays written once per batch, below
                    # Any sample says the GPU has smoothing (agents send the state only on
                    # change and every SMOOTHING_STATE_EVERY_SAMPLES samples: waiting for a
                    # current one could take many); only a current one says it lost ours.
                    smoothing_last[start + g.index] = g.smoothing
                    in_hardware[start + g.index] = g.smoothing.enabled and (
                        g.smoothing.mechanism != SOFTWARE_MECHANISM
                    )
                    smoothing_ids.append(start + g.index)
                    smoothing_held.append(
                        not current
                        or (
                            wanted is not None
                            and g.smoothing.enabled == wanted.enabled
                            and g.smoothing.preset == wanted.preset
                        )
                    )
                if current:
                    held_ids.append(start + g.index)
                    cap.append(g.cap_w)
                    clock.append(g.max_sm_clock_mhz)
            previous = last_seq[server]
            gap = sample.seq - previous - 1
            if 0 < gap <= MAX_SEQ_GAP and previous >= 0:  # lower: the agent restarted
                lost += max(0, gap - replaced)
            last_seq[server] = sample.seq
            servers.append(server)
            arrivals.append(arrived)
            sampled.append(sample.ts)
            modes.append(sample.mode)
            samples.append(sample)
        self._write_batch(gpu_ids, power, held_ids, cap, clock)
        self._write_heard(servers, arrivals, sampled, modes)
        counters.telemetry_lost += lost
        counters.telemetry_over_rate += over_rate
        return got

    def _write_batch(
        self,
        gpu_ids: list[int],
        power: list[float],
        held_ids: list[int],
        cap: list[float],
        clock: list[float | None],
    ) -> None:
        """A batch's power, and the caps and clock locks of its current samples."""
        if gpu_ids:
            self.power_w[gpu_ids] = power
        if held_ids:
            self.cap_w[held_ids] = cap
            self.clock_mhz[held_ids] = np.array(clock, dtype=float)  # None (no lock): NaN

    def _write_heard(
        self, servers: list[int], arrivals: list[float], sampled: list[float], modes: list[str]
    ) -> None:
        if servers:
            # a batch may hold one node twice only if fed by hand: the newest arrival wins
            self.last_seen[servers] = np.maximum(self.last_seen[servers], arrivals)
            self.sample_ts[servers] = sampled
            self.mode[servers] = modes
            self.offline[servers] = False

    def _warn_unknown_gpu(self, node: str, index: int, n_gpus: int) -> None:
        self._log.warning(
            f"gpuidx-{node}",
            self._monotonic(),
            "node %s reports GPU %d; the budgets file gives it %d",
            node,
            index,
            n_gpus,
        )

    # --- plausibility ------------------------------------------------------------

    def allowed_hz(self) -> np.ndarray:
        """Per node, the telemetry rate it may send at: twice the rate its status reports
        (else ``telemetry_max_hz``), and never more than twice the site's agents'
        (``telemetry_period_s``), whatever its status says."""
        known = np.isfinite(self.period_s)
        allowed_hz = np.where(known, 2.0 / self.period_s, self.settings.telemetry_max_hz)
        site_period_s = self.settings.telemetry_period_s
        if site_period_s is not None:
            allowed_hz = np.minimum(allowed_hz, 2.0 / site_period_s)
        return allowed_hz

    def check_rates(self, received: np.ndarray, seconds: float) -> None:
        """``received``: telemetry per node over the last ``seconds`` (the inbox's count). A
        node over the rate it may send at (``allowed_hz``) is implausible, as a sample no
        GPU could send is, until it is back under it; with a site telemetry period, its
        samples are decoded at most at twice that rate meanwhile."""
        if seconds <= 0:
            return
        allowed_hz = self.allowed_hz()
        limit = allowed_hz * seconds + 2  # +2: samples early or late by a little are no rate
        self.over_rate = received > limit
        if self.settings.telemetry_period_s is not None:
            self._min_gap_s = (0.5 / allowed_hz).tolist()
        for server in np.flatnonzero(self.over_rate).tolist():
            node = self.tree.server_names[server]
            seen_hz = float(received[server]) / seconds
            self._disbelieve(
                server,
                node,
                f"{seen_hz:.1f} telemetry messages a second, allowed {allowed_hz[server]:g}",
            )

    def _doubt(
        self,
        sample: Telemetry,
        start: int,
        n_gpus: int,
        previous_seq: int,
        settled: bool,
        arrived: float,
    ) -> str | None:
        """Why this sample cannot be true, or None. Cheap: a few comparisons per GPU.

        A GPU's draw may pass 1.15 x its cap + 25 W for a moment: its limiter lets the first
        ~0.1-0.2 s of a load step through (``POWER_OVER_CAP_FOR_S``). A sample taken less
        than ``CAP_SETTLE_S`` after the node's ack (not ``settled``) may also catch a GPU
        between a cut and its draw following it (an H200: the enforced limit reads the cut
        after up to 92 ms, the draw is within 2 % of it after 66-144 ms, docs/HARDWARE.md):
        its power is held to the GPU's maximum cap, not to the cap it reports. ``arrived``:
        when the sample was received (monotonic)."""
        if SEQ_RESTART_MAX < sample.seq <= previous_seq:
            return f"seq went back from {previous_seq} to {sample.seq}"
        cap_min, cap_max, over_since = self._gpu_cap_min, self._gpu_cap_max, self._over_cap_since
        why: str | None = None
        for g in sample.gpus:
            if g.index >= n_gpus:
                continue  # logged where the sample is taken in
            k = start + g.index
            if g.power_w > cap_max[k] * POWER_ABSURD_RATIO:
                return (
                    f"gpu {g.index} draws {g.power_w:.0f} W, over {POWER_ABSURD_RATIO:g} x its "
                    f"model's {cap_max[k]:.0f} W maximum cap"
                )
            bound_w = g.cap_w if settled else max(g.cap_w, cap_max[k])
            if g.power_w <= bound_w * POWER_OVER_CAP_RATIO + POWER_OVER_CAP_W:
                over_since[k] = math.nan
            elif math.isnan(over_since[k]):
                over_since[k] = arrived  # a load step, perhaps: doubted if it lasts
            elif why is None and arrived - over_since[k] >= POWER_OVER_CAP_FOR_S:
                why = (
                    f"gpu {g.index} draws {g.power_w:.0f} W over its {bound_w:.0f} W cap, "
                    f"over it for {arrived - over_since[k]:.1f} s"
                )
            if why is None and (
                abs(g.cap_min_w - cap_min[k]) > RANGE_TOLERANCE_W
                or abs(g.cap_max_w - cap_max[k]) > RANGE_TOLERANCE_W
                or not g.cap_min_w - RANGE_TOLERANCE_W <= g.cap_w <= g.cap_max_w + RANGE_TOLERANCE_W
            ):
                why = (
                    f"gpu {g.index} reports cap {g.cap_w:.0f} W in [{g.cap_min_w:.0f}, "
                    f"{g.cap_max_w:.0f}] W; its model's range is [{cap_min[k]:.0f}, "
                    f"{cap_max[k]:.0f}] W"
                )
        return why

    def _disbelieve(self, server: int, node: str, why: str) -> None:
        self.implausible[server] = True
        self.implausible_samples[server] += 1
        self._plausible_streak[server] = 0
        self._log.warning(
            f"implausible-{node}",
            self._monotonic(),
            "node %s: implausible telemetry (%s): counted at its caps and not commanded until "
            "%d plausible samples in a row (%d implausible so far)",
            node,
            why,
            PLAUSIBLE_TO_CLEAR,
            int(self.implausible_samples[server]),
        )

    def _plausible_again(self, server: int, node: str) -> None:
        """One more plausible sample of an implausible node: believed after enough."""
        self._plausible_streak[server] += 1
        if self._plausible_streak[server] >= PLAUSIBLE_TO_CLEAR:
            self.implausible[server] = False
            log.info("node %s: telemetry plausible again", node)

    # --- statuses ----------------------------------------------------------------

    def take_status(self, server: int, node: str, status: Status) -> None:
        if status.failsafe_cap_w is not None:
            self._take_failsafe_cap(server, node, status.failsafe_cap_w)
        if status.period_s is not None:
            self.period_s[server] = status.period_s
        self.offline[server] = status.state == "offline"
        if status.state == "offline":
            log.warning(
                "node %s is offline: counted at its last caps (at least its failsafe caps)", node
            )

    def _take_failsafe_cap(self, server: int, node: str, reported_w: float) -> None:
        gpus = self.tree.server_gpus[server]
        planned_w = self.tree.failsafe_cap_w[gpus]
        over = reported_w > float(planned_w.max()) + FAILSAFE_TOLERANCE_W
        self.failsafe_over_plan[server] = over
        self.failsafe_cap_w[gpus] = np.maximum(planned_w, reported_w) if over else planned_w
        if over:
            self._log.warning(
                f"failsafe-{node}",
                self._monotonic(),
                "node %s falls back to failsafe caps up to %.0f W, above the budgets file's "
                "%.0f W: the budgets were proven for the file's caps; set failsafe.cap_w in its "
                "agent config to at most that (it is counted at its own meanwhile)",
                node,
                reported_w,
                float(planned_w.max()),
            )

    def in_mode(self, mode: str) -> np.ndarray:
        modes: np.ndarray = self.mode == mode
        return modes

    def unheard(self, now: float, stale_after_s: float) -> np.ndarray:
        """The servers not heard from for over ``stale_after_s`` at ``now``, or offline."""
        unheard: np.ndarray = ((now - self.last_seen) > stale_after_s) | self.offline
        return unheard

    def by_mode(self, now: float, stale_after_s: float) -> dict[str, int]:
        """Servers counted by the mode each last reported (``MODES``), the :meth:`unheard`
        ones as ``STALE`` whatever they reported: every server once."""
        stale = self.unheard(now, stale_after_s)
        heard = ~stale
        counts = {mode: int(np.count_nonzero((self.mode == mode) & heard)) for mode in MODES}
        counts[STALE] = int(np.count_nonzero(stale))
        return counts

    def with_last_smoothing(self, sample: Telemetry) -> Telemetry:
        """``sample`` with each GPU that carries no smoothing state given the one its
        telemetry last carried, if any: what it holds, for a record of it (a state is sent
        when it changes and every SMOOTHING_STATE_EVERY_SAMPLES samples, not every time)."""
        server = self.tree.server_ordinal.get(sample.node)
        if server is None:
            return sample
        start, count = self.tree.server_gpus[server].start, len(self.tree.server_gpus[server])
        for g in sample.gpus:
            if g.smoothing is None and g.index < count:
                g.smoothing = self.smoothing_last[start + g.index]
        return sample
