"""Requests in flight: a clean answer when shutdown cuts one, and a drain before the store closes.

When ``--shutdown-timeout`` expires uvicorn cancels the requests still running and goes
straight on to the app's lifespan shutdown, which closed the store before the cancelled
generations had written their ``abort`` records; their clients got uvicorn's plain-text 500
(issue 15). :class:`InFlightMiddleware` counts requests being served and, when a request is
cancelled before its response started, answers 503 ``shutting_down`` in the surface's shape
instead. The lifespan awaits :meth:`InFlight.drain` before it closes the engine and the
store, so every cut generation's record (written while its task unwinds) reaches the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from rlgate.errors import Unavailable
from rlgate.server.asgi_errors import send_error

log = logging.getLogger("rlgate.server")


class InFlight:
    def __init__(self) -> None:
        self.count = 0
        self._idle: asyncio.Event | None = None

    def enter(self) -> None:
        self.count += 1

    def exit(self) -> None:
        self.count -= 1
        if self.count == 0 and self._idle is not None:
            self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until no request is being served (at most ``timeout`` s); True if none is left."""
        if self.count == 0:
            return True
        self._idle = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self.count == 0


class InFlightMiddleware:
    def __init__(self, app: Any, inflight: InFlight) -> None:
        self.app = app
        self.inflight = inflight

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        self.inflight.enter()
        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if started:  # a stream cut mid-way: its generation was recorded as "abort"; nothing to add
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # answered below: the request ends normally
            log.warning("%s %s cut by the shutdown timeout: answered 503", scope.get("method"), scope.get("path"))
            with contextlib.suppress(Exception):
                await send_error(scope, send, Unavailable(
                    "the gateway is shutting down and cut this request (shutdown timeout); it was recorded "
                    "as aborted", code="shutting_down"))
        finally:
            self.inflight.exit()
