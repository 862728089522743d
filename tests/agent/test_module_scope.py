"""The agent with agent.power_limit_scope = "module": the controller's caps applied as the
module-scope power limit on GPUs that have one (GB200, fake pynvml), the GPU limit on the
others, what the device enforces reported, everything put back on exit; the config option."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from powerd.agent.config import AgentConfig, load_config
from powerd.agent.core import AgentCore
from powerd.agent.daemon import AgentDaemon
from powerd.configfile import ConfigError
from powerd.gpu import PowerScope
from powerd.gpu.models import gpu_model
from powerd.gpu.module_scope import ModuleScopeCap, with_module_scope
from powerd.gpu.nvml import NvmlGpu, open_nvml
from tests.support.agent_core_harness import (
    FAILSAFE_W,
    NODE,
    cap,
    command,
    core_clock,
    core_following,
)
from tests.support.fakes.fake_pynvml import FakeNvml, ModuleLimit
from tests.support.keys import VERIFIER

# The fake GB200: GPU default 1200 W, module 400-1350 W with default 1350 W, so the rest of
# the module keeps 150 W and the caps the module can enforce are 250-1200 W.
ALLOWANCE_W = 150.0


def module_of(fake: FakeNvml, index: int = 0) -> ModuleLimit:
    module = fake.device(index).module
    assert module is not None
    return module


def module_node(*keys: str) -> tuple[AgentCore, FakeNvml]:
    """A started core following a leader, on NVML GPUs of the fake, module scope where
    they have it (as the daemon installs it for power_limit_scope = "module")."""
    fake = FakeNvml([gpu_model(k) for k in keys])
    gpus = with_module_scope(open_nvml(fake))
    return core_following(core_clock(), gpus), fake


# -- config ----------------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_scope_is_gpu_unless_told() -> None:
    assert load_config(None).power_limit_scope is PowerScope.GPU


def test_module_scope_is_read_from_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[agent]\npower_limit_scope = "module"\n'))
    assert config.power_limit_scope is PowerScope.MODULE


@pytest.mark.parametrize("value", ['"board"', '"GPU"', '""'])
def test_an_unknown_scope_names_the_choices(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[agent]\npower_limit_scope = {value}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    message = str(exc.value)
    assert str(path) in message and "agent.power_limit_scope" in message
    assert "'gpu' or 'module'" in message


def test_a_scope_that_is_not_text_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent\.power_limit_scope must be a string"):
        load_config(write(tmp_path, "[agent]\npower_limit_scope = 1\n"))


def test_an_override_is_validated_too() -> None:
    config = load_config(None)
    with pytest.raises(ConfigError, match="'gpu' or 'module'"):
        config.with_overrides(power_limit_scope="rack")


# -- the daemon installs it ------------------------------------------------------------------


def daemon_gpus(scope: PowerScope, fake: FakeNvml) -> list[object]:
    config = AgentConfig(node=NODE, power_limit_scope=scope)
    daemon = AgentDaemon(config, open_nvml(fake), verifier=VERIFIER)
    return list(daemon.core.gpus.values())


def test_module_scope_wraps_the_gpus_that_have_it_and_logs_why_not_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeNvml([gpu_model("GB200"), gpu_model("H100")])
    with caplog.at_level(logging.WARNING, logger="powerd.gpu"):
        gb200, h100 = daemon_gpus(PowerScope.MODULE, fake)
    assert isinstance(gb200, ModuleScopeCap)
    assert isinstance(h100, NvmlGpu)
    why = [
        r.getMessage() for r in caplog.records if "stay on the GPU power limit" in r.getMessage()
    ]
    assert len(why) == 1 and why[0].startswith("gpu 1:")


def test_gpu_scope_wraps_nothing() -> None:
    fake = FakeNvml([gpu_model("GB200")])
    assert all(isinstance(g, NvmlGpu) for g in daemon_gpus(PowerScope.GPU, fake))


# -- caps applied, reported, restored --------------------------------------------------------


def test_failsafe_and_commands_go_to_the_module_limit_where_there_is_one() -> None:
    core, fake = module_node("GB200", "H100")
    gb200, h100 = fake.device(0), fake.device(1)
    # start: the failsafe cap, on the module of the GB200 and the GPU limit of the H100
    assert module_of(fake).current_mw == round((FAILSAFE_W + ALLOWANCE_W) * 1000)
    assert (gb200.limit_mw, h100.limit_mw) == (1_200_000, 500_000)
    ack = core.on_command(command(1, 1, cap(0, 700.0), cap(1, 600.0)))
    assert ack.result == "applied", ack.errors
    assert [g.cap_w for g in ack.gpus] == [700.0, 600.0]  # read back from the devices
    assert module_of(fake).current_mw == 850_000
    assert (gb200.limit_mw, h100.limit_mw) == (1_200_000, 600_000)
    telemetry = core.telemetry()
    assert [g.cap_w for g in telemetry.gpus] == [700.0, 600.0]
    assert [(g.cap_min_w, g.cap_max_w) for g in telemetry.gpus] == [(250.0, 1200.0), (200.0, 700.0)]


def test_a_cap_below_what_the_module_can_enforce_is_clamped_and_said() -> None:
    core, fake = module_node("GB200")
    ack = core.on_command(command(1, 1, cap(0, 210.0)))
    assert ack.gpus[0].clamped and ack.gpus[0].cap_w == 250.0
    assert module_of(fake).current_mw == module_of(fake).min_mw == 400_000


def test_a_refused_module_write_is_in_the_ack_and_the_cap_holds_on_the_gpu_limit() -> None:
    core, fake = module_node("GB200")
    fake.require_root = True  # pynvml drops NO_PERMISSION on the v2 setter...
    ack = core.on_command(command(1, 1, cap(0, 700.0)))
    assert ack.result == "partial"
    assert "not taken" in ack.errors[0].message  # ...the read-back catches it
    # the v1 setter does raise NO_PERMISSION: nothing moved, and the ack says what holds
    assert ack.gpus[0].cap_w == FAILSAFE_W


def test_failsafe_puts_the_module_back_at_the_failsafe_cap() -> None:
    core, fake = module_node("GB200")
    core.on_command(command(1, 1, cap(0, 1100.0)))
    assert module_of(fake).current_mw == 1_250_000
    core.enter_failsafe("test")
    assert module_of(fake).current_mw == round((FAILSAFE_W + ALLOWANCE_W) * 1000)


def test_on_exit_restore_puts_the_module_limit_back_as_it_was() -> None:
    fake = FakeNvml([gpu_model("GB200"), gpu_model("H100")])
    module_of(fake).current_mw = 1_300_000  # an operator's limit, before the agent started
    core = core_following(core_clock(), with_module_scope(open_nvml(fake)))
    core.on_command(command(1, 1, cap(0, 700.0), cap(1, 600.0)))
    core.stop("restore")
    assert module_of(fake).current_mw == 1_300_000
    assert (fake.device(0).limit_mw, fake.device(1).limit_mw) == (1_200_000, 700_000)


def test_on_exit_keep_leaves_the_module_limit() -> None:
    core, fake = module_node("GB200")
    core.on_command(command(1, 1, cap(0, 700.0)))
    core.stop("keep")
    assert module_of(fake).current_mw == 850_000


# -- property --------------------------------------------------------------------------------


@st.composite
def module_limits(draw: st.DrawFn) -> tuple[int, int, int]:
    """A module's (min, max, default) limits in mW, around the GB200's 1200 W GPU default."""
    low = draw(st.integers(50_000, 2_000_000))
    high = draw(st.integers(low, 3_000_000))
    return low, high, draw(st.integers(low, high))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    limits=module_limits(),
    caps_w=st.lists(
        st.floats(0.001, 3000.0) | st.floats(0.001, 1e6, allow_infinity=False),
        min_size=1,
        max_size=5,
    ),
)
def test_whatever_cap_arrives_the_module_limit_is_within_the_module_range(
    limits: tuple[int, int, int], caps_w: list[float]
) -> None:
    fake = FakeNvml([gpu_model("GB200")])
    module = module_of(fake)
    module.min_mw, module.max_mw, module.default_mw = limits
    module.current_mw = module.default_mw
    core = core_following(core_clock(), with_module_scope(open_nvml(fake)))
    allowance_w = module.default_mw / 1000 - 1200.0
    for seq, cap_w in enumerate(caps_w, start=1):
        ack = core.on_command(command(1, seq, cap(0, cap_w)))
        assert ack.result == "applied", ack.errors
        assert module.min_mw <= module.current_mw <= module.max_mw
        assert fake.device(0).limit_mw == 1_200_000  # the GPU limit stays at its default
        enforced_w = ack.gpus[0].cap_w
        assert enforced_w == pytest.approx(module.current_mw / 1000 - allowance_w, abs=0.002)
        assert ack.gpus[0].clamped == (enforced_w != pytest.approx(cap_w, abs=0.002))


def test_the_fake_gb200_module_figures_are_the_ones_these_tests_assume() -> None:
    module = ModuleLimit.of_model(gpu_model("GB200"))
    assert module is not None
    assert dataclasses.astuple(module) == (400_000, 1_350_000, 1_350_000, 1_350_000)
    assert module.default_mw / 1000 - gpu_model("GB200").cap_default_w == ALLOWANCE_W
