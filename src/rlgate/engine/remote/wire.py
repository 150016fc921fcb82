"""Reading a backend's token stream: server-sent events, parsed events, token checks.

Every event is validated before its tokens are passed on (:func:`check_tokens`): token ids
are non-negative integers, logprobs finite numbers <= 0, one logprob per token.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from rlgate.engine.base import FinishReason, GenerateRequest
from rlgate.engine.remote.errors import MalformedResponse

if TYPE_CHECKING:
    from rlgate.engine.remote.backend import Backend

__all__ = ["Chunk", "StreamState", "as_float", "as_int_list", "check_tokens", "drain", "sse_data"]


@dataclass
class Chunk:
    """One parsed event: the tokens it adds, and the finish reason if it is the last."""

    token_ids: list[int]
    logprobs: list[float]
    finish: FinishReason | None = None
    weight_label: str | None = None  # the backend's own label for its weights (SGLang)


@dataclass
class StreamState:
    """Per-request parsing state."""

    request: GenerateRequest
    backend: Backend
    ids: list[int] = field(default_factory=list)  # tokens passed on so far
    finished: bool = False


async def sse_data(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The ``data`` of each server-sent event (multi-line data joined with newlines).

    Parsed from raw bytes: cheaper than ``aiter_lines`` for streams of many small events.
    """
    buf = b""
    async for piece in resp.aiter_bytes():
        buf += piece
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
            if b"\r" in buf[:-1]:
                buf = buf[:-1].replace(b"\r", b"\n") + buf[-1:]
        while (end := buf.find(b"\n\n")) >= 0:
            event, buf = buf[:end], buf[end + 2:]
            data = _event_data(event)
            if data is not None:
                yield data
    if buf.strip():
        data = _event_data(buf.strip(b"\r\n"))
        if data is not None:
            yield data


def _event_data(event: bytes) -> bytes | None:
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if not sep or name not in (b"data", b"event", b"id", b"retry"):
            raise MalformedResponse(f"not a server-sent event stream: {line[:200]!r}")
        if name == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


async def drain(events: AsyncIterator[bytes], timeout: float = 1.0) -> None:
    """Read what follows the last event (usage, ``[DONE]``) for at most ``timeout`` seconds."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(timeout):
            async for _ in events:
                pass


def check_tokens(chunk: Chunk) -> None:
    """Raise :class:`MalformedResponse` unless the chunk's ids and logprobs are well formed."""
    if len(chunk.token_ids) != len(chunk.logprobs):
        raise MalformedResponse(f"{len(chunk.token_ids)} token ids but {len(chunk.logprobs)} logprobs")
    for t in chunk.token_ids:
        if type(t) is not int or t < 0:
            raise MalformedResponse(f"token id {t!r} is not a non-negative integer")
    for lp in chunk.logprobs:
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp) or lp > 1e-3:
            raise MalformedResponse(f"logprob {lp!r} is not a finite number <= 0")


def as_int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise MalformedResponse(f"{what} is not a list of integers: {str(value)[:200]}")
    return value


def as_float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedResponse(f"{what} is not a number: {value!r}")
    return float(value)
