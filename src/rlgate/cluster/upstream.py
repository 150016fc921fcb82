"""The router's HTTP client to the replicas: pooled keep-alive connections, bytes in, bytes out.

``aiohttp``'s client parses responses in C and reuses connections per replica; the router
never parses bodies it forwards. Idle pooled connections are retired after
``KEEP_ALIVE_S`` seconds, before the replica's own server would close them (65 s, as
``server/serve.py`` sets), so a request never lands on a connection that is being closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from multidict import CIMultiDict

KEEP_ALIVE_S = 30.0
CONNECT_TIMEOUT_S = 5.0
_DROP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
         "proxy-connection"}


class UpstreamUnavailable(Exception):
    """The replica could not be reached, or went away during the response."""


class UpstreamResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.headers = [(k.lower(), v) for k, v in resp.raw_headers]
        ctype = resp.headers.get("content-type", "")
        self.is_sse = ctype.startswith("text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc

    def release(self) -> None:
        self._resp.release()


class Upstream:
    def __init__(self, *, max_connections: int = 1024) -> None:
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                             keepalive_timeout=KEEP_ALIVE_S, enable_cleanup_closed=False)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    def _headers(headers: list[tuple[bytes, bytes]]) -> CIMultiDict[str]:
        out: CIMultiDict[str] = CIMultiDict()
        for k, v in headers:
            name = k.decode("latin-1")
            if name.lower() not in _DROP:
                out.add(name, v.decode("latin-1"))
        return out

    async def open(self, base_url: str, method: str, target: str, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> UpstreamResponse:
        """Send a request; the response's body is read by the caller (``chunks``)."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        try:
            resp = await self._session.request(method, base_url + target, headers=self._headers(headers),
                                               data=body or None, allow_redirects=False)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise UpstreamUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return UpstreamResponse(resp)

    async def call(self, base_url: str, method: str, target: str, headers: list[tuple[bytes, bytes]],
                   body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """A whole request/response (control routes): (status, headers, body)."""
        resp = await self.open(base_url, method, target, headers, body)
        try:
            data = b"".join([c async for c in resp.chunks()])
        finally:
            resp.release()
        return resp.status, _as_bytes(resp.headers), data


def _as_bytes(headers: list[tuple[Any, Any]]) -> list[tuple[bytes, bytes]]:
    return [(k if isinstance(k, bytes) else k.encode("latin-1"), v if isinstance(v, bytes) else v.encode("latin-1"))
            for k, v in headers]
