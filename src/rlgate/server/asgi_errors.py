"""Answering from ASGI middleware: an error in the surface's shape, optionally closing the
connection, and draining a little of an unread body first so the client sees the answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from rlgate.errors import GatewayError, error_body
from rlgate.surfaces import error_shape

# Before answering without reading a body, read and discard up to this much of it (for at
# most DRAIN_SECONDS): a client still sending when the server closes the connection may get
# a TCP reset instead of the answer. Larger bodies are cut off without reading them.
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 2.0


async def drain(receive: Any, budget: int = DRAIN_BYTES, seconds: float = DRAIN_SECONDS) -> None:
    """Read and discard up to ``budget`` bytes of the request body, for at most ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
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


def drainable_length(scope: dict[str, Any]) -> int | None:
    """The declared length of a body worth draining before an answer, or None: a client that
    sent ``Expect: 100-continue`` has not sent its body and waits for the server's go-ahead,
    which reading the body would give (uvicorn sends ``100 Continue`` on the first read); it
    gets the final answer at once instead, and uploads nothing (RFC 9110, 10.1.1)."""
    for name, value in scope.get("headers", []):
        if name == b"expect" and value.strip().lower() == b"100-continue":
            return None
    return declared_length(scope)


def declared_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def send_error(scope: dict[str, Any], send: Any, exc: GatewayError, *, close: bool = True) -> None:
    body = json.dumps(error_body(exc, error_shape(scope.get("path", "")))).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    if close:  # the unread rest of the body must not be taken for the next request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse_unread(scope: dict[str, Any], receive: Any, send: Any, exc: GatewayError) -> None:
    """Answer ``exc`` without buffering the body: a small declared body is drained first."""
    size = drainable_length(scope)
    if size is not None and size <= DRAIN_BYTES:
        await drain(receive)
    await send_error(scope, send, exc)
