"""The body-size middleware: bodies over ``max_body_bytes`` answer 413 in the surface's
error shape (chunked bodies too). docs/operations.md has the table of limits.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rlgate.errors import PayloadTooLarge, error_body, surface_of

# Before answering 413, read and discard up to this much more of the body (for at most
# DRAIN_SECONDS): a client still sending when the server closes the connection may get a
# TCP reset instead of the 413. Larger bodies are cut off without reading them.
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 2.0


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _drain(self, receive: Any) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_SECONDS
        budget = DRAIN_BYTES
        while budget > 0:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                message = await asyncio.wait_for(receive(), left)
            except TimeoutError:
                return
            if message["type"] != "http.request":
                return
            budget -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return

    async def _reject(self, scope: dict[str, Any], send: Any) -> None:
        exc = PayloadTooLarge(f"request body larger than {self.max_bytes} bytes")
        body = json.dumps(error_body(exc, surface_of(scope.get("path", "")))).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                    if declared > self.max_bytes:
                        if declared <= DRAIN_BYTES:  # small enough to read it all
                            await self._drain(receive)
                        await self._reject(scope, send)
                        return
                except ValueError:
                    pass
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnect before the body arrived
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                if message.get("more_body", False):
                    await self._drain(receive)
                await self._reject(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
