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

The source is iterated by ONE helper task for its whole life, so it runs in one context
(the request's write tracking, which the store reads through context variables, stays
consistent), and is closed when the consumer stops early (the generation's own cleanup
then records the abort). The queue between them holds one item: no read-ahead, no
unbounded buffering.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final, TypeVar

T = TypeVar("T")


class KeepAlive:
    """Marker yielded by :func:`with_keepalive` when the source has been quiet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "KEEPALIVE"


KEEPALIVE: Final = KeepAlive()
_END: Final = object()


async def with_keepalive(source: AsyncIterator[T], interval: float | None) -> AsyncIterator[T | KeepAlive]:
    """``source``'s items, with :data:`KEEPALIVE` after each ``interval`` seconds of silence.

    ``interval`` None or <= 0: the source is passed through unchanged. An exception raised by
    the source is raised here, after the items before it.
    """
    if not interval or interval <= 0:
        async for item in source:
            yield item
        return
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(maxsize=1)

    async def pump() -> None:
        try:
            async for item in source:
                await queue.put((True, item))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((False, exc))
        else:
            await queue.put((False, _END))
        finally:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()  # a no-op if the source finished; runs its cleanup if it did not

    task = asyncio.ensure_future(pump())
    get: asyncio.Future[tuple[bool, Any]] | None = None
    try:
        while True:
            if get is None:
                get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({get}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            ok, item = get.result()
            get = None
            if ok:
                yield item
            elif item is _END:
                return
            else:
                raise item
    finally:
        if get is not None:
            get.cancel()
        if not task.done():
            task.cancel()
        # Let the source's cleanup (engine abort, recording) finish; the task's own
        # cancellation is its result here, a cancellation of this consumer still propagates.
        await asyncio.gather(task, return_exceptions=True)
