"""A separate bind that serves one Prometheus registry without a key (``--metrics-port``).

For scrapers that should not hold the admin key: it serves only metrics (no session ids,
no keys, no text of any conversation; labels are bounded enums), on its own address and
port, with ``prometheus_client``'s own HTTP server on a daemon thread. Used by the gateway
(``GatewayConfig.metrics_port``) and by ``rlgate train`` / ``rlgate demo``.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import start_http_server

log = logging.getLogger("rlgate.metrics")


class MetricsServer:
    """``GET /metrics`` (any path) of ``registry`` on ``host:port``; ``port=0`` picks a free one."""

    def __init__(self, registry: Any, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.host = host
        self.port = int(self._server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
