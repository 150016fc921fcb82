"""The router's edge: the same protections as one gateway, from the same code.

``edge_app(router, config)`` wraps the :class:`~rlgate.cluster.router.Router` in the gateway's
own ASGI middleware (issue 23: the router had none, so 20 unauthenticated 30 MB uploads took it
from 172 MiB to 1,880 MiB, and 2,100 connections trickling body bytes made every legitimate
request wait behind them)::

    KeyGate(BodyLimitMiddleware(Router))

* :class:`~rlgate.server.auth_gate.KeyGate` with :class:`RouterKeys` as its decision: a request
  with a body and no acceptable key gets 401 / 403 before a byte of its body is read (no
  ``100 Continue`` either);
* :class:`~rlgate.server.body_limit.BodyLimitMiddleware`: 413 over ``max_body_bytes``, 408 for a
  body that does not arrive within ``body_timeout``, 503 ``server_busy`` when the bodies held
  together would pass ``max_buffered_body_bytes``;
* the server protocol (header timeout, header size cap, connection cap) and the log filters
  come from ``server/connections.py`` and ``server/logging_filters.py`` where the router is
  served (``rlgate serve --replicas N``, :meth:`Cluster.start_router`).

Which keys the router accepts before it reads a body:

=======================================  =====================================================
key                                      decided
=======================================  =====================================================
none                                     401 ``missing_api_key``
the admin key                            accepted (constant-time digest comparison)
any other key on an admin-only route     403
a minted session key (``rk1.``)          HMAC-checked here: a forged one is 401
a key the client chose at start_session  asked once of the replica that holds it (``GET
                                         /v1/models`` with the key: no body); a confirmed key
                                         is remembered (``CONFIRMED_KEYS``, ``CONFIRM_TTL_S``)
``/ui/...`` (the viewer's login form)    a declared body up to ``MAX_FORM_BYTES``, else 413
=======================================  =====================================================

A session key that was valid and has since been retired reaches its replica, which answers
401 as before; the router has held at most that one body.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from rlgate.api.auth import ADMIN_ONLY_PATHS
from rlgate.cluster.keys import derive_routing_secret, hashed_replica, is_minted, key_replica
from rlgate.config import GatewayConfig
from rlgate.errors import AuthenticationFailed, GatewayError, PayloadTooLarge, PermissionDenied, Unavailable
from rlgate.server.asgi_errors import declared_length
from rlgate.server.auth_gate import KeyGate
from rlgate.server.body_limit import BodyLimitMiddleware

CONFIRMED_KEYS = 65_536  # client-chosen keys remembered as confirmed (digests; least recently used out)
CONFIRM_TTL_S = 300.0  # a confirmation is trusted this long, then asked again
MAX_FORM_BYTES = 4096  # /ui/login's form body

# (replica index, key) -> the replica's status for GET /v1/models with that key (None: unreachable)
Confirm = Callable[[int, str], Awaitable[int | None]]


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """``Authorization: Bearer`` (scheme case-insensitive) or ``x-api-key``, as the gateway reads them."""
    auth = key = None
    for name, value in headers:
        if name == b"authorization":
            auth = value
        elif name == b"x-api-key":
            key = value
    if auth:
        scheme, _, tok = auth.decode("latin-1").strip().partition(" ")
        if scheme.lower() == "bearer" and tok.strip():
            return tok.strip()
    if key and key.strip():
        return key.decode("latin-1").strip()
    return None


def missing_key() -> AuthenticationFailed:
    return AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                                code="missing_api_key")


class RouterKeys:
    """Who may send the router a body (see the module doc)."""

    def __init__(self, admin_key: str, routing_secret: bytes | None, replicas: Callable[[], int],
                 confirm: Confirm) -> None:
        self._admin_digest = hashlib.sha256(admin_key.encode()).digest()
        self.secret = routing_secret or derive_routing_secret(admin_key)
        self._replicas = replicas
        self._confirm = confirm
        self._confirmed: OrderedDict[bytes, float] = OrderedDict()

    def is_admin(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(hashlib.sha256(token.encode()).digest(),
                                                         self._admin_digest)

    def replica_of(self, token: str) -> int:
        """The replica a session key belongs to; 401 for a forged minted key."""
        n = self._replicas()
        if is_minted(token):
            index = key_replica(self.secret, token)
            if index is None or index >= n:
                raise AuthenticationFailed("invalid API key: not a session key of this gateway")
            return index
        return hashed_replica(token, n)

    async def decide(self, scope: dict[str, Any]) -> GatewayError | None:
        path: str = scope.get("path", "")
        if path.startswith("/ui/"):
            size = declared_length(scope)
            if size is None or size > MAX_FORM_BYTES:
                return PayloadTooLarge(f"the viewer's forms take at most {MAX_FORM_BYTES} bytes")
            return None
        token = bearer_token(scope["headers"])
        if token is None:
            return missing_key()
        if self.is_admin(token):
            return None
        if path in ADMIN_ONLY_PATHS:
            return PermissionDenied("this route needs the admin key")
        try:
            index = self.replica_of(token)
        except GatewayError as exc:
            return exc
        if is_minted(token):
            return None
        return await self._confirmed_key(index, token)

    async def _confirmed_key(self, index: int, token: str) -> GatewayError | None:
        digest = hashlib.sha256(token.encode("utf-8", "replace")).digest()
        now = time.monotonic()
        seen = self._confirmed.get(digest)
        if seen is not None and now - seen < CONFIRM_TTL_S:
            self._confirmed.move_to_end(digest)
            return None
        status = await self._confirm(index, token)
        if status is None:
            return Unavailable(f"gateway replica {index}, which holds this session, is unavailable",
                               code="replica_unavailable")
        if status in (401, 403):
            self._confirmed.pop(digest, None)
            return AuthenticationFailed("invalid API key: no live session has this key")
        self._confirmed[digest] = now
        self._confirmed.move_to_end(digest)
        while len(self._confirmed) > CONFIRMED_KEYS:
            self._confirmed.popitem(last=False)
        return None


def edge_app(app: Any, keys: RouterKeys, config: GatewayConfig) -> KeyGate:
    """``app`` behind the gateway's key gate and body limits (``config``: the replicas' settings)."""
    limited = BodyLimitMiddleware(app, config.max_body_bytes, body_timeout=config.body_timeout,
                                  max_buffered_bytes=config.max_buffered_body_bytes)
    return KeyGate(limited, keys.decide)
