"""Every limit: hit it, get the documented status and error shape, then serve normally."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from helpers import admin_headers, eventually, key_headers, start_session
from rlgate.engine.fake import FakeEngine

USER = [{"role": "user", "content": "hi"}]

# path -> (minimal body, error shape)
SURFACES = {
    "/v1/chat/completions": ({"messages": USER, "max_tokens": 4}, "openai"),
    "/v1/responses": ({"input": "hi", "max_output_tokens": 4}, "openai"),
    "/v1/messages": ({"max_tokens": 4, "messages": USER}, "anthropic"),
}


def assert_shape(r: httpx.Response, shape: str, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    if shape == "anthropic":
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"]
        if code is not None:
            assert body["error"]["code"] == code, body
    return body


async def ok(c, path: str, key: str) -> None:
    body, _ = SURFACES[path]
    r = await c.post(path, json=body, headers=key_headers(key))
    assert r.status_code == 200, r.text


# --------------------------------------------------------------------------- body size


@pytest.mark.parametrize("path", [*SURFACES, "/rl/start_session", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_limit_413(make_app, asgi_client, path, chunked):
    async with asgi_client(make_app(max_body_bytes=2048)) as c:
        _, key = await start_session(c)
        big = b'{"messages": [{"role": "user", "content": "' + b"x" * 4096 + b'"}]}'

        async def chunks():
            for k in range(0, len(big), 512):
                yield big[k:k + 512]

        content = chunks() if chunked else big
        headers = {**key_headers(key if path != "/rl/start_session" else "unused"), "content-type": "application/json"}
        if path == "/rl/start_session":
            headers = {**admin_headers(), "content-type": "application/json"}
        r = await c.post(path, content=content, headers=headers)
        shape = "anthropic" if path.startswith("/v1/messages") else "openai"
        body = assert_shape(r, shape, 413, None if shape == "anthropic" else "request_too_large")
        if shape == "anthropic":
            assert body["error"]["type"] == "request_too_large"
        for p in SURFACES:  # the server keeps serving
            await ok(c, p, key)


async def test_body_limit_over_a_real_socket_with_chunked_upload(make_app):
    """uvicorn + the middleware: a chunked upload without content-length is cut at the limit."""
    from rlgate.server.runner import ServerThread

    app = make_app(max_body_bytes=4096)
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:
            _, key = await start_session(c)

            async def over(n_chunks):
                yield b'{"messages": [{"role": "user", "content": "'
                for _ in range(n_chunks):
                    yield b"y" * 1024

            for path, (_, shape) in SURFACES.items():
                headers = {**key_headers(key), "content-type": "application/json"}
                r = await c.post(path, content=over(8), headers=headers)  # 8 KB, chunked
                assert "content-length" not in r.request.headers
                assert_shape(r, shape, 413)
                try:  # 1 MB: the server answers / closes without reading it all
                    r = await c.post(path, content=over(1000), headers=headers)
                    assert_shape(r, shape, 413)
                except (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError):
                    pass
            for path in SURFACES:
                await ok(c, path, key)


# --------------------------------------------------------------------------- sessions


async def test_max_sessions_429(make_app, asgi_client):
    async with asgi_client(make_app(max_sessions=2)) as c:
        _, k1 = await start_session(c)
        await start_session(c)
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        assert_shape(r, "openai", 429, "too_many_sessions")
        await c.post("/rl/end_session", headers=key_headers(k1))  # ended sessions do not count
        await start_session(c)


async def test_max_stored_sessions_429(make_app, asgi_client):
    async with asgi_client(make_app(max_stored_sessions=2)) as c:
        sid, key = await start_session(c)
        await start_session(c)
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        assert_shape(r, "openai", 429, "too_many_stored_sessions")
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert r.status_code == 200
        await start_session(c)  # exported sessions free their slot


@pytest.mark.parametrize("path", list(SURFACES))
async def test_max_interactions_per_session_429(make_app, asgi_client, path):
    async with asgi_client(make_app(max_interactions_per_session=2)) as c:
        sid, key = await start_session(c)
        await ok(c, path, key)
        await ok(c, path, key)
        body, shape = SURFACES[path]
        r = await c.post(path, json=body, headers=key_headers(key))
        assert_shape(r, shape, 429, "too_many_interactions")
        if shape == "anthropic":
            assert r.json()["error"]["type"] == "rate_limit_error"
        _, other = await start_session(c)
        await ok(c, path, other)
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = (await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())).json()
        assert exp["stats"]["completed"] == 2


async def test_max_concurrent_requests_per_session_429(make_app, asgi_client, tokenizer):
    release = asyncio.Event()

    class HeldEngine(FakeEngine):
        """Generates only once the test releases it: the first requests stay in flight."""

        async def stream(self, request):
            await release.wait()
            async for delta in super().stream(request):
                yield delta

    app = make_app(HeldEngine(tokenizer, output_tokens=10), max_concurrent_requests_per_session=2)
    sessions = app.state.gateway.sessions
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        slow = [asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER},
                                           headers=key_headers(key))) for _ in range(2)]
        await eventually(lambda: sum(s.in_flight for s in sessions.sessions.values()) == 2,
                         what="two requests in flight")
        for path, (body, shape) in SURFACES.items():
            r = await c.post(path, json=body, headers=key_headers(key))
            assert_shape(r, shape, 429, "too_many_concurrent_requests")
        _, other = await start_session(c)  # other sessions are not affected
        release.set()
        await ok(c, "/v1/chat/completions", other)
        assert all(r.status_code == 200 for r in await asyncio.gather(*slow))
        await ok(c, "/v1/chat/completions", key)


# --------------------------------------------------------------------------- request content


def too_many(path: str, what: str, n: int) -> dict:
    if what == "messages":
        msgs = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"m{k}"} for k in range(n)]
        msgs[-1]["role"] = "user"
        if path == "/v1/responses":
            return {"input": [{"role": m["role"], "content": m["content"]} for m in msgs], "max_output_tokens": 4}
        return {**SURFACES[path][0], "messages": msgs}
    if what == "tools":
        if path == "/v1/messages":
            return {**SURFACES[path][0], "tools": [{"name": f"t{k}", "input_schema": {"type": "object"}}
                                                   for k in range(n)]}
        if path == "/v1/responses":
            return {**SURFACES[path][0], "tools": [{"type": "function", "name": f"t{k}",
                                                    "parameters": {"type": "object"}} for k in range(n)]}
        return {**SURFACES[path][0], "tools": [{"type": "function", "function": {
            "name": f"t{k}", "parameters": {"type": "object"}}} for k in range(n)]}
    if what == "stop":
        if path == "/v1/messages":
            return {**SURFACES[path][0], "stop_sequences": [f"s{k}" for k in range(n)]}
        return {**SURFACES[path][0], "stop": [f"s{k}" for k in range(n)]}
    raise AssertionError(what)


CONTENT_LIMITS = [
    ("/v1/chat/completions", "messages"), ("/v1/responses", "messages"), ("/v1/messages", "messages"),
    ("/v1/chat/completions", "tools"), ("/v1/responses", "tools"), ("/v1/messages", "tools"),
    ("/v1/chat/completions", "stop"), ("/v1/messages", "stop"),
]


@pytest.mark.parametrize("path,what", CONTENT_LIMITS)
async def test_request_content_limits_400(make_app, asgi_client, tokenizer, path, what):
    limits = {"max_messages_per_request": 3, "max_tools": 2, "max_stop_sequences": 2}
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine, **limits)) as c:
        sid, key = await start_session(c)
        at_limit = too_many(path, what, 3 if what == "messages" else 2)
        r = await c.post(path, json=at_limit, headers=key_headers(key))
        assert r.status_code == 200, r.text
        r = await c.post(path, json=too_many(path, what, 4 if what == "messages" else 3), headers=key_headers(key))
        _, shape = SURFACES[path]
        code = {"messages": "too_many_messages", "tools": "too_many_tools", "stop": "too_many_stop_sequences"}[what]
        assert_shape(r, shape, 400, code)
        assert len(engine.requests) == 1  # nothing generated, nothing recorded
        await ok(c, path, key)
        if path == "/v1/messages" and what == "messages":
            r = await c.post("/v1/messages/count_tokens", json={"messages": too_many(path, what, 4)["messages"]},
                             headers=key_headers(key))
            assert_shape(r, "anthropic", 400)


@pytest.mark.parametrize("path", list(SURFACES))
async def test_max_tokens_cap_applies_to_every_surface(make_app, asgi_client, tokenizer, path):
    engine = FakeEngine(tokenizer, output_tokens=50)
    async with asgi_client(make_app(engine, max_tokens_cap=3)) as c:
        _, key = await start_session(c)
        body = dict(SURFACES[path][0])
        body["max_output_tokens" if path == "/v1/responses" else "max_tokens"] = 1000
        r = await c.post(path, json=body, headers=key_headers(key))
        assert r.status_code == 200
        assert engine.requests[-1].sampling.max_new_tokens == 3


# --------------------------------------------------------------------------- sweeper and shutdown


async def test_idle_sweeper_ends_but_keeps_sessions(make_app, asgi_client):
    """The sweeper loop (run by the lifespan) ends a session idle past the timeout and keeps it."""
    app = make_app(session_idle_timeout=0.3, sweep_interval=0.05)
    async with app.router.lifespan_context(app), asgi_client(app) as c:
        sid, key = await start_session(c)
        await ok(c, "/v1/chat/completions", key)

        async def swept() -> bool:
            return (await c.get("/rl/metrics", headers=admin_headers())).json()["sessions_swept"] == 1

        await eventually(swept, what="the idle session swept")
        r = await c.post("/v1/chat/completions", json={"messages": USER}, headers=key_headers(key))
        assert_shape(r, "openai", 409, "session_ended")
        assert (await c.get("/rl/metrics", headers=admin_headers())).json()["open_sessions"] == 0
        exp = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert exp.status_code == 200 and exp.json()["status"] == "ended" and len(exp.json()["interactions"]) == 1


async def test_the_sweeper_ends_only_idle_sessions(make_app, asgi_client):
    """Which sessions are idle is decided by their last request (an explicit clock: no waiting)."""
    import time

    app = make_app(session_idle_timeout=100)
    mgr = app.state.gateway.sessions
    async with asgi_client(app) as c:
        quiet_id, quiet = await start_session(c)
        busy_id, busy = await start_session(c, "busy")
        await ok(c, "/v1/chat/completions", quiet)
        t_quiet = mgr.sessions[quiet_id].last_active
        await eventually(lambda: time.time() > t_quiet, what="the clock moving on")
        await ok(c, "/v1/chat/completions", busy)
        t_busy = mgr.sessions[busy_id].last_active
        assert t_busy > t_quiet
        assert mgr.sweep(now=t_quiet + 100 + (t_busy - t_quiet) / 2) == [quiet_id]
        r = await c.post("/v1/chat/completions", json={"messages": USER}, headers=key_headers(quiet))
        assert_shape(r, "openai", 409, "session_ended")
        await ok(c, "/v1/chat/completions", busy)
        assert mgr.metrics["sessions_swept"] == 1


async def test_sweep_interval_and_limits_come_from_the_cli(tiny_tokenizer_dir):
    import argparse

    from rlgate.cli import add_serve_args, build_app

    p = argparse.ArgumentParser()
    add_serve_args(p)
    args = p.parse_args(["--model", str(tiny_tokenizer_dir), "--engine", "fake", "--store", ":memory:",
                         "--sweep-interval", "0.5", "--session-idle-timeout", "2", "--max-tools", "7",
                         "--max-messages-per-request", "9", "--max-stop-sequences", "3",
                         "--max-concurrent-requests-per-session", "4", "--max-stored-sessions", "11",
                         "--shutdown-timeout", "5"])
    cfg = build_app(args, "k" * 40).state.gateway.config
    assert (cfg.sweep_interval, cfg.session_idle_timeout, cfg.max_tools, cfg.max_messages_per_request,
            cfg.max_stop_sequences, cfg.max_concurrent_requests_per_session, cfg.max_stored_sessions,
            cfg.shutdown_timeout) == (0.5, 2.0, 7, 9, 3, 4, 11, 5.0)


async def test_no_new_sessions_while_shutting_down(make_app, asgi_client):
    app = make_app()
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        app.state.gateway.sessions.accepting = False  # what SIGTERM does first (server/serve.py)
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        assert_shape(r, "openai", 503, "shutting_down")
        for path in SURFACES:  # sessions already admitted keep working until the server stops
            await ok(c, path, key)


# --------------------------------------------------------------------------- issue 15


def _image_message(path: str, data: str) -> dict:
    if path == "/v1/messages":
        return {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": data}}, {"type": "text", "text": "what is it?"}]}
    if path == "/v1/responses":
        return {"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{data}"},
                                            {"type": "input_text", "text": "what is it?"}]}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
                                        {"type": "text", "text": "what is it?"}]}


def _image_body(path: str, messages: list[dict]) -> dict:
    if path == "/v1/responses":
        return {"input": messages, "max_output_tokens": 2}
    return {"messages": messages, "max_tokens": 2}


@pytest.mark.parametrize("path", list(SURFACES))
async def test_images_are_limited_per_image_and_per_session(make_app, asgi_client, path):
    """Issue 15: a 25 MiB image cost 19 prompt tokens and nothing else; 40 requests on one key
    added 1.15 GB of memory and 1.05 GB to the store."""
    shape = SURFACES[path][1]
    app = make_app(max_image_bytes=100_000, max_image_bytes_per_session=250_000)
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        r = await c.post(path, json=_image_body(path, [_image_message(path, "A" * 100_001)]), headers=key_headers(key))
        assert_shape(r, shape, 413, None if shape == "anthropic" else "image_too_large")
        ok_image = "B" * 90_000
        for k in range(2):  # two new images fit the session budget
            r = await c.post(path, json=_image_body(path, [_image_message(path, ok_image + str(k))]),
                             headers=key_headers(key))
            assert r.status_code == 200, r.text
        r = await c.post(path, json=_image_body(path, [_image_message(path, ok_image + "x")]), headers=key_headers(key))
        assert_shape(r, shape, 413, None if shape == "anthropic" else "session_image_budget_exceeded")
        assert app.state.gateway.sessions.sessions[sid].image_bytes <= 250_000
        r = await c.post(path, json=_image_body(path, [{"role": "user", "content": "text still works"}]),
                         headers=key_headers(key))
        assert r.status_code == 200, r.text
        _, other = await start_session(c)  # the budget is per session
        r = await c.post(path, json=_image_body(path, [_image_message(path, ok_image)]), headers=key_headers(other))
        assert r.status_code == 200, r.text


async def test_an_image_counts_once_along_a_conversation(make_app, asgi_client):
    app = make_app(max_image_bytes_per_session=250_000)
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        messages = [_image_message("/v1/chat/completions", "C" * 200_000)]
        for turn in range(4):  # the image is re-sent with every turn, but recorded once
            r = await c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2},
                             headers=key_headers(key))
            assert r.status_code == 200, (turn, r.text)
            messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn}"}]
        session = app.state.gateway.sessions.sessions[sid]
        assert 200_000 <= session.image_bytes < 250_000
        # and held once in memory: every turn shares the first turn's message object
        assert len({id(i.messages[0]) for i in session.interactions.values()}) == 1


def _nested_schema(depth: int) -> dict:
    schema: dict = {"type": "object", "properties": {}}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("path", list(SURFACES))
async def test_deeply_nested_tool_schema_is_a_400(make_app, asgi_client, path):
    """Issue 15: a tool schema nested 150 levels answered 500 (RecursionError)."""
    shape = SURFACES[path][1]
    schema = _nested_schema(150)
    if path == "/v1/messages":
        extra = {"tools": [{"name": "deep", "input_schema": schema}]}
    elif path == "/v1/responses":
        extra = {"tools": [{"type": "function", "name": "deep", "parameters": schema}]}
    else:
        extra = {"tools": [{"type": "function", "function": {"name": "deep", "parameters": schema}}]}
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        r = await c.post(path, json={**SURFACES[path][0], **extra}, headers=key_headers(key))
        assert_shape(r, shape, 400, None if shape == "anthropic" else "too_deeply_nested")
        await ok(c, path, key)


async def test_internal_errors_are_server_errors(make_app, monkeypatch):
    """A 500 says so in its type (it answered `invalid_request_error` before)."""
    app = make_app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as c:
        _, key = await start_session(c)

        def boom(*a, **k):
            raise RuntimeError("a bug")

        monkeypatch.setattr(app.state.gateway.generation, "prepare", boom)
        r = await c.post("/v1/chat/completions", json={"messages": USER}, headers=key_headers(key))
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = await c.post("/v1/messages", json={"max_tokens": 2, "messages": USER}, headers=key_headers(key))
        assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"


async def test_concurrent_exports_with_wait_timeout_export_once(make_app, asgi_client):
    """Issue 15: two concurrent exports with wait_timeout both returned 200 for the same session."""
    async with asgi_client(make_app()) as c:
        sid, key = await start_session(c)
        await ok(c, "/v1/chat/completions", key)
        exports = [asyncio.create_task(c.post("/export_trajectories", json={"session_id": sid, "wait_timeout": 30},
                                              headers=admin_headers())) for _ in range(3)]
        for _ in range(200):  # event-loop turns, not time: every export reaches its wait loop
            await asyncio.sleep(0)
        assert not any(t.done() for t in exports)  # all three are waiting for the session to end
        await c.post("/rl/end_session", headers=key_headers(key))
        statuses = sorted(r.status_code for r in await asyncio.gather(*exports))
        assert statuses == [200, 404, 404], statuses
