"""`powerd fleet` against a real controller over a real Mosquitto: the loop closes, racks pushed
over their threshold are brought back, and a controller offered more telemetry than it may
decode degrades as it should (one leader, heartbeats on time, drops counted, no storm)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from powerd.controller import service
from powerd.fleet.app import fleet_argv
from powerd.topology import parse_budgets
from tests.support.brokers import Mosquitto
from tests.support.controller_harness import (
    BANDS,
    CLUSTER,
    controller_config,
    running_controller,
)
from tests.support.fleet_sites import small_site
from tests.support.keys import key_files

# the fleet's measured power rates and heartbeats on time: run apart from the other tests (pyproject.toml, markers)
pytestmark = pytest.mark.realtime

FAILSAFE_AFTER_S = 1.5  # the simulated agents', as the controller harness's agents


async def run_fleet(
    broker: Mosquitto, budgets: Path, out: Path, *args: str, timeout_s: float = 90
) -> dict:
    """``python -m powerd fleet`` to the end of its ``--duration-s``; its JSON report."""
    report = out / "fleet.json"
    argv = fleet_argv(
        budgets,
        broker.url,
        CLUSTER,
        report,
        start="running",
        failsafe_after_s=FAILSAFE_AFTER_S,
        trust=key_files(out)[1],  # the key the harness's controller signs with
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        *args,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, err.decode()
    return json.loads(report.read_text())


async def test_the_fleet_closes_the_loop_and_pushed_racks_come_back(mosquitto, tmp_path):
    budgets = tmp_path / "site.toml"
    budgets.write_text(small_site(racks=4))  # 72 nodes, 288 GB200
    topology = parse_budgets(budgets.read_text())
    # the bands: the fleet pushes racks over their capping thresholds and times their cut
    # back under them (safety by caps, the default, holds a rack within its limit instead)
    config = controller_config(mosquitto, policy=BANDS)
    async with running_controller(mosquitto, topology, config) as ctl:
        fleet = await run_fleet(
            mosquitto,
            budgets,
            tmp_path,
            "--period-s=0.25",
            "--duration-s=8",
            "--warmup-s=2",
            "--push-every-s=1",
            "--push-hold-s=1.5",
        )
        cycles = [c.result.counters for c in ctl.cycles if c.mono > ctl.cycles[0].mono + 2]
    summary = fleet["summary"]
    assert summary["nodes"] == summary["reporting_nodes"] == 72
    assert summary["epochs"] == [ctl.core.epoch] and summary["failsafe_entries"] == 0
    # every pushed rack was seen over its threshold and brought back under it by the acks
    # of the commands that cut it (how fast is bench/bench_scale.py's business)
    assert summary["pushes"] >= 3
    assert summary["pushes_brought_back"] == summary["pushes"] - sum(
        1 for p in fleet["pushes"] if p["visible_s"] is None
    )
    assert summary["pushes_brought_back"] >= 2
    assert summary["acks"].get("applied", 0) >= summary["pushes_brought_back"]
    assert all(c.stale_nodes == 0 for c in cycles)
    assert sum(c.resends for c in cycles) == 0


async def test_overload_one_leader_heartbeats_on_time_drops_counted_no_storm(
    mosquitto, tmp_path, caplog
):
    """144 nodes at 50 Hz (7,200 messages a second) to a controller that may spend 0.5 %
    of a core decoding (a few hundred messages a second): most samples are replaced in its
    inbox before it decodes them. It must still lead under one epoch, heartbeat in time
    for every agent (no failsafe), decide every cycle, count what it dropped, see no node
    as stale, and send no resend storm."""
    caplog.set_level(logging.WARNING, logger="powerd.controller")
    budgets = tmp_path / "site.toml"
    budgets.write_text(small_site(racks=8))
    topology = parse_budgets(budgets.read_text())
    config = controller_config(mosquitto, ingest_share=0.005)
    async with running_controller(mosquitto, topology, config) as ctl:
        epoch = ctl.core.epoch
        fleet = await run_fleet(
            mosquitto,
            budgets,
            tmp_path,
            "--period-s=0.02",
            "--connections=2",
            "--duration-s=8",
            "--warmup-s=2",
            "--push-every-s=1",
        )
        assert ctl.service.leading.is_set() and ctl.core.epoch == epoch
        start = ctl.cycles[0].mono + 2
        cycles = [c for c in ctl.cycles if c.mono > start]
    counters = [c.result.counters for c in cycles]
    summary = fleet["summary"]
    # overloaded: it decoded only part of what came, and said so
    received = sum(c.telemetry_received for c in counters)
    dropped = sum(c.telemetry_dropped for c in counters)
    assert received > 10_000 and dropped > received / 2
    assert "telemetry over capacity" in caplog.text
    # the inbox held at most one sample per node
    assert max(c.telemetry_waiting for c in counters) <= len(topology.servers)
    # one leader, one epoch, heartbeats in time for every agent: none fell to failsafe
    assert summary["epochs"] == [epoch] and summary["failsafe_entries"] == 0
    assert summary["heartbeat_gap_s"]["max"] < FAILSAFE_AFTER_S
    # it decided every cycle (0.25 s) on what it had, and saw nobody as stale
    assert len(cycles) >= 4 / 0.25
    assert all(c.stale_nodes == 0 for c in counters)
    # no storm: resends at most 1 % of commands
    commands = sum(c.commands_sent for c in counters)
    assert sum(c.resends for c in counters) <= 0.01 * max(commands, 1)


async def test_fleet_jobs_announce_phases_and_get_clock_locks_in_communication(
    mosquitto, tmp_path, monkeypatch
):
    """Also: the controller sends a cycle's commands a few at a time, reading its sockets
    between (``COMMANDS_PER_SLICE``, here 5 of the 72 nodes' when the jobs start), and
    every one of them arrives and is acknowledged: no resend."""
    monkeypatch.setattr(service, "COMMANDS_PER_SLICE", 5)
    budgets = tmp_path / "site.toml"
    budgets.write_text(small_site(racks=4))
    topology = parse_budgets(budgets.read_text())
    async with running_controller(mosquitto, topology, controller_config(mosquitto)) as ctl:
        fleet = await run_fleet(
            mosquitto,
            budgets,
            tmp_path,
            "--period-s=0.25",
            "--duration-s=7",
            "--jobs=2",
            "--compute-s=1.5",
            "--communication-s=1.5",
        )
        jobs = {name: (job.priority, len(job.nodes)) for name, job in ctl.core.jobs.items()}
        counters = [c.result.counters for c in ctl.cycles]
    summary = fleet["summary"]
    assert max(c.commands_sent for c in counters) > 5 * 10  # many slices in one cycle
    assert sum(c.resends for c in counters) == 0 and summary["acks"]["applied"] > 72
    assert jobs == {"fleet-job000": ("high", 36), "fleet-job001": ("normal", 36)}
    assert summary["phase_events"] >= 2 * 4  # startup, compute, communication, compute...
    # the controller granted the jobs' GPUs clock policies (in commands), and the jobs'
    # announcements then locked their clocks in communication, as real agents' do
    assert summary["phase_locks"] > 0 and summary["failsafe_entries"] == 0


async def test_grid_smoothing_reaches_every_gb200_and_their_draw_rises_at_its_rate(
    mosquitto, tmp_path
):
    """The controller's profile, rolled out over a real broker to simulated GB200 agents that
    take it as agents do: every GPU holds it, and their draw then rises to the profile's
    floor no faster than the ramp-up rate each was given."""
    budgets = tmp_path / "site.toml"
    # 72 nodes, 288 GB200, under a grid ramp of 20 kW/s: each GPU's share (0.9 x 20 kW/s /
    # 288 = 62.5 W/s) takes seconds to cover the 240 W up to the floor
    site = small_site(racks=4).replace("ramp_up_mw_per_s = 1 ", "ramp_up_mw_per_s = 0.02 ")
    budgets.write_text(site)
    topology = parse_budgets(site)
    config = controller_config(mosquitto, grid_smoothing=True)
    async with running_controller(mosquitto, topology, config) as ctl:
        fleet = await run_fleet(mosquitto, budgets, tmp_path, "--period-s=0.25", "--duration-s=6")
        profile = ctl.service.core.settings.smoothing
    assert profile is not None and profile.enabled and profile.floor_percent > 60.0
    summary = fleet["summary"]
    smoothing = summary["smoothing"]
    assert smoothing["gpus"] == smoothing["on_at_end"] == 288
    assert smoothing["all_s"] is not None and smoothing["all_s"] < 5.0
    assert summary["epochs"] == [ctl.core.epoch] and summary["failsafe_entries"] == 0
    # from 60 % of their maximum (--base-load) up to the 80 % floor: at the rate, not at
    # once (at once: 288 x 240 W in one 0.25 s round, ~280 kW/s); the slack is the noise
    rate_w_per_s = 288 * profile.ramp_up_w_per_s
    assert rate_w_per_s == pytest.approx(18000.0)
    assert 0.5 * rate_w_per_s < summary["gpu_power_w_per_s"]["up_max"] < 2.0 * rate_w_per_s
