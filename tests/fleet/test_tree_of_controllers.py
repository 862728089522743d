"""A tree of controllers as real processes over one real Mosquitto: three leaf controllers
(``powerd controller --scope rowN``), a standby leaf for row2, a site coordinator and its
standby, and one ``powerd fleet`` per row, on the shipped 3-row example site
(``powerd/data/budgets/tree-3rows.toml``).

One test, in phases that share the processes (each phase's checks say which it is):

1. **pushes**: fleets at a low base load push racks over their capping threshold; each
   row's leaf brings them back within two of its cycles.
2. **priority across rows**: fleets at full power with one job per row (row1 high, row2
   normal, row3 low) want more than the site's pool: the coordinator cuts the low row
   first, the high row gets what it wants.
3. **a leaf killed** (SIGKILL): row2's standby leads within its takeover bound, under the
   grant it took as a standby; the other rows never notice (no failsafe, one epoch, their
   leaders unchanged).
4. **the coordinator killed** (SIGKILL): its standby grants before the leaves' grants
   expire, so no leaf leaves a live grant; then the standby killed too: the leaves hold
   their last grants for the TTL, then min(grant, file budget) for another TTL, then their
   file budgets, and the agents never lose their leaves.

Over the whole run every summary the leaves sent is checked: the budgets in force never
sum above the pool, no row measured above its limit, the site's measured power (the sum
of the rows': the site has no overhead of its own here) under its capping threshold.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import powerd
from powerd.controller.config import ControllerConfig
from powerd.coordinator.config import CoordinatorConfig
from powerd.fleet.app import fleet_argv
from powerd.protocol import Grant, Heartbeat, Summary, Topics, decode
from powerd.signing import generate_key_files
from powerd.topology import load_budgets
from powerd.topology.scope import leaf_pool_w, parse_scope, scoped
from tests.support.brokers import Mosquitto, MqttProbe, Received
from tests.support.controller_harness import controller_argv, until
from tests.support.keys import key_files

# reaction times and takeover deadlines of a tree of processes: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

BUDGETS = Path(powerd.__file__).parent / "data" / "budgets" / "tree-3rows.toml"
CLUSTER = "tree3"
TOPICS = Topics(CLUSTER)
ROWS = ("row1", "row2", "row3")
PRIORITY = {"row1": "high", "row2": "normal", "row3": "low"}
KILLED_ROW = "row2"  # the row whose leader is killed; its standby takes over

# Leaves: a cycle a second. Their agents (the fleets) fall to failsafe after
# AGENT_FAILSAFE_AFTER_S without a live heartbeat; validate() (powerd/controller/config.py)
# wants takeover + a cycle + a heartbeat (3.5 s) to end TAKEOVER_MARGIN_S (1 s) before it.
CYCLE_S = 1.0
HEARTBEAT_S = 0.5
TAKEOVER_AFTER_S = 2.0
AGENT_FAILSAFE_AFTER_S = 6.0
# The coordinator: validate() wants takeover + a period under the TTL, the TTL >= 2 periods.
PERIOD_S = 2.0
GRANT_TTL_S = 6.0
COORDINATOR_TAKEOVER_S = 3.0
COORDINATOR_HEARTBEAT_S = CoordinatorConfig().heartbeat_s  # a standby looks this often
# The fleets' telemetry periods: pushes are timed from the push, so a short period there.
PUSH_TELEMETRY_S = 0.25
LOAD_TELEMETRY_S = 0.5

WAIT_S = 30.0  # deadline of a wait for something that takes a few cycles (2-core CI machine)
# How late a leaf's summary may show a change due at a given instant: the change is made at
# its next cycle (CYCLE_S), the summary goes out at the first cycle a summary period after
# the last one (so up to another period later: the last may have gone at an early cycle
# just before), and a cycle may start late on a loaded machine. Seen on a 2-vCPU CI run: a
# row back on its file budget in the summary 2.016 s after it was due, past the 2.0 s this
# allowed when it counted one cycle and the lateness only.
SUMMARY_EVERY_S = ControllerConfig().summary_every_s
SUMMARY_SLACK_S = CYCLE_S + SUMMARY_EVERY_S + 0.5
# How much earlier than due a change may seem: the probe's clock reads a grant's arrival
# a little after the leaf's does when the test process is busy.
EARLY_S = 0.25


# --- the site's figures, from the budgets file -----------------------------------------


@dataclass(frozen=True)
class Site:
    pool_w: float  # what the leaves' budgets may sum to
    limit_w: float
    threshold_w: float  # the site's capping threshold
    row_limit_w: dict[str, float]
    file_budget_w: dict[str, float]
    cap_threshold: float  # the site's fractions, every leaf's root's
    cap_target: float  # a leaf that holds no GPU wants its watts / this
    uncap_threshold: float

    def granted_w(self, row: str, grant: Grant) -> float:
        """The budget a leaf holds under a live grant: at most its rows' breakers allow
        (powerd.controller.scoping, ``granted_max_w``)."""
        return min(grant.budget_w, self.row_limit_w[row] / self.cap_threshold)

    def held_allowance_w(self, s: Summary) -> float:
        """How far below what it wants a leaf granted all it wants may be held: 1 % of its
        budget (its own racks' bands and a cycle's noise).

        This test found a defect, fixed since: granted what it wants at its cap target,
        a high row whose power settled between its uncapping threshold and its target kept
        up to 5 % of its budget held for good (1.2 kW here, seen 650 and 1,094 W), while the
        low row kept its grant. The coordinator now asks for held watts at the uncapping
        threshold (policies/coordination.py)."""
        return 0.01 * s.budget_w


def site_figures() -> Site:
    topology = load_budgets(BUDGETS)
    rows = {row: scoped(topology, parse_scope(row)) for row in ROWS}
    site = Site(
        pool_w=leaf_pool_w(topology),
        limit_w=float(topology.limit_w[0]),
        threshold_w=float(topology.budget_w[0] * topology.cap_threshold[0]),
        row_limit_w={row: float(t.limit_w[0]) for row, t in rows.items()},
        file_budget_w={row: float(t.budget_w[0]) for row, t in rows.items()},
        cap_threshold=float(topology.cap_threshold[0]),
        cap_target=float(topology.cap_target[0]),
        uncap_threshold=float(topology.uncap_threshold[0]),
    )
    # the figures of the file's header comment, which the phases below rely on
    assert (site.pool_w, site.limit_w) == (66_000, 75_000)
    assert set(site.row_limit_w.values()) == {30_000} and set(site.file_budget_w.values()) == {
        22_000
    }
    return site


# --- processes -------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path


class Procs:
    """Every process of the test, its output in a log file; all stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[str, Proc] = {}

    def start(self, name: str, argv: list[str]) -> Proc:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.procs[name] = proc = Proc(name, popen, log)
        return proc

    def kill(self, name: str) -> float:
        """SIGKILL: no step-down, its last heartbeat and summary stay retained. When it was."""
        proc = self.procs[name]
        proc.popen.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        proc.popen.wait(WAIT_S)
        assert proc.popen.returncode == -signal.SIGKILL
        return killed_at

    async def finished(self, name: str, timeout_s: float = WAIT_S) -> None:
        """Wait for a process to end on its own (or on a SIGTERM sent); it must exit 0."""
        popen = self.procs[name].popen
        await until(lambda: popen.poll() is not None, timeout_s, f"{name} to exit")
        assert popen.returncode == 0, f"{name} exited {popen.returncode}:\n{self.tail(name)}"

    def tail(self, name: str, chars: int = 2500) -> str:
        log = self.procs[name].log
        return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.tail(name)}" for name in self.procs)

    def stop_all(self) -> None:
        """SIGTERM every process still running (a clean stop), then SIGKILL the stragglers."""
        running = [p.popen for p in self.procs.values() if p.popen.poll() is None]
        for popen in running:
            popen.terminate()
        for popen in running:
            try:
                popen.wait(10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(10)


def leaf_config(path: Path, broker: Mosquitto, coordinator_pub: Path) -> Path:
    """The leaves' config file: short timings, the coordinators' key for their grants."""
    path.write_text(
        f"""
[controller]
cluster = "{CLUSTER}"
cycle_s = {CYCLE_S}
heartbeat_s = {HEARTBEAT_S}
stale_after_s = {3 * CYCLE_S}
ack_timeout_s = 1.0
command_ttl_s = 10.0
takeover_after_s = {TAKEOVER_AFTER_S}
epoch_discovery_s = 0.5
agent_failsafe_after_s = {AGENT_FAILSAFE_AFTER_S}

[broker]
url = "{broker.url}"
reconnect_min_s = 0.05
reconnect_max_s = 0.5

[policy]
# the bands, as the controller harness's fast_uncap: racks pushed over their capping
# thresholds are cut back under them, and the site held under its own (safety by caps,
# the default, holds every level within its limit instead); caps handed back in one step
# (only the bands and ramp limits slow them): quick steady states
safety_by_caps = false
uncap_step_fraction = 1.0

[trust]
coordinator_keys = ["{coordinator_pub}"]

[recorder]
enabled = false
"""
    )
    return path


def leaf_argv(config: Path, signing_key: Path, row: str, name: str) -> list[str]:
    return controller_argv(
        [
            *("--config", str(config), "--budgets", str(BUDGETS)),
            *("--scope", row, "--name", name, "--signing-key", str(signing_key)),
        ]
    )


def coordinator_argv(broker: Mosquitto, signing_key: Path, trust: Path, name: str) -> list[str]:
    return [
        *(sys.executable, "-m", "powerd", "coordinator", "--budgets", str(BUDGETS)),
        *("--broker", broker.url, "--cluster", CLUSTER, "--name", name),
        *("--signing-key", str(signing_key), "--trust", str(trust)),
        *("--period-s", str(PERIOD_S), "--grant-ttl-s", str(GRANT_TTL_S)),
        *("--takeover-after-s", str(COORDINATOR_TAKEOVER_S)),
    ]


def fleet_of(
    broker: Mosquitto, row: str, report: Path, trust: Path, **options: object
) -> list[str]:
    return [
        sys.executable,
        *fleet_argv(
            BUDGETS,
            broker.url,
            CLUSTER,
            report,
            scope=row,
            trust=trust,
            failsafe_after_s=AGENT_FAILSAFE_AFTER_S,
            control_connections=2,
            connections=1,
            **options,
        ),
    ]


# --- what went over the broker ------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    at: float  # monotonic time of arrival at the probe
    scope: str
    summary: Summary


def scope_of(topic: str) -> str:
    return topic.split("/")[-2]


def summaries(p: MqttProbe, after: int = 0, before: int | None = None) -> list[Seen]:
    """Every leaf summary the probe received (between the marks ``after`` and ``before``),
    in order."""
    return [
        Seen(m.at, scope_of(m.topic), decode(Summary, m.payload, scope_of(m.topic)))
        for m in p.messages[after:before]
        if m.topic.endswith("/summary") and not m.retain
    ]


def grants(p: MqttProbe, row: str) -> list[tuple[float, Grant]]:
    return [
        (m.at, decode(Grant, m.payload, row))
        for m in p.messages
        if m.topic == TOPICS.grant(row) and not m.retain
    ]


def heartbeats(p: MqttProbe, topic: str) -> list[tuple[float, Heartbeat]]:
    return [(m.at, decode(Heartbeat, m.payload)) for m in p.messages if m.topic == topic]


def grant_named(m: Received) -> tuple[int | None, int | None]:
    """The grant a summary says its budget comes from: (epoch, seq), (None, None) for none."""
    summary = decode(Summary, m.payload, scope_of(m.topic))
    return summary.grant_epoch, summary.grant_seq


def wanted_w(s: Summary, site: Site) -> float:
    """The budget a leaf wants: what it draws at the site's cap target, or, with GPUs held,
    what it draws and would draw more at its uncapping threshold (policies/coordination.py,
    ``allocate``)."""
    fraction = site.uncap_threshold if sum(s.held_w) > 0 else site.cap_target
    return (s.fixed_w + sum(s.demand_w) + sum(s.held_w)) / fraction


def leader_is(controller: str, above_epoch: int = -1) -> Callable[[Received], bool]:
    def check(m: Received) -> bool:
        beat = decode(Heartbeat, m.payload)
        return beat.controller == controller and beat.state == "leader" and beat.epoch > above_epoch

    return check


def read_report(path: Path) -> dict:
    return json.loads(path.read_text())


def brief(s: Summary) -> str:
    return (
        f"{s.scope}/{s.controller}: measured {s.measured_w / 1e3:.2f} kW, budget "
        f"{s.budget_w / 1e3:.2f} kW (grant {s.grant_epoch}/{s.grant_seq}), held "
        f"{[round(w) for w in s.held_w]}, demand {[round(w) for w in s.demand_w]}"
    )


# --- the phases' checks -------------------------------------------------------------------


def check_pushes(reports: dict[str, dict], epochs: dict[str, int]) -> dict[str, object]:
    """Phase 1: every rack pushed over its threshold was brought back under it by its leaf
    within two leaf cycles of its telemetry showing it (``reaction_from_visible_s``): the
    leaf decides at once on a crossing, at the latest at its next cycle, and a cut goes
    out with the decision. From the push itself (``reaction_s``) add one telemetry period:
    the fleet's nodes report the new load only at their next sample, spread over the
    period, and no controller can see it sooner. No other slack: the broker's hops are
    milliseconds, the fleet times the cut when it applies the command."""
    for row, report in reports.items():
        summary = report["summary"]
        assert summary["failsafe_entries"] == 0 and summary["epochs"] == [epochs[row]], summary
        assert summary["pushes"] >= 3, summary
        not_seen = sum(1 for push in report["pushes"] if push["visible_s"] is None)
        # every push that went over its threshold was brought back
        assert summary["pushes_brought_back"] == summary["pushes"] - not_seen, report
        assert summary["pushes_brought_back"] >= 2, report
        assert summary["reaction_from_visible_s"]["max"] <= 2 * CYCLE_S, (row, summary)
        assert summary["reaction_s"]["p99"] <= 2 * CYCLE_S + PUSH_TELEMETRY_S, (row, summary)
    return {
        row: {k: r["summary"][k] for k in ("pushes", "reaction_s", "reaction_from_visible_s")}
        for row, r in reports.items()
    }


def priority_holds(now: dict[str, Summary], site: Site) -> str | None:
    """Why the low row is not (yet) cut first, or None if it is."""
    if set(now) != set(ROWS) or any(s.grant_seq is None for s in now.values()):
        return "not every leaf is under a grant"
    high, normal, low = (now[row] for row in ROWS)
    if not (high.demand_w[0] > 0 and normal.demand_w[1] > 0 and low.demand_w[2] > 0):
        return "the leaves do not see their jobs' priorities yet"
    if not low.budget_w < min(high.budget_w, normal.budget_w):
        return "the low row's budget is not the lowest"
    if not low.budget_w < wanted_w(low, site):
        return "the low row is not cut"
    if not high.held_w[0] <= site.held_allowance_w(high):
        return "the high row's GPUs are held below what they want"
    if not low.held_w[2] > high.held_w[0]:
        return "the high row's GPUs are held more than the low row's"
    # 1 %: its want is this cycle's, the grant last period's (a few watts of noise)
    if not high.budget_w >= wanted_w(high, site) * (1 - 0.01):
        return "the high row is granted less than it wants"
    return None


def newest(p: MqttProbe, start: int, stop: int) -> dict[str, Summary]:
    """Each leaf's newest summary among the probe's messages[start:stop]."""
    return {seen.scope: seen.summary for seen in summaries(p, start, stop)}


async def settle_priority(p: MqttProbe, site: Site, mark: int) -> int:
    """Phase 2: wait until the low row is cut first and the high row gets what it wants, and
    it stays so for a whole coordinator period: from a point on, at every summary, through a
    grant to every row and a summary of each after it. That point (a message position)."""
    deadline = time.monotonic() + 2 * WAIT_S
    position, since = mark, None
    while True:
        got = await p.expect(TOPICS.all_summaries, after=position, timeout_s=WAIT_S)
        position = p.messages.index(got) + 1
        now = newest(p, mark, position)
        why = priority_holds(now, site)
        if why is not None:
            since = None
            if time.monotonic() > deadline:
                wants = [f"{brief(s)}, wants {wanted_w(s, site):.0f} W" for s in now.values()]
                raise AssertionError(f"{why}: {'; '.join(wants)}")
            continue
        since = position - 1 if since is None else since
        held: set[str] = set()
        for row in ROWS:
            granted = [
                k for k in range(since, position) if p.messages[k].topic == TOPICS.grant(row)
            ]
            later = [
                k
                for k in range(granted[0] if granted else position, position)
                if p.messages[k].topic == TOPICS.summary(row)
            ]
            if later:
                held.add(row)
        if held == set(ROWS):
            return since


def check_priority(p: MqttProbe, site: Site, start: int, stop: int) -> dict[str, object]:
    """Phase 2, once settled: at every summary from ``start`` to ``stop`` (row2's leaf
    failover and the coordinator's included) the low row is cut first and the high row
    gets what it wants; every period's grants say the same."""
    current = newest(p, 0, start)
    checked = 0
    for seen in summaries(p, start, stop):
        current[seen.scope] = seen.summary
        # Budgets are comparable only within one allocation: between a period's first
        # grant and the last leaf's summary under it, the leaves' newest summaries mix two
        # periods (one grant seq for every leaf a period; a new epoch after a failover).
        if len({(s.grant_epoch, s.grant_seq) for s in current.values()}) > 1:
            continue
        why = priority_holds(current, site)
        assert why is None, f"{why}: {[brief(s) for s in current.values()]}"
        checked += 1
    assert checked >= 10, f"only {checked} summaries with every leaf under one period's grant"
    last: dict[str, Grant] = {}
    for m in p.messages[start:stop]:
        if m.topic.endswith("/grant") and not m.retain:
            last[scope_of(m.topic)] = decode(Grant, m.payload, scope_of(m.topic))
            if len(last) == len(ROWS):
                granted = {row: g.budget_w for row, g in last.items()}
                assert granted["row3"] < min(granted["row1"], granted["row2"]), granted
    return {
        row: {
            "granted_w": round(last[row].budget_w),
            "wants_w": round(wanted_w(s, site)),
            "measured_w": round(s.measured_w),
            "held_w": [round(w) for w in s.held_w],
        }
        for row, s in current.items()
    }


def check_takeover(
    p: MqttProbe,
    topic: str,
    dead: str,
    killed_at: float,
    new_beat: Received,
    takeover_after_s: float,
    bound_s: float,
) -> float:
    """Phases 3 and 4: the standby led (its leader heartbeat, the first thing it sends on
    taking over, is ``new_beat``) within ``bound_s`` of the kill, and not before its leader
    had been silent ``takeover_after_s``."""
    last_beat_at = max(at for at, beat in heartbeats(p, topic) if beat.controller == dead)
    assert last_beat_at <= killed_at + EARLY_S, "a heartbeat from the dead leader"
    takeover_s = new_beat.at - killed_at
    assert takeover_s <= bound_s, (topic, takeover_s, bound_s)
    silent_s = new_beat.at - last_beat_at
    assert silent_s >= takeover_after_s - EARLY_S, (topic, silent_s, takeover_after_s)
    return round(takeover_s, 3)


async def period_in_force(p: MqttProbe, coordinator: str) -> dict[str, tuple[float, Grant]]:
    """The next period of ``coordinator``'s grants, once every leaf reports it in force:
    each row's grant and when it arrived."""
    mark = p.mark()

    def of(m: Received) -> Grant:
        return decode(Grant, m.payload, scope_of(m.topic))

    first = of(
        await p.expect(
            TOPICS.grant(ROWS[0]),
            lambda m: of(m).coordinator == coordinator,
            after=mark,
            timeout_s=WAIT_S,
        )
    )
    out = {}
    for row in ROWS:  # granted in one go, in the order of the rows
        got = await p.expect(
            TOPICS.grant(row),
            lambda m: (of(m).epoch, of(m).seq) == (first.epoch, first.seq),
            after=mark,
            timeout_s=WAIT_S,
        )
        out[row] = (got.at, of(got))
        await p.expect(
            TOPICS.summary(row),
            lambda m: grant_named(m) == (first.epoch, first.seq),
            after=mark,
            timeout_s=WAIT_S,
        )
    return out


def check_live_grants(p: MqttProbe, site: Site, mark: int) -> None:
    """Phase 4, the coordinator's failover: every summary past ``mark`` names a grant
    received less than its TTL before, and holds it (not min(grant, file budget))."""
    by_order = {
        (row, grant.epoch, grant.seq): (at, grant) for row in ROWS for at, grant in grants(p, row)
    }
    for seen in summaries(p, mark):
        s = seen.summary
        assert s.grant_epoch is not None and s.grant_seq is not None, brief(s)
        got_at, grant = by_order[(seen.scope, s.grant_epoch, s.grant_seq)]
        assert seen.at - got_at < GRANT_TTL_S, (seen.at - got_at, brief(s))
        assert math.isclose(s.budget_w, site.granted_w(seen.scope, grant)), brief(s)


def check_fallback(
    p: MqttProbe, site: Site, mark: int, killed_at: float
) -> dict[str, dict[str, float | None]]:
    """Phase 4: each leaf, from its last grant's arrival, holds that grant for its TTL, then
    min(grant, file budget) with the grant still named, from twice the TTL its file budget
    (grant_seq null), and never goes back."""
    timeline: dict[str, dict[str, float | None]] = {}
    for row in ROWS:
        got_at, grant = grants(p, row)[-1]
        assert got_at <= killed_at + EARLY_S, "a grant from a dead coordinator"
        file_w = site.file_budget_w[row]
        granted_w = site.granted_w(row, grant)
        expiring_w = min(grant.budget_w, file_w)
        seen = [s for s in summaries(p, mark) if s.scope == row]
        on_file = False
        expiring_at = file_at = None
        for s in seen:
            age = s.at - got_at
            summary = s.summary
            where = (
                f"{row} {age:.2f} s after its last grant ({grant.budget_w:.0f} W): {brief(summary)}"
            )
            assert summary.measured_w <= site.row_limit_w[row], where
            if summary.grant_seq is None:
                on_file = True
                file_at = age if file_at is None else file_at
                assert age >= 2 * GRANT_TTL_S - EARLY_S, where
                assert summary.budget_w == file_w == summary.file_budget_w, where
                continue
            assert not on_file, f"back under a grant: {where}"
            assert (summary.grant_epoch, summary.grant_seq) == (grant.epoch, grant.seq), where
            assert age <= 2 * GRANT_TTL_S + SUMMARY_SLACK_S, where
            if age < GRANT_TTL_S - EARLY_S:
                assert math.isclose(summary.budget_w, granted_w), where
            elif age > GRANT_TTL_S + SUMMARY_SLACK_S:
                assert math.isclose(summary.budget_w, expiring_w), where
            else:
                assert any(math.isclose(summary.budget_w, w) for w in (granted_w, expiring_w)), (
                    where
                )
            if summary.budget_w <= file_w and expiring_at is None and granted_w > file_w:
                expiring_at = age
            assert summary.budget_w <= max(granted_w, file_w), where
        assert file_at is not None, f"{row} never went back to its file budget"
        assert file_at <= 2 * GRANT_TTL_S + SUMMARY_SLACK_S, (row, file_at)
        if granted_w > file_w:  # visible only where the grant was above the file budget
            assert expiring_at is not None and expiring_at <= GRANT_TTL_S + SUMMARY_SLACK_S
        timeline[row] = {
            "grant_w": round(grant.budget_w),
            "killed_after_grant_s": round(killed_at - got_at, 3),
            "min_grant_file_at_s": None if expiring_at is None else round(expiring_at, 2),
            "file_at_s": None if file_at is None else round(file_at, 2),
        }
    return timeline


def check_invariants(seen: list[Seen], site: Site) -> dict[str, float]:
    """Every summary of the run: the budgets in force (each leaf's newest) never sum above
    the pool, no row measured above its limit, the site (the rows' newest measured power)
    under its capping threshold, hence its limit."""
    now: dict[str, Summary] = {}
    most_budget = most_measured = 0.0
    for s in seen:
        summary = s.summary
        assert summary.measured_w <= site.row_limit_w[s.scope], brief(summary)
        assert summary.limit_w == site.row_limit_w[s.scope]
        now[s.scope] = summary
        if len(now) < len(ROWS):
            continue
        budget_w = sum(x.budget_w for x in now.values())
        measured_w = sum(x.measured_w for x in now.values())
        assert budget_w <= site.pool_w * (1 + 1e-9), [brief(x) for x in now.values()]
        assert measured_w <= site.threshold_w < site.limit_w, [brief(x) for x in now.values()]
        most_budget, most_measured = max(most_budget, budget_w), max(most_measured, measured_w)
    assert len(seen) > 100  # three leaves, a summary a cycle, for some 45 s
    return {
        "count": len(seen),
        "max_budget_sum_w": round(most_budget),
        "max_site_measured_w": round(most_measured),
    }


async def logged(procs: Procs, name: str, text: str) -> None:
    """Wait for a process to log ``text``: a standby says nothing on the wire until it
    leads, but logs "connected to BROKER as NAME" once it follows the leader."""
    log = procs.procs[name].log
    await until(lambda: text in log.read_text(errors="replace"), WAIT_S, f"{name}: {text}")


# --- the test ----------------------------------------------------------------------------


async def test_a_tree_of_controllers_cuts_low_rows_first_and_survives_its_failures(
    mosquitto: Mosquitto, tmp_path: Path
) -> None:
    site = site_figures()
    started = time.monotonic()
    figures: dict[str, object] = {}
    ctl_key, ctl_pub = key_files(tmp_path)  # the leaves' role key, which the fleets trust
    coord_key, coord_pub = generate_key_files(tmp_path / "coordinator")
    config = leaf_config(tmp_path / "leaf.toml", mosquitto, coord_pub)
    procs = Procs(tmp_path)
    watched = [f"{TOPICS.prefix}/scopes/#", TOPICS.coordinator_heartbeat]
    try:
        async with MqttProbe(mosquitto.port, watched) as p:
            # --- the tree: a leaf per row and the coordinator; then the standbys ---------
            leaders = {row: f"leaf-{row}" for row in ROWS}
            for row in ROWS:
                procs.start(leaders[row], leaf_argv(config, ctl_key, row, leaders[row]))
            procs.start("coord-a", coordinator_argv(mosquitto, coord_key, ctl_pub, "coord-a"))
            epochs = {}
            for row in ROWS:
                topic = Topics(CLUSTER, scope=row).heartbeat
                beat = await p.expect(topic, leader_is(leaders[row]), timeout_s=WAIT_S)
                epochs[row] = decode(Heartbeat, beat.payload).epoch
            beat = await p.expect(
                TOPICS.coordinator_heartbeat, leader_is("coord-a"), timeout_s=WAIT_S
            )
            coord_epoch = decode(Heartbeat, beat.payload).epoch
            standby = f"leaf-{KILLED_ROW}-b"
            procs.start(standby, leaf_argv(config, ctl_key, KILLED_ROW, standby))
            procs.start("coord-b", coordinator_argv(mosquitto, coord_key, ctl_pub, "coord-b"))

            # --- 1. pushes: a rack over its threshold is capped within 2 leaf cycles ------
            push_reports = {row: tmp_path / f"push-{row}.json" for row in ROWS}
            for row in ROWS:
                procs.start(
                    f"push-{row}",
                    fleet_of(
                        mosquitto,
                        row,
                        push_reports[row],
                        ctl_pub,
                        start="running",  # caps at their maximum: a pushed rack goes over
                        base_load=0.4,  # 6.9 kW a rack, 13.6 kW pushed: over its 11.76 kW
                        period_s=PUSH_TELEMETRY_S,
                        # pushes at 2, 6 and 10 s, each held longer than the reaction
                        # allowed (else a slow one would be released, not brought back),
                        # one rack at a time per row, and a released rack has 1.5 s (over a
                        # cycle) to be handed its watts back before the next push
                        warmup_s=2,
                        push_every_s=4,
                        push_hold_s=2.5,
                        duration_s=13,
                    ),
                )
            for row in ROWS:
                await procs.finished(f"push-{row}")
            pushed = {row: read_report(push_reports[row]) for row in ROWS}
            figures["pushes"] = check_pushes(pushed, epochs)

            # --- 2. priority across rows: every GPU wants its maximum -------------------
            load_reports = {row: tmp_path / f"load-{row}.json" for row in ROWS}
            load_mark = p.mark()
            for row in ROWS:
                procs.start(
                    f"load-{row}",
                    fleet_of(
                        mosquitto,
                        row,
                        load_reports[row],
                        ctl_pub,
                        start="fresh",  # at their failsafe caps: the site starts within its limit
                        base_load=1.0,
                        period_s=LOAD_TELEMETRY_S,
                        duration_s=600,  # stopped (SIGTERM) once the last phase is over
                        jobs=1,
                        job_priority=PRIORITY[row],
                        compute_s=600,
                    ),
                )
            settled = await settle_priority(p, site, load_mark)
            figures["priority_settled_after_s"] = round(
                p.messages[settled].at - p.messages[load_mark].at, 1
            )

            # --- 3. row2's leader killed: its standby leads, the other rows never notice -
            await logged(procs, standby, f"as {standby}")
            killed_topic = Topics(CLUSTER, scope=KILLED_ROW).heartbeat
            assert not [b for _, b in heartbeats(p, killed_topic) if b.controller == standby]
            kill_mark = p.mark()
            killed_at = procs.kill(leaders[KILLED_ROW])
            new_beat = await p.expect(
                killed_topic,
                leader_is(standby, above_epoch=epochs[KILLED_ROW]),
                after=kill_mark,
                timeout_s=WAIT_S,
            )
            # validate()'s reckoning: its silence timer, a cycle to notice, a heartbeat
            figures["leaf_takeover_s"] = check_takeover(
                p,
                killed_topic,
                leaders[KILLED_ROW],
                killed_at,
                new_beat,
                TAKEOVER_AFTER_S,
                bound_s=TAKEOVER_AFTER_S + CYCLE_S + HEARTBEAT_S,
            )
            new_epoch = decode(Heartbeat, new_beat.payload).epoch
            # it leads under the grant it took as a standby, not on its file budget
            first = await p.expect(
                TOPICS.summary(KILLED_ROW),
                lambda m: decode(Summary, m.payload).controller == standby,
                after=kill_mark,
                timeout_s=WAIT_S,
            )
            taken_over = decode(Summary, first.payload)
            assert taken_over.epoch == new_epoch, brief(taken_over)
            assert taken_over.grant_seq is not None, brief(taken_over)

            # --- 4a. the coordinator killed: its standby grants before any grant expires -
            await logged(procs, "coord-b", "as coordinator coord-b")
            await period_in_force(p, "coord-a")
            coord_mark = p.mark()
            coord_killed_at = procs.kill("coord-a")
            beat = await p.expect(
                TOPICS.coordinator_heartbeat,
                leader_is("coord-b", above_epoch=coord_epoch),
                after=coord_mark,
                timeout_s=WAIT_S,
            )
            # its silence timer, and it looks at least once a heartbeat
            figures["coordinator_takeover_s"] = check_takeover(
                p,
                TOPICS.coordinator_heartbeat,
                "coord-a",
                coord_killed_at,
                beat,
                COORDINATOR_TAKEOVER_S,
                bound_s=COORDINATOR_TAKEOVER_S + COORDINATOR_HEARTBEAT_S,
            )
            # its first grants: within validate()'s takeover + a period, under the TTL
            in_force_b = await period_in_force(p, "coord-b")
            first_b = min(at for at, _ in in_force_b.values()) - coord_killed_at
            assert first_b < COORDINATOR_TAKEOVER_S + PERIOD_S < GRANT_TTL_S, first_b
            figures["coordinator_grants_again_after_s"] = round(first_b, 3)
            check_live_grants(p, site, coord_mark)

            # --- 4b. and its standby killed: grant, then min(grant, file), then file -----
            await period_in_force(p, "coord-b")
            last_mark = p.mark()
            # the priority held from when it settled, through the leaf's and the
            # coordinator's failovers, as long as the coordinators granted
            figures["priority"] = check_priority(p, site, settled, last_mark)
            last_killed_at = procs.kill("coord-b")
            for row in ROWS:
                await p.expect(
                    TOPICS.summary(row),
                    lambda m: grant_named(m) == (None, None),
                    after=last_mark,
                    timeout_s=2 * GRANT_TTL_S + WAIT_S,
                )
            on_file = p.mark()
            for row in ROWS:  # and they stay there
                await p.expect(TOPICS.summary(row), after=on_file, timeout_s=WAIT_S)
            figures["fallback_s"] = check_fallback(p, site, last_mark, last_killed_at)

            # the fleets' reports: nobody fell to failsafe, only row2 saw a new epoch
            for row in ROWS:
                procs.procs[f"load-{row}"].popen.terminate()
            for row in ROWS:
                await procs.finished(f"load-{row}")
            loads = {row: read_report(load_reports[row])["summary"] for row in ROWS}
            for row, summary in loads.items():
                assert summary["failsafe_entries"] == 0, (row, summary)
                assert summary["reporting_nodes"] == summary["nodes"] == 8, (row, summary)
                assert summary["heartbeat_gap_s"]["max"] < AGENT_FAILSAFE_AFTER_S, (row, summary)
                want = [epochs[row], new_epoch] if row == KILLED_ROW else [epochs[row]]
                assert summary["epochs"] == want, (row, summary["epochs"], want)
            figures["heartbeat_gap_max_s"] = {
                row: s["heartbeat_gap_s"]["max"] for row, s in loads.items()
            }
            # the other rows' leaders led throughout, under one epoch
            for row in ROWS:
                if row != KILLED_ROW:
                    beats = heartbeats(p, Topics(CLUSTER, scope=row).heartbeat)
                    assert {(b.controller, b.state, b.epoch) for _, b in beats} == {
                        (leaders[row], "leader", epochs[row])
                    }

            # --- over the whole run: every summary ---------------------------------------
            figures["summaries"] = check_invariants(summaries(p), site)
            figures["runtime_s"] = round(time.monotonic() - started, 1)
            print(f"tree of controllers: {json.dumps(figures)}")
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
