"""Tool input schemas: checked against the JSON Schema meta-schema, on every surface, without
fetching anything they name, and without holding the event loop (benchmarks/hardening.py s1
measures the time; these tests check what is accepted and refused)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from helpers import key_headers, start_session
from rlgate.api.common import check_tool_schema, nesting_depth_over
from rlgate.errors import InvalidRequest

VALID: list[Any] = [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
    {"type": "object", "properties": {"a": {"anyOf": [{}] * 5000}}},  # wide: ~0.6 ms a branch before
    {"properties": {"a": True}},
    {"type": "object", "$defs": {"x": {"$ref": "#/$defs/x"}}, "properties": {"a": {"$ref": "#/$defs/x"}}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "definitions": {}},
    {"type": "object", "enum": []},
    {"type": "object", "$dynamicRef": "#meta"},
]
INVALID: list[tuple[Any, str]] = [  # (schema, where the error is)
    ({"type": "objectx"}, "type"),
    ({"type": "object", "properties": {"a": {"type": 5}}}, "properties/a/type"),
    ({"type": "object", "properties": {"a": {"anyOf": [{}] * 4999 + [{"minLength": -1}]}}},
     "properties/a/anyOf/4999/minLength"),
    ({"type": "object", "required": "a"}, "required"),
    ({"type": "object", "items": [{}]}, "items"),
    ({"type": "object", "$defs": {"a": 5}}, "$defs/a"),
    ({"type": "object", "additionalProperties": "no"}, "additionalProperties"),
    ({"type": ["object", "object"]}, "type"),
    ({"type": "object", "$anchor": "1bad"}, "$anchor"),
    ({"$schema": 5, "type": "object"}, "$schema"),
]


@pytest.mark.parametrize("schema", VALID, ids=range(len(VALID)))
def test_valid_schemas_are_accepted_as_sent(schema):
    assert check_tool_schema("f", schema, "tools[0]") is schema


@pytest.mark.parametrize("schema,where", INVALID, ids=[w for _, w in INVALID])
def test_invalid_schemas_name_the_tool_and_where(schema, where):
    with pytest.raises(InvalidRequest) as exc:
        check_tool_schema("f", schema, "tools[0]")
    assert exc.value.status == 400 and exc.value.param == "tools[0]"
    assert f"tool 'f': invalid JSON schema (at {where}):" in exc.value.message


def test_not_an_object_schema_is_refused():
    for schema, words in ((["x"], "must be a JSON object"), ({"type": "string"}, "must have type 'object'")):
        with pytest.raises(InvalidRequest, match=words):
            check_tool_schema("f", schema, "p")
    assert check_tool_schema("f", None, "p") == {"type": "object", "properties": {}}


def test_nesting_depth_counts_containers_only():
    assert not nesting_depth_over("x" * 10, 0) and nesting_depth_over({}, 0) and not nesting_depth_over({}, 1)
    assert nesting_depth_over({"a": [{"b": [1, "s"]}]}, 3) and not nesting_depth_over({"a": [{"b": [1, "s"]}]}, 4)
    deep: Any = 1
    for _ in range(200):
        deep = [deep, {"k": "v"}]
    assert nesting_depth_over(deep, 200) and not nesting_depth_over(deep, 201)


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture
def witness() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 that records every request it gets."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            hits.append(self.path)
            body = b'{"type": "object"}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def _bodies(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    user = [{"role": "user", "content": "hi"}]
    return {
        "/v1/chat/completions": {"messages": user, "max_tokens": 2, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": schema}}]},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2, "tools": [
            {"type": "function", "name": "f", "parameters": schema}]},
        "/v1/messages": {"max_tokens": 2, "messages": user, "tools": [{"name": "f", "input_schema": schema}]},
        "/v1/messages/count_tokens": {"messages": user, "tools": [{"name": "f", "input_schema": schema}]},
    }


async def test_nothing_a_schema_names_is_fetched(make_app, asgi_client, witness):
    url, hits = witness
    schema = {"$schema": f"{url}/meta", "$id": f"{url}/root", "type": "object",
              "properties": {"a": {"$ref": f"{url}/a.json"}, "b": {"$dynamicRef": f"{url}/b#x"}}}
    async with asgi_client(make_app()) as c:
        h = key_headers((await start_session(c))[1])
        for path, body in _bodies(schema).items():
            r = await c.post(path, json=body, headers=h)
            assert r.status_code == 200, (path, r.text)
    assert hits == []


async def test_an_invalid_schema_is_refused_in_each_surface_shape(make_app, asgi_client):
    schema = {"type": "object", "properties": {"a": {"anyOf": [{}] * 4999 + [{"type": 5}]}}}
    async with asgi_client(make_app()) as c:
        h = key_headers((await start_session(c))[1])
        for path, body in _bodies(schema).items():
            r = await c.post(path, json=body, headers=h)
            assert r.status_code == 400, (path, r.text)
            err = r.json()["error"]
            assert "invalid JSON schema (at properties/a/anyOf/4999/type)" in err["message"]
            if path.startswith("/v1/messages"):
                assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
            else:
                assert err["type"] == "invalid_request_error" and err["param"]
        r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, headers=h)
        assert r.status_code == 200  # the session goes on


async def test_a_large_tool_list_renders_off_the_event_loop(make_app, asgi_client):
    """Tools count towards the size that decides where a prompt renders: a long tool list with a
    short message renders on the render pool (it rendered on the event loop: 0.8 s for 3.6 MB)."""
    app = make_app()
    pool = app.state.gateway.generation.render_pool
    ran: list[Any] = []
    real = pool.run

    async def counting(fn: Any) -> Any:
        ran.append(fn)
        return await real(fn)

    pool.run = counting
    props = {f"p{i}": {"type": "string", "description": "x" * 40} for i in range(600)}  # ~40 KB of tools
    async with asgi_client(app) as c:
        h = key_headers((await start_session(c))[1])
        small = {"type": "object", "properties": {"a": {"type": "string"}}}
        for schema, pooled in ((small, 0), ({"type": "object", "properties": props}, 1)):
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [
                {"type": "function", "function": {"name": "f", "parameters": schema}}]}
            r = await c.post("/v1/chat/completions", json=body, headers=h)
            assert r.status_code in (200, 400), r.text  # 400: longer than the tiny model's context
            assert len(ran) == pooled
