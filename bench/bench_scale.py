"""One controller at site scale over a real broker: Mosquitto, `powerd controller`, `powerd fleet`.

For each scenario it starts a fresh Mosquitto, the controller (its own
process, recording to a line-protocol file at ``recorder.fine_every_s =
10``), a bare paho subscriber (``bench.bare_subscriber``, the yardstick) and
the fleet simulator (``powerd fleet``: every node's telemetry at its period,
acks as agents send them, a rack pushed to full power every ``--push-every-s``
after the warm-up). Over the measured window, after ``--warmup-s``, it
reports:

- CPU per telemetry message: the controller's (utime + stime from /proc over
  the messages it received, from its ``decision`` points) and the bare
  subscriber's, and their ratio; CPU shares of every process;
- stale nodes per cycle (max), epochs, commands, resends, deferred raises,
  telemetry dropped (replaced before decoding) and lost (never arrived);
- heartbeat gaps p50/p99/max as the simulated agents saw them;
- reaction latency p50/p99: from a rack's push until the ack of the command
  that brought its real power back under its capping threshold (and, beside
  it, from the first telemetry that showed it over).

Scenarios: ``--nodes`` (the shipped 150 MW site cut to whole rows: 5,184,
10,368 and 20,736 nodes) at ``--period-s``, and with ``--overload`` two more
on the whole site: twice what the controller may take (its ``ingest_share``
set from the decode cost measured in the 20,736-node run, so that it can
decode half of what comes), and twice the telemetry rate (every node at half
the period) with the default budget.

With ``--jobs N`` the fleet also runs N training jobs (whole racks each) that announce
their phases, so the controller sorts its GPUs by job every cycle, as it does on a site.

With ``--hostile retained-2mb,hostlist-flood`` one login attacks from the start of the
window for its first two thirds (issue 34): one retained 2 MB message on a node's
telemetry topic, and phase announcements whose host lists name 100,000 hosts at 20 a
second (half a stranger's prefix, half the site's own). The results give heartbeat gaps
and stale nodes during the attack and after it (``hostile``).

    python -m bench.bench_scale [--nodes 5184,10368,20736] [--overload] [--jobs N]
        [--hostile retained-2mb,hostlist-flood] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt

from bench.common import add_safety_argument, cpu_s, machine, mem_mb, report, run_dir
from powerd.fleet.app import fleet_argv
from powerd.fleet.sites import NODES_PER_RACK, RACKS_PER_ROW, SITE_FILE, cut_site
from powerd.mqtt.url import PASSWORD_ENV
from powerd.protocol import PROTOCOL_VERSION, Topics
from powerd.signing import generate_key_files
from powerd.telemetry_schema import parse_line
from powerd.topology import load_budgets
from powerd.topology.grid import GridSpec
from tests.support.brokers import TEST_PASSWORD, TEST_USER, Mosquitto

NODES_PER_ROW = RACKS_PER_ROW * NODES_PER_RACK
CLUSTER = "scale"
# Mosquitto as docs/CONTROLLER.md recommends for this site: a client's queue holds a
# quarter of a second of the whole site's telemetry (its default, 1,000, is 50 ms at
# 20,736 messages a second: a cycle's pause, and the broker drops).
BROKER_CONFIG = "max_queued_messages 5000\n"


@dataclass(frozen=True)
class Scenario:
    name: str
    rows: int
    period_s: float = 1.0
    ingest_share: float | None = None  # None: the controller's default
    bare: bool = True  # run the yardstick beside it
    grid_smoothing: bool = False  # the controller's controller.grid_smoothing
    max_raises_per_s: float | None = None  # None: the controller's default
    jobs: int = 0  # the fleet's training jobs (whole racks each), announcing their phases
    verify_every: int = 1  # the fleet checks one command's signature in this many
    # demand response: an operator's site limit, sent this long into the window, for so long
    site_limit_w: float | None = None
    site_limit_after_s: float = 5.0
    site_limit_for_s: float = 20.0
    safety_by_caps: bool = True  # the controller's [policy] safety_by_caps
    hostile: tuple[str, ...] = ()  # HOSTILE attacks during the window's first two thirds


# What --hostile may name: one retained 2 MB message on a node's telemetry topic; phase
# announcements naming 100,000 hosts, 20 a second.
HOSTILE = ("retained-2mb", "hostlist-flood")
HOSTILE_SHARE = 2 / 3  # of the window under attack; the rest shows the recovery
FLOOD_PER_S = 20.0
RETAINED_BYTES = 2_000_000


def budgets_for(rows: int, out: Path) -> Path:
    """The shipped site with its first ``rows`` rows."""
    path = out / f"site-{rows}rows.toml"
    path.write_text(cut_site(rows=rows))
    return path


def controller_config(
    broker: Mosquitto,
    out: Path,
    ingest_share: float | None,
    grid_smoothing: bool = False,
    max_raises_per_s: float | None = None,
    operator: bool = False,
    safety_by_caps: bool = True,
) -> Path:
    """The controller's config, signing with ``out/controller.key`` (made here; the fleet
    trusts ``out/controller.pub``): the signing cost is part of what is measured. With
    ``operator``, it takes site limits signed with ``out/operator.key`` (made here)."""
    path = out / "controller.toml"
    generate_key_files(out / "controller")
    operator_keys = ""
    if operator:
        generate_key_files(out / "operator")
        operator_keys = f'operator_keys = ["{out / "operator.pub"}"]\n'
    share = "" if ingest_share is None else f"ingest_share = {ingest_share}\n"
    if grid_smoothing:
        share += "grid_smoothing = true\n"
    if max_raises_per_s is not None:
        share += f"max_raises_per_s = {max_raises_per_s}\n"
    path.write_text(
        f'[controller]\nname = "bench"\ncluster = "{CLUSTER}"\n{share}'
        f'[broker]\nurl = "{broker.url}"\n'
        f'[recorder]\nfile = "{out / "controller.lp"}"\nfine_every_s = 10\n'
        f'[trust]\nsigning_key = "{out / "controller.key"}"\n{operator_keys}'
        + f"[policy]\nsafety_by_caps = {'true' if safety_by_caps else 'false'}\n"
    )
    return path


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    """``python ARGS``; the broker's login password in its environment, as powerd reads it."""
    with log.open("wb") as f:
        return subprocess.Popen(
            [sys.executable, *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", PASSWORD_ENV: TEST_PASSWORD},
        )


def wait_for_line(log: Path, pattern: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and re.search(pattern, log.read_text(errors="replace")):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{log.name}: no {pattern!r} within {timeout_s} s")


def decisions(lp: Path, start_wall: float, end_wall: float) -> list[dict]:
    """The controller's ``decision`` points inside the window, oldest first."""
    out = []
    with lp.open() as f:  # hundreds of MB of gpu points: look at decision lines only
        for line in f:
            if not line.startswith("decision,"):
                continue
            point = parse_line(line.rstrip("\n"))
            if point.ts_ns is not None and start_wall <= point.ts_ns / 1e9 <= end_wall:
                out.append({**point.fields, "_wall": point.ts_ns / 1e9})
    return out


def run_scenario(
    s: Scenario, warmup_s: float, window_s: float, push_every_s: float, keep: Path | None = None
) -> dict:
    """One scenario; its files (logs, the controller's records) go to a temporary directory,
    or are kept under ``keep``."""
    with run_dir(s.name, keep, temp_prefix="bench-scale-") as out:
        budgets = budgets_for(s.rows, out)
        broker = Mosquitto(out, extra_config=BROKER_CONFIG)
        broker.start()
        procs: dict[str, subprocess.Popen] = {}
        try:
            ctl_log = out / "controller.log"
            config = controller_config(
                broker,
                out,
                s.ingest_share,
                s.grid_smoothing,
                s.max_raises_per_s,
                operator=s.site_limit_w is not None,
                safety_by_caps=s.safety_by_caps,
            )
            procs["controller"] = spawn(
                ["-m", "powerd", "controller", "--config", str(config), "--budgets", str(budgets)],
                ctl_log,
            )
            wait_for_line(ctl_log, "leads with epoch", 60)
            fleet_json = out / "fleet.json"
            duration_s = warmup_s + window_s + 2.0
            procs["fleet"] = spawn(
                fleet_argv(
                    budgets,
                    broker.url,
                    CLUSTER,
                    fleet_json,
                    trust=out / "controller.pub",
                    period_s=s.period_s,
                    duration_s=duration_s,
                    warmup_s=warmup_s,
                    push_every_s=push_every_s,
                    start="running",
                    jobs=s.jobs,
                    verify_every=s.verify_every,
                    log_level="info",
                ),
                out / "fleet.log",
            )
            # the fleet counts its warm-up from its first round, after its connections: so
            # does the benchmark (on a loaded machine 1,296 nodes take seconds to connect)
            wait_for_line(out / "fleet.log", r"fleet: \d+ nodes", 120)
            bare_json = out / "bare.json"
            if s.bare:
                procs["bare"] = spawn(
                    [
                        "-m",
                        "bench.bare_subscriber",
                        "--port",
                        str(broker.port),
                        "--cluster",
                        CLUSTER,
                        "--warmup-s",
                        str(warmup_s),
                        "--seconds",
                        str(window_s),
                        "--json",
                        str(bare_json),
                        "--username",
                        TEST_USER,
                    ],
                    out / "bare.log",
                )
            mosquitto_pid = broker._proc.pid if broker._proc else None
            time.sleep(warmup_s)
            pids = {"controller": procs["controller"].pid, "fleet": procs["fleet"].pid}
            if mosquitto_pid:
                pids["mosquitto"] = mosquitto_pid
            cpu0 = {k: cpu_s(p) for k, p in pids.items()}
            wall0, mono0 = time.time(), time.monotonic()
            limit_sent_wall = None
            attack = None
            if s.hostile:
                with attacking(broker, s.hostile, load_budgets(budgets).servers[0]):
                    time.sleep(HOSTILE_SHARE * window_s)
                attack = (wall0, time.time())
            if s.site_limit_w is not None:
                time.sleep(s.site_limit_after_s)
                limit_sent_wall = send_site_limit(broker, out, s.site_limit_w, s.site_limit_for_s)
            time.sleep(max(0.0, window_s - (time.monotonic() - mono0)))
            cpu1 = {k: cpu_s(p) for k, p in pids.items()}
            wall1, elapsed = time.time(), time.monotonic() - mono0
            rss_mb, peak_mb = mem_mb(procs["controller"].pid)
            procs["fleet"].wait(timeout=duration_s + 60)
            if "bare" in procs:
                procs["bare"].wait(timeout=60)
            procs["controller"].send_signal(signal.SIGTERM)
            procs["controller"].wait(timeout=60)
            fleet = json.loads(fleet_json.read_text())
            bare = json.loads(bare_json.read_text()) if s.bare else None
            points = decisions(out / "controller.lp", wall0, wall1)
            log_tail = ctl_log.read_text(errors="replace")[-3000:]
            demand_response = None
            if s.site_limit_w is not None and limit_sent_wall is not None:
                demand_response = site_limit_result(
                    fleet, s, limit_sent_wall, load_budgets(budgets).grid, points
                )
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            broker.stop()
    result = summarise(s, fleet, bare, points, cpu0, cpu1, elapsed, rss_mb, peak_mb, log_tail)
    if demand_response is not None:
        result["site_limit"] = demand_response
    if attack is not None:
        result["hostile"] = hostile_result(s.hostile, fleet, points, *attack, wall1)
    return result


@contextmanager
def attacking(broker: Mosquitto, attacks: tuple[str, ...], victim: str) -> Iterator[None]:
    """One login's attacks (``HOSTILE``) while the block runs, from a paho client of this
    process (not the controller's)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.username_pw_set(TEST_USER, TEST_PASSWORD)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    topics = Topics(CLUSTER)
    stop = threading.Event()
    flood = threading.Thread(target=flood_host_lists, args=(client, topics, victim, stop))
    try:
        if "retained-2mb" in attacks:
            big = b"h" * RETAINED_BYTES
            client.publish(topics.telemetry(victim), big, qos=1, retain=True).wait_for_publish(30)
        if "hostlist-flood" in attacks:
            flood.start()
        yield
    finally:
        stop.set()
        if flood.is_alive():
            flood.join(10)
        client.loop_stop()
        client.disconnect()


def flood_host_lists(client: mqtt.Client, topics: Topics, node: str, stop: threading.Event) -> None:
    """Phase announcements naming 100,000 hosts, ``FLOOD_PER_S`` a second until ``stop``:
    half a stranger's prefix, half the site's own (``node``'s, digits wider)."""
    lists = ["zz[000001-100000]", f"{node.rstrip('0123456789')}[000001-100000]"]
    k = 0
    while not stop.wait(1 / FLOOD_PER_S):
        doc = {"v": PROTOCOL_VERSION, "job": f"flood{k}", "ts": time.time(), "phase": "compute"}
        doc["hostlist"] = lists[k % 2]
        client.publish(topics.phase(f"flood{k}", owner="mallory"), json.dumps(doc), qos=0)
        k += 1


def hostile_result(
    attacks: tuple[str, ...],
    fleet: dict,
    points: list[dict],
    start_wall: float,
    end_wall: float,
    window_end_wall: float,
) -> dict:
    """Heartbeat gaps (as the fleet's agents saw them: the late ones, over 1.2 s) and stale
    nodes (the controller's decisions) during the attack and after it."""
    started = float(fleet["started_wall"])
    late = [(started + t, gap) for t, gap, _ in fleet["heartbeat_gaps"]]

    def part(begin: float, end: float) -> dict:
        within = [p for p in points if begin <= p["_wall"] <= end] if points else []
        gaps = [gap for at, gap in late if begin <= at <= end]
        return {
            "seconds": round(end - begin, 1),
            "cycles": len(within),
            "heartbeat_gap_max_s": round(max(gaps), 3) if gaps else "<= 1.2",
            "heartbeats_late": len(gaps),
            "stale_nodes_max": max((int(p.get("stale_nodes", 0)) for p in within), default=None),
            "inputs_refused": int(sum(p.get("inputs_refused", 0) for p in within)),
            # cumulative in each point: refused host lists (longer than the site) among them
            "rejected_payloads": int(
                within[-1]["rejected_payloads"] - within[0]["rejected_payloads"]
            )
            if within
            else 0,
        }

    return {
        "attacks": list(attacks),
        "during": part(start_wall, end_wall),
        "after": part(end_wall, window_end_wall),
    }


def send_site_limit(broker: Mosquitto, out: Path, limit_w: float, for_s: float) -> float:
    """``powerd limit set`` as an operator would run it, signed with ``out/operator.key``;
    the wall clock when it returned (the limit published)."""
    done = subprocess.run(
        [
            sys.executable, "-m", "powerd", "limit", "set",
            "--site", f"{limit_w:.0f}W", "--for", f"{for_s}s",
            "--key", str(out / "operator.key"), "--operator", "bench",
            "--reason", "bench_scale demand response",
            "--broker", broker.url, "--cluster", CLUSTER,
            "--wait-s", "0",  # the clock starts at publication, as before the confirmation
        ],
        capture_output=True,
        text=True,
        env={**os.environ, PASSWORD_ENV: TEST_PASSWORD},
        timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"powerd limit set failed: {done.stdout}{done.stderr}")
    return time.time()


def site_limit_result(
    fleet: dict, s: Scenario, sent_wall: float, grid: GridSpec | None, points: list[dict]
) -> dict:
    """How the site met an operator's limit, on the fleet's own draw (GPUs and overheads,
    a round of telemetry each, as the grid sees the site): the draw before, how long it
    took to get under the limit against the glide at the ramp-down limit, the fastest fall
    on the way, what went over the limit once under it, and the rise after it expired."""
    assert s.site_limit_w is not None
    limit_w = s.site_limit_w
    sent_s = sent_wall - float(fleet["started_wall"])
    expires_s = sent_s + s.site_limit_for_s
    series = np.array(fleet["site_power_w"], dtype=float).reshape(-1, 2)
    t, power_w = series[:, 0], series[:, 1]
    period = s.period_s
    rate = np.diff(power_w) / period  # W/s, ending at t[1:]
    before = power_w[(t >= sent_s - 5.0) & (t < sent_s)]
    if not before.size:  # a fleet slowed down (a loaded machine): its last round before the
        # limit, however old, else its first after it if that came within a period (before
        # any cycle under the limit could have moved a cap)
        before = power_w[t < sent_s][-1:]
    if not before.size:
        before = power_w[(t >= sent_s) & (t < sent_s + period)][:1]
    before_w = float(before.mean()) if before.size else float("nan")
    ramp_down = math.inf if grid is None else float(grid.ramp_down_w_per_s)
    ramp_up = math.inf if grid is None else float(grid.ramp_up_w_per_s)
    under = np.flatnonzero((t >= sent_s) & (t < expires_s) & (power_w <= limit_w))
    reached_at = float(t[under[0]]) if under.size else None
    held = (t >= (reached_at if reached_at is not None else expires_s)) & (t < expires_s)
    gliding = (t[1:] >= sent_s) & (t[1:] < expires_s)
    released = t[1:] >= expires_s + period
    over_w = power_w[held] - limit_w

    def round_to(value: float | None, digits: int = 1) -> float | None:
        return None if value is None or not math.isfinite(value) else round(value, digits)

    return {
        "limit_w": limit_w,
        "sent_after_warmup_s": s.site_limit_after_s,
        "for_s": s.site_limit_for_s,
        "power_before_w": round_to(before_w, 0),
        "ramp_down_limit_w_per_s": round_to(ramp_down),
        "ramp_up_limit_w_per_s": round_to(ramp_up),
        "glide_s": round_to((before_w - limit_w) / ramp_down, 2),
        "reached_s": None if reached_at is None else round(reached_at - sent_s, 2),
        "fall_max_w_per_s": round_to(float(-rate[gliding].min()) if gliding.any() else None),
        "rounds_over_limit_once_under": int((over_w > 0).sum()),
        "over_limit_max_w": round_to(float(over_w.max()) if over_w.size else None, 0),
        "rise_max_after_expiry_w_per_s": round_to(
            float(rate[released].max()) if released.any() else None
        ),
        "limit_in_force_cycles": sum(1 for p in points if p.get("site_limit_w") is not None),
    }


def summarise(
    s: Scenario,
    fleet: dict,
    bare: dict | None,
    points: list[dict],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
    elapsed: float,
    rss_mb: float,
    peak_mb: float,
    log_tail: str,
) -> dict:
    def total(name: str) -> int:
        return int(sum(p.get(name, 0) for p in points))

    received = total("telemetry_received")
    ctl_cpu = cpu1["controller"] - cpu0["controller"]
    ctl_us = ctl_cpu / max(received, 1) * 1e6
    summary = fleet["summary"]
    pushes = [p for p in fleet["pushes"] if p["back_s"] is not None]
    commands = total("commands_sent")
    result = {
        "scenario": s.name,
        "nodes": summary["nodes"],
        "period_s": s.period_s,
        "ingest_share": s.ingest_share,
        "window_s": round(elapsed, 1),
        "cycles": len(points),
        "telemetry_offered_per_s": summary["telemetry_per_s"],
        "telemetry_received_per_s": round(received / elapsed),
        "cpu_share_of_one_core": {k: round((cpu1[k] - cpu0[k]) / elapsed, 3) for k in sorted(cpu0)},
        "controller_us_per_message": round(ctl_us, 1),
        "bare_us_per_message": None if bare is None else bare["us_per_message"],
        "ratio_to_bare": None if bare is None else round(ctl_us / bare["us_per_message"], 2),
        "controller_rss_mb": round(rss_mb, 1),
        "controller_peak_rss_mb": round(peak_mb, 1),
        "stale_nodes_max": max((int(p.get("stale_nodes", 0)) for p in points), default=None),
        "epochs": sorted({int(p["epoch"]) for p in points}),
        "fleet_epochs": summary["epochs"],
        "commands": commands,
        "resends": total("resends"),
        "resend_share": round(total("resends") / max(commands, 1), 4),
        "raises_deferred_max": max((int(p.get("raises_deferred", 0)) for p in points), default=0),
        "commands_in_flight_max": max(
            (int(p.get("commands_in_flight", 0)) for p in points), default=0
        ),
        "telemetry_dropped": total("telemetry_dropped"),
        "telemetry_lost": total("telemetry_lost"),
        "telemetry_waiting_max": max(
            (int(p.get("telemetry_waiting", 0)) for p in points), default=0
        ),
        "cycle_s_max": round(max((float(p["cycle_s"]) for p in points), default=0.0), 3),
        "ingest_s_per_cycle_max": round(
            max((float(p.get("ingest_s", 0.0)) for p in points), default=0.0), 3
        ),
        "decode_us_per_message": round(
            1e6
            * sum(float(p.get("ingest_s", 0.0)) for p in points)
            / max(received - total("telemetry_dropped"), 1),
            1,
        ),
        "heartbeat_gap_s": summary["heartbeat_gap_s"],
        "reaction_s": summary["reaction_s"],
        "reaction_from_visible_s": summary["reaction_from_visible_s"],
        "pushes": len(fleet["pushes"]),
        "pushes_brought_back": len(pushes),
        "fleet_failsafe_entries": summary["failsafe_entries"],
        "acks": summary["acks"],
        "grid_smoothing": s.grid_smoothing,
        "jobs": s.jobs,
        "phase_events": summary["phase_events"],
        "verify_every": s.verify_every,
        "signatures_unchecked": summary["signatures_unchecked"],
        "fleet_applied_by_kind": summary["applied_by_kind"],
        "clock_locks_by_command": summary["clock_locks"],
        "clock_locks_by_announcement": summary["phase_locks"],
        "gpu_power_w_per_s": summary["gpu_power_w_per_s"],
        "smoothing": summary["smoothing"],
    }
    if not points:
        result["controller_log_tail"] = log_tail
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--nodes",
        default="5184,10368,20736",
        help="comma-separated node counts, whole rows of the 150 MW site (1,296 nodes a row)",
    )
    parser.add_argument("--period-s", type=float, default=1.0)
    parser.add_argument("--overload", action="store_true", help="add the 2x overload run")
    parser.add_argument("--warmup-s", type=float, default=15.0)
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--push-every-s", type=float, default=2.0)
    parser.add_argument(
        "--grid-smoothing",
        action="store_true",
        help="the controller with grid_smoothing: every GB200 asked for its share of [site.grid]",
    )
    parser.add_argument(
        "--ingest-share",
        type=float,
        help="the controller's ingest_share in every run but the 2x-budget one [default: its own]",
    )
    parser.add_argument(
        "--max-raises-per-s",
        type=float,
        help="the controller's max_raises_per_s in every run [default: its own]",
    )
    parser.add_argument(
        "--no-bare",
        action="store_true",
        help="leave out the bare subscriber (the yardstick): its CPU for the others",
    )
    parser.add_argument(
        "--keep-dir",
        type=Path,
        help="keep each run's files (logs, the controller's records) in a folder under this",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="the fleet runs this many training jobs (whole racks each) announcing startup, "
        "then 20 s of compute and 3 s of communication in turn [default: none]",
    )
    parser.add_argument(
        "--verify-every",
        type=int,
        default=1,
        help="the fleet checks the signature of one command in this many (each real agent "
        "checks its own on its own CPU, ~120 us; one process playing 20,736 that checks "
        "them all measures itself) [default: 1, every one]",
    )
    parser.add_argument(
        "--site-limit-mw",
        type=float,
        help="demand response: an operator sets this temporary site limit (`powerd limit "
        "set`, signed) --site-limit-after-s into the window, for --site-limit-for-s; the "
        "results say how the site's draw got under it and stayed [default: none]",
    )
    parser.add_argument("--site-limit-after-s", type=float, default=5.0)
    parser.add_argument("--site-limit-for-s", type=float, default=20.0)
    add_safety_argument(parser, "The controller's policy.")
    parser.add_argument(
        "--hostile",
        default="",
        help=f"comma-separated attacks by one login during the window's first two thirds "
        f"({', '.join(HOSTILE)}); the results say what the attack did and what was left "
        "after it; at 20,736 nodes give --warmup-s 30, so that the fleet's own start-up "
        "(every node capped at once) is over before the attack begins [default: none]",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    hostile = tuple(a.strip() for a in args.hostile.split(",") if a.strip())
    if any(a not in HOSTILE for a in hostile):
        parser.error(f"--hostile takes {', '.join(HOSTILE)}")
    if args.verify_every < 1:
        parser.error("--verify-every must be 1 or more")
    if args.jobs < 0:
        parser.error("--jobs must be 0 or more")
    scenarios = []
    for text in args.nodes.split(","):
        if not text.strip():
            continue
        nodes = int(text)
        rows = max(1, round(nodes / NODES_PER_ROW))
        name = f"{rows * NODES_PER_ROW} nodes" + (", grid smoothing" if args.grid_smoothing else "")
        name += f", {args.jobs} jobs" if args.jobs else ""
        name += f", site limit {args.site_limit_mw:g} MW" if args.site_limit_mw else ""
        name += ", safety by caps" if args.safety == "caps" else ", bands"
        name += f", hostile: {'+'.join(hostile)}" if hostile else ""
        scenarios.append(
            Scenario(
                name,
                rows,
                args.period_s,
                args.ingest_share,
                bare=not args.no_bare,
                grid_smoothing=args.grid_smoothing,
                max_raises_per_s=args.max_raises_per_s,
                jobs=args.jobs,
                verify_every=args.verify_every,
                site_limit_w=None if args.site_limit_mw is None else args.site_limit_mw * 1e6,
                site_limit_after_s=args.site_limit_after_s,
                site_limit_for_s=args.site_limit_for_s,
                safety_by_caps=args.safety == "caps",
                hostile=hostile,
            )
        )
    if args.overload and not any(s.rows == 16 for s in scenarios):
        scenarios.append(
            Scenario(
                f"{16 * NODES_PER_ROW} nodes",
                16,
                args.period_s,
                args.ingest_share,
                bare=not args.no_bare,
                grid_smoothing=args.grid_smoothing,
                max_raises_per_s=args.max_raises_per_s,
                safety_by_caps=args.safety == "caps",
            )
        )
    results = []
    for s in scenarios:
        print(f"running {s.name} ...", file=sys.stderr, flush=True)
        results.append(
            run_scenario(s, args.warmup_s, args.window_s, args.push_every_s, args.keep_dir)
        )
    if args.overload:
        site = next(r for r in results if r["nodes"] == 16 * NODES_PER_ROW)
        # the decode budget that takes half of what the whole site sends: 2x its capacity
        share = 0.5 * site["telemetry_received_per_s"] * site["decode_us_per_message"] * 1e-6
        share = round(min(max(share, 0.005), 1.0), 4)
        for s in (
            Scenario(
                "overload: 2x its decode budget",
                16,
                args.period_s,
                share,
                bare=False,
                grid_smoothing=args.grid_smoothing,
                max_raises_per_s=args.max_raises_per_s,
                safety_by_caps=args.safety == "caps",
            ),
            Scenario(
                "overload: 2x the telemetry rate",
                16,
                args.period_s / 2,
                args.ingest_share,
                bare=False,
                grid_smoothing=args.grid_smoothing,
                max_raises_per_s=args.max_raises_per_s,
                safety_by_caps=args.safety == "caps",
            ),
        ):
            print(f"running {s.name} ...", file=sys.stderr, flush=True)
            results.append(
                run_scenario(s, args.warmup_s, args.window_s, args.push_every_s, args.keep_dir)
            )
    report(
        {
            "benchmark": "scale",
            "machine": machine(),
            "command": "python -m bench.bench_scale " + " ".join(sys.argv[1:]),
            "budgets": SITE_FILE,
            "warmup_s": args.warmup_s,
            "window_s": args.window_s,
            "results": results,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
