"""``powerd gpus --check``: every control the agent uses is tried on each GPU and put back
as found; a device's enforcement delay is measured; what fails is said, with exit 1."""

from __future__ import annotations

import json
import time

from click.testing import CliRunner

from powerd.cli import main
from powerd.gpu.check import check_gpu, report_lines
from powerd.gpu.errors import GpuPermissionError
from powerd.gpu.models import gpu_model
from powerd.gpu.nvml import open_nvml
from powerd.gpu.simulated import open_simulated
from tests.support.fakes.fake_pynvml import FakeNvml


def by_control(check) -> dict[str, bool | None]:
    return {c.control: c.ok for c in check.controls}


def test_simulated_gpus_pass_and_are_left_as_found() -> None:
    result = CliRunner().invoke(main, ["gpus", "--simulate", "2xH100", "--check", "--json"])
    assert result.exit_code == 0, result.output
    checks = [json.loads(line) for line in result.stdout.splitlines()]
    assert [c["index"] for c in checks] == [0, 1] and all(c["ok"] for c in checks)
    for c in checks:
        oks = {r["control"]: r["ok"] for r in c["controls"]}
        assert oks == {
            "cap": True,
            "clock lock": True,
            "power smoothing": None,  # an H100 has none: not a failure
            "module power limit": None,
        }
        assert c["restored"] and set(c["reads_ms"]) >= {"energy", "one telemetry sample"}


def test_the_enforcement_delay_is_measured_and_every_blackwell_control_put_back() -> None:
    """A GB200 on the fake NVML, enforcing a new limit 50 ms after it is set."""
    fake = FakeNvml([gpu_model("GB200")], clock=time.monotonic, enforce_delay_s=0.05)
    (gpu,) = open_nvml(fake)
    device = fake.device(0)
    before = (device.limit_mw, device.smoothing_enabled, device.module and device.module.current_mw)
    check = check_gpu(gpu)
    assert by_control(check) == {
        "cap": True,
        "clock lock": True,
        "power smoothing": True,
        "module power limit": True,
    }
    assert check.enforce_ms is not None and 45 <= check.enforce_ms < 1000
    assert check.ok and check.restored
    after = (device.limit_mw, device.smoothing_enabled, device.module and device.module.current_mw)
    assert after == before and device.locked_clocks_mhz is None
    assert "GPU 0 (NVIDIA GB200): ok" in report_lines([check])[0]


def test_a_node_where_the_agent_is_not_root_fails_and_says_why() -> None:
    fake = FakeNvml([gpu_model("H100")])
    fake.require_root = True
    (gpu,) = open_nvml(fake)
    check = check_gpu(gpu)
    assert by_control(check)["cap"] is False and by_control(check)["clock lock"] is False
    assert not check.ok and check.restored  # nothing was changed
    assert "root" in next(c.detail for c in check.controls if c.control == "cap")


def test_a_control_that_cannot_be_put_back_is_reported() -> None:
    (gpu,) = open_simulated("1xH100")
    gpu.inject_error("unlock_sm_clock", GpuPermissionError("not allowed"), times=None)
    check = check_gpu(gpu)
    assert by_control(check)["clock lock"] is False
    assert not check.restored and not check.ok
    assert check.restore_errors == ["not allowed"]
    assert any("NOT as found: not allowed" in line for line in report_lines([check]))
