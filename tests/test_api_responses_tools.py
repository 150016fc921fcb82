"""Responses API tool types beyond functions: namespace, custom, local_shell (served) and hosted
tools (dropped, reported). Codex sends several of them by default."""

from __future__ import annotations

import json

import pytest
from openai.types.responses import Response

from helpers import key_headers, start_session
from rlgate.engine.fake import FakeEngine
from test_api_responses import STREAM_EVENT, check_stream, create, export
from wire import sse_events

NAMESPACE = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "spawn", "description": "Start a sub-agent.", "strict": False,
     "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}},
    {"type": "function", "name": "close", "parameters": {"type": "object", "properties": {}}},
]}
CUSTOM = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
          "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
HOSTED = [{"type": "web_search", "external_web_access": False}, {"type": "file_search", "vector_store_ids": ["v"]},
          {"type": "image_generation"}]


def call(name: str, args: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


async def test_hosted_tools_are_dropped_and_named_not_refused(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["ok", "ok"])
    function = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        for stream in (False, True):
            r = await c.post("/v1/responses", headers=key_headers(key),
                             json={"input": "hi", "tools": [function, *HOSTED], "stream": stream})
            assert r.status_code == 200, r.text
            assert r.headers["x-rlgate-ignored-params"] == "tools:file_search,tools:image_generation,tools:web_search"
    # the model saw the function only
    prompt = tokenizer.decode(engine.requests[0].input_ids)
    assert '"name": "f"' in prompt and "web_search" not in prompt and "file_search" not in prompt


async def test_namespace_tools_are_served_and_calls_name_their_namespace(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[call("spawn", {"task": "look"}), "Done."])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        conversation: list = [{"role": "user", "content": "delegate"}]
        first = await create(c, key, input=conversation, tools=[NAMESPACE])
        Response.model_validate(first)
        (item,) = first["output"]
        assert (item["type"], item["name"], item["namespace"]) == ("function_call", "spawn", "agents")
        assert json.loads(item["arguments"]) == {"task": "look"}
        assert first["tools"][0]["type"] == "namespace"
        # the client sends the call back (with its namespace) plus its output: one chain
        conversation += [item, {"type": "function_call_output", "call_id": item["call_id"], "output": "started"}]
        await create(c, key, input=conversation, tools=[NAMESPACE])
        exp = await export(c, sid, key)
    prompt = tokenizer.decode(engine.requests[0].input_ids)
    assert '"name": "spawn"' in prompt and '"name": "close"' in prompt and "Start a sub-agent." in prompt
    parent, child = exp["interactions"]
    assert child["relation"] == "extend" and child["parent_id"] == parent["id"]
    assert child["input_ids"][: len(parent["input_ids"])] == parent["input_ids"]  # prompt + output of the parent


async def test_same_name_in_two_namespaces_is_qualified(make_app, asgi_client, tokenizer):
    other = {**NAMESPACE, "name": "jobs"}
    engine = FakeEngine(tokenizer, script=[call("jobs.spawn", {"task": "x"})])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        out = await create(c, key, input="go", tools=[NAMESPACE, other])
    assert (out["output"][0]["name"], out["output"][0]["namespace"]) == ("spawn", "jobs")
    prompt = tokenizer.decode(engine.requests[0].input_ids)
    assert '"name": "agents.spawn"' in prompt and '"name": "jobs.spawn"' in prompt


@pytest.mark.parametrize("stream", [False, True])
async def test_custom_tool_call_round_trip(make_app, asgi_client, tokenizer, stream):
    patch = "*** Begin Patch\n*** End Patch"
    engine = FakeEngine(tokenizer, script=[call("apply_patch", {"input": patch}), "Patched."])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        conversation: list = [{"role": "user", "content": "fix it"}]
        if stream:
            r = await c.post("/v1/responses", headers=key_headers(key),
                             json={"input": conversation, "tools": [CUSTOM], "stream": True})
            events = sse_events(r.text)
            first = check_stream(events)
            names = [n for n, _ in events]
            assert "response.custom_tool_call_input.delta" in names and "response.custom_tool_call_input.done" in names
        else:
            first = await create(c, key, input=conversation, tools=[CUSTOM])
        Response.model_validate(first)
        (item,) = first["output"]
        assert (item["type"], item["name"], item["input"]) == ("custom_tool_call", "apply_patch", patch)
        conversation += [item, {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "applied"}]
        second = await create(c, key, input=conversation, tools=[CUSTOM])
        assert Response.model_validate(second).output_text == "Patched."
        exp = await export(c, sid, key)
    prompt = tokenizer.decode(engine.requests[0].input_ids)
    assert "start: /.+/" in prompt  # the grammar is shown to the model
    parent, child = exp["interactions"]
    assert child["relation"] == "extend" and child["parent_id"] == parent["id"]
    assert child["messages"][-1]["role"] == "tool" and child["messages"][-1]["content"] == "applied"


async def test_local_shell_call_round_trip(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[call("local_shell", {"command": ["ls", "-la"], "timeout_ms": 1000}), "ok"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        conversation: list = [{"role": "user", "content": "list"}]
        first = await create(c, key, input=conversation, tools=[{"type": "local_shell"}])
        Response.model_validate(first)
        (item,) = first["output"]
        assert item["type"] == "local_shell_call"
        assert item["action"] == {"type": "exec", "command": ["ls", "-la"], "timeout_ms": 1000, "env": {}}
        conversation += [item, {"type": "local_shell_call_output", "id": item["call_id"], "output": "a b"}]
        await create(c, key, input=conversation, tools=[{"type": "local_shell"}])
        exp = await export(c, sid, key)
    parent, child = exp["interactions"]
    assert child["relation"] == "extend" and child["parent_id"] == parent["id"]


async def test_unknown_tool_output_reference_is_a_clear_400(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/responses", headers=key_headers(key), json={"input": [
            {"role": "user", "content": "x"}, {"type": "custom_tool_call_output", "call_id": "nope", "output": "y"}]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input[1].call_id" and "custom_tool_call" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_context_length_error_as_openai_clients_read_it(make_app, asgi_client, tokenizer, stream):
    """Non-streamed: a 400 with code context_length_exceeded. Streamed: response.failed with that
    code, which Codex reads as "context window exceeded" (a 400 before the stream is fatal to it)."""
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/responses", headers=key_headers(key), json={"input": "word " * 3000, "stream": stream})
        exp = await export(c, sid, key)
    if stream:
        assert r.status_code == 200
        events = sse_events(r.text)
        assert [n for n, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]
        failed = events[-1][1]["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"
        message = failed["error"]["message"]
        # The SDK's published enum of error codes lacks this one (Codex's parser requires it; the
        # SDK does not validate at runtime): everything else is the SDK's shape.
        failed["error"]["code"] = "server_error"
        for _, data in events:
            STREAM_EVENT.validate_python(data)
    else:
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        message = r.json()["error"]["message"]
    assert f"maximum context length is {engine.max_context_length} tokens" in message
    assert engine.requests == [] and exp["interactions"] == []
