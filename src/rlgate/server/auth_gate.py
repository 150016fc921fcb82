"""Authenticate before reading a body; per-key rate limits. One gate for every entry point.

Without this, every POST body was buffered (up to ``max_body_bytes``) before its route
looked at the key: 100 unauthenticated 30 MB uploads took the gateway to 3.46 GB (issue 15),
and the cluster router, which had no gate, went from 172 MiB to 1,880 MiB under 20 such
uploads (issue 23). :class:`KeyGate` asks a decision function about a request from its
headers alone; a request with a body and no acceptable key is answered 401 / 403 (or 429) at
once, in the surface's shape, and its connection closed, without its body being read (a small
declared body is drained first so the client sees the answer; a client that sent
``Expect: 100-continue`` gets the answer instead of ``100 Continue``). Requests without a body
(GET) go on to their routes, which check keys as before.

* the gateway (:func:`gateway_gate`): :func:`rlgate.api.auth.authenticate_early` decides; a
  session key's request then spends a token of its session's bucket
  (:class:`~rlgate.core.rate_limit.RateLimiter`): an empty bucket answers 429 with
  ``Retry-After``;
* the cluster router: its own decision (``cluster/router_auth.py``: the admin key, HMAC-checked
  session keys, a client-chosen key confirmed by the replica that holds it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers

from rlgate.api.auth import AUTHENTICATED_SESSION, AUTHENTICATED_TENANT, authenticate_early, authenticate_tenant
from rlgate.core.rate_limit import RateLimiter
from rlgate.core.sessions import SessionManager
from rlgate.errors import GatewayError
from rlgate.records.tenants import TenantKeys
from rlgate.server.asgi_errors import refuse_unread
from rlgate.server.body_limit import BODY_METHODS

# From a request's scope (headers, path; nothing read yet): None to let it through, or the
# error to answer. It may note what it found in the scope for the app.
Decide = Callable[[dict[str, Any]], Awaitable[GatewayError | None]]


class KeyGate:
    """ASGI middleware: requests with a body pass only if ``decide`` lets them (see module doc)."""

    def __init__(self, app: Any, decide: Decide) -> None:
        self.app = app
        self.decide = decide
        self.refused = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        error = await self.decide(scope)
        if error is not None:
            self.refused += 1
            await refuse_unread(scope, receive, send, error)
            return
        await self.app(scope, receive, send)


def gateway_gate(sessions: SessionManager, limiter: RateLimiter, tenants: TenantKeys | None = None) -> Decide:
    """The gateway's decision: a live session key (within its rate limit), the admin key, a route
    with its own authentication (the viewer's login form), or (``tenants``: ``rlgate serve --online``)
    a tenant key on a route tenants may use (within the tenant's rate limit)."""

    async def decide(scope: dict[str, Any]) -> GatewayError | None:
        headers = Headers(scope=scope)
        session, error = authenticate_early(scope.get("path", ""), headers, sessions)
        if error is not None and tenants is not None:
            tenant, refused = authenticate_tenant(scope.get("path", ""), headers, tenants)
            if tenant is not None:
                try:
                    limiter.take(tenant.id)
                except GatewayError as exc:
                    return exc
                scope[AUTHENTICATED_TENANT] = tenant  # the route's session_from_request takes it
                return None
            error = refused or error
        if error is not None:
            return error
        if session is not None:
            try:
                limiter.take(session.id)
            except GatewayError as exc:
                return exc
            scope[AUTHENTICATED_SESSION] = session  # the route's session_from_request takes it as found
        return None

    return decide


class AuthGateMiddleware(KeyGate):
    """The gateway's gate (``app.add_middleware(AuthGateMiddleware, sessions=..., limiter=...)``)."""

    def __init__(self, app: Any, sessions: SessionManager, limiter: RateLimiter,
                 tenants: TenantKeys | None = None) -> None:
        super().__init__(app, gateway_gate(sessions, limiter, tenants))
