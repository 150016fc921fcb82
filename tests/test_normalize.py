"""One request normalisation for every surface (api/normalize.py): same checks, same defaults."""

from __future__ import annotations

import pytest

from helpers import key_headers, start_session

USER = [{"role": "user", "content": "hi"}]
TOOL = {"name": "add", "description": "add two numbers",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}

SURFACES = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "anthropic": "/v1/messages",
}


def body(surface: str, *, messages=USER, tools=None, tool_choice=None, **extra) -> dict:
    if surface == "chat":
        b = {"messages": messages, **extra}
        if tools:
            b["tools"] = [{"type": "function", "function": t} for t in tools]
    elif surface == "responses":
        b = {"input": messages, **extra}
        if tools:
            b["tools"] = [{"type": "function", **t} for t in tools]
    else:
        b = {"max_tokens": 16, "messages": messages, **extra}
        if tools:
            b["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                          for t in tools]
    if tool_choice is not None:
        b["tool_choice"] = tool_choice
    return b


def named(surface: str, name: str) -> dict:
    return {"chat": {"type": "function", "function": {"name": name}},
            "responses": {"type": "function", "name": name},
            "anthropic": {"type": "tool", "name": name}}[surface]


def required(surface: str):
    return {"type": "any"} if surface == "anthropic" else "required"


def error_of(r) -> tuple[str, str | None]:
    j = r.json()
    if "type" in j and j["type"] == "error":
        return j["error"]["message"], None
    return j["error"]["message"], j["error"]["param"]


@pytest.mark.parametrize("surface", SURFACES)
async def test_the_same_checks_on_every_surface(surface, make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)

        async def post(b):
            return await c.post(SURFACES[surface], json=b, headers=key_headers(key))

        r = await post(body(surface, messages=[]))
        assert r.status_code == 400 and "at least one" in error_of(r)[0]
        r = await post(body(surface, tools=[TOOL], tool_choice=named(surface, "mul")))
        assert r.status_code == 400 and "'mul'" in error_of(r)[0] and "not among the tools" in error_of(r)[0]
        if surface != "anthropic":
            assert error_of(r)[1].endswith("name")
        r = await post(body(surface, tool_choice=required(surface)))  # a tool call required, but no tools
        assert r.status_code == 400 and "needs tools" in error_of(r)[0]
        r = await post(body(surface, tools=[TOOL, {**TOOL, "description": "another"}]))  # one name, two tools
        assert r.status_code == 400 and "tool names must be unique; 'add' is given twice" in error_of(r)[0]
        if surface != "anthropic":
            assert error_of(r)[1] == {"chat": "tools[1].function.name", "responses": "tools[1].name"}[surface]
        r = await post(body(surface, tools=[TOOL], tool_choice=named(surface, "add")))
        assert r.status_code == 200


async def test_every_surface_records_the_same_defaults(make_app, asgi_client):
    app = make_app()
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        for surface, path in SURFACES.items():
            r = await c.post(path, json=body(surface), headers=key_headers(key))
            assert r.status_code == 200, (surface, r.text)
    session = app.state.gateway.sessions.sessions[sid]
    samplings = [{k: v for k, v in i.sampling.items() if k != "max_new_tokens"} for i in session.interactions.values()]
    assert len(samplings) == 3
    assert samplings[0] == samplings[1] == samplings[2] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": None}


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "video", "v": 1}]}]},
     "messages[0].content[0]", "Input tag 'video' found using 'type' does not match any of the expected tags"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url.url", "Field required"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name",
     "Field required"),
    ("/v1/responses", {"input": "hi", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "custom"}]}]},
     "tools[0].tools[0].name", "Field required"),
])
async def test_an_invalid_field_is_named_as_the_request_spells_it(make_app, asgi_client, path, body, param, words):
    """pydantic's locations name the union members it tried (``content.str``, a tool's tag:
    ``tools[0].function.name`` for a Responses tool); the error names the request's own field."""
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        r = await c.post(path, json=body, headers=key_headers(key))
        assert r.status_code == 400, r.text
        message, got = error_of(r)
        assert got == param and message.startswith(f"{param}: {words}"), r.text


async def test_control_routes_name_their_fields_and_refuse_broken_json(make_app, asgi_client):
    from helpers import admin_headers

    async with asgi_client(make_app()) as c:
        h = {**admin_headers(), "content-type": "application/json"}
        r = await c.post("/rl/start_session", content=b"{", headers=h)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text
        assert r.json()["error"]["message"].startswith("the request body is not valid JSON")
        r = await c.post("/rl/start_session", json={"task_id": "t", "mode": "sideways"}, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "mode", r.text
        r = await c.post("/export_trajectories", json={"session_id": ["x"]}, headers=admin_headers())
        assert r.status_code == 422 and r.json()["error"]["param"] == "session_id", r.text
