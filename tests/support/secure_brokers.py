"""Mosquitto with passwords, the shipped ACL and TLS, for the agent's and the controller's tests."""

from __future__ import annotations

import subprocess
from importlib import resources
from pathlib import Path

from tests.support.brokers import Mosquitto


def shipped_acl_config(d: Path, users: dict[str, str]) -> str:
    """Mosquitto config lines for powerd's shipped ACL and a password file of ``users``
    (login: password), both written in ``d``."""
    acl = d / "acl"
    acl.write_text(resources.files("powerd.data").joinpath("mosquitto-acl.example").read_text())
    passwords = passwd_file(d / "passwd", users)
    return f"password_file {passwords}\nacl_file {acl}"


def shipped_acl_broker(d: Path, users: dict[str, str]) -> Mosquitto:
    """Mosquitto (not started) with no anonymous access, ``users``' passwords and the
    shipped ACL."""
    return Mosquitto(d, allow_anonymous=False, extra_config=shipped_acl_config(d, users))


def passwd_file(path: Path, users: dict[str, str]) -> Path:
    path.write_text("")
    for user, password in users.items():
        subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True)
    return path


def make_certs(d: Path, client_cn: str) -> dict[str, Path]:
    """A throwaway CA in ``d``, a server certificate for 127.0.0.1 and a client certificate
    (``client_cn``), and a second CA that signed nothing. Keys: ``ca_crt``, ``server_key``..."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=powerd-test-ca",
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", f"/CN={client_cn}")):
        run("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        )
    # a second CA that signed nothing here: trusting it must not be enough
    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "other.key",
        "-out",
        "other.crt",
        "-days",
        "2",
        "-subj",
        "/CN=someone-else",
    )
    return {p.stem + p.suffix.replace(".", "_"): p for p in d.iterdir()}


def tls_broker(tmp_path: Path, certs: dict[str, Path], require_client_cert: bool) -> Mosquitto:
    options = (
        f"cafile {certs['ca_crt']}\ncertfile {certs['server_crt']}\nkeyfile {certs['server_key']}\n"
        f"require_certificate {'true' if require_client_cert else 'false'}"
    )
    return Mosquitto(tmp_path, listener_options=options, tls=True)
