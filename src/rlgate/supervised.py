"""One supervised background loop: the gateway's periodic passes, each of which must never die.

The session sweeper, the metrics guard poller, the online mode's background pass, its feedback tail,
its trainer and the router's replica refresh each do one pass again and again until they are
cancelled at shutdown. :func:`forever` is that loop, written once: it waits (a fixed interval, or any
awaitable such as an event), runs the pass (a plain function or a coroutine function), and when the
pass raises it logs the traceback with what failed and how many times in a row, and goes on. Only
cancellation ends it.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

__all__ = ["forever"]

Wait = float | Callable[[], Awaitable[object]]


async def forever(one_pass: Callable[[], object], *, wait: Wait, what: str, log: logging.Logger,
                  at_once: bool = False) -> None:
    """Run ``one_pass`` after each ``wait`` (seconds, or an awaitable to await) until cancelled.

    ``at_once``: the first pass runs before the first wait. An exception from a pass is logged
    (``"<what> failed"``, with the count of consecutive failures past the first) and the loop goes on.
    """
    failures = 0
    first = True
    while True:
        if not (first and at_once):
            if callable(wait):
                await wait()
            else:
                await asyncio.sleep(wait)
        first = False
        try:
            result = one_pass()
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a background pass must never end the loop
            failures += 1
            log.exception("%s failed%s", what, f" ({failures} times in a row)" if failures > 1 else "")
        else:
            failures = 0
