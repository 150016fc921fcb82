"""Request bodies: size, read time and the memory all buffered bodies take together.

* a body over ``max_bytes`` answers 413 ``request_too_large`` (chunked bodies too): one that
  announces a larger ``content-length`` is refused before it is read; a chunked one is cut
  as soon as it crosses the limit;
* a body that does not arrive in full within ``body_timeout`` seconds of its headers answers
  408 ``request_timeout`` (a client trickling bytes cannot hold a connection and a buffer);
* bodies being buffered or served hold at most ``max_buffered_bytes`` together; a request
  that would go over answers 503 ``server_busy`` with ``Retry-After``.

Errors are in the surface's shape and close the connection. docs/operations.md has the
table of limits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rlgate.config import GatewayConfig
from rlgate.errors import GatewayError, PayloadTooLarge, RequestTimeout, Unavailable
from rlgate.server.asgi_errors import DRAIN_BYTES, declared_length, drain, drainable_length, send_error

BODY_METHODS = ("POST", "PUT", "PATCH")


class _Held:
    count = 0  # bytes held by one request


class _Gone(Exception):
    """The client disconnected before its body arrived."""


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int, *, body_timeout: float = GatewayConfig.body_timeout,
                 max_buffered_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.body_timeout = body_timeout
        self.max_buffered_bytes = max_buffered_bytes
        self.buffered = 0  # bytes of bodies held right now (all requests)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        held = _Held()
        try:
            try:
                async with asyncio.timeout(self.body_timeout):
                    await self._read(scope, receive, chunks, held)
            except GatewayError as exc:
                await send_error(scope, send, exc)
                return
            except TimeoutError:
                await send_error(scope, send, RequestTimeout(
                    f"the request body did not arrive within {self.body_timeout:g} s"))
                return
            except _Gone:
                return
            body = b"".join(chunks)
            chunks.clear()
            replayed = False

            async def replay() -> dict[str, Any]:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.buffered -= held.count

    async def _read(self, scope: dict[str, Any], receive: Any, chunks: list[bytes], held: _Held) -> None:
        """Buffer the body into ``chunks``, counted in ``held`` and ``self.buffered`` as it comes."""
        declared = declared_length(scope)
        if declared is not None and declared > self.max_bytes:
            drainable = drainable_length(scope)
            if drainable is not None and drainable <= DRAIN_BYTES:  # small enough to read: the client sees the 413
                await drain(receive)
            raise self._too_large()
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _Gone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await drain(receive)
                raise self._too_large()
            if self.max_buffered_bytes is not None and self.buffered + len(chunk) > self.max_buffered_bytes:
                raise Unavailable("the gateway holds too many request bodies right now; retry shortly",
                                  code="server_busy", retry_after=1)
            self.buffered += len(chunk)
            held.count += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body larger than {self.max_bytes} bytes")
