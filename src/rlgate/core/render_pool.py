"""Request-controlled CPU work (rendering and tokenizing large prompts) off the event loop.

A 30 MB prompt took 118 s to tokenize on the event loop, and every other request (``/health``
included) waited for it (issue 15). :class:`RenderPool` runs such work on a few worker
threads instead, bounded three ways:

* **size**: the caller refuses, before any rendering, a prompt whose characters cannot fit
  the context (``GenerationService.max_prompt_chars``), so the work handed here is bounded;
* **threads**: at most ``workers`` run at once; more wait in the executor's queue;
* **time**: a request waits at most ``timeout`` seconds, queueing included, then answers 503
  ``render_timeout``. Work still queued is cancelled; work already running cannot be
  interrupted in a thread and finishes in the background (its input is bounded, above).

Tokenization releases the GIL (``ChatRenderer.encode``); template rendering is Python and
shares the GIL, which the event loop still gets every few milliseconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from rlgate.errors import Unavailable

T = TypeVar("T")


class RenderPool:
    def __init__(self, workers: int, timeout: float) -> None:
        self.workers = max(1, workers)
        self.timeout = timeout
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=self.workers,
                                                               thread_name_prefix="rlgate-render")
        self.submitted = 0
        self.timed_out = 0

    async def run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, fn)
        self.submitted += 1
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except TimeoutError:
            self.timed_out += 1
            fut.cancel()  # dequeued if it has not started; a running thread finishes on its own
            fut.add_done_callback(_retrieve)
            raise Unavailable(
                f"building the prompt took longer than render_timeout={self.timeout:g} s (the gateway is "
                "busy rendering large prompts); retry later or send a shorter prompt",
                code="render_timeout",
            ) from None
        except asyncio.CancelledError:  # the client went away: nobody wants the result
            fut.cancel()
            fut.add_done_callback(_retrieve)
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Consume the result of abandoned work (no 'exception was never retrieved' warnings)."""
    if not fut.cancelled():
        fut.exception()
