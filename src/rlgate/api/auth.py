"""Who is calling: the admin key (control routes), a session key (generation, rewards) or, with
``rlgate serve --online``, a tenant key (generation, feedback, its own data).

Tokens come from ``Authorization: Bearer <t>`` (scheme case-insensitive) or
``x-api-key`` (what the Anthropic SDK sends). Missing -> 401. Admin routes: any other
token -> 403. Session routes: a token that is no live session's key -> 401 (the admin
key is not a session key). Tokens are never logged.

:func:`authenticate_early` makes the same decision from the headers alone, so that the
ASGI layer can refuse a request before reading its body (``server/auth_gate.py``); the
routes still check which key they need.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request

from rlgate.api.app_state import online_state
from rlgate.core.sessions import SessionManager
from rlgate.errors import AuthenticationFailed, GatewayError, PermissionDenied
from rlgate.records.tenants import Tenant, TenantKeys
from rlgate.surfaces import surface_for
from rlgate.trajectory.interaction import Session

# Routes only the admin key may call: a wrong token gets 403 there (401 elsewhere).
ADMIN_ONLY_PATHS = frozenset({"/grant_capacity", "/rl/start_session", "/rl/start_sessions", "/export_trajectories",
                              "/rl/collect", "/rl/finish_session", "/rl/update_weights", "/rl/metrics", "/metrics",
                              "/rl/policies", "/rl/policies/unload"})
# What a tenant key may reach (rlgate serve --online): the API surfaces and these (api/online/router.py).
TENANT_PATHS = frozenset({"/v1/feedback", "/v1/data/delete"})
# Routes that authenticate from their body or a cookie (the viewer's login form): the early gate
# leaves them to their own checks (their bodies are small and bounded by the body limit).
OWN_AUTH_PREFIXES = ("/ui/",)


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """The key a request carries (``headers`` must be case-insensitive, as Starlette's are)."""
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    return None


def request_token(request: Request) -> str | None:
    return token_from_headers(request.headers)


def _missing() -> AuthenticationFailed:
    return AuthenticationFailed(
        "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'", code="missing_api_key"
    )


def _token_or_401(request: Request) -> str:
    token = request_token(request)
    if token is None:
        raise _missing()
    return token


def require_admin(request: Request) -> None:
    token = _token_or_401(request)
    if not request.app.state.gateway.sessions.is_admin(token):
        raise PermissionDenied("this route needs the admin key")


# Where the early gate (server/auth_gate.py) leaves the session it found for the request's key:
# the route then neither parses the headers nor hashes the key again.
AUTHENTICATED_SESSION = "rlgate.session"
# ... and the tenant it found for a tenant key (rlgate serve --online): the route's session is then the
# tenant's conversation's (online/conversations.py).
AUTHENTICATED_TENANT = "rlgate.tenant"


def session_from_request(request: Request) -> Session:
    tenant = request.scope.get(AUTHENTICATED_TENANT)
    if tenant is not None:
        online = online_state(request.app)
        assert online is not None  # a tenant is authenticated only in the online mode
        return online.session_for(tenant, request.headers)
    sessions = request.app.state.gateway.sessions
    found = request.scope.get(AUTHENTICATED_SESSION)
    if found is not None and sessions.sessions.get(found.id) is found:  # still held (not exported meanwhile)
        return found
    token = _token_or_401(request)
    return sessions.session_for_key(token)


def tenant_from_request(request: Request) -> Tenant | None:
    """The active tenant whose key the request carries (``rlgate serve --online``), else None."""
    found = request.scope.get(AUTHENTICATED_TENANT)
    if isinstance(found, Tenant) and found.active:
        return found
    online = online_state(request.app)
    token = request_token(request)
    return online.tenants.identify(token) if online is not None and token is not None else None


def is_admin_request(request: Request) -> bool:
    token = request_token(request)
    return token is not None and request.app.state.gateway.sessions.is_admin(token)


def authenticate_early(
    path: str, headers: Mapping[str, str], sessions: SessionManager
) -> tuple[Session | None, GatewayError | None]:
    """``(session, None)`` for a session key, ``(None, None)`` for the admin key or a route with its
    own authentication, ``(None, error)`` for a missing or unknown key (the error the route itself
    would answer)."""
    if path.startswith(OWN_AUTH_PREFIXES):
        return None, None
    token = token_from_headers(headers)
    if token is None:
        return None, _missing()
    try:
        return sessions.identify(token), None  # None: the admin key
    except AuthenticationFailed as exc:
        if path in ADMIN_ONLY_PATHS:
            return None, PermissionDenied("this route needs the admin key")
        return None, exc


def authenticate_tenant(path: str, headers: Mapping[str, str],
                        tenants: TenantKeys) -> tuple[Tenant | None, GatewayError | None]:
    """For a key that is neither the admin's nor a session's (``rlgate serve --online``): ``(tenant,
    None)`` for a tenant key on a route tenants may use, ``(None, 403)`` for a tenant key elsewhere,
    ``(None, None)`` for a key that is no tenant's either."""
    token = token_from_headers(headers)
    tenant = tenants.identify(token) if token is not None else None
    if tenant is None:
        return None, None
    if surface_for(path) is None and path not in TENANT_PATHS:
        return None, PermissionDenied("a tenant key reaches the API surfaces, /v1/feedback and /v1/data/delete only")
    return tenant, None
