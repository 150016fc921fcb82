"""``/ui``: the trajectory viewer inside the gateway (``GatewayConfig.ui``; off by default).

=====================================  =========================================
route                                  what
=====================================  =========================================
GET  /ui                               sessions list (newest ``limit``, filters)
GET  /ui/session?id=SID                a session's conversation tree
GET  /ui/turn?session=SID&id=TID       one interaction: tokens, messages, request
     [&part=N]                         (a long one in parts of 4,096 tokens: render.py)
GET  /ui/group?id=GID                  a GRPO group side by side
GET  /ui/login, POST /ui/login         the login form (key in the body, never a URL)
POST /ui/logout                        forget this browser's login
=====================================  =========================================

Ids travel in the query string (they are any string a client chose: ``/`` included).
Pages are built from a snapshot taken on the event loop, then rendered (and detokenized,
with the viewer's own copy of the tokenizer) on a worker thread, so a 10,000-token turn
does not hold up generation. See ui/auth.py for who may look.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from rlgate.core.gateway import Gateway
from rlgate.ui.auth import COOKIE, is_viewer, same_origin
from rlgate.ui.live import episode, group_episodes, group_of, session_rows
from rlgate.ui.model import mark_stale
from rlgate.ui.page import SECURITY_HEADERS, content_security_policy, document
from rlgate.ui.render import (
    LiveLinks,
    e,
    group_view,
    interaction_view,
    session_view,
    sessions_list,
)
from rlgate.ui.tokens import token_texts_window

log = logging.getLogger("rlgate.ui")

router = APIRouter(include_in_schema=False)  # full paths: the app includes routers without a prefix
LINKS = LiveLinks()
MAX_LOGIN_BODY = 4096


def _gw(request: Request) -> Gateway:
    return request.app.state.gateway


def _page(request: Request, title: str, body: str, status: int = 200) -> Response:
    extra = ""
    if request.cookies.get(COOKIE):
        extra = ('<form method="post" action="/ui/logout"><button type="submit">log out</button></form>')
    resp = HTMLResponse(document(title, body, mode="live", header_extra=extra), status_code=status)
    _secure(resp)
    return resp


def _secure(resp: Response) -> Response:
    resp.headers.update(SECURITY_HEADERS)
    resp.headers["Content-Security-Policy"] = content_security_policy()
    return resp


def _to_login(request: Request) -> Response | None:
    if is_viewer(request):
        return None
    return _secure(RedirectResponse("/ui/login", status_code=303))


def _not_found(request: Request, what: str) -> Response:
    return _page(request, "not found", f'<h1>not found</h1><p>{e(what)}</p><p><a href="/ui">sessions</a></p>', 404)


def _tokenizer(request: Request) -> Any:
    """The viewer's own copy of the tokenizer: decoding on a worker thread must not share the
    Rust tokenizer that the event loop encodes with."""
    state = request.app.state
    tok = getattr(state, "ui_tokenizer", None)
    if tok is None:
        tok = state.ui_tokenizer = copy.deepcopy(_gw(request).tokenizer)
    return tok


# --------------------------------------------------------------------------- login


def login_form_html(error: str = "") -> str:
    msg = f'<p class="error">{e(error)}</p>' if error else ""
    return ('<div class="login"><h1>rlgate viewer</h1><p>Enter the gateway\'s admin key. It is sent in the '
            'form body only; the browser gets a login cookie (HttpOnly, SameSite=Strict), never the key.</p>'
            f'{msg}<form method="post" action="/ui/login"><input type="password" name="key" '
            'autocomplete="current-password" required autofocus><button type="submit">log in</button></form></div>')


@router.get("/ui/login")
async def login_form(request: Request) -> Response:
    if is_viewer(request):
        return _secure(RedirectResponse("/ui", status_code=303))
    return _page(request, "log in", login_form_html())


@router.post("/ui/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return _page(request, "refused", "<h1>refused</h1><p>cross-site login refused</p>", 403)
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        return _page(request, "log in", login_form_html("request too large"), 413)
    key = (parse_qs(body.decode("utf-8", "replace")).get("key") or [""])[0]
    if not key or not _gw(request).sessions.is_admin(key):
        log.warning("/ui: failed login from %s", request.client.host if request.client else "?")
        return _page(request, "log in", login_form_html("wrong key"), 403)
    token = request.app.state.ui_logins.issue()
    resp = RedirectResponse("/ui", status_code=303)
    resp.set_cookie(COOKIE, token, max_age=int(request.app.state.ui_logins.ttl), path="/ui", httponly=True,
                    samesite="strict", secure=request.url.scheme == "https")
    return _secure(resp)


@router.post("/ui/logout")
async def logout(request: Request) -> Response:
    if not same_origin(request):
        return _page(request, "refused", "<h1>refused</h1><p>cross-site request refused</p>", 403)
    request.app.state.ui_logins.revoke(request.cookies.get(COOKIE))
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
    return _secure(resp)


# --------------------------------------------------------------------------- views


@router.get("/ui")
@router.get("/ui/")
async def sessions_page(request: Request, limit: int = 2000) -> Response:
    if (r := _to_login(request)) is not None:
        return r
    mgr = _gw(request).sessions
    held = sorted(mgr.sessions.values(), key=lambda s: s.created_at, reverse=True)
    shown = held[:max(1, min(limit, 100_000))]
    rows = session_rows(shown)
    body = await asyncio.to_thread(sessions_list, f"{len(held)} sessions on this gateway", rows, LINKS,
                                   omitted=len(held) - len(shown), omitted_hint="?limit=N")
    return _page(request, "sessions", body)


@router.get("/ui/session")
async def session_page(request: Request, id: str = "") -> Response:  # noqa: A002 - the query parameter
    sid = id
    if (r := _to_login(request)) is not None:
        return r
    mgr = _gw(request).sessions
    s = mgr.sessions.get(sid)
    if s is None:
        return _not_found(request, f"session {sid!r} is not held by this gateway")
    ep = episode(s)
    gid = group_of(s)
    rows = session_rows([m for m in mgr.sessions.values() if group_of(m) == gid])
    me = next((row for row in rows if row.id == sid), None)
    if me is not None:
        ep.advantage, ep.advantage_computed = me.advantage, me.advantage_computed
    mark_stale([ep], mgr.config.guard_stale_lag)
    return _page(request, f"session {sid}", await asyncio.to_thread(session_view, ep, LINKS))


@router.get("/ui/turn")
async def turn_page(request: Request, session: str = "", id: str = "", part: int = 1) -> Response:  # noqa: A002
    """One part of a turn (``part``: 1, 2, ...; a page shows a bounded window of a long turn)."""
    sid, tid = session, id
    if (r := _to_login(request)) is not None:
        return r
    g = _gw(request)
    s = g.sessions.sessions.get(sid)
    if s is None:
        return _not_found(request, f"session {sid!r} is not held by this gateway")
    target = s.interactions.get(tid)
    ep = episode(s, only={tid, target.parent_id or ""} if target is not None else {tid})  # a snapshot (copies)
    turn = next((t for t in ep.turns if t.id == tid), None)
    if turn is None:
        return _not_found(request, f"no completed turn {tid!r} in session {sid!r}")
    lag = g.config.guard_stale_lag
    versions: dict[str | None, int] = {None: g.engine.version}  # None: turns recorded before policies
    versions.update(g.policies.versions())
    mark_stale([ep], lag)
    tokenizer = _tokenizer(request)

    def texts(start: int, end: int) -> list[str]:
        return token_texts_window(tokenizer, turn.input_ids, start, end)

    def render() -> str:
        return interaction_view(ep, turn, texts, LINKS, newest_version=versions, stale_lag=lag, part=part)

    return _page(request, f"turn {tid}", await asyncio.to_thread(render))


@router.get("/ui/group")
async def group_page(request: Request, id: str = "") -> Response:  # noqa: A002 - the query parameter
    gid = id
    if (r := _to_login(request)) is not None:
        return r
    members = group_episodes(_gw(request).sessions, gid)
    if not members:
        return _not_found(request, f"no session of group {gid!r} is held by this gateway")
    return _page(request, f"group {gid}", await asyncio.to_thread(group_view, gid, members, LINKS))
