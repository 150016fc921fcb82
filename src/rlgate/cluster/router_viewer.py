"""``/ui`` through the router: one viewer for the whole cluster (when the replicas run ``--ui``).

Before (issue 23) the router sent ``/ui`` to a random replica: the sessions list showed 2 or 4
sessions on alternate loads, a session's page 404'd when it landed on another replica, the login
cookie worked on one replica only, and a login with ``Origin`` but no ``Sec-Fetch-Site`` got 403
(the router rewrote ``Host``). Now:

======================================  ================================================
route                                   served
======================================  ================================================
``GET /ui``                             here: every replica's rows (``/ui/data/sessions``),
                                        merged newest first, advantages over whole groups
``GET /ui/group?id=``                   here: the group's episodes from every replica
``GET /ui/session?id=``,                the replica the session id names (``r<k>.``), with
``GET /ui/turn?session=``               the admin key added for a logged-in browser
``GET|POST /ui/login``, ``/ui/logout``  here: the router's own login tokens (ui/auth.py)
======================================  ================================================

Pages are rendered with the functions ``/ui`` itself uses (ui/render.py, ui/page.py), with the
same security headers and CSP.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from rlgate.cluster.keys import session_id_replica
from rlgate.cluster.upstream import UpstreamUnavailable
from rlgate.ui.auth import COOKIE, UiLogins, same_origin
from rlgate.ui.model import Episode, SessionRow, Turn, assign_advantages
from rlgate.ui.page import SECURITY_HEADERS, content_security_policy, document
from rlgate.ui.render import LiveLinks, e, group_view, sessions_list
from rlgate.ui.routes import MAX_LOGIN_BODY, login_form_html

if TYPE_CHECKING:
    from rlgate.cluster.directory import ReplicaInfo, ReplicaTable
    from rlgate.cluster.upstream import Upstream
    from rlgate.config import GatewayConfig

# the router's forwarding: (replica, scope, headers, body, send)
Forward = Callable[["ReplicaInfo", dict[str, Any], list[tuple[bytes, bytes]], bytes, Any], Awaitable[None]]

log = logging.getLogger("rlgate.cluster.router")

LINKS = LiveLinks()
_ROUTED = {"/ui/session": "id", "/ui/turn": "session"}  # page -> the query parameter naming the session


class RouterViewer:
    def __init__(self, upstream: Upstream, table: ReplicaTable, config: GatewayConfig, admin_key: str,
                 is_admin: Callable[[str | None], bool], forward: Forward) -> None:
        self.upstream = upstream
        self.table = table
        self.is_admin = is_admin
        self.forward = forward
        self.logins = UiLogins(config.ui_login_ttl)
        self._admin = [(b"authorization", b"Bearer " + admin_key.encode())]

    def _admin_header(self) -> list[tuple[bytes, bytes]]:
        return list(self._admin)

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any, admin: bool) -> None:
        request = Request(scope, receive)
        viewer = admin or self.logins.valid(request.cookies.get(COOKIE))
        path, method = scope["path"], scope["method"]
        if path == "/ui/login":
            resp = await (self._login(request) if method == "POST" else self._login_form(request, viewer))
        elif path == "/ui/logout" and method == "POST":
            resp = self._logout(request)
        elif method != "GET":
            resp = self._page(request, "not found", "<h1>not found</h1>", 405)
        elif not viewer:
            resp = _secure(RedirectResponse("/ui/login", status_code=303))
        elif path in ("/ui", "/ui/"):
            resp = await self._sessions(request)
        elif path == "/ui/group":
            resp = await self._group(request)
        elif path in _ROUTED:
            await self._forward(scope, request, send, _ROUTED[path])
            return
        else:
            resp = self._page(request, "not found", '<h1>not found</h1><p><a href="/ui">sessions</a></p>', 404)
        await resp(scope, receive, send)

    # ------------------------------------------------------------------ pages rendered here

    async def _sessions(self, request: Request) -> Response:
        try:
            limit = max(1, min(int(request.query_params.get("limit", "2000")), 100_000))
        except ValueError:
            limit = 2000
        parts = await self._from_all(f"/ui/data/sessions?limit={limit}")
        found: list[tuple[float, SessionRow]] = []
        total = 0
        for part in parts:
            total += int(part.get("total", 0))
            for row in part.get("rows", []):
                created = float(row.pop("created_at", 0.0))
                found.append((created, SessionRow(**row)))
        found.sort(key=lambda x: x[0], reverse=True)
        rows = [r for _, r in found[:limit]]
        for r in rows:  # advantages over whole groups, not each replica's part of one
            r.advantage, r.advantage_computed = None, False
        assign_advantages(rows)
        missing = len(self.table.replicas) - len(parts)
        title = f"{total} sessions on {len(parts)} replicas" + (f" ({missing} not answering)" if missing else "")
        body = await asyncio.to_thread(sessions_list, title, rows, LINKS, omitted=total - len(rows),
                                       omitted_hint="?limit=N")
        return self._page(request, "sessions", body)

    async def _group(self, request: Request) -> Response:
        gid = request.query_params.get("id", "")
        parts = await self._from_all("/ui/data/group?id=" + _quote(gid))
        members = [_episode(d) for part in parts for d in part.get("episodes", [])]
        if not members:
            return self._page(request, "not found", f"<h1>not found</h1><p>no session of group {e(gid)} is held "
                              'by this cluster</p><p><a href="/ui">sessions</a></p>', 404)
        for m in members:
            m.advantage, m.advantage_computed = None, False
        assign_advantages(members)
        return self._page(request, f"group {gid}", await asyncio.to_thread(group_view, gid, members, LINKS))

    async def _from_all(self, target: str) -> list[dict[str, Any]]:
        async def one(r: ReplicaInfo) -> dict[str, Any] | None:
            if not r.url or r.state == "down":
                return None
            try:
                status, _, data = await self.upstream.call(r.url, "GET", target, self._admin_header(), b"")
            except UpstreamUnavailable as exc:
                self.table.mark_down(r, str(exc))
                return None
            if status != 200:
                log.warning("replica %d answered %d to %s", r.index, status, target.split("?")[0])
                return None
            obj = json.loads(data)
            return obj if isinstance(obj, dict) else None

        got = await asyncio.gather(*(one(r) for r in self.table.replicas))
        return [g for g in got if g is not None]

    # ------------------------------------------------------------------ pages of one session

    async def _forward(self, scope: dict[str, Any], request: Request, send: Any, param: str) -> None:
        sid = request.query_params.get(param, "")
        index = session_id_replica(sid)
        replicas = self.table.replicas
        if index is None or index >= len(replicas):
            resp = self._page(request, "not found", f"<h1>not found</h1><p>session {e(sid)} is not a session of "
                              'this cluster</p><p><a href="/ui">sessions</a></p>', 404)
            await resp(scope, request.receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"authorization", b"x-api-key")]
        await self.forward(replicas[index], scope, headers + self._admin_header(), b"", send)

    # ------------------------------------------------------------------ login

    async def _login_form(self, request: Request, viewer: bool) -> Response:
        if viewer:
            return _secure(RedirectResponse("/ui", status_code=303))
        return self._page(request, "log in", login_form_html())

    async def _login(self, request: Request) -> Response:
        if not same_origin(request):
            return self._page(request, "refused", "<h1>refused</h1><p>cross-site login refused</p>", 403)
        body = await request.body()
        if len(body) > MAX_LOGIN_BODY:
            return self._page(request, "log in", login_form_html("request too large"), 413)
        key = (parse_qs(body.decode("utf-8", "replace")).get("key") or [""])[0]
        if not key or not self.is_admin(key):
            log.warning("/ui: failed login from %s", request.client.host if request.client else "?")
            return self._page(request, "log in", login_form_html("wrong key"), 403)
        resp = RedirectResponse("/ui", status_code=303)
        resp.set_cookie(COOKIE, self.logins.issue(), max_age=int(self.logins.ttl), path="/ui", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
        return _secure(resp)

    def _logout(self, request: Request) -> Response:
        if not same_origin(request):
            return self._page(request, "refused", "<h1>refused</h1><p>cross-site request refused</p>", 403)
        self.logins.revoke(request.cookies.get(COOKIE))
        resp = RedirectResponse("/ui/login", status_code=303)
        resp.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return _secure(resp)

    def _page(self, request: Request, title: str, body: str, status: int = 200) -> Response:
        extra = ('<form method="post" action="/ui/logout"><button type="submit">log out</button></form>'
                 if request.cookies.get(COOKIE) else "")
        return _secure(HTMLResponse(document(title, body, mode="live", header_extra=extra), status_code=status))


def _secure(resp: Response) -> Response:
    resp.headers.update(SECURITY_HEADERS)
    resp.headers["Content-Security-Policy"] = content_security_policy()
    return resp


def _quote(s: str) -> str:
    from urllib.parse import quote

    return quote(s, safe="")


def _episode(d: dict[str, Any]) -> Episode:
    return Episode(**{**d, "turns": [Turn(**t) for t in d.get("turns", [])]})
