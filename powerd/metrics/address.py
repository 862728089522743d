"""``[metrics] listen = "HOST:PORT"``: where a daemon serves ``/metrics``."""

from __future__ import annotations

from typing import NamedTuple


class ListenAddress(NamedTuple):
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> ListenAddress:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:9471``); ValueError saying what is
    wrong with it."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(
            f"{text!r} is not HOST:PORT (for example 0.0.0.0:9471, or 127.0.0.1:9471 for "
            "this host only)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: put an IPv6 address in brackets, [ADDRESS]:PORT")
    if not host:
        raise ValueError(f"{text!r}: no host before the port")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r}: the port must be a number in 1..65535")
    return ListenAddress(host, int(port_text))
