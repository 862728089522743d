"""`powerd controller` as a process against a real Mosquitto: it leads, records line protocol to a
file, steps down on SIGTERM; a bad budgets file or configuration stops it with exit code 1 and
a message naming the file."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import pytest

from powerd.topology import parse_budgets
from tests.support.controller_harness import (
    FAILSAFE_CAP_W,
    SERVERS,
    TOPICS,
    WAIT_S,
    budgets_toml,
    heartbeat_of,
    probe,
    run_controller_cli,
    running_agents,
    spawn_controller,
    until,
)

# measurement,tags fields timestamp-in-ns
# These fail before connecting anywhere; were one not to, it would time out against this.
NO_BROKER = "mqtt://127.0.0.1:1"
# measurement,tags fields timestamp; a space inside a tag is escaped (cause=failsafe\ start)
_PART = r"(?:[^ \\]|\\.)+"
LINE = re.compile(rf"^(tree|decision|gpu|phase_event|job_held),{_PART} {_PART} \d{{19}}$")


async def test_controller_leads_records_and_steps_down_on_sigterm(mosquitto, tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    record = tmp_path / "telemetry.lp"
    args = [
        "--budgets", str(budgets),
        "--broker", mosquitto.url,
        "--cluster", TOPICS.cluster,
        "--name", "ctl-cli",
        "--cycle-s", "0.2",
        "--record", str(record),
    ]  # fmt: skip
    topology = parse_budgets(budgets.read_text())
    async with probe(mosquitto) as p, running_agents(mosquitto, topology, "compute") as agents:
        started = time.time()
        proc = spawn_controller(args, tmp_path / "controller.log")
        try:
            beat = await p.expect(
                TOPICS.heartbeat, lambda m: heartbeat_of(m).state == "leader", timeout_s=30
            )
            # it controls: every agent acknowledges its commands, and its caps move the GPUs
            # off the failsafe caps they started at, up to their maximum (safety by caps, the
            # default: every rack of this tree fits its GPUs at 700 W within its limit)
            for node in SERVERS:
                await p.expect(TOPICS.ack(node))
            await agents.wait_for(
                lambda: min(agents.caps()) > FAILSAFE_CAP_W, what="caps raised past failsafe"
            )

            def recorded() -> str:
                return record.read_text() if record.exists() else ""

            await until(
                lambda: all(f"\n{m}," in "\n" + recorded() for m in ("tree", "decision", "gpu")),
                what=f"tree, decision and gpu lines in {record}",
            )
            mark = p.mark()
            proc.send_signal(signal.SIGTERM)
            returncode = await asyncio.to_thread(proc.wait, WAIT_S)
        finally:
            proc.kill()
            proc.wait(WAIT_S)
        standby = await p.expect(
            TOPICS.heartbeat, lambda m: heartbeat_of(m).state == "standby", after=mark
        )

    log = (tmp_path / "controller.log").read_text()
    assert returncode == 0, log
    leader = heartbeat_of(beat)
    # its epoch: the wall clock in ms when it took over (no retained heartbeat to beat)
    assert leader.controller == "ctl-cli" and leader.epoch >= int(started * 1000)
    down = heartbeat_of(standby)
    assert (down.controller, down.state, down.epoch) == ("ctl-cli", "standby", leader.epoch)
    async with probe(mosquitto) as late:  # the standby heartbeat is what stays retained
        retained = await late.expect(TOPICS.heartbeat)
    assert retained.retain and heartbeat_of(retained).state == "standby"
    # its last word (a leader heartbeat may have been in flight when SIGTERM came)
    assert [m for m in p.messages[mark:] if m.topic == TOPICS.heartbeat][-1] is standby
    beats = {heartbeat_of(m).epoch for m in p.messages if m.topic == TOPICS.heartbeat}
    assert beats == {leader.epoch}

    lines = record.read_text().splitlines()
    assert lines and all(LINE.match(line) for line in lines), [
        line for line in lines if not LINE.match(line)
    ][:3]
    stamps_s = [int(line.rsplit(" ", 1)[1]) / 1e9 for line in lines]
    assert started - 5 < min(stamps_s) and max(stamps_s) < time.time() + 1
    assert any(line.startswith("tree,") and "name=r1-k1" in line for line in lines)
    assert any(line.startswith("gpu,") and "node=r1-k2-n2" in line for line in lines)
    assert any(line.startswith("decision,") and "controller=ctl-cli" in line for line in lines)


BAD_BUDGETS = {
    "missing": None,
    "not-toml": "version = 1\n[site\n",
    "no-limit": 'version = 1\n[site]\nname = "x"\n',
    "kilowatts-as-watts": budgets_toml().replace("limit_w = 6200", "limit_w = 6.2"),
}


@pytest.mark.parametrize("case", sorted(BAD_BUDGETS))
def test_bad_budgets_file_exits_1_naming_the_file(case, tmp_path):
    budgets = tmp_path / f"budgets-{case}.toml"
    if BAD_BUDGETS[case] is not None:
        budgets.write_text(BAD_BUDGETS[case])
    done = run_controller_cli(
        ["--budgets", str(budgets), "--broker", NO_BROKER, "--cluster", TOPICS.cluster]
    )
    assert done.returncode == 1, done.stderr
    assert f"Error: {budgets}" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one clear line, no log noise


def bad_configs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """case: (extra arguments, what the message must say)."""
    unknown = tmp_path / "unknown-key.toml"
    unknown.write_text("[controller]\ncycle_z = 1\n")
    wrong_type = tmp_path / "wrong-type.toml"
    wrong_type.write_text('[controller]\ncycle_s = "fast"\n')
    takeover = tmp_path / "takeover.toml"
    takeover.write_text("[controller]\nheartbeat_s = 1\ntakeover_after_s = 1.5\n")
    return {
        "unknown key": (["--config", str(unknown)], f"{unknown}: unknown key(s) ['cycle_z']"),
        "wrong type": (["--config", str(wrong_type)], f"{wrong_type}: controller.cycle_s"),
        "takeover too soon": (["--config", str(takeover)], f"{takeover}: controller.takeover"),
        "missing config": (["--config", str(tmp_path / "nope.toml")], "nope.toml: no such file"),
        "cycle out of range": (["--cycle-s", "0"], "controller.cycle_s must be in"),
        "broker scheme": (["--broker", "ftp://x"], "--broker"),
        "record dir missing": (["--record", str(tmp_path / "no" / "t.lp")], "t.lp"),
        "record url option": (["--record", "influx+http://127.0.0.1:1?org=o&bucket=b&x=1"], "x"),
    }


CONFIG_CASES = [
    "unknown key",
    "wrong type",
    "takeover too soon",
    "missing config",
    "cycle out of range",
    "broker scheme",
    "record dir missing",
    "record url option",
]


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_bad_configuration_exits_1_with_a_clear_message(case, tmp_path):
    budgets = tmp_path / "budgets.toml"
    budgets.write_text(budgets_toml())
    extra, says = bad_configs(tmp_path)[case]
    args = ["--budgets", str(budgets), "--cluster", TOPICS.cluster]
    if "--broker" not in extra:
        args += ["--broker", NO_BROKER]
    done = run_controller_cli(args + extra)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: ") or "\nError: " in done.stderr, done.stderr
    assert says in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def record_forms() -> list[str]:
    """Every scheme the recorder takes (powerd.recorder.config), as a --record value starts."""
    from powerd.recorder.config import _INFLUX_SCHEMES  # what open_recorder accepts

    return [f"{scheme}://" for scheme in (*_INFLUX_SCHEMES, "file")]


@pytest.mark.parametrize("command", ["controller", "demo"])
def test_record_help_lists_every_form_the_recorder_takes(command: str):
    """The controller's help named influx+http:// and a file only, not influx1+http://
    (InfluxDB 1.x), https:// or file://; both commands now share one text
    (powerd.cli.options.record_option)."""
    from powerd.cli import main

    found = next(p for p in main.commands[command].params if p.name == "record")
    assert found.help is not None
    named = [m.group(0) for m in re.finditer(r"(?<![\w+])[\w+]+://", found.help)]
    missing = [form for form in record_forms() if form not in named]
    assert not missing, found.help
    assert "line-protocol file" in found.help


def test_a_cycle_written_with_its_unit_gets_the_number_to_write():
    from click.testing import CliRunner

    from powerd.cli import main

    result = CliRunner().invoke(main, ["controller", "--budgets", "b.toml", "--cycle-s", "2s"])
    assert result.exit_code == 2
    assert "--cycle-s takes seconds as a number: write 2 for 2s" in result.output
