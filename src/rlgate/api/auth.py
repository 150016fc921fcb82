"""Who is calling: the admin key (control routes) or a session key (generation, rewards).

Tokens come from ``Authorization: Bearer <t>`` (scheme case-insensitive) or
``x-api-key`` (what the Anthropic SDK sends). Missing -> 401. Admin routes: any other
token -> 403. Session routes: a token that is no live session's key -> 401 (the admin
key is not a session key). Tokens are never logged.
"""

from __future__ import annotations

from starlette.requests import Request

from rlgate.errors import AuthenticationFailed, PermissionDenied
from rlgate.trajectory.interaction import Session


def request_token(request: Request) -> str | None:
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.headers.get("x-api-key")
    if key and key.strip():
        return key.strip()
    return None


def _token_or_401(request: Request) -> str:
    token = request_token(request)
    if token is None:
        raise AuthenticationFailed(
            "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'", code="missing_api_key"
        )
    return token


def require_admin(request: Request) -> None:
    token = _token_or_401(request)
    if not request.app.state.gateway.sessions.is_admin(token):
        raise PermissionDenied("this route needs the admin key")


def session_from_request(request: Request) -> Session:
    token = _token_or_401(request)
    return request.app.state.gateway.sessions.session_for_key(token)


def is_admin_request(request: Request) -> bool:
    token = request_token(request)
    return token is not None and request.app.state.gateway.sessions.is_admin(token)
