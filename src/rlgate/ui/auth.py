"""Who may see ``/ui``: the admin, by header or by a login cookie. No key ever travels in a URL.

* ``Authorization: Bearer <admin key>`` (or ``x-api-key``) on any ``/ui`` request (scripts, tests);
* or the login form: ``POST /ui/login`` with the key in the form body. The gateway answers with
  a random login token (never the key) in a cookie ``rlgate_ui`` that is ``HttpOnly``,
  ``SameSite=Strict``, ``Path=/ui`` (and ``Secure`` over HTTPS), valid ``ui_login_ttl`` seconds.
  Tokens are kept per app, as SHA-256 digests; ``POST /ui/logout`` forgets one.

CSRF: the cookie is ``SameSite=Strict`` (never sent by a cross-site request) and both POST routes
refuse a request whose ``Origin`` is not this server or whose ``Sec-Fetch-Site`` says
``cross-site`` / ``same-site``. Every other ``/ui`` route is a read-only GET.
"""

from __future__ import annotations

import hashlib
import secrets
import time

from starlette.requests import Request

from rlgate.api.auth import request_token

COOKIE = "rlgate_ui"
MAX_LOGINS = 1000  # tokens kept per app; the oldest goes first


class UiLogins:
    """Live login tokens of one app: digest -> expiry (monotonic seconds)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._tokens: dict[str, float] = {}

    def issue(self) -> str:
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        self._tokens = {k: v for k, v in self._tokens.items() if v > now}
        while len(self._tokens) >= MAX_LOGINS:
            del self._tokens[next(iter(self._tokens))]
        self._tokens[_digest(token)] = now + self.ttl
        return token

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        expiry = self._tokens.get(_digest(token))  # dict lookup by digest: timing depends on the digest
        return expiry is not None and expiry > time.monotonic()

    def revoke(self, token: str | None) -> None:
        if token:
            self._tokens.pop(_digest(token), None)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_viewer(request: Request) -> bool:
    """The admin key in a header, or a valid login cookie."""
    token = request_token(request)
    if token is not None and request.app.state.gateway.sessions.is_admin(token):
        return True
    return request.app.state.ui_logins.valid(request.cookies.get(COOKIE))


def same_origin(request: Request) -> bool:
    """False for a POST that another site made the browser send (CSRF).

    ``Sec-Fetch-Site`` (set by the browser, not by page scripts) decides when present; otherwise
    an ``Origin`` header must name this server. No ``Origin`` at all: not a browser form post
    (SameSite=Strict still keeps the cookie away from other sites)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")
