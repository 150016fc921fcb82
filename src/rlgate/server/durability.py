"""Responses wait for the store: what a client was told is on disk.

:class:`DurabilityMiddleware` opens a :class:`~rlgate.core.request_scope.RequestScope` per
request and holds the response's ``http.response.start`` until the store writes the
request made (their sequence numbers, recorded in the scope by the session manager's
:class:`~rlgate.core.request_scope.ScopedStore` as each write is made) are durable, so a
200 from a control route (start / end session, reward, capacity) or a non-streamed
generation means the change is committed. Streamed generations wait inside
``GenerationService.run`` before the final event (finish reason, usage, ``[DONE]``).
If the store failed to write, the response is replaced by a 503 in the surface's error
shape and the request's in-memory changes are undone
(:func:`rlgate.core.request_scope.store_refusal`): nothing the client was refused stays in
memory for a later request to land on.

:func:`rlgate.core.request_scope.after_response` defers work until the response has
been handed to the server: the session manager uses it to forget an exported session
only once its export response was sent (at-least-once exports).
"""

from __future__ import annotations

import logging
from typing import Any

from rlgate.core.request_scope import begin_request, end_request, store_refusal
from rlgate.server.asgi_errors import send_error
from rlgate.store.base import StoreError

log = logging.getLogger("rlgate.store")


class DurabilityMiddleware:
    def __init__(self, app: Any, store: Any) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_scope, token = begin_request()
        replaced = False

        async def durable_send(message: dict[str, Any]) -> None:
            nonlocal replaced
            if replaced:
                return
            if message["type"] == "http.response.start":
                try:
                    await request_scope.wait_durable(self.store)
                except StoreError as exc:
                    replaced = True
                    await send_error(scope, send, store_refusal(exc, scope.get("path", "")), close=False)
                    return
            await send(message)

        try:
            await self.app(scope, receive, durable_send)
        finally:
            end_request(token)
            for fn in request_scope.after:
                try:
                    fn()
                except Exception:  # a hook must not turn a sent response into an error
                    log.exception("after-response hook failed")
