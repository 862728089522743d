"""Grid power smoothing from the controller: each GPU that has hardware smoothing is asked,
once, for its share of the site's grid spec (powerd.controller.smoothing); refusals,
restarts, new epochs and reloads are handled; the number of commands stays bounded."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

from policies import ClusterState
from policies.rules import rising_after_wait
from powerd.controller.core import ControllerCore, ControllerSettings
from powerd.controller.smoothing import GRID_PRESET, grid_smoothing
from powerd.protocol import (
    SOFTWARE_MECHANISM,
    Ack,
    Command,
    GpuAck,
    GpuSmoothing,
    GpuSmoothingState,
    Telemetry,
    decode,
    encode,
)
from powerd.topology import BudgetError, parse_budgets
from tests.controller.test_controller_core import (
    BANDS,
    BUDGETS,
    NODES,
    WALL0,
    Bench,
    ack_payload,
    phase_payload,
    telemetry_payload,
)
from tests.support.clock import ManualClock

GRID = """
[site.grid]
ramp_up_kw_per_s = 1
ramp_down_kw_per_s = 0.5
floor_fraction = 0.6
"""
# BUDGETS has 5 nodes x 2 GPUs; the grid table goes right after its [site] table
GRID_BUDGETS = BUDGETS.replace("[models.H100]", GRID + "\n[models.H100]")
SITE_GPUS = 10


def smoothing_bench(**settings) -> Bench:
    topology = parse_budgets(GRID_BUDGETS, source="grid-budgets.toml")
    clock = ManualClock(100.0)
    settings.setdefault("smoothing", grid_smoothing(topology))
    core = ControllerCore(
        topology.tree,
        ControllerSettings(**settings),
        monotonic=clock,
        wall=lambda: WALL0 + clock.t,
    )
    return Bench(core, clock, topology)


def report(
    bench: Bench,
    node: str,
    state: GpuSmoothingState | None,
    power_w: float = 300.0,
    ts: float = WALL0,
) -> None:
    """Telemetry from ``node`` whose GPUs report smoothing ``state`` (None: they have none),
    sampled at ``ts``."""
    sample = decode(Telemetry, telemetry_payload(node, power_w, ts=ts), node)
    gpus = [msgspec.structs.replace(g, smoothing=state) for g in sample.gpus]
    bench.core.on_telemetry(node, encode(msgspec.structs.replace(sample, gpus=gpus)))


def held(profile: GpuSmoothing) -> GpuSmoothingState:
    return GpuSmoothingState(
        enabled=profile.enabled, preset=profile.preset, floor_percent=profile.floor_percent
    )


OFF = GpuSmoothingState(enabled=False, preset=0, floor_percent=0.0)


def smoothing_of(commands: list[tuple[str, Command]]) -> dict[str, list[GpuSmoothing | None]]:
    return {
        node: [None if g.smoothing is msgspec.UNSET else g.smoothing for g in c.gpus]
        for node, c in commands
    }


def applied_ack(node: str, command: Command, smoothing: bool = True) -> bytes:
    """The agent's ack: caps as commanded, the profile read back (or None: not applied)."""
    ack = decode(Ack, ack_payload(node, command), node)
    gpus = [
        msgspec.structs.replace(g, smoothing=c.smoothing if smoothing else None)
        for g, c in zip(ack.gpus, command.gpus, strict=True)
        if isinstance(g, GpuAck)
    ]
    return encode(msgspec.structs.replace(ack, gpus=gpus))


def test_the_profile_is_each_gpus_share_of_the_site_grid_spec() -> None:
    profile = grid_smoothing(parse_budgets(GRID_BUDGETS, source="g.toml"))
    assert profile.preset == GRID_PRESET and profile.enabled
    assert profile.ramp_up_w_per_s == pytest.approx(0.9 * 1000 / SITE_GPUS)
    assert profile.ramp_down_w_per_s == pytest.approx(0.9 * 500 / SITE_GPUS)
    assert profile.floor_percent == pytest.approx(60.0)
    assert profile.ramp_down_hysteresis_ms == 1000.0  # the spec's window: 1 s by default


def test_no_grid_spec_no_smoothing_and_the_error_says_where() -> None:
    with pytest.raises(BudgetError, match=r"\[site.grid\].*ramp limit or a floor"):
        grid_smoothing(parse_budgets(BUDGETS, source="plain.toml"))
    empty = BUDGETS.replace("[models.H100]", "[site.grid]\n\n[models.H100]")
    with pytest.raises(BudgetError, match=r"plain\.toml"):
        grid_smoothing(parse_budgets(empty, source="plain.toml"))


def test_gpus_with_smoothing_get_the_profile_once_the_others_never() -> None:
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    assert profile is not None
    for node in NODES:
        report(bench, node, OFF if node.startswith("k1") else None)
    first = bench.cycle()
    sent = smoothing_of(first.commands)
    for node in NODES:
        want = [profile, profile] if node.startswith("k1") else [None, None]
        assert sent.get(node, [None, None]) == want, node
    for node, command in first.commands:
        bench.core.on_ack(node, applied_ack(node, command))
    for _ in range(3):  # the GPUs now report our profile: nothing more to say
        for node in NODES:
            report(bench, node, held(profile) if node.startswith("k1") else None)
        later = bench.cycle(1.0)
        assert all(s is None for ss in smoothing_of(later.commands).values() for s in ss)


def test_a_gpu_that_refuses_is_not_asked_again_until_a_new_epoch() -> None:
    bench = smoothing_bench()
    report(bench, "k1-n1", OFF)
    command = dict(bench.cycle().commands)["k1-n1"]
    bench.core.on_ack("k1-n1", applied_ack("k1-n1", command, smoothing=False))
    assert bench.core.smoothing_refused[list(bench.gpus("k1-n1"))].all()
    for _ in range(3):
        report(bench, "k1-n1", OFF)
        assert not any(smoothing_of(bench.cycle(1.0).commands).get("k1-n1", []))
    bench.core.new_epoch(bench.core.epoch + 1)
    report(bench, "k1-n1", OFF)
    again = smoothing_of(bench.cycle(1.0).commands)
    assert again["k1-n1"] == [bench.core.settings.smoothing] * 2


def test_a_gpu_found_without_our_profile_is_asked_again() -> None:
    """Its agent restarted and restored the smoothing it found: the profile goes again."""
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    assert profile is not None
    report(bench, "k1-n1", OFF)
    command = dict(bench.cycle().commands)["k1-n1"]
    bench.core.on_ack("k1-n1", applied_ack("k1-n1", command))
    report(bench, "k1-n1", held(profile))
    assert "k1-n1" not in dict(bench.cycle(1.0).commands)
    report(bench, "k1-n1", OFF, ts=WALL0 + 2.0)  # restarted, sampled 2 s after its ack
    again = smoothing_of(bench.cycle(1.0).commands)
    assert again["k1-n1"] == [profile, profile]


def test_a_state_in_a_sample_taken_just_after_an_ack_still_says_the_gpu_has_smoothing() -> None:
    """Agents send a state on change and every 10th sample only: the one sample that carries it
    may come right after a command's ack (caps not yet settled), and the controller must still
    learn from it that the GPU can be asked for the profile."""
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    report(bench, "k1-n1", None)  # the samples in between carry no state
    first = dict(bench.cycle().commands)["k1-n1"]
    assert first.gpus[0].smoothing is msgspec.UNSET  # nothing known yet: no profile
    bench.core.on_ack("k1-n1", applied_ack("k1-n1", first, smoothing=False))
    report(bench, "k1-n1", OFF, ts=WALL0 + bench.clock.t - 100.0)  # sampled as the ack came
    assert bench.core.smoothing_capable[list(bench.gpus("k1-n1"))].all()
    bench.clock.advance(1.0)
    report(bench, "k1-n1", None, ts=WALL0 + 2.0)
    assert smoothing_of(bench.cycle().commands).get("k1-n1") == [profile, profile]


def test_an_unacknowledged_command_is_resent_with_the_profile() -> None:
    bench = smoothing_bench(ack_timeout_s=2.0)
    report(bench, "k1-n1", OFF)
    assert dict(bench.cycle().commands)["k1-n1"].gpus[0].smoothing is not msgspec.UNSET
    report(bench, "k1-n1", OFF)
    bench.clock.advance(3.0)
    report(bench, "k1-n1", OFF)
    resent = smoothing_of(bench.core.cycle().commands)
    assert resent["k1-n1"] == [bench.core.settings.smoothing] * 2


def test_profiles_alone_go_out_with_the_raises_round_robin() -> None:
    """A profile is not urgent: with one raise a cycle, one node a cycle gets it (no flood
    when a whole site's GPUs first report smoothing)."""
    bench = smoothing_bench(max_raises_per_cycle=1)
    for node in NODES:  # every node at its cap already: nothing else to command ...
        report(bench, node, OFF)
    first = bench.cycle()
    for node, command in first.commands:
        bench.core.on_ack(node, applied_ack(node, command))
        bench.caps[node] = [g.cap_w for g in command.gpus]  # type: ignore[misc]
    got: set[str] = {n for n, s in smoothing_of(first.commands).items() if any(s)}
    for _ in range(10):
        for node in NODES:
            state = held(bench.core.settings.smoothing) if node in got else OFF  # type: ignore[arg-type]
            sample = decode(
                Telemetry, telemetry_payload(node, 300.0, bench.caps.get(node, 700.0)), node
            )
            gpus = [msgspec.structs.replace(g, smoothing=state) for g in sample.gpus]
            bench.core.on_telemetry(node, encode(msgspec.structs.replace(sample, gpus=gpus)))
        result = bench.cycle(1.0)
        with_profile = {n for n, s in smoothing_of(result.commands).items() if any(s)}
        assert len(with_profile) <= 1
        got |= with_profile
        for node, command in result.commands:
            bench.core.on_ack(node, applied_ack(node, command))
            bench.caps[node] = [g.cap_w for g in command.gpus]  # type: ignore[misc]
    assert got == set(NODES)


def test_profiles_go_before_hand_backs_in_turn() -> None:
    """When commands that can wait are more than the bound, the grid's protection goes
    first: nodes still without the profile before nodes whose turn to be handed watts
    back it is (found by `bench_scale --jobs 2 --grid-smoothing`: behind the jobs'
    hand-backs the profile took 52 s to reach every GPU of the 150 MW site). Under the
    bands, which hand GPUs drawing far below their caps watts back (safety by caps raises
    only GPUs held at their caps: no turn to wait for here)."""
    bench = smoothing_bench(max_raises_per_cycle=2, policy=BANDS)
    profile = bench.core.settings.smoothing
    assert profile is not None
    capped = NODES[:2]  # hold the profile, capped at 400 W: they want watts back, in turn
    bare = set(NODES[2:])  # at their maximum, without the profile
    for node in capped:  # sent the profile already (an earlier command of this epoch)
        mine = bench.gpus(node)
        bench.core.smoothing_sent_seq[mine.start : mine.stop] = 1
    got: set[str] = set()
    for _ in range(len(bare)):  # two a cycle: done in two cycles, three at the most
        if got == bare:
            break
        for node in NODES:
            state = held(profile) if node in capped or node in got else OFF
            cap_w = 400.0 if node in capped else 700.0
            sample = decode(Telemetry, telemetry_payload(node, 300.0, cap_w), node)
            gpus = [msgspec.structs.replace(g, smoothing=state) for g in sample.gpus]
            bench.core.on_telemetry(node, encode(msgspec.structs.replace(sample, gpus=gpus)))
        result = bench.cycle(1.0)
        assert result.state is not None and result.state.uncap_cycles is not None  # turns
        with_profile = {n for n, s in smoothing_of(result.commands).items() if any(s)}
        assert with_profile and with_profile <= bare  # a profile first, every cycle
        got |= with_profile
        for node, command in result.commands:
            bench.core.on_ack(node, applied_ack(node, command))
    assert got == bare


def test_without_grid_smoothing_no_command_carries_a_profile() -> None:
    bench = smoothing_bench(smoothing=None)
    for node in NODES:
        report(bench, node, OFF)
    for _ in range(3):
        result = bench.cycle(1.0)
        assert all(s is None for ss in smoothing_of(result.commands).values() for s in ss)


def test_under_grid_smoothing_starting_gpus_take_their_share_out_of_the_uncapping_ramp() -> None:
    """Software smoothing fills a starting job up at each GPU's ramp-up share by itself; the
    controller hands caps back under what is left of the ramp (found by `powerd demo
    --smoothing --duration-s 20`: a start filling up while another job's caps came back
    moved the site +21.7 kW/s against its 20 kW/s limit)."""
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    assert profile is not None
    policy = bench.core.cycle_policy(bench.core.settings.cycle_s)
    assert policy.startup_rise_w_per_s == profile.ramp_up_w_per_s == pytest.approx(90.0)
    plain = smoothing_bench(smoothing=None)
    assert plain.core.cycle_policy(plain.core.settings.cycle_s).startup_rise_w_per_s == 0.0


def test_under_grid_smoothing_an_early_cycle_keeps_a_starts_headroom() -> None:
    """A staged GPU's cap stands two cycles of its fill's rise over its draw: the draw is a
    cycle old and the next cap lands a cycle later, whenever this cycle came. An early one
    (a threshold crossed, 0.09 s after the last in `powerd demo --smoothing`) took the
    seconds since the last cycle for its period and cut a checkpoint's cap 33 W under its
    fill, and compute resumed capped."""
    bench = smoothing_bench()
    cycle_s = bench.core.settings.cycle_s
    for dt_s in (cycle_s, 0.1 * cycle_s):
        assert bench.core.cycle_policy(dt_s).stage_fill_s == pytest.approx(2.0 * cycle_s)
    plain = smoothing_bench(smoothing=None)
    assert plain.core.cycle_policy(0.1 * cycle_s).stage_fill_s == 0.0


def state_after(bench: Bench, advance_s: float) -> tuple[ClusterState, np.ndarray, np.ndarray]:
    """What the policy was given in a cycle ``advance_s`` on, and its phase times."""
    state = bench.cycle(advance_s).state
    assert state is not None and state.phase_s is not None and state.wait_before_s is not None
    return state, state.phase_s, state.wait_before_s


def test_under_grid_smoothing_a_long_wait_keeps_its_rise_out_of_the_ramp() -> None:
    """The policy learns how long each job has been in its announced phase and how long the
    wait it left lasted (rule 4 counts GPUs rising back after a wait longer than the
    profile's hysteresis, 1 s here); a repeated announcement keeps the phase's start, and a
    phase inferred from power has no time. Without smoothing nothing is counted."""
    bench = smoothing_bench()
    assert bench.core.cycle_policy(bench.core.settings.cycle_s).wait_rise_after_s == 1.0
    plain = smoothing_bench(smoothing=None)
    assert plain.core.cycle_policy(plain.core.settings.cycle_s).wait_rise_after_s == float("inf")
    gpus = slice(0, 2)  # k1-n1's
    bench.phase("llm", "startup", ["k1-n1"])
    bench.clock.advance(2.0)
    bench.phase("llm", "compute")
    bench.clock.advance(3.0)
    bench.phase("llm", "communication")
    bench.clock.advance(1.0)
    bench.phase("llm", "communication")  # a repeat: the wait still began 1.5 s ago
    state, phase_s, wait_before_s = state_after(bench, 0.5)
    np.testing.assert_allclose(phase_s[gpus], 1.5)
    np.testing.assert_allclose(wait_before_s[gpus], 0.0)  # compute followed no wait
    assert np.isnan(phase_s[2:]).all()  # no job there
    bench.phase("llm", "compute")
    state, phase_s, wait_before_s = state_after(bench, 0.25)
    np.testing.assert_allclose(phase_s[gpus], 0.25)
    np.testing.assert_allclose(wait_before_s[gpus], 1.5)
    policy = bench.core.cycle_policy(bench.core.settings.cycle_s)
    every_gpu = np.ones(len(state.phase), dtype=bool)  # (none reported: none controllable)
    # the step back of a GPU smoothed in software (none says otherwise): falling at once,
    # 1.5 s at 45 W/s (a 0.5 kW/s ramp down) over one window's rise at 90 W/s (1 kW/s
    # up): three quarters of the share, for a window after the resume
    assert state.ramps_in_hardware is not None and not state.ramps_in_hardware.any()
    share = rising_after_wait(state, state.phase, every_gpu, policy)
    np.testing.assert_allclose(share[gpus], 0.75)
    assert not share[2:].any()
    # in hardware the fall waits out the 1 s hysteresis: 0.5 s of it, a quarter
    hardware = dataclasses.replace(state, ramps_in_hardware=np.ones(len(state.phase), bool))
    np.testing.assert_allclose(
        rising_after_wait(hardware, state.phase, every_gpu, policy)[gpus], 0.25
    )
    bench.phase("llm", "checkpoint")
    bench.clock.advance(4.0)
    bench.phase("llm", "compute")
    _, _, wait_before_s = state_after(bench, 0.0)
    np.testing.assert_allclose(wait_before_s[gpus], 4.0)  # a checkpoint is a wait too
    bench.core.jobs["llm"].inferred_phase = "communication"  # as _infer_phases sets it
    _, phase_s, _ = state_after(bench, 0.0)
    assert np.isnan(phase_s).all()


def test_a_phase_s_expected_length_reaches_the_policy_until_the_next_announcement() -> None:
    bench = smoothing_bench(smoothing=None)
    gpus = slice(0, 2)  # k1-n1's
    bench.phase("llm", "startup", ["k1-n1"])
    bench.core.on_phase("llm", phase_payload("llm", "checkpoint", expected_s=45.0))
    state, phase_s, _ = state_after(bench, 1.0)
    assert state.phase_expected_s is not None
    np.testing.assert_allclose(state.phase_expected_s[gpus], 45.0)
    np.testing.assert_allclose(phase_s[gpus], 1.0)
    assert np.isnan(state.phase_expected_s[2:]).all()  # no job there
    bench.phase("llm", "compute")  # said nothing of its length
    state, _, _ = state_after(bench, 0.0)
    assert state.phase_expected_s is not None and np.isnan(state.phase_expected_s).all()


def test_under_grid_smoothing_caps_over_a_budget_are_cut_at_the_ramp_down_share() -> None:
    """Capping below every limit cuts no faster than the GPUs' share of the grid's ramp-down
    (policies/capping.py rule 3; found by `bench_tree --grid-smoothing` on the 150 MW site:
    racks pushed over their thresholds by the floor cut at once, 73-208 kW a row in one
    second); without grid smoothing, at once."""
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    assert profile is not None
    policy = bench.core.cycle_policy(bench.core.settings.cycle_s)
    assert policy.cut_fall_w_per_s == profile.ramp_down_w_per_s
    plain = smoothing_bench(smoothing=None)
    assert plain.core.cycle_policy(plain.core.settings.cycle_s).cut_fall_w_per_s == float("inf")


def test_the_policy_learns_which_gpus_their_own_hardware_ramps() -> None:
    """A GPU whose telemetry says its smoothing is on and carried out by the GPU ramps its
    draw itself (a job's start on it is no step); one smoothed in software by its jobs, or
    with smoothing off, or never said, does not."""
    bench = smoothing_bench()
    profile = bench.core.settings.smoothing
    assert profile is not None
    on = held(profile)
    report(bench, NODES[0], on)
    report(bench, NODES[1], msgspec.structs.replace(on, mechanism=SOFTWARE_MECHANISM))
    report(bench, NODES[2], OFF)
    report(bench, NODES[3], None)
    state = bench.cycle(0.5).state
    assert state is not None and state.ramps_in_hardware is not None
    assert state.ramps_in_hardware.tolist() == [True] * 2 + [False] * (SITE_GPUS - 2)
    report(bench, NODES[0], OFF)  # switched off: no longer
    state = bench.cycle(0.5).state
    assert state is not None and state.ramps_in_hardware is not None
    assert not state.ramps_in_hardware.any()
