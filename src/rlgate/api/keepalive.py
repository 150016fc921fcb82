"""Keep-alive events for streams that go quiet (a long prefill, a busy engine).

A client that sees no event for a while gives up: Claude Code's stream watchdog aborts a
stream after 300 s without an event and falls back to non-streamed requests; Codex ends a
Responses stream after ``stream_idle_timeout_ms`` (300 s by default) without an SSE event;
proxies close idle connections sooner. A 62k-token prompt on a local engine can take
longer than that to prefill.

:func:`with_keepalive` wraps a stream of events and yields :data:`KEEPALIVE` whenever the
source has produced nothing for ``interval`` seconds; each surface turns that into its own
keep-alive frame (Anthropic: an ``event: ping``; Responses: a repeated
``response.in_progress``; Chat Completions: an SSE comment line).

Each step of the source runs in a helper task so that waiting for it can time out without
cancelling it; all steps share ONE context (the request's scope, core/request_scope.py, which
collects the store writes to wait for, stays the same). Nothing runs ahead: the next step starts only
when the consumer asks for the next item, so a consumer that goes away leaves the source
suspended exactly as a plain ``async for`` would (and closing this generator closes it).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Final, TypeVar

T = TypeVar("T")


class KeepAlive:
    """Marker yielded by :func:`with_keepalive` when the source has been quiet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "KEEPALIVE"


KEEPALIVE: Final = KeepAlive()
_END: Final = object()


async def with_keepalive(source: AsyncIterator[T], interval: float | None) -> AsyncGenerator[T | KeepAlive]:
    """``source``'s items, with :data:`KEEPALIVE` after each ``interval`` seconds of silence.

    ``interval`` None or <= 0: the source is passed through unchanged. An exception raised by
    the source is raised here, after the items before it.
    """
    if not interval or interval <= 0:
        async for item in source:
            yield item
        return
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    step: asyncio.Task[Any] | None = None
    try:
        while True:
            if step is None:
                step = loop.create_task(_next(source), context=context)
            done, _ = await asyncio.wait({step}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            finished, step = step, None
            item = finished.result()  # the source's exception, if it raised
            if item is _END:
                return
            yield item
    finally:
        # Stop a running step, then close the source, in a task of its own: a consumer that is
        # being cancelled (a client disconnect cancels the response task, possibly repeatedly)
        # cannot interrupt the cleanup, so the engine request is always aborted and recorded.
        cleanup = loop.create_task(_close(step, source), context=context)
        await _outlast(cleanup)


async def _outlast(task: asyncio.Task[Any]) -> None:
    """Wait for ``task`` even through cancellations of the current task (re-raised once it is done).

    The request is not over before its generation is recorded: the shutdown drain waits for the
    requests in flight and then closes the store (``server/inflight.py``), so a request that
    returned while its cleanup still ran lost its ``abort`` record (issue 15, defect 6)."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the cleanup itself was cancelled: task.result() below says so
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()  # the cleanup's own exception, if any


async def _close(step: asyncio.Task[Any] | None, source: AsyncIterator[Any]) -> None:
    if step is not None:
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
    aclose = getattr(source, "aclose", None)
    if aclose is not None:
        await aclose()  # a no-op if the source finished; runs its cleanup if it did not


async def _next(source: AsyncIterator[Any]) -> Any:
    try:
        return await source.__anext__()
    except StopAsyncIteration:
        return _END
