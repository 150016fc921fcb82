"""Connection-level limits uvicorn does not enforce: a header timeout and a connection cap.

uvicorn (0.54) has no timeout for reading a request's headers: a connection that sends
nothing, or half a request line, stays open for ever (issue 15: 1000 slow-header
connections were all still open after 90 s), and its ``limit_concurrency`` answers a
plain-text 503 only once a full request arrived. Its ``http`` option takes a protocol
class, so :func:`gateway_protocol` subclasses its h11 protocol (the pure-Python one, always
installed) to add:

* **header timeout**: a connection must deliver a complete request line and headers within
  ``header_timeout`` seconds of opening, and later requests within ``header_timeout`` of
  their first byte (idle keep-alive connections are left to ``timeout_keep_alive``); else it
  is closed;
* **connection cap**: a connection opened while ``max_connections`` are open gets a 503
  ``too_many_connections`` in the surface's shape (``Retry-After: 1``) for its first request,
  and is closed; it has at most ``OVER_CAP_HEADER_TIMEOUT`` seconds to send that request, so
  a flood of idle connections frees its file descriptors quickly.

The subclass touches only the protocol's documented life cycle (``connection_made``,
``data_received``, ``connection_lost``) and two attributes (``conn``, the h11 state machine;
``app``). ``tests/test_connections.py`` pins the behaviour against the installed uvicorn.
A reverse proxy in front (nginx ``client_header_timeout``, ``client_body_timeout``,
``limit_conn``) gives the same protection and is the right place for it on a shared host.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlgate.errors import Unavailable
from rlgate.server.asgi_errors import send_error

log = logging.getLogger("rlgate.server")

OVER_CAP_HEADER_TIMEOUT = 1.0


async def _too_many_connections(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send_error(scope, send, Unavailable("too many open connections to the gateway; retry shortly",
                                              code="too_many_connections", retry_after=1))


class _GatewayH11Protocol(H11Protocol):
    header_timeout: float = 10.0
    max_connections: int = 2048

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._timeout = self.header_timeout
        if len(self.connections) > self.max_connections:
            self.app = _too_many_connections
            self._timeout = min(self._timeout, OVER_CAP_HEADER_TIMEOUT)
            log.warning("%d open connections (max_connections=%d): answering 503", len(self.connections),
                        self.max_connections)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of a next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the request line and headers are in

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self._timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection that sent no complete request headers within %g s", self._timeout)
            self.transport.close()


def gateway_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the gateway's header timeout and connection cap."""
    return type("GatewayH11Protocol", (_GatewayH11Protocol,),
                {"header_timeout": header_timeout, "max_connections": max_connections})
