"""The controller's commands with training jobs on the site: the closed loop in one process.

``ControllerCore`` and ``FleetModel`` (every node of a budgets file, its agents' answers)
exchange their messages directly, on a simulated clock one control period a step, with
no broker and no CPU contention between them: what is counted is what the controller
decides to send, separate from what a simulator sharing a small machine fails to keep up
with (``bench_scale`` runs the same loop over a real broker, in processes). Every
command is signed, verified, applied and acknowledged; each node's telemetry is taken
in every step; a live heartbeat each step.

N jobs of whole racks (``FleetOptions.jobs``) announce startup with their nodes, then
compute (``--compute-s``) and communication (``--communication-s``) in turn;
``--push-every-s`` sends a random rack to its maximum power for 5 s that often (as
``bench_scale`` does); ``--withhold-share`` blinds the controller to a share of the nodes
in spells (their telemetry withheld: they go stale and come back); ``--lose-share`` loses
each sample with that chance and ``--ack-delay-s`` delivers acks that many periods late,
as an oversubscribed broker and fleet do (``bench_scale`` with the bare subscriber beside
two jobs lost 13-17,000 samples a second, and acks came seconds late). Commands are counted
by kind, per node, against what that node was last sent:

- ``first``: the node's first command of the epoch (every node once, at the start),
- ``cut``: some GPU's cap lowered,
- ``raise``: some GPU's cap raised by at least 2 % of its range, none lowered,
- ``small raise``: raised by less,
- ``other``: no cap moved (a clock lock, a clock policy, a smoothing profile, a resend).

    python -m bench.bench_commands [--budgets FILE] [--jobs 2] [--seconds 120]
        [--push-every-s 2] [--smoothing] [--withhold-share 0.5] [--lose-share 0.6]
        [--ack-delay-s 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import statistics
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import add_safety_argument, machine, report
from powerd.controller.config import ControllerConfig
from powerd.controller.core import ControllerCore
from powerd.controller.inbox import Waiting
from powerd.controller.service import INGEST_BATCH
from powerd.controller.smoothing import grid_smoothing
from powerd.fleet.model import FleetModel, FleetOptions
from powerd.protocol import Command, Heartbeat, Topics, encode
from powerd.signing import Signer, Verifier
from powerd.topology import load_budgets

WALL0 = 1_795_000_000.0
PUSH_HOLD_S = 5
KINDS = ("first", "cut", "raise", "small raise", "other")
SMALL_RAISE_FRACTION = 0.02  # of a GPU's range: powerd.controller.core.RAISE_WORTH_FRACTION
# --withhold-share: from this second, in every other spell of this many seconds
WITHHOLD_AFTER_S = 90
WITHHOLD_S = 8


def _kind(command: Command, before: list[float] | None, span_w: np.ndarray) -> str:
    if before is None:
        return "first"
    moves = [
        g.cap_w - b if isinstance(g.cap_w, float) else 0.0
        for g, b in zip(command.gpus, before, strict=True)
    ]
    if any(m < -1.0 for m in moves):
        return "cut"
    if any(m > 1.0 for m in moves):
        worth = any(m >= SMALL_RAISE_FRACTION * s for m, s in zip(moves, span_w, strict=True))
        return "raise" if worth else "small raise"
    return "other"


def run(
    budgets: Path,
    jobs: int,
    seconds: int,
    push_every_s: float,
    smoothing: bool,
    compute_s: float,
    communication_s: float,
    seed: int = 1,
    withhold_share: float = 0.0,
    lose_share: float = 0.0,
    ack_delay_s: int = 0,
    safety_by_caps: bool = True,
) -> dict:
    topology = load_budgets(budgets)
    clock = [1000.0]

    def mono() -> float:
        return clock[0]

    def wall() -> float:
        return WALL0 + clock[0]

    settings = ControllerConfig(name="bench", cluster="bench", grid_smoothing=smoothing).settings()
    if smoothing:
        settings = dataclasses.replace(settings, smoothing=grid_smoothing(topology))
    policy = dataclasses.replace(settings.policy, safety_by_caps=safety_by_caps)
    settings = dataclasses.replace(settings, policy=policy)
    core = ControllerCore(topology.tree, settings, monotonic=mono, wall=wall)
    core.new_epoch(1)
    signer = Signer.generate()
    options = FleetOptions(
        jobs=jobs, compute_s=compute_s, communication_s=communication_s, seed=seed
    )
    fleet = FleetModel(topology, options, Verifier([signer.trusted()]), cluster="bench")
    topics = Topics("bench")
    fleet.start(mono())
    tree = topology.tree
    span_w = tree.cap_max_w - tree.cap_min_w
    last: dict[str, list[float]] = {}
    rng = random.Random(seed)
    pushed: list[tuple[float, int]] = []
    rows: list[dict[str, Any]] = []
    cycle_ms: list[float] = []
    reporting = fleet.reporting()
    site = int(np.flatnonzero(tree.parent < 0)[0])
    lossy = np.random.default_rng(seed)
    acks_due: collections.deque[list[tuple[str, bytes]]] = collections.deque(
        [] for _ in range(ack_delay_s)
    )
    for step in range(seconds):
        clock[0] += 1.0
        fleet._clock_now = mono()
        beat = Heartbeat(v=1, epoch=core.epoch, ts=wall(), controller="bench", state="leader")
        fleet.on_heartbeat(signer.sign(topics.heartbeat, encode(beat)), mono(), wall())
        fleet.tick(mono())
        fleet.new_round()
        if push_every_s > 0 and step >= 10:
            if step % max(1, round(push_every_s)) == 0:
                fleet.push(int(rng.choice(list(fleet.racks))), mono())
                pushed.append((mono(), fleet.pushes[-1].rack))
            for at, rack in list(pushed):
                if mono() - at >= PUSH_HOLD_S:
                    fleet.release(rack)
                    pushed.remove((at, rack))
        for job, payload in fleet.phase_events(mono(), wall()):
            core.on_phase(job, payload)
        heard = reporting
        if withhold_share > 0 and step >= WITHHOLD_AFTER_S and (step // WITHHOLD_S) % 2 == 0:
            # a blind spell: that share of the nodes unheard (a different tenth each spell)
            spell = step // WITHHOLD_S
            heard = reporting[(reporting * 7 + spell) % 10 >= withhold_share * 10]
        if lose_share > 0:
            heard = heard[lossy.random(len(heard)) >= lose_share]
        waiting = [
            Waiting(tree.server_ordinal[fleet.names[n]], fleet.telemetry(n, wall(), 1.0), mono(), 0)
            for n in heard
        ]
        for first in range(0, len(waiting), INGEST_BATCH):
            core.ingest(waiting[first : first + INGEST_BATCH])
        if ack_delay_s:  # those due now, then this period's
            for node, late_ack in acks_due.popleft():
                core.on_ack(node, late_ack)
            acks_due.append([])
        started = time.perf_counter()
        result = core.cycle()
        cycle_ms.append(1000 * (time.perf_counter() - started))
        kinds: collections.Counter[str] = collections.Counter()
        for node, command in result.commands:
            gpus = topology.server_gpus(node)
            kind = _kind(command, last.get(node), span_w[gpus.start : gpus.stop])
            kinds[kind] += 1
            last[node] = [g.cap_w if isinstance(g.cap_w, float) else 0.0 for g in command.gpus]
            topic = topics.command(node)
            ack = fleet.on_command(node, signer.sign(topic, encode(command)), mono(), wall())
            if ack is not None and ack_delay_s:
                acks_due[-1].append((node, ack))
            elif ack is not None:
                core.on_ack(node, ack)
        c = result.counters
        rows.append(
            {
                "t_s": step + 1,
                "phases": [j.phase for j in fleet.jobs],
                "commands": len(result.commands),
                **{k: kinds[k] for k in KINDS},
                "raises_deferred": c.raises_deferred,
                "uncap_waiting": getattr(c, "uncap_waiting", 0),  # absent before 2026-11-26
                "resends": c.resends,
                "in_flight": getattr(c, "commands_in_flight", 0),  # absent before 2026-11-26
                "stale_nodes": c.stale_nodes,
                "caps_mw": round(float(result.decision.cap_w.sum()) / 1e6, 3),
                # the site's power as the controller counts it (unheard nodes at their caps)
                "site_counted_mw": round(float(result.decision.node_power_w[site]) / 1e6, 3),
            }
        )
    totals = {k: sum(int(r[k]) for r in rows) for k in ("commands", *KINDS)}
    sent = [int(r["commands"]) for r in rows]
    after = sent[60:]
    busy = [t for t, n in enumerate(sent, 1) if n > 0.01 * len(fleet.names)]
    return {
        "benchmark": "commands",
        "machine": machine(),
        "command": "python -m bench.bench_commands " + " ".join(sys.argv[1:]),
        "budgets": str(budgets),
        "nodes": len(fleet.names),
        "jobs": jobs,
        "seconds": seconds,
        "smoothing": smoothing,
        "push_every_s": push_every_s,
        "withhold_share": withhold_share,
        "lose_share": lose_share,
        "ack_delay_s": ack_delay_s,
        "totals": totals,
        "commands_max_per_cycle_after_start": max(sent[2:], default=0),
        "commands_per_s_after_60s": round(statistics.fmean(after), 1) if after else None,
        "last_second_over_1pct_of_nodes": busy[-1] if busy else None,
        "caps_mw_at_end": rows[-1]["caps_mw"] if rows else None,
        "cycle_ms_median": round(statistics.median(cycle_ms), 1) if cycle_ms else None,
        "clock_locks_by_command": fleet.counters.clock_locks,
        "clock_locks_by_announcement": getattr(fleet.counters, "phase_locks", 0),
        "per_second": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default = Path(str(resources.files("powerd.data") / "budgets" / "site-150mw.toml"))
    parser.add_argument("--budgets", type=Path, default=default)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--push-every-s", type=float, default=2.0, help="0: no pushes")
    parser.add_argument("--compute-s", type=float, default=20.0)
    parser.add_argument("--communication-s", type=float, default=3.0)
    parser.add_argument("--smoothing", action="store_true", help="controller grid smoothing on")
    parser.add_argument(
        "--withhold-share",
        type=float,
        default=0.0,
        help=f"a blind controller: from {WITHHOLD_AFTER_S} s on, this share of the nodes' "
        f"telemetry (in tenths) is withheld for {WITHHOLD_S} s in every {2 * WITHHOLD_S} "
        "(they go stale), as a broker dropping it would [default: 0, none]",
    )
    parser.add_argument(
        "--lose-share",
        type=float,
        default=0.0,
        help="each node's sample lost with this chance every period, from the start [default: 0]",
    )
    parser.add_argument(
        "--ack-delay-s",
        type=int,
        default=0,
        help="acks reach the controller this many periods after their command [default: 0]",
    )
    add_safety_argument(parser, "The controller's policy.")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    shares = (args.withhold_share, args.lose_share)
    if args.jobs < 0 or args.seconds < 1 or not all(0.0 <= s <= 1.0 for s in shares):
        parser.error(
            "--jobs must be 0 or more, --seconds 1 or more, --withhold-share and "
            "--lose-share in [0, 1]"
        )
    if args.ack_delay_s < 0:
        parser.error("--ack-delay-s must be 0 or more")
    result = run(
        args.budgets,
        args.jobs,
        args.seconds,
        args.push_every_s,
        args.smoothing,
        args.compute_s,
        args.communication_s,
        withhold_share=args.withhold_share,
        lose_share=args.lose_share,
        ack_delay_s=args.ack_delay_s,
        safety_by_caps=args.safety == "caps",
    )
    report({k: v for k, v in result.items() if k != "per_second"}, None)  # the rows: JSON only
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
