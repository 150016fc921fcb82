"""The router's client to the replicas (cluster/upstream.py) against raw HTTP servers on 127.0.0.1:
keep-alive reuse, a stale pooled connection retried, a replica dying mid-response, chunked
bodies, HEAD, ``Connection: close``, backpressure, idle connections retired."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from helpers import eventually
from rlgate.cluster.upstream import KEEP_ALIVE_S, MAX_BUFFER, Upstream, UpstreamUnavailable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class RawServer:
    """An HTTP/1.1 server written by hand, so each test controls exactly what goes on the wire."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        n = self.connections
        try:
            await self.handler(reader, writer, n)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


def ok(body: bytes, *extra: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), b"".join(h + b"\r\n" for h in extra), body)


async def test_keep_alive_reuses_one_connection_and_sends_one_request_per_call():
    async def handler(reader, writer, n):
        while True:
            req = await server.read_request(reader)
            writer.write(ok(b'{"n": %d}' % len(server.requests), b"x-replica: 0"))
            await writer.drain()
            assert req

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        for i in range(5):
            status, headers, body = await up.call(url, "POST", "/v1/chat/completions?x=1",
                                                  [(b"Authorization", b"Bearer k"), (b"Host", b"evil"),
                                                   (b"Content-Length", b"999"), (b"Expect", b"100-continue")],
                                                  b'{"a": 1}')
            assert (status, body) == (200, b'{"n": %d}' % (i + 1))
            assert (b"x-replica", b"0") in headers
        await up.close()
    assert server.connections == 1
    req = server.requests[0]
    assert req.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    lines = req.split(b"\r\n\r\n")[0].lower().split(b"\r\n")
    # the router's own Host and Content-Length, not the client's; hop-by-hop headers dropped
    assert lines.count(b"host: " + url.removeprefix("http://").encode()) == 1 and b"host: evil" not in lines
    assert b"content-length: 8" in lines and b"content-length: 999" not in lines
    assert b"authorization: bearer k" in lines and not any(x.startswith(b"expect") for x in lines)
    assert req.endswith(b'{"a": 1}')


async def test_a_pooled_connection_the_replica_closed_is_not_used_again():
    async def handler(reader, writer, n):
        await server.read_request(reader)
        writer.write(ok(b"first" if n == 1 else b"second"))
        await writer.drain()
        # keep-alive promised, then closed: the client holds a pooled connection that is dead

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        assert (await up.call(url, "GET", "/a", [], b""))[2] == b"first"
        await eventually(lambda: all(c.closed for cs in up._idle.values() for c in cs))
        assert (await up.call(url, "GET", "/b", [], b""))[2] == b"second"
        await up.close()
    assert server.connections == 2


async def test_a_pooled_connection_closed_without_the_client_noticing_is_retried():
    """The replica closed the connection after its response, but the close is read only after the
    next request went out on it: sent again on a new connection, the replica never saw it."""
    async def handler(reader, writer, n):
        await server.read_request(reader)
        writer.write(ok(b"n%d" % n))
        await writer.drain()
        if n == 1:
            await reader.read(1)  # the second request's first byte: close without answering
            writer.transport.abort()

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        assert (await up.call(url, "GET", "/a", [], b""))[2] == b"n1"
        assert (await up.call(url, "GET", "/b", [], b""))[2] == b"n2"
        await up.close()
    assert server.connections == 2


async def test_a_replica_that_dies_mid_response_is_an_error_not_a_short_body():
    async def handler(reader, writer, n):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"6\r\ndata: \r\n")
        await writer.drain()
        await reader.read(1)  # until the test says so
        writer.transport.abort()

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        resp = await up.open(url, "POST", "/v1/chat/completions", [], b"{}")
        assert resp.status == 200 and resp.is_sse
        got = []
        with pytest.raises(UpstreamUnavailable, match="closed the connection"):
            async for chunk in resp.chunks():
                got.append(chunk)  # the chunked coding is removed
                server.writers[0].transport.abort()
        assert got == [b"data: "]
        resp.release()
        assert not up._idle.get(url)  # a broken connection is not pooled
        await up.close()


async def test_unreachable_replica():
    up = Upstream()
    async with RawServer(lambda r, w, n: asyncio.sleep(0)) as url:
        pass  # the port is closed again
    with pytest.raises(UpstreamUnavailable):
        await up.call(url, "GET", "/health", [], b"")
    with pytest.raises(UpstreamUnavailable, match="not an http:// replica URL"):
        await up.call("https://127.0.0.1:1", "GET", "/", [], b"")
    await up.close()


async def test_head_and_connection_close_are_not_reused():
    async def handler(reader, writer, n):
        while True:
            req = await server.read_request(reader)
            if req.startswith(b"HEAD"):  # a Content-Length and no body, as HEAD answers
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
            else:
                writer.write(ok(b"hello", b"connection: close"))
            await writer.drain()

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        assert await up.call(url, "HEAD", "/", [], b"") == (200, [(b"content-length", b"5")], b"")
        assert (await up.call(url, "GET", "/", [], b""))[2] == b"hello"
        assert (await up.call(url, "GET", "/", [], b""))[2] == b"hello"
        assert not up._idle.get(url)
        await up.close()
    assert server.connections == 3


async def test_a_slow_reader_holds_back_the_replica_not_the_routers_memory():
    total = 8 * 1024 * 1024
    sent = asyncio.Event()

    async def handler(reader, writer, n):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()
        sent.set()

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        resp = await up.open(url, "GET", "/stream", [], b"")
        conn = resp._conn
        assert conn is not None
        # nothing is read for a while: the connection stops reading once MAX_BUFFER is held
        await eventually(lambda: conn.paused)
        for _ in range(20):
            await asyncio.sleep(0.01)
            assert conn.buffered < MAX_BUFFER + 1024 * 1024 and not sent.is_set()
        got = 0
        async for chunk in resp.chunks():
            got += len(chunk)
        assert got == total and sent.is_set()
        resp.release()
        assert len(up._idle[url]) == 1  # read to the end: pooled again
        await up.close()


async def test_idle_connections_are_retired():
    async def handler(reader, writer, n):
        while True:
            await server.read_request(reader)
            writer.write(ok(b"{}"))
            await writer.drain()

    server = RawServer(handler)
    async with server as url:
        up = Upstream()
        await up.call(url, "GET", "/", [], b"")
        (conn,) = up._idle[url]
        up._reap(time.monotonic() + KEEP_ALIVE_S / 2)
        assert up._idle[url] == [conn] and not conn.closed
        up._reap(time.monotonic() + KEEP_ALIVE_S + 1)
        assert url not in up._idle and conn.closed
        await up.call(url, "GET", "/", [], b"")
        await up.close()
    assert server.connections == 2


async def test_in_flight_requests_are_capped():
    release = asyncio.Event()
    in_handler = 0

    async def handler(reader, writer, n):
        nonlocal in_handler
        while True:
            await server.read_request(reader)
            in_handler += 1
            await release.wait()
            writer.write(ok(b"{}"))
            await writer.drain()

    server = RawServer(handler)
    async with server as url:
        up = Upstream(max_connections=2)
        calls = [asyncio.ensure_future(up.call(url, "GET", "/", [], b"")) for _ in range(5)]
        await eventually(lambda: in_handler == 2)
        await asyncio.sleep(0.05)
        assert in_handler == 2 and server.connections == 2  # the other three wait for a slot
        release.set()
        assert [c[0] for c in await asyncio.gather(*calls)] == [200] * 5
        assert server.connections == 2
        await up.close()


async def test_the_router_sends_small_responses_whole_and_streams_large_ones():
    """A non-streamed reply goes back in one piece with its Content-Length; one over
    WHOLE_RESPONSE_BYTES (an export) streams through, so the router never holds it whole; a
    replica dying in the middle of a small one is a 503 in the API's shape, not a short body."""
    from rlgate.cluster import router as router_mod
    from rlgate.cluster.directory import ReplicaInfo

    big = b"[" + b"1," * (router_mod.WHOLE_RESPONSE_BYTES // 2 + 10) + b"1]"

    async def handler(reader, writer, n):
        while True:
            req = await server.read_request(reader)
            if b" /small " in req:
                writer.write(ok(b'{"ok":true}'))
            elif b" /big " in req:
                writer.write(ok(big))
            else:  # dies after half of its body
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 50)
                await writer.drain()
                writer.transport.abort()
                return
            await writer.drain()

    server = RawServer(handler)
    async with server as url:
        r = router_mod.Router.__new__(router_mod.Router)  # only what _forward uses
        r.upstream, r.forwarded = Upstream(), 0

        class Table:
            def mark_down(self, replica, reason):
                replica.state = "down"

        r.table = Table()
        replica = ReplicaInfo(index=0, url=url, state="healthy")

        async def forward(path: str) -> list[dict]:
            sent: list[dict] = []

            async def send(m):
                sent.append(m)

            scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b""}
            await r._forward(replica, scope, [], b"", send)
            return sent

        small = await forward("/small")
        assert [m["type"] for m in small] == ["http.response.start", "http.response.body"]
        assert (b"content-length", b"11") in small[0]["headers"] and small[1]["body"] == b'{"ok":true}'
        large = await forward("/big")
        bodies = [m["body"] for m in large if m["type"] == "http.response.body"]
        assert len(bodies) > 2 and b"".join(bodies) == big  # in pieces, as they arrived
        assert not any(k == b"content-length" for k, _ in large[0]["headers"])  # uvicorn frames it
        with pytest.raises(router_mod.Unavailable, match="went away during the response"):
            await forward("/dies")
        assert replica.state == "down"
        await r.upstream.close()
