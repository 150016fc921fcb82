"""Connection-level limits uvicorn does not enforce: a header timeout, a header size cap and
a connection cap, on uvicorn's httptools protocol.

uvicorn (0.54) has no timeout for reading a request's headers: a connection that sends
nothing, or half a request line, stays open for ever (issue 15: 1000 slow-header
connections were all still open after 90 s); its httptools protocol buffers a request's
headers without a size limit; and its ``limit_concurrency`` answers a plain-text 503 only
once a full request arrived. Its ``http`` option takes a protocol class, so
:func:`gateway_protocol` subclasses its httptools protocol (the C parser: issue 14 measured
about 0.7 ms of CPU per request less than its pure-Python h11 protocol) to add:

* **header timeout**: a connection must deliver a complete request line and headers within
  ``header_timeout`` seconds of opening, and later requests within ``header_timeout`` of
  their first byte (idle keep-alive connections are left to ``timeout_keep_alive``); else it
  is closed;
* **header size**: a request line and headers over ``max_header_bytes`` get a 400 and the
  connection is closed (h11's own limit, which this replaces, did the same);
* **one write per response**: a response's head leaves with its body (``_OneWriteResponses``);
* **connection cap**: a connection opened while ``max_connections`` are open gets a 503
  ``too_many_connections`` in the surface's shape (``Retry-After: 1``) for its first request,
  and is closed; it has at most ``OVER_CAP_HEADER_TIMEOUT`` seconds to send that request, so
  a flood of idle connections frees its file descriptors quickly.

The subclass touches only the protocol's life cycle (``connection_made``, ``data_received``,
``connection_lost``), the parser callbacks it extends (``on_message_begin``,
``on_headers_complete``, ``on_message_complete``, each calling uvicorn's) and three
attributes (``app``, ``transport``, ``loop``). ``tests/test_connections.py`` pins the
behaviour against the installed uvicorn. A reverse proxy in front (nginx
``client_header_timeout``, ``large_client_header_buffers``, ``limit_conn``) gives the same
protection and is the right place for it on a shared host.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rlgate.config import GatewayConfig
from rlgate.errors import Unavailable
from rlgate.server.asgi_errors import send_error

log = logging.getLogger("rlgate.server")

OVER_CAP_HEADER_TIMEOUT = 1.0


async def _too_many_connections(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send_error(scope, send, Unavailable("too many open connections to the gateway; retry shortly",
                                              code="too_many_connections", retry_after=1))


class _HeadersTooLarge(Exception):
    pass


class _OneWriteResponses:
    """The transport a request's response is written to: uvicorn writes the status line and
    headers the moment the app sends ``http.response.start``, and the body with the next
    message, so every response left in two writes (two syscalls, two packets, two wake-ups of
    the reader; on the cluster the router pays it twice per request). This holds a response
    head back until the next write, which then carries both, or until the end of the current
    event-loop iteration (a stream whose first event is not ready yet still gets its headers
    at once). Writes keep their order whatever is held; interim 1xx answers go out at once.
    """

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
            self._transport.write(data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 1"):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self._transport, name)


class _GatewayProtocol(HttpToolsProtocol):
    header_timeout: float = GatewayConfig.header_timeout
    max_connections: int = GatewayConfig.max_connections
    max_header_bytes: int = 64 * 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._timeout = self.header_timeout
        self._idle = True  # between requests: no byte of a next request seen yet
        self._in_head = False  # a request line / headers have started and not finished
        self._head_bytes = 0  # request line and headers parsed so far
        self._head_raw = 0  # bytes received while they are incomplete
        self._heads_done = False  # a request's headers completed during the current data_received
        self._responses = _OneWriteResponses(transport, self.loop)
        if len(self.connections) > self.max_connections:
            self.app = _too_many_connections
            self._timeout = min(self._timeout, OVER_CAP_HEADER_TIMEOUT)
            log.warning("%d open connections (max_connections=%d): answering 503", len(self.connections),
                        self.max_connections)
        self._arm()

    def data_received(self, data: bytes) -> None:
        was_in_head = self._in_head
        if self._header_timer is None and (self._idle or self._in_head):
            self._arm()  # the first byte of a next request on a kept-alive connection
        self._heads_done = False
        super().data_received(data)
        if self._in_head:
            # httptools holds an unfinished header line in its own buffer, out of on_header's
            # sight: count what arrived while the headers are incomplete
            self._head_raw = (self._head_raw if was_in_head else 0) + len(data)
            if self._head_raw > self.max_header_bytes and not self.transport.is_closing():
                self._headers_too_large()
        elif self._heads_done or not self._idle:
            # the request line and headers are in (the whole request may be too: idle again)
            self._disarm()

    def on_message_begin(self) -> None:
        self._idle = False
        self._in_head = True
        self._head_raw = self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > self.max_header_bytes:
            raise _HeadersTooLarge  # feed_data raises HttpParserCallbackError: uvicorn answers 400, closes
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.max_header_bytes:
            raise _HeadersTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done = True
        transport, self.transport = self.transport, self._responses  # type: ignore[assignment]
        try:
            super().on_headers_complete()  # the request's cycle writes its response through it
        finally:
            self.transport = transport

    def on_message_complete(self) -> None:
        self._idle = True
        super().on_message_complete()

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

    def _headers_too_large(self) -> None:
        log.info("closing a connection whose request headers exceed %d bytes", self.max_header_bytes)
        self.send_400_response("Request headers too large.")

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        responding = self.cycle is not None and not self.cycle.response_complete
        if (self._idle or self._in_head) and not responding and not self.transport.is_closing():
            log.info("closing a connection that sent no complete request headers within %g s", self._timeout)
            self.transport.close()


def gateway_protocol(header_timeout: float, max_connections: int, max_header_bytes: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the gateway's header timeout, header size cap and
    connection cap."""
    return type("GatewayProtocol", (_GatewayProtocol,),
                {"header_timeout": header_timeout, "max_connections": max_connections,
                 "max_header_bytes": max_header_bytes})
