"""Authenticate before reading a body; per-key rate limits.

Without this, every POST body was buffered (up to ``max_body_bytes``) before its route
looked at the key: 100 unauthenticated 30 MB uploads took the gateway to 3.46 GB (issue 15).
:class:`AuthGateMiddleware` decides from the headers alone
(:func:`rlgate.api.auth.authenticate_early`): a request with a body and no valid key is
answered 401 / 403 at once, in the surface's shape, and its connection closed, without its
body being read (a small declared body is drained first so the client sees the answer).
Requests without a body (GET) go on to their routes, which check keys as before.

A session key's request then spends a token of its session's bucket
(:class:`~rlgate.core.rate_limit.RateLimiter`); an empty bucket answers 429 with
``Retry-After``, also before the body is read.
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers

from rlgate.api.auth import AUTHENTICATED_SESSION, authenticate_early
from rlgate.core.rate_limit import RateLimiter
from rlgate.core.sessions import SessionManager
from rlgate.errors import GatewayError
from rlgate.server.asgi_errors import refuse_unread
from rlgate.server.body_limit import BODY_METHODS


class AuthGateMiddleware:
    def __init__(self, app: Any, sessions: SessionManager, limiter: RateLimiter) -> None:
        self.app = app
        self.sessions = sessions
        self.limiter = limiter
        self.refused = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        session, error = authenticate_early(path, Headers(scope=scope), self.sessions)
        if error is None and session is not None:
            try:
                self.limiter.take(session.id)
            except GatewayError as exc:
                error = exc
        if error is not None:
            self.refused += 1
            await refuse_unread(scope, receive, send, error)
            return
        if session is not None:
            scope[AUTHENTICATED_SESSION] = session  # the route's session_from_request takes it as found
        await self.app(scope, receive, send)
