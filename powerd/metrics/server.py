"""Serving one daemon's ``CollectorRegistry`` at ``http://HOST:PORT/metrics``.

A small threaded HTTP server of the standard library (a daemon thread, so it never keeps
a stopping process alive) around ``prometheus_client.generate_latest``: the same on every
prometheus-client from 0.17 on. A scrape runs in the server's thread and reads only the
snapshot the daemon last handed its collector.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from powerd.metrics.address import ListenAddress, parse_listen

log = logging.getLogger(__name__)


class MetricsError(ValueError):
    """The endpoint cannot be served; the message says where and what to do."""


def serve(collector: Collector, listen: str, what: str) -> MetricsServer | None:
    """``collector``'s series at ``http://listen/metrics`` (its own registry: no
    process-wide default series), or None, said in the log at ERROR, when the address
    cannot be bound: metrics never stop a daemon from managing power (Prometheus then
    reports the target down, alert PowerdTargetDown)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server = MetricsServer(registry, listen, what)
    except MetricsError as exc:
        log.error("%s; running without metrics", exc)
        return None
    log.info("metrics at %s", server.url)
    return server


class MetricsServer:
    """``/metrics`` of ``registry`` on ``listen`` (HOST:PORT), served from a thread."""

    def __init__(self, registry: CollectorRegistry, listen: str, what: str) -> None:
        """``what``: the daemon, for the error messages ("controller"). Raises MetricsError
        when the address cannot be bound (a port in use, a host not on this machine)."""
        address = parse_listen(listen)
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        server_class = type("_Server", (ThreadingHTTPServer,), {"address_family": family})
        try:
            self._server = server_class((address.host, address.port), _handler(registry))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise MetricsError(
                    f"metrics.listen {address}: port {address.port} is in use (another "
                    f"{what}, or another program): give a free one with --metrics-listen "
                    "HOST:PORT or [metrics] listen"
                ) from None
            raise MetricsError(
                f"metrics.listen {address}: cannot listen there: {exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://{ListenAddress(address.host, self.port)}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"{what}-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


def _handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served here")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: a scrape every 15 s is not worth a log line."""

    return Handler
