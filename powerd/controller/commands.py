"""What the controller asked of each node, and the commands that change it.

``CommandPlanner`` owns the command window: what each GPU was commanded (caps, clock
locks, the grid smoothing profile, clock policies through ``ClockGrants``), which
commands are in flight and when they are resent, the acks that answer them, and
drift (a node found holding other caps or locks than commanded is commanded back).
It turns a decision into per-node commands: sent only when a node's caps or clock
locks change, resent when not acknowledged in time. A node that cannot be heard is
not commanded: by construction it holds its failsafe caps on its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policies import ClusterState, Decision, Tree
from policies.turns import CAP_TOLERANCE_W, Turns, serve_raises
from powerd.controller.clock_grants import ClockGrants, ClockPolicies, same
from powerd.controller.counters import CycleCounters
from powerd.controller.jobs import JobRegistry
from powerd.controller.node_views import CAP_SETTLE_S, NodeViews
from powerd.controller.settings import ControllerSettings
from powerd.protocol import Ack, Command, CommClock, GpuCommand
from powerd.ratelimit import LogOncePer
from powerd.vocabulary import PROTOCOL_VERSION

# A node found holding other caps than commanded is commanded again at most this often.
DRIFT_RETRY_S = 10.0
# A command still not acknowledged ack_timeout_s after it was sent is resent; each resend
# since the node's last ack doubles that wait, up to 2**this times: agents (or a broker) that
# are slow to answer are not sent every command again each ack_timeout_s
RESEND_MAX_DOUBLINGS = 3
# While nodes are handed watts back in turn, a raise smaller than this share of a GPU's range
# (20 W on a 200-1200 W GB200) is not sent, unless it is the last to its maximum: it is what
# is left of a breaker's room shared out (the site's last 100 kW to 82,944 GPUs, 20 W a
# command), and the nodes keep their caps, which is safe
RAISE_WORTH_FRACTION = 0.02


@dataclass(frozen=True)
class Changes:
    """Per GPU, what a decision changes: its cap, its clock lock (said explicitly),
    whether that change is urgent (a cut, a clock unlocked or raised), and whether the
    GPU still needs the grid smoothing profile."""

    cap: np.ndarray
    clock: np.ndarray
    urgent: np.ndarray
    smooth: np.ndarray


class CommandPlanner:
    def __init__(
        self,
        tree: Tree,
        settings: ControllerSettings,
        views: NodeViews,
        turns: Turns,
        clocks: tuple[Callable[[], float], Callable[[], float]],
        log_once: LogOncePer,
    ) -> None:
        self.tree = tree
        self.settings = settings
        self.views = views
        self.turns = turns
        self._monotonic, self._wall = clocks
        self._log = log_once
        n_gpus, n_servers = tree.n_gpus, tree.n_servers
        self.epoch = 0
        self.seq = 0
        # what we asked of each server and whether it was acknowledged
        self.commanded_cap_w = np.full(n_gpus, np.nan)
        self.commanded_clock = np.full(n_gpus, np.nan)
        self.pending: dict[int, tuple[int, float]] = {}  # server -> (seq, sent at)
        # Grid smoothing, per GPU: it reports hardware smoothing; the seq of the command
        # that carried our profile (-1: not sent since we last knew what it holds); it
        # refused the profile (not asked again under this epoch).
        self.smoothing_capable = np.zeros(n_gpus, dtype=bool)
        self.smoothing_sent_seq = np.full(n_gpus, -1, dtype=np.int64)
        self.smoothing_refused = np.zeros(n_gpus, dtype=bool)
        self.grants = ClockGrants(tree, settings)
        # servers we could not command since they were last commanded: what they hold is
        # read back from their telemetry when they are back (track_holdings)
        self._returning = np.zeros(n_servers, dtype=bool)
        # per server: the seq of its newest command, and of the newest it acknowledged
        self._sent_seq = np.full(n_servers, -1, dtype=np.int64)
        self._acked_seq = np.full(n_servers, -1, dtype=np.int64)
        # per server, commands resent since its last ack: each doubles the wait for the next
        self.resends_unacked = np.zeros(n_servers, dtype=np.int64)
        self._drift_retry_at = np.full(n_servers, -math.inf)  # monotonic
        # found holding other caps than commanded: commanded back to our decision, never
        # re-decided from what they hold (a replayed command must not become ours)
        self._drifted = np.zeros(n_servers, dtype=bool)
        self._clock_drifted = np.zeros(n_gpus, dtype=bool)  # its clock, per GPU

    # --- acks ----------------------------------------------------------------------

    def on_ack(self, server: int, node: str, ack: Ack, counters: CycleCounters) -> None:
        """Take in a node's ack of one of our commands."""
        pending = self.pending.get(server)
        newest_unacked = ack.seq == self._sent_seq[server] > self._acked_seq[server]
        if pending is None and ack.epoch == self.epoch and newest_unacked:
            # the ack of the newest command it was sent, late: the node went stale and its
            # command was dropped. What it holds now is this, not what older samples say.
            counters.acks_late += 1
        elif ack.epoch != self.epoch or pending is None or ack.seq < pending[0]:
            return  # an old command's ack (or one taken already)
        self.pending.pop(server, None)
        self._acked_seq[server] = ack.seq
        self.resends_unacked[server] = 0
        if ack.result == "stale":
            # It holds a newer command of this epoch than ours: not one we sent. Not
            # applied: asked again (a newer seq) next cycle, and drift checks what it holds.
            counters.acks_stale += 1
            self._log.warning(
                f"ack-{node}",
                self._monotonic(),
                "node %s: command %d acknowledged as stale: the node applied a command of "
                "epoch %d that this controller did not send",
                node,
                ack.seq,
                ack.epoch,
            )
            self.forget_commanded(server)
            return
        counters.acks_received += 1
        self.views.acked_ts[server] = ack.ts
        self._take_acked_gpus(server, node, ack)
        if ack.result in ("partial", "rejected"):
            self._log.warning(
                f"ack-{node}",
                self._monotonic(),
                "node %s: command %d %s: %s",
                node,
                ack.seq,
                ack.result,
                "; ".join(e.message for e in ack.errors),
            )
            if ack.result == "rejected":  # ask again next cycle
                self.forget_commanded(server)

    def _take_acked_gpus(self, server: int, node: str, ack: Ack) -> None:
        """What each GPU of an applied ack holds, and whether it took our profile and
        clock policy."""
        gpus, views, grants = self.tree.server_gpus[server], self.views, self.grants
        for g in ack.gpus:
            if g.index < len(gpus) and g.cap_w is not None:
                views.cap_w[gpus.start + g.index] = g.cap_w
                lock = g.max_sm_clock_mhz
                views.clock_mhz[gpus.start + g.index] = np.nan if lock is None else lock
            gpu = gpus.start + g.index
            carried = g.index < len(gpus) and self.smoothing_sent_seq[gpu] == ack.seq
            if carried and g.smoothing is None:  # carried our profile; not applied
                self.smoothing_refused[gpu] = True
            granted = g.index < len(gpus) and grants.sent_seq[gpu] == ack.seq
            if granted and g.comm_clock is not None and ack.result != "rejected":
                grants.acked[server] = min(grants.acked[server], self._monotonic())
            if granted and g.comm_clock is None:  # an agent that does not know clock policies
                grants.refused[gpu] = True
                self._log.warning(
                    f"comm-clock-{node}",
                    self._monotonic(),
                    "node %s takes no clock policy (an older agent?): the controller locks "
                    "its clocks in communication itself",
                    node,
                )

    def smoothing_seen(self, gpu_ids: list[int], holds_ours: list[bool]) -> None:
        """GPUs that report smoothing (hardware or software) can be asked for ours; one
        that no longer holds ours (its agent restarted and restored its own, say) and has
        no command of ours in flight is asked again."""
        ids = np.asarray(gpu_ids, dtype=np.intp)
        self.smoothing_capable[ids] = True
        lost = ids[~np.asarray(holds_ours, dtype=bool)]
        if self.settings.smoothing is None or not len(lost):
            return
        lost = lost[self.smoothing_sent_seq[lost] >= 0]
        in_flight = np.isin(self.tree.gpu_server_ordinal[lost], list(self.pending))
        self.smoothing_sent_seq[lost[~in_flight]] = -1

    # --- commands --------------------------------------------------------------------

    def commands(
        self,
        decision: Decision,
        live: np.ndarray,
        now: float,
        counters: CycleCounters,
        registry: JobRegistry,
    ) -> list[tuple[str, Command]]:
        """Commands for the nodes whose caps or clock locks change, and resends.

        Cuts and clocks unlocked (or raised) go out at once, whatever their number, but
        for a levelling's (rule 3c of ``policies.capping``: watts moved between GPUs of one
        class between the bands, which no limit needs; after a glide cut in turn,
        ``_cut_in_turn``, every node of a site may be levelled). A
        command that only hands watts back, or levels, locks a clock (or lowers a lock), restates
        what a node holds after a new epoch, or resends one not acknowledged waits its
        turn when more than ``max_raises_per_cycle`` want one: resends first, then the
        nodes whose GPUs still need the grid smoothing profile, then those whose turn to
        be handed watts back it is (``_uncap_in_turn``), then the rest round robin.
        Those left keep their lower caps, or their clocks unlocked, a cycle or more
        longer, which is safe. The bound is a window: the commands still in flight (sent,
        unanswered, not yet overdue; resends not counted) count against it, so raises
        follow the pace at which agents and the broker answer (with acks within a cycle,
        the whole bound). That bounds the flood when a whole site
        uncaps at once, when a job of 10,000 nodes whose agents take no clock policy
        enters communication (a lock saves energy and can wait; an unlock is what
        compute waits for), and when agents (or the broker) are slow to answer 20,000
        commands: each resend since a node's last ack doubles its wait for the next
        (``RESEND_MAX_DOUBLINGS``), and they go out a bounded number a cycle.
        """
        policies = self.grants.policies(now, registry)
        counters.clock_policy_gpus = int(policies.follows.sum())
        changes = self._changes(decision, policies)
        overdue = self._overdue(now, counters)
        send = self._to_send(changes, live, overdue, counters)
        return self._send(send, decision, changes, policies, overdue, now, counters)

    def _changes(self, decision: Decision, policies: ClockPolicies) -> Changes:
        """What ``decision`` changes of what each GPU was commanded (``Changes``)."""
        cap_max = self.tree.cap_max_w
        commanded_cap_w = self.commanded_cap_w
        cap_changed = ~(np.abs(decision.cap_w - commanded_cap_w) <= CAP_TOLERANCE_W)
        # the last fraction of a watt back to cap_max is sent too: else the GPU stays "capped"
        cap_changed |= (decision.cap_w >= cap_max) & ~(commanded_cap_w >= cap_max)
        want_clock, had_clock = decision.max_sm_clock_mhz, self.commanded_clock
        clock_moved = ~same(want_clock, had_clock)
        clock_moved &= ~policies.follows  # the job's announcements move those clocks
        # What a node holds is unknown (new epoch, forgotten): say its clock explicitly, so a
        # lock left by an earlier leader or command is removed (null) rather than kept (absent).
        # So does a command that grants or ends a clock policy: the controller's own lock,
        # until the job's next announcement.
        unknown = np.isnan(commanded_cap_w)
        drifted = self._drifted[self.tree.gpu_server_ordinal]  # commanded back; its clock too
        cap_changed |= drifted
        clock_changed = clock_moved | unknown | policies.changed | self._clock_drifted
        holds = np.where(unknown | drifted, self.views.cap_w, commanded_cap_w)
        levelled = decision.levelled if len(decision.levelled) else np.zeros_like(cap_changed)
        if self.turns.uncap_turn is not None:  # in turn, a raise of a few watts is not worth one,
            worth_w = RAISE_WORTH_FRACTION * (cap_max - self.tree.cap_min_w)  # nor the cut
            rise_w = decision.cap_w - holds  # a levelling trades for it
            small = (np.abs(rise_w) < worth_w) & (decision.cap_w < cap_max)
            cap_changed &= ~(small & ((rise_w > 0) | levelled))
        # a levelling's cut gives watts no limit needs: it waits its turn with the raises
        cut = cap_changed & (decision.cap_w < holds - CAP_TOLERANCE_W) & ~levelled
        with np.errstate(invalid="ignore"):  # NaN: no lock
            freed = clock_moved & (np.isnan(want_clock) | (want_clock > had_clock))
        urgent = cut | (freed & ~(unknown & np.isnan(want_clock)))
        smooth = np.zeros(self.tree.n_gpus, dtype=bool)
        if self.settings.smoothing is not None:  # not urgent: served with the raises
            smooth = self.smoothing_capable & ~self.smoothing_refused
            smooth &= self.smoothing_sent_seq < 0
        return Changes(cap_changed, clock_changed, urgent, smooth)

    def _overdue(self, now: float, counters: CycleCounters) -> np.ndarray:
        """Per server, its command in flight is not acknowledged in time (a resend due)."""
        overdue = np.zeros(self.tree.n_servers, dtype=bool)
        backoff = 2.0 ** np.minimum(self.resends_unacked, RESEND_MAX_DOUBLINGS)
        # in flight: sent and still expected; a resend is not counted, so nodes that never
        # answer (their acks refused by the broker, say) do not hold the window shut
        n_in_flight = 0
        for server, (_, sent_at) in self.pending.items():
            overdue[server] = now - sent_at > self.settings.ack_timeout_s * backoff[server]
            n_in_flight += int(not overdue[server] and self.resends_unacked[server] == 0)
        counters.commands_in_flight = n_in_flight
        return overdue

    def _to_send(
        self, changes: Changes, live: np.ndarray, overdue: np.ndarray, counters: CycleCounters
    ) -> np.ndarray:
        """The servers commanded this cycle: every urgent one, and of the others as many as
        the window lets through (``policies.turns.serve_raises``)."""
        ordinal, n_servers = self.tree.gpu_server_ordinal, self.tree.n_servers

        def any_per_server(mask: np.ndarray) -> np.ndarray:
            return np.bincount(ordinal, weights=mask, minlength=n_servers) > 0

        needs_profile = any_per_server(changes.smooth)
        changed = any_per_server(changes.cap | changes.clock)
        wanted = live & (changed | needs_profile | overdue)
        must = wanted & any_per_server(changes.urgent)
        raises = np.flatnonzero(wanted & ~must)
        # a window: no more than max_raises_per_cycle commands in flight (cuts go anyway)
        budget = max(0, self.settings.max_raises_per_cycle - counters.commands_in_flight)
        raises, counters.raises_deferred = serve_raises(
            raises, overdue[raises], needs_profile[raises], budget, self.turns
        )
        return np.sort(np.concatenate([np.flatnonzero(must), raises]))

    def _send(
        self,
        send: np.ndarray,
        decision: Decision,
        changes: Changes,
        policies: ClockPolicies,
        overdue: np.ndarray,
        now: float,
        counters: CycleCounters,
    ) -> list[tuple[str, Command]]:
        """A command to each of ``send``, and what was commanded remembered."""
        # a resend (no ack) says our profile again where it was carried and not refused
        resmooth = self.smoothing_capable & ~self.smoothing_refused
        out: list[tuple[str, Command]] = []
        for server in send.tolist():
            late = bool(overdue[server])
            if late:
                counters.acks_missing += 1
                counters.resends += 1
                self.forget_commanded(server)
                self.resends_unacked[server] += 1
            elif server in self.pending:
                counters.superseded += 1
            gpus = self.tree.server_gpus[server]
            self.seq += 1
            command = Command(
                v=PROTOCOL_VERSION,
                epoch=self.epoch,
                seq=self.seq,
                ts=self._wall(),
                ttl_s=self.settings.command_ttl_s,
                gpus=self._entries(server, decision, changes, policies, late, resmooth),
            )
            out.append((self.tree.server_names[server], command))
            self.pending[server] = (self.seq, now)
            self._sent_seq[server] = self.seq
            self._drifted[server] = False
            self._clock_drifted[gpus.start : gpus.stop] = False
            self.commanded_cap_w[gpus.start : gpus.stop] = decision.cap_w[gpus.start : gpus.stop]
            self.commanded_clock[gpus.start : gpus.stop] = decision.max_sm_clock_mhz[
                gpus.start : gpus.stop
            ]
            self.grants.sent(server, gpus, policies)
            counters.commands_sent += 1
        return out

    def _entries(
        self,
        server: int,
        decision: Decision,
        changes: Changes,
        policies: ClockPolicies,
        late: bool,
        resmooth: np.ndarray,
    ) -> list[GpuCommand]:
        """The GPUs of ``server``'s command ``self.seq``: each its cap; its clock lock where
        it changes (or on a resend), our smoothing profile where wanted, and its clock
        policy where granted."""
        smoothing, grants = self.settings.smoothing, self.grants
        entries = []
        for local, i in enumerate(self.tree.server_gpus[server]):
            clock = decision.max_sm_clock_mhz[i]
            entry = GpuCommand(index=local, cap_w=float(decision.cap_w[i]))
            if late or changes.clock[i]:
                entry.max_sm_clock_mhz = None if np.isnan(clock) else float(clock)
            if smoothing is not None and (changes.smooth[i] or (late and resmooth[i])):
                entry.smoothing = smoothing
                self.smoothing_sent_seq[i] = self.seq
            if policies.granted[i]:
                job, owner = grants.key_list[policies.job[server]]
                entry.comm_clock = CommClock(
                    job=job, owner=owner, max_sm_clock_mhz=float(policies.clock_mhz[i])
                )
                grants.sent_seq[i] = self.seq
            entries.append(entry)
        return entries

    # --- what nodes hold -------------------------------------------------------------

    def track_holdings(self, now: float, live: np.ndarray, counters: CycleCounters) -> None:
        """What each node holds, as far as commands go.

        A node in failsafe holds its failsafe caps, not what we last asked: it is asked
        again (every cycle, until it leaves failsafe). A node we cannot command (silent,
        offline, local) keeps no pending command; when it is back, what it holds is read
        from its first fresh telemetry and it is commanded only where that differs from
        the decision. So a node that was only stale (or a controller that fell behind)
        costs no command at all, and a burst of returning nodes is no burst of commands.

        Drift: a node with no command pending whose telemetry, sampled after it acked our
        last command, shows caps or a clock lock other than what we asked (an old
        leader's command applied late, a replayed one, a hand-set cap, a restart we did not
        see) is commanded back to what we asked: the decision starts from our command, not
        from what it holds (a drifted cap is never adopted as our own: ``as_commanded``),
        and where it drifted up, that command is a cut, sent at once. At most once
        per ``DRIFT_RETRY_S`` per node, since a GPU that refuses a value would drift forever.
        """
        failsafe = live & self.views.in_mode("failsafe")
        for server in np.flatnonzero(failsafe).tolist():
            self.forget_commanded(server)
        self._returning[failsafe] = False
        for silent in [s for s in self.pending if not live[s]]:
            del self.pending[silent]
            self.resends_unacked[silent] = 0  # back, it starts afresh
        self._returning |= ~live
        decoded_fresh = (now - self.views.last_seen) <= self.settings.stale_after_s
        back = live & self._returning & decoded_fresh
        if back.any():
            self._adopt_read_back(back)
            self._returning[back] = False
        # heard from (a payload waiting) but not yet decoded since it was away: not yet
        live &= ~self._returning
        self._check_drift(now, live & decoded_fresh & ~failsafe, counters)

    def as_commanded(self, state: ClusterState, now: float) -> ClusterState:
        """``state`` with the GPUs of nodes found drifted within ``DRIFT_RETRY_S`` at the
        caps we commanded: the decision starts from our command, never from the drifted
        caps (``track_holdings``), and a GPU that refuses our cap is not re-decided from
        what it holds every cycle until the next retry."""
        recent = now < self._drift_retry_at[self.tree.gpu_server_ordinal]
        drifted = recent & ~np.isnan(self.commanded_cap_w)
        if not drifted.any():
            return state
        cap_w = np.where(drifted, self.commanded_cap_w, state.cap_w)
        return dataclasses.replace(state, cap_w=cap_w)

    def _check_drift(self, now: float, candidates: np.ndarray, counters: CycleCounters) -> None:
        views = self.views
        pending = np.zeros(len(candidates), dtype=bool)
        pending[list(self.pending)] = True
        settled = candidates & ~pending & (views.sample_ts >= views.acked_ts + CAP_SETTLE_S)
        settled &= now >= self._drift_retry_at
        if not settled.any():
            return
        gpus = settled[self.tree.gpu_server_ordinal]
        commanded_cap, commanded_clock = self.commanded_cap_w, self.commanded_clock
        known = ~np.isnan(commanded_cap)
        cap_off = known & ~(np.abs(views.cap_w - commanded_cap) <= CAP_TOLERANCE_W)
        clock_off = known & ~(
            (np.isnan(commanded_clock) & np.isnan(views.clock_mhz))
            | (commanded_clock == views.clock_mhz)
        )
        clock_off &= np.isnan(self.grants.sent_mhz)  # under a policy: the job's announcements
        off = gpus & (cap_off | clock_off)
        if not off.any():
            return
        drifted = (
            np.bincount(self.tree.gpu_server_ordinal, weights=off, minlength=len(candidates)) > 0
        )
        self._drifted |= drifted
        self._clock_drifted |= gpus & clock_off
        self._drift_retry_at[drifted] = now + DRIFT_RETRY_S
        counters.nodes_drifted += int(drifted.sum())
        first = self.tree.server_names[int(np.flatnonzero(drifted)[0])]
        self._log.warning(
            "drift",
            now,
            "%d nodes hold caps or clock locks other than commanded (%s first): commanded again",
            int(drifted.sum()),
            first,
        )

    def _adopt_read_back(self, servers: np.ndarray) -> None:
        """Take what these servers report they hold as what they were commanded."""
        gpus = servers[self.tree.gpu_server_ordinal]
        self.commanded_cap_w[gpus] = self.views.cap_w[gpus]
        self.commanded_clock[gpus] = self.views.clock_mhz[gpus]

    # --- epochs ----------------------------------------------------------------------

    def new_epoch(self, epoch: int) -> None:
        """Lead under a new epoch: every node is commanded afresh."""
        self.epoch = epoch
        self.seq = 0
        self.pending.clear()
        self.resends_unacked[:] = 0  # nothing of ours is unanswered: backoffs start afresh
        self._returning[:] = False
        self.views.acked_ts[:] = -math.inf
        self._drifted[:] = False
        self._clock_drifted[:] = False
        self._sent_seq[:] = -1
        self._acked_seq[:] = -1
        self.commanded_cap_w[:] = np.nan
        self.commanded_clock[:] = np.nan
        self.smoothing_sent_seq[:] = -1
        self.smoothing_refused[:] = False
        self.grants.reset()

    def forget_commanded(self, server: int) -> None:
        """What ``server`` was commanded is unknown: read back, and commanded afresh."""
        gpus = self.tree.server_gpus[server]
        self.commanded_cap_w[gpus.start : gpus.stop] = np.nan
        self.commanded_clock[gpus.start : gpus.stop] = np.nan
        self.smoothing_sent_seq[gpus.start : gpus.stop] = -1
        self.grants.forget(server, gpus)
        self.pending.pop(server, None)
        self._drifted[server] = False  # what it holds is read back: nothing to command back
        self._clock_drifted[gpus.start : gpus.stop] = False
