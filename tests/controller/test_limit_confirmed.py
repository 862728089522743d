"""`powerd limit set|clear` confirmed by the leader, and `powerd status` (issue 36, "Operator
actions lost silently"): real Mosquitto with the shipped ACL and passwords, a real
`powerd controller` process, the CLI as a process.

Before: `limit set` printed "site limited to ..." and exited 0 whatever came of it: under
a login the ACL denies, with no controller running, with a key not trusted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from powerd.signing import generate_key_files
from tests.liveness.clocks import needs_faketime, skewed_clock, spawn_controller, stop, tail
from tests.support.brokers import Mosquitto
from tests.support.controller_harness import CLUSTER, budgets_toml, controller_toml
from tests.support.keys import key_files
from tests.support.secure_brokers import shipped_acl_broker

PASSWORDS = {
    "powerd-controller": "ctl-Secret-1",
    "powerd-operator": "op-Secret-3",
    "powerd-reader": "read-Secret-4",
}


@dataclass
class Site:
    broker: Mosquitto
    directory: Path
    op_key: Path
    controller_pub: Path
    log: Path

    def url(self, user: str) -> str:
        return f"mqtt://{user}@127.0.0.1:{self.broker.port}"

    def powerd(
        self, *args: str, user: str = "powerd-operator", env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environ = {**(env or os.environ), "POWERD_MQTT_PASSWORD": PASSWORDS[user]}
        argv = [sys.executable, "-m", "powerd", *args, "--broker", self.url(user)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environ)

    def limit(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return self.powerd(
            "limit", *args, "--key", str(self.op_key), "--cluster", CLUSTER,
            "--trust", str(self.controller_pub), **kwargs,  # type: ignore[arg-type]
        )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The broker under the shipped ACL, and one controller (the module's: ~3 s to start)
    logged in as powerd-controller, trusting one operator key."""
    d = tmp_path_factory.mktemp("site")
    broker = shipped_acl_broker(d, PASSWORDS)
    broker.start()
    op_key, op_pub = generate_key_files(d / "operator")
    ctl_key, ctl_pub = key_files(d)
    (d / "ctl.pw").write_text(PASSWORDS["powerd-controller"])
    config = controller_toml(broker, "ctl-a").replace(
        broker.url, f"mqtt://powerd-controller@127.0.0.1:{broker.port}"
    )
    config = config.replace("reconnect_min_s", f'password_file = "{d / "ctl.pw"}"\nreconnect_min_s')
    (d / "c.toml").write_text(config + f'\n[trust]\noperator_keys = ["{op_pub}"]\n')
    (d / "b.toml").write_text(budgets_toml())
    log = d / "ctl.log"
    argv = [
        "--config",
        str(d / "c.toml"),
        "--budgets",
        str(d / "b.toml"),
        "--signing-key",
        str(ctl_key),
    ]
    ctl = spawn_controller(argv, log)
    try:
        yield Site(broker, d, op_key, ctl_pub, log)
    finally:
        stop(ctl)
        broker.stop()


@needs_faketime
def test_a_limit_is_confirmed_refused_when_older_and_cleared(site: Site) -> None:
    """(a) set under the operator login: confirmed (signature checked), and `powerd status`
    shows it in force; (d) a limit older than the one held: refused, with the reason;
    (e) clear: confirmed, and status shows none in force."""
    got = site.limit("set", "--site", "9kW", "--for", "15m", "--wait-s", "20")
    assert got.returncode == 0, got.stdout + got.stderr + tail(site.log)
    assert "confirmed by controller ctl-a" in got.stdout and "9.0 kW" in got.stdout
    assert "unverified" not in got.stdout
    status = site.powerd("status", "--cluster", CLUSTER, "--trust", str(site.controller_pub))
    assert status.returncode == 0, status.stderr
    assert "ctl-a" in status.stdout and "9.0 kW" in status.stdout and ", in force" in status.stdout

    behind = skewed_clock(site.directory, "operator", "-1h").env()  # its ts older than held
    got = site.limit("set", "--site", "8kW", "--for", "15m", "--wait-s", "20", env=behind)
    assert got.returncode == 1, got.stdout + got.stderr
    assert "REFUSED by controller ctl-a" in got.stderr and "not newer" in got.stderr

    got = site.limit("clear", "--wait-s", "20")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "confirmed by controller ctl-a" in got.stdout and "cleared" in got.stdout
    status = site.powerd("status", "--cluster", CLUSTER, "--json", user="powerd-reader")
    assert status.returncode == 0, status.stderr
    (leader,) = json.loads(status.stdout)["leaders"]
    assert leader["state"]["limit"]["limit_w"] is None and not leader["verified"]
    assert leader["state"]["nodes"]["stale"] == 4  # no agents here: every node stale


def test_a_login_the_acl_denies_is_told_at_once(site: Site) -> None:
    """(b) powerd-reader may not publish a limit: MQTT v5's PUBACK says so."""
    got = site.limit("set", "--site", "9kW", "--for", "1m", user="powerd-reader")
    assert got.returncode == 1, got.stdout
    assert "NOT taken" in got.stderr and "Not authorized" in got.stderr


def test_no_leader_and_an_untrusted_key_time_out(site: Site, tmp_path: Path) -> None:
    """(c) no controller for the cluster; (d) a key not in trust.operator_keys: both exit 1
    after --wait-s, naming the likely causes; status finds no leader for the cluster."""
    got = site.powerd("limit", "set", "--site", "9kW", "--for", "1m", "--key", str(site.op_key),
                      "--cluster", "nobody", "--wait-s", "1")  # fmt: skip
    assert got.returncode == 1 and "NOT confirmed within 1 s" in got.stderr, got.stderr
    assert "no leader state seen at all" in got.stderr and "trust.operator_keys" in got.stderr
    stranger, _ = generate_key_files(tmp_path / "stranger")
    got = site.powerd("limit", "set", "--site", "9kW", "--for", "1m", "--key", str(stranger),
                      "--cluster", CLUSTER, "--wait-s", "1.5")  # fmt: skip
    assert got.returncode == 1 and "NOT confirmed" in got.stderr, got.stderr
    assert "controller ctl-a" in got.stderr  # the leader is there: the key is the cause
    status = site.powerd("status", "--cluster", "nobody", "--wait-s", "1")
    assert status.returncode == 1 and "no leader state" in status.stderr
