"""The router's HTTP client to the replicas: pooled keep-alive connections, bytes in, bytes out.

The router forwards every generation request, so this client is on the cluster's hot path.
It speaks only what the router needs, HTTP/1.1 to rlgate's own replicas: one write per
request (head and body together), responses parsed by ``httptools`` (the C parser uvicorn
uses for the server side, already a dependency), bodies handed on as they arrive, never
parsed. ``aiohttp``'s ``ClientSession.request``, used before, cost the router ~0.45 ms of
CPU per forwarded request (a quarter of all it spent: URL objects, cookie jar, tracing
hooks, timeouts per request); see docs/architecture.md, "The router's client", for the
measurements.

* **Pool**: idle connections per replica, reused last-in first-out. An idle connection is
  retired after ``KEEP_ALIVE_S`` seconds, before the replica's own server would close it
  (65 s, as ``server/serve.py`` sets). At most ``max_connections`` requests are in flight
  at once; more wait for a slot.
* **Retry**: a request that fails on a *reused* connection before any byte of its response
  arrived (the replica closed it meanwhile) is sent once more on a new connection; the
  replica never saw it. Any other failure is :class:`UpstreamUnavailable`.
* **Backpressure**: a response body is buffered up to ``MAX_BUFFER`` bytes, then the
  connection stops reading until the router's client takes what is there (a slow SSE
  reader slows its replica's socket, not the router's memory).
* **Timeouts**: ``CONNECT_TIMEOUT_S`` to connect; none for the response (streams are long:
  the replica's own limits end a stuck generation).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

__all__ = ["Upstream", "UpstreamResponse", "UpstreamUnavailable"]

KEEP_ALIVE_S = 30.0
CONNECT_TIMEOUT_S = 5.0
MAX_BUFFER = 256 * 1024  # response bytes held before the connection stops reading
_DROP = {b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer",
         b"upgrade", b"proxy-connection", b"expect"}


class UpstreamUnavailable(Exception):
    """The replica could not be reached, or went away during the response."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection to a replica and the response being read on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self._reset(head=False)

    def _reset(self, *, head: bool) -> None:
        self.head_only = head
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.got_bytes = False
        self.headers_done = False
        self.complete = False
        self.error: str | None = None
        self.keep_alive = False
        self.paused = False
        self.waiter: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the replica switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"malformed response from the replica: {exc}")
        if self.buffered > MAX_BUFFER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._fail(f"the replica closed the connection ({exc!r})" if exc else "the replica closed the connection")
        self._wake()

    # ------------------------------------------------------------------ httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        if self.head_only:  # a HEAD response has headers only, whatever Content-Length says
            self.complete = True
            self.keep_alive = False
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # ------------------------------------------------------------------ use

    def _fail(self, error: str) -> None:
        if self.error is None and not self.complete:
            self.error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        """Until something new arrived (headers, body, the end, an error)."""
        self.waiter = self.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def take(self) -> list[bytes]:
        chunks, self.chunks, self.buffered = self.chunks, [], 0
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()
        return chunks

    def send(self, data: bytes, *, head: bool) -> None:
        self._reset(head=head)
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """A response whose head has arrived; its body is read with :meth:`chunks` or :meth:`read`."""

    def __init__(self, upstream: Upstream, key: str, conn: _Connection) -> None:
        self._upstream = upstream
        self._key = key
        self._conn: _Connection | None = conn
        self.status = conn.status
        self.headers = conn.headers
        ctype = next((v for k, v in conn.headers if k == b"content-type"), b"")
        self.is_sse = ctype.startswith(b"text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked transfer coding removed)."""
        conn = self._conn
        assert conn is not None, "the response was released"
        while True:
            if conn.chunks:
                for chunk in conn.take():
                    yield chunk
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise UpstreamUnavailable(conn.error)
            await conn.wait()

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def release(self) -> None:
        """Give the connection back (kept if the response was read to its end), else close it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._upstream._release(self._key, conn)


class Upstream:
    """Pooled connections to the replicas (see the module docstring)."""

    def __init__(self, *, max_connections: int = 1024) -> None:
        self.max_connections = max_connections
        self._idle: dict[str, list[_Connection]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever())

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()
        self._slots = None

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(KEEP_ALIVE_S / 4)
            self._reap(time.monotonic())

    def _reap(self, now: float) -> None:
        for key, conns in list(self._idle.items()):
            keep = [c for c in conns if not c.closed and now - c.idle_since < KEEP_ALIVE_S]
            for c in conns:
                if c not in keep:
                    c.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    async def _connect(self, key: str) -> _Connection:
        parts = urlsplit(key)
        if parts.scheme != "http" or not parts.hostname:
            raise UpstreamUnavailable(f"not an http:// replica URL: {key!r}")
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), parts.hostname, parts.port or 80),
                CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return conn

    def _pooled(self, key: str) -> _Connection | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            c = conns.pop()
            if not c.closed and now - c.idle_since < KEEP_ALIVE_S:
                c.reused = True
                return c
            c.close()
        return None

    def _release(self, key: str, conn: _Connection) -> None:
        if self._slots is not None:
            self._slots.release()
        if conn.complete and conn.keep_alive and not conn.closed and conn.error is None:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(key, []).append(conn)
        else:
            conn.close()

    @staticmethod
    def _request_bytes(method: str, target: str, host: str, headers: list[tuple[bytes, bytes]],
                       body: bytes) -> bytes:
        parts = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1")]
        for k, v in headers:
            if k.lower() not in _DROP:
                parts += (k, b": ", v, b"\r\n")
        parts.append(b"content-length: %d\r\n\r\n" % len(body))
        parts.append(body)
        return b"".join(parts)

    async def open(self, base_url: str, method: str, target: str, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> UpstreamResponse:
        """Send a request and wait for its response head; the caller reads the body
        (:meth:`UpstreamResponse.chunks`) and then calls :meth:`UpstreamResponse.release`."""
        if self._slots is None:
            await self.start()
        assert self._slots is not None
        data = self._request_bytes(method, target, urlsplit(base_url).netloc, headers, body)
        await self._slots.acquire()
        try:
            conn = await self._head(base_url, method, data)
        except BaseException:
            self._slots.release()
            raise
        return UpstreamResponse(self, base_url, conn)

    async def _head(self, key: str, method: str, data: bytes) -> _Connection:
        while True:
            conn = self._pooled(key) or await self._connect(key)
            conn.send(data, head=method == "HEAD")
            try:
                while not conn.headers_done and conn.error is None:
                    await conn.wait()
            except BaseException:
                conn.close()
                raise
            if conn.error is None:
                return conn
            conn.close()
            if not (conn.reused and not conn.got_bytes):  # a stale pooled connection: retry on a new one
                raise UpstreamUnavailable(conn.error)

    async def call(self, base_url: str, method: str, target: str, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A whole request/response (control routes): (status, headers, body)."""
        resp = await self.open(base_url, method, target, headers, body)
        try:
            data = await resp.read()
        finally:
            resp.release()
        return resp.status, resp.headers, data
