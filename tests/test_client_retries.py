"""GatewayClient and a dropped connection (issue 25: one end_session in ~700 failed with
httpx.ReadError and was not retried).

A proxy on 127.0.0.1 in front of a real gateway reads each request and, while told to, drops the
connection without answering: after the gateway has acted on it (the answer is lost) or before
forwarding it. Idempotent calls are retried and succeed; a call that is not idempotent is not
replayed once the gateway may have acted on it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from helpers import ADMIN_KEY
from rlgate.client.gateway import GatewayClient
from rlgate.server.runner import ServerThread


class DroppingProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.drop_after_forwarding = 0  # requests forwarded whose answer is then lost
        self.seen = 0
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None

    def start(self) -> str:
        """Serve from a thread with its own event loop (the test's loop is the client's)."""
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0),
                                                       self.loop).result(30)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                self.seen += 1
                up_r, up_w = await asyncio.open_connection(*self.upstream)
                lines = [ln for ln in head.split(b"\r\n") if ln and not ln.lower().startswith(b"connection:")]
                up_w.write(b"\r\n".join([*lines, b"Connection: close", b"", b""]) + body)
                await up_w.drain()
                answer = await up_r.read()
                up_w.close()
                if self.drop_after_forwarding > 0:
                    self.drop_after_forwarding -= 1
                    writer.transport.abort()  # the gateway acted; the client never hears it
                    return
                writer.write(answer)
                await writer.drain()
                writer.close()
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def stop(self) -> None:
        assert self.server is not None

        async def close() -> None:
            assert self.server is not None
            self.server.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
async def proxied(make_app):
    app = make_app()
    with ServerThread(app) as url:
        proxy = DroppingProxy(url)
        purl = proxy.start()
        client = GatewayClient(purl, ADMIN_KEY, timeout=30)
        try:
            yield proxy, client, app
        finally:
            await client.aclose()
            proxy.stop()


async def test_idempotent_calls_survive_a_lost_answer(proxied):
    proxy, client, app = proxied
    s = await client.start_session("t")
    proxy.drop_after_forwarding = 1
    assert (await client.health())["status"] == "ok"
    proxy.drop_after_forwarding = 1
    n = await s.end()
    assert n == 0 and s.ended
    assert app.state.gateway.sessions.sessions[s.session_id].status == "ended"
    proxy.drop_after_forwarding = 1
    out = await s.export(keep=True)
    assert out["session_id"] == s.session_id


async def test_a_call_that_is_not_idempotent_is_not_replayed(proxied):
    import httpx

    proxy, client, app = proxied
    proxy.drop_after_forwarding = 1
    before = proxy.seen
    with pytest.raises(httpx.TransportError):
        await client.start_session("t")
    assert proxy.seen == before + 1  # sent once: a replay would have started a second session
    assert len(app.state.gateway.sessions.sessions) == 1
