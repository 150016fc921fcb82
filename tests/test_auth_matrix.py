"""Every route of the app × {no key, wrong key, session key, admin key}.

The test walks the app's route table: a route that is not classified below fails the
suite, so a route added later without deciding its auth cannot slip through.
"""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute

from helpers import ADMIN_KEY, key_headers, start_session

PUBLIC = "public"  # no key needed
ADMIN = "admin"  # admin key only (others: 401 without key, 403 with a wrong one)
SESSION = "session"  # a session key only (others: 401)
SESSION_OR_ADMIN = "session_or_admin"  # either key
ANY_KEY = "any_key"  # any valid key (session or admin)

# path -> (auth class, minimal valid JSON body or None)
CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
ROUTES: dict[tuple[str, str], tuple[str, dict | None]] = {
    ("GET", "/health"): (PUBLIC, None),
    ("GET", "/openapi.json"): (PUBLIC, None),
    ("GET", "/docs"): (PUBLIC, None),
    ("GET", "/docs/oauth2-redirect"): (PUBLIC, None),
    ("GET", "/redoc"): (PUBLIC, None),
    ("POST", "/grant_capacity"): (ADMIN, {}),
    ("POST", "/rl/start_session"): (ADMIN, {"task_id": "x"}),
    ("POST", "/rl/end_session"): (SESSION, {}),
    ("POST", "/rl/set_reward"): (SESSION_OR_ADMIN, {"reward": 1.0}),
    ("POST", "/export_trajectories"): (ADMIN, {"session_id": "nobody-0"}),
    ("POST", "/rl/collect"): (ADMIN, {"max_sessions": 1}),
    ("POST", "/rl/finish_session"): (ADMIN, {"session_id": "nobody-0"}),
    ("POST", "/rl/start_sessions"): (ADMIN, {"sessions": [{"task_id": "x"}]}),
    ("POST", "/rl/update_weights"): (ADMIN, {"path": "/nonexistent"}),
    ("GET", "/rl/metrics"): (ADMIN, None),
    ("GET", "/rl/policies"): (ADMIN, None),
    ("POST", "/rl/policies"): (ADMIN, {"name": "x", "path": "/nonexistent"}),
    ("POST", "/rl/policies/unload"): (ADMIN, {"name": "x"}),
    ("GET", "/metrics"): (ADMIN, None),
    ("GET", "/v1/models"): (ANY_KEY, None),
    ("GET", "/models"): (ANY_KEY, None),
    ("POST", "/chat/completions"): (SESSION, CHAT_BODY),
    ("POST", "/v1/chat/completions"): (SESSION, CHAT_BODY),
    ("POST", "/responses"): (SESSION, {"input": "hi", "max_output_tokens": 2}),
    ("POST", "/v1/responses"): (SESSION, {"input": "hi", "max_output_tokens": 2}),
    ("POST", "/v1/messages"): (SESSION, {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/messages/count_tokens"): (SESSION, {"messages": [{"role": "user", "content": "hi"}]}),
}


def _leaf_routes(routes) -> list:
    """Routes, with included routers expanded (FastAPI >= 0.16x wraps each in ``_IncludedRouter``;
    every router here is included without a prefix)."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        out.extend(_leaf_routes(inner.routes) if inner is not None else [r])
    return out


def app_routes(app) -> list[tuple[str, str]]:
    out = []
    for r in _leaf_routes(app.routes):
        methods = getattr(r, "methods", None) or set()
        for m in sorted(methods - {"HEAD", "OPTIONS"}):
            out.append((m, r.path))
    return out


def test_every_route_is_classified(make_app):
    app = make_app()
    unclassified = [r for r in app_routes(app) if r not in ROUTES]
    assert not unclassified, f"routes without an auth decision in this test: {unclassified}"
    leaves = _leaf_routes(app.routes)
    # all but the docs routes are FastAPI routes, or served by Starlette for one (server/app.py: PlainRoute)
    assert sum(isinstance(getattr(r, "api_route", r), APIRoute) for r in leaves) >= len(ROUTES) - 4
    assert set(ROUTES) <= set(app_routes(app)), "a classified route is missing from the app"


def _expect(auth: str, who: str) -> set[int] | None:
    """Allowed statuses: a set to match, or None meaning 'not an auth failure'."""
    if auth == PUBLIC:
        return None
    if who == "none":
        return {401}
    if auth == ADMIN:
        return None if who == "admin" else {403}
    if auth == SESSION:
        return None if who == "session" else {401}
    if auth in (SESSION_OR_ADMIN, ANY_KEY):
        return None if who in ("session", "admin") else {401}
    raise AssertionError(auth)


@pytest.mark.parametrize("who", ["none", "wrong", "session", "admin"])
async def test_auth_matrix(make_app, asgi_client, who):
    app = make_app()
    async with asgi_client(app) as c:
        _, session_key = await start_session(c, "auth")
        # one completed interaction so that session-key reward calls can succeed
        r = await c.post("/v1/chat/completions", json=CHAT_BODY, headers=key_headers(session_key))
        assert r.status_code == 200
        headers = {
            "none": {},
            "wrong": key_headers("not-a-key-" + "x" * 30),
            "session": key_headers(session_key),
            "admin": key_headers(ADMIN_KEY),
        }[who]
        for method, path in app_routes(app):
            auth, body = ROUTES[(method, path)]
            if path == "/rl/end_session":
                continue  # checked last: it would end the session used by the other routes
            r = await c.request(method, path, json=body, headers=headers)
            expected = _expect(auth, who)
            if expected is None:
                assert r.status_code not in (401, 403), (method, path, who, r.status_code, r.text)
                assert r.status_code < 500, (method, path, who, r.status_code, r.text)
            else:
                assert r.status_code in expected, (method, path, who, r.status_code, r.text)
                if path.startswith("/v1/messages"):
                    assert r.json()["type"] == "error" and "type" in r.json()["error"]
                else:
                    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await c.post("/rl/end_session", headers=headers)
        assert r.status_code == (200 if who == "session" else 401)


async def test_x_api_key_and_bearer_scheme_case(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        r = await c.post("/grant_capacity", headers={"x-api-key": ADMIN_KEY})
        assert r.status_code == 200
        r = await c.post("/grant_capacity", headers={"Authorization": f"bearer {ADMIN_KEY}"})
        assert r.status_code == 200
        r = await c.post("/grant_capacity", headers={"Authorization": f"Basic {ADMIN_KEY}"})
        assert r.status_code == 401
        _, key = await start_session(c)
        r = await c.post("/v1/chat/completions", json=CHAT_BODY, headers={"x-api-key": key})
        assert r.status_code == 200


def test_the_early_auth_gate_knows_the_admin_routes():
    """The ASGI gate answers before the body is read (server/auth_gate.py): it must say 403 exactly
    where the routes would."""
    from rlgate.api.auth import ADMIN_ONLY_PATHS

    assert set(ADMIN_ONLY_PATHS) == {path for (_, path), (auth, _) in ROUTES.items() if auth == ADMIN}


async def test_a_key_retired_while_its_body_arrives_is_refused_by_the_route(make_app, asgi_client):
    """The early gate hands the session it found to the route (one lookup per request); a session
    exported while the request's body was still arriving is not taken from it: the route answers
    401 as for any retired key, and writes nothing for the forgotten session."""
    import asyncio
    import json

    from helpers import admin_headers

    app = make_app()
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        sid, key = await start_session(c)
        assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        body_sent = asyncio.Event()
        gate_passed = asyncio.Event()
        body = b"{}"

        async def receive() -> dict:
            gate_passed.set()  # the gate answered from the headers; the body is being read
            await body_sent.wait()
            return {"type": "http.request", "body": body, "more_body": False}

        out: dict = {}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                out["status"] = message["status"]
            elif message["type"] == "http.response.body":
                out["body"] = out.get("body", b"") + message.get("body", b"")

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/rl/end_session", "raw_path": b"/rl/end_session", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                 "headers": [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode()), (b"host", b"x")]}
        late = asyncio.create_task(app(scope, receive, send))
        await gate_passed.wait()
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert r.status_code == 200  # exported and forgotten
        body_sent.set()
        await late
        assert out["status"] == 401, out
        assert "invalid API key" in json.loads(out["body"])["error"]["message"]
        assert sid not in app.state.gateway.sessions.sessions
