"""Anthropic Messages through the app in-process (fake engine): conversion, responses,
stop reasons, errors, count_tokens and the SSE event stream."""

from __future__ import annotations

import json
import re

import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.api.anthropic.serving import SIGNATURE
from rlgate.engine.base import EngineError, TokenDelta
from rlgate.engine.fake import FakeEngine, fake_logprob
from wire import sse_events

USER = [{"role": "user", "content": "hi"}]
ADD_TOOL = {"name": "add", "description": "Add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
OPENAI_ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers", "parameters": ADD_TOOL["input_schema"]}}
GOOD_CALL = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
BAD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def hdr(key: str) -> dict[str, str]:
    return {"x-api-key": key, "anthropic-version": "2023-06-01"}


def body(messages=None, **kw):
    return {"model": "claude-test", "max_tokens": 64, "messages": USER if messages is None else messages, **kw}


async def _export(c, sid):
    r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


async def _end_and_export(c, sid, key):
    await c.post("/rl/end_session", headers=key_headers(key))
    return await _export(c, sid)


def assemble(events: list[tuple[str, dict]]) -> dict:
    """Rebuild the final message from stream events (as an SDK does), checking invariants."""
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[1] == "ping"
    assert names[-2:] == ["message_delta", "message_stop"]
    msg = json.loads(json.dumps(events[0][1]["message"]))
    assert msg["content"] == [] and msg["stop_reason"] is None
    json_bufs: dict[int, str] = {}
    open_index = None
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None, "a block started before the previous one stopped"
            assert data["index"] == len(msg["content"]), "block indices must increase by one"
            msg["content"].append(data["content_block"])
            open_index = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, d = msg["content"][open_index], data["delta"]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "thinking",
                    "input_json_delta": "tool_use"}[d["type"]]
            assert block["type"] == kind
            if d["type"] == "text_delta":
                assert d["text"]
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                block["signature"] = d["signature"]
            else:
                json_bufs[open_index] = json_bufs.get(open_index, "") + d["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            if open_index in json_bufs:
                msg["content"][open_index]["input"] = json.loads(json_bufs[open_index])
            open_index = None
    assert open_index is None
    delta = events[-2][1]
    msg["stop_reason"] = delta["delta"]["stop_reason"]
    msg["stop_sequence"] = delta["delta"]["stop_sequence"]
    msg["usage"]["output_tokens"] = delta["usage"]["output_tokens"]
    return msg


async def test_message_shape_and_export(make_app, asgi_client, tokenizer, stop_ids):
    engine = FakeEngine(tokenizer, script=["Hello there!"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c, "t")
        r = await c.post("/v1/messages", json=body(), headers=hdr(key))
        assert r.status_code == 200, r.text
        msg = r.json()
        prompt = tokenizer.apply_chat_template(USER, tokenize=True, add_generation_prompt=True)["input_ids"]
        out = tokenizer.encode("Hello there!", add_special_tokens=False) + [stop_ids[0]]
        assert msg["id"].startswith("msg_")
        assert msg == {
            "id": msg["id"], "type": "message", "role": "assistant", "model": "claude-test",
            "content": [{"type": "text", "text": "Hello there!"}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": len(prompt), "output_tokens": len(out),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
        assert engine.requests[0].input_ids == prompt
        # the message id is the interaction id: rewards can target it
        r = await c.post("/rl/set_reward", json={"reward": 1.0, "interaction_id": msg["id"]}, headers=hdr(key))
        assert r.status_code == 200
        # Bearer works too; the model defaults to the gateway's name
        r = await c.post("/v1/messages", json={"max_tokens": 4, "messages": USER}, headers=key_headers(key))
        assert r.status_code == 200 and r.json()["model"] == "rlgate"
        exp = await _end_and_export(c, sid, key)
    first = exp["interactions"][0]
    assert first["id"] == msg["id"] and first["reward"] == 1.0 and first["relation"] == "root"
    assert first["input_ids"] == prompt + out
    assert first["logprobs"][len(prompt):] == [fake_logprob(t, i) for i, t in enumerate(out)]
    assert first["output_message"] == {"role": "assistant", "content": "Hello there!"}


async def test_every_block_type_converts_like_the_equivalent_openai_messages(make_app, asgi_client, tokenizer):
    """Exact prompt ids == the tiny template's rendering of the equivalent OpenAI-style messages."""
    anthropic_messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "Look at these: ", "cache_control": {"type": "ephemeral"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.png"}},
            {"type": "text", "text": " and add 1 and 2."},
        ]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call add twice.", "signature": "sig=="},
            {"type": "redacted_thinking", "data": "opaque-encrypted-bytes"},
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
            {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {"a": 3, "b": 4}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
            {"type": "text", "text": "Second one failed?"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": [
                {"type": "text", "text": "overflow"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            ]},
        ]},
        {"role": "assistant", "content": "It is 3."},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]},
    ]
    system = [{"type": "text", "text": "You are exact. ", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "Use tools."}]
    openai_messages = [
        {"role": "system", "content": "You are exact. Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Look at these: "}, {"type": "image"},
                                     {"type": "image"}, {"type": "text", "text": " and add 1 and 2."}]},
        {"role": "assistant", "content": "Adding.", "reasoning_content": "I should call add twice.",
         "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
                        {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "3"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": [{"type": "text", "text": "overflow"},
                                                                 {"type": "image"}]},
        {"role": "user", "content": "Second one failed?"},
        {"role": "assistant", "content": "It is 3."},
        {"role": "user", "content": "Thanks"},
    ]
    expected = tokenizer.apply_chat_template(openai_messages, tools=[OPENAI_ADD_TOOL], tokenize=True,
                                             add_generation_prompt=True)["input_ids"]
    engine = FakeEngine(tokenizer, script=["ok"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/messages", headers=hdr(key),
                         json=body(anthropic_messages, system=system, tools=[ADD_TOOL]))
        assert r.status_code == 200, r.text
        assert engine.requests[0].input_ids == expected
        exp = await _end_and_export(c, sid, key)
    recorded = exp["interactions"][0]["messages"]
    assert [m["role"] for m in recorded] == ["system", "user", "assistant", "tool", "tool", "user", "assistant",
                                             "user"]
    assert recorded[1]["content"][1]["image_url"]["url"] == f"data:image/png;base64,{PNG}"
    assert recorded[1]["content"][2]["image_url"]["url"] == "https://example.invalid/cat.png"
    assert recorded[2]["reasoning_content"] == "I should call add twice."
    assert [json.loads(tc["function"]["arguments"]) for tc in recorded[2]["tool_calls"]] == [
        {"a": 1, "b": 2}, {"a": 3, "b": 4}]
    assert recorded[3] == {"role": "tool", "content": "3", "tool_call_id": "toolu_1", "name": "add"}
    assert recorded[4]["is_error"] is True and recorded[4]["tool_call_id"] == "toolu_2"
    assert "is_error" not in recorded[3]


STOP_CASES = [
    ("stop token", ["Hi there"], {}, "end_turn", None, [{"type": "text", "text": "Hi there"}]),
    ("max_tokens", ["one two three four five six"], {"max_tokens": 2}, "max_tokens", None, None),
    ("stop sequence", ["one two three four"], {"stop_sequences": ["zzz", "three"]}, "stop_sequence", "three",
     [{"type": "text", "text": "one two"}]),
    ("tool use", [GOOD_CALL], {"tools": [ADD_TOOL]}, "tool_use", None, None),
    ("parse failure keeps the text", [BAD_CALL], {"tools": [ADD_TOOL]}, "end_turn", None,
     [{"type": "text", "text": BAD_CALL}]),
    ("tool_choice none disables parsing", [GOOD_CALL], {"tools": [ADD_TOOL], "tool_choice": {"type": "none"}},
     "end_turn", None, [{"type": "text", "text": GOOD_CALL}]),
    ("tool_choice any is accepted", [GOOD_CALL], {"tools": [ADD_TOOL], "tool_choice": {"type": "any"}},
     "tool_use", None, None),
    ("no tools: markup is text", [GOOD_CALL], {}, "end_turn", None, [{"type": "text", "text": GOOD_CALL}]),
    ("empty reply", [""], {}, "end_turn", None, []),
]


@pytest.mark.parametrize("name,script,extra,reason,sequence,content", STOP_CASES, ids=[c[0] for c in STOP_CASES])
async def test_stop_reasons(make_app, asgi_client, tokenizer, name, script, extra, reason, sequence, content):
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/messages", json=body(**extra), headers=hdr(key))
        assert r.status_code == 200, r.text
        msg = r.json()
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)
    if content is not None:
        assert msg["content"] == content
    if name == "max_tokens":
        assert msg["usage"]["output_tokens"] == 2 and engine.requests[0].sampling.max_new_tokens == 2
    if reason == "tool_use":
        text, call = msg["content"]
        assert text == {"type": "text", "text": "Let me add."}
        assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and len(call["id"]) > 10
        assert call["name"] == "add" and call["input"] == {"a": 1, "b": 2}


async def test_thinking_block_with_reasoning_parser(make_app, asgi_client, tokenizer):
    script = ["<think>\nAdd them.\n</think>\n\n" + GOOD_CALL, "<think>\nsimple\n</think>\n\nDone."]
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine, reasoning_parser="think")) as c:
        _, key = await start_session(c)
        msg = (await c.post("/v1/messages", json=body(tools=[ADD_TOOL]), headers=hdr(key))).json()
        assert [b["type"] for b in msg["content"]] == ["thinking", "text", "tool_use"]
        assert msg["content"][0] == {"type": "thinking", "thinking": "Add them.", "signature": SIGNATURE}
        assert msg["stop_reason"] == "tool_use"
        r = await c.post("/v1/messages", json=body(stream=True), headers=hdr(key))
    events = sse_events(r.text)
    streamed = assemble(events)
    assert streamed["content"] == [{"type": "thinking", "thinking": "simple", "signature": SIGNATURE},
                                   {"type": "text", "text": "Done."}]
    # a signature_delta closes the thinking block
    names = [(n, d.get("delta", {}).get("type")) for n, d in events]
    i = names.index(("content_block_delta", "signature_delta"))
    assert names[i + 1][0] == "content_block_stop"
    start = next(d for n, d in sse_events(r.text) if n == "content_block_start")  # not rebuilt by assemble()
    assert start["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}  # as the API: the
    # signature comes in its delta
    # what a client receives is signed, in the plain answer and in the stream's delta, with the same non-empty
    # signature: clients treat "" as unsigned and re-send the reasoning as user text
    delta_signature = events[i][1]["delta"]["signature"]
    assert delta_signature and delta_signature == msg["content"][0]["signature"]


BAD_REQUESTS = [
    ("non-json body", dict(content=b"{not json", headers={"content-type": "application/json"}), 400, "JSON"),
    ("wrong content type", dict(content=b"x=1", headers={"content-type": "application/x-www-form-urlencoded"}),
     415, "content type"),
    ("json array body", dict(json=[1]), 400, "object"),
    ("missing max_tokens", dict(json={"model": "m", "messages": USER}), 400, "max_tokens"),
    ("zero max_tokens", dict(json=body(max_tokens=0)), 400, "max_tokens"),
    ("empty messages", dict(json=body([])), 400, "at least one message"),
    ("missing messages", dict(json={"max_tokens": 5}), 400, "messages"),
    ("wrong role", dict(json=body([{"role": "tool", "content": "x"}])), 400, "role"),
    ("system message first", dict(json=body([{"role": "system", "content": "x"}])), 400, "cannot be the first"),
    ("system message after assistant", dict(json=body([
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "system", "content": "c"}])),
     400, "right after a user message"),
    ("system message before user", dict(json=body([
        {"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "user", "content": "c"}])),
     400, "followed by an assistant message"),
    ("two system messages", dict(json=body([
        {"role": "user", "content": "a"}, {"role": "system", "content": "b"}, {"role": "system", "content": "c"}])),
     400, "followed by an assistant message"),
    ("system message with an image", dict(json=body([{"role": "user", "content": "a"}, {"role": "system", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}])), 400, "only contain text"),
    ("content wrong type", dict(json=body([{"role": "user", "content": 5}])), 400, "string or a list"),
    ("unknown block type", dict(json=body([{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])),
     400, "'document'"),
    ("unknown block type in tool_result", dict(json=body([
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "search_result", "source": "s", "title": "t", "content": []}]}]}], tools=[ADD_TOOL])),
     400, "'search_result'"),
    ("tool_result with unknown id", dict(json=body([
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "3"}]}])),
     400, "'t9'"),
    ("tool_result before its tool_use", dict(json=body([
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]}])),
     400, "'t1'"),
    ("tool_use in a user message", dict(json=body([{"role": "user", "content": [
        {"type": "tool_use", "id": "t1", "name": "add", "input": {}}]}])), 400, "'tool_use'"),
    ("tool_result in an assistant message", dict(json=body([{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}])), 400, "'tool_result'"),
    ("image in an assistant message", dict(json=body([{"role": "assistant", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://x.invalid/a.png"}}]}])), 400, "'image'"),
    ("tool_use input not an object", dict(json=body([{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "add", "input": "a=1"}]}])), 400, "input"),
    ("image file source", dict(json=body([{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}])), 400, "source"),
    ("malformed input_schema", dict(json=body(tools=[
        {"name": "f", "input_schema": {"type": "object", "properties": 5}}])), 400, "invalid JSON schema"),
    ("non-object input_schema", dict(json=body(tools=[{"name": "f", "input_schema": {"type": "string"}}])),
     400, "type 'object'"),
    ("missing input_schema", dict(json=body(tools=[{"name": "f"}])), 400, "input_schema"),
    ("server tool", dict(json=body(tools=[{"type": "bash_20250124", "name": "bash"}])), 400, "server tools"),
    ("duplicate tool names", dict(json=body(tools=[ADD_TOOL, ADD_TOOL])), 400, "unique"),
    ("tool_choice names an unknown tool", dict(json=body(tools=[ADD_TOOL], tool_choice={"type": "tool",
                                                                                        "name": "mul"})),
     400, "'mul'"),
    ("bad tool_choice type", dict(json=body(tool_choice={"type": "sometimes"})), 400, "tool_choice"),
    ("temperature above 1", dict(json=body(temperature=1.5)), 400, "temperature"),
    ("top_p zero", dict(json=body(top_p=0)), 400, "top_p"),
    ("system block not text", dict(json=body(system=[{"type": "image", "source": {
        "type": "url", "url": "https://x.invalid/a.png"}}])), 400, "'image'"),
    ("prompt longer than context", dict(json=body([{"role": "user", "content": "word " * 3000}])), 400,
     "prompt is too long: "),
]


@pytest.mark.parametrize("name,kwargs,status,needle", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
async def test_bad_input_is_4xx_anthropic_shaped_and_records_nothing(make_app, asgi_client, tokenizer, name,
                                                                      kwargs, status, needle):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        headers = {**hdr(key), **kwargs.pop("headers", {})}
        r = await c.post("/v1/messages", headers=headers, **kwargs)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/json")
        err = r.json()
        assert set(err) == {"type", "error"} and err["type"] == "error"
        assert set(err["error"]) == {"type", "message"}
        assert err["error"]["type"] == "invalid_request_error"
        assert needle in err["error"]["message"], err["error"]["message"]
        assert engine.requests == []
        # a streaming request with the same fault fails the same way, before any event
        if isinstance(kwargs.get("json"), dict):
            r = await c.post("/v1/messages", headers=headers, json={**kwargs["json"], "stream": True})
            assert r.status_code == status and r.json()["type"] == "error"
        exp = await _end_and_export(c, sid, key)
    assert exp["interactions"] == [] and exp["stats"]["failed"] == 0


async def test_count_tokens_matches_the_messages_call_and_records_nothing(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[GOOD_CALL, "Three."])
    first = body([{"role": "user", "content": "add 1 and 2"}], system="Be brief.", tools=[ADD_TOOL])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        counting = {k: v for k, v in first.items() if k != "max_tokens"}  # not required here
        r = await c.post("/v1/messages/count_tokens", json=counting, headers=hdr(key))
        assert r.status_code == 200, r.text
        assert set(r.json()) == {"input_tokens"} and r.json()["input_tokens"] > 0
        assert engine.requests == []  # counting generates nothing
        n = r.json()["input_tokens"]
        msg = (await c.post("/v1/messages", json=first, headers=hdr(key))).json()
        assert len(engine.requests[0].input_ids) == n == msg["usage"]["input_tokens"]
        # second turn (extends the first in token-exact mode): the same body counts the same
        call = msg["content"][1]
        second = {**first, "messages": first["messages"] + [
            {"role": "assistant", "content": msg["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "3"}]}]}
        r = await c.post("/v1/messages/count_tokens", json=second, headers=hdr(key))  # full body, max_tokens too
        assert r.status_code == 200 and "x-rlgate-ignored-params" not in r.headers
        n2 = r.json()["input_tokens"]
        msg2 = (await c.post("/v1/messages", json=second, headers=hdr(key))).json()
        assert len(engine.requests[1].input_ids) == n2 == msg2["usage"]["input_tokens"]
        # errors are Anthropic-shaped here too
        r = await c.post("/v1/messages/count_tokens", json={"messages": []}, headers=hdr(key))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        exp = await _end_and_export(c, sid, key)
    assert [i["relation"] for i in exp["interactions"]] == ["root", "extend"]


async def test_claude_code_shaped_request(make_app, asgi_client, tokenizer):
    """System as blocks with cache_control, tools with input_schema, metadata.user_id, thinking
    config, a history with tool_use / tool_result / thinking blocks: accepted and rendered."""
    tools = [
        {"name": "Bash", "description": "Run a shell command", "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}}, "required": ["command"]}},
        {"name": "Read", "description": "Read a file", "cache_control": {"type": "ephemeral"}, "input_schema": {
            "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
    ]
    request = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
             "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "\nYou are an interactive CLI tool.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                {"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Use ls.", "signature": "EqQBCgIYAhIM"},
                {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "file.txt",
                 "cache_control": {"type": "ephemeral"}}]},
        ],
        "tools": tools,
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "user_abc_account__session_123"},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "temperature": 1,
    }
    engine = FakeEngine(tokenizer, script=["There is one file: file.txt"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/messages/count_tokens", headers=hdr(key), json=request)
        assert r.status_code == 200, r.text
        n = r.json()["input_tokens"]
        r = await c.post("/v1/messages", headers={**hdr(key), "anthropic-beta": "claude-code-20250219"},
                         json=request)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        assert set(r.headers["x-rlgate-ignored-params"].split(",")) == {"metadata", "thinking"}
        msg = assemble(sse_events(r.text))
        assert msg["content"] == [{"type": "text", "text": "There is one file: file.txt"}]
        exp = await _end_and_export(c, sid, key)
    item = exp["interactions"][0]
    prompt_ids = item["input_ids"][: item["loss_mask"].index(1)]
    assert len(prompt_ids) == n
    prompt = tokenizer.decode(prompt_ids)
    assert '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>' in prompt
    assert "<tool_response>\nfile.txt\n</tool_response>" in prompt
    assert "<think>\nUse ls.\n</think>" in prompt
    assert "You are Claude Code, Anthropic's official CLI for Claude.\nYou are an interactive CLI tool." in prompt
    assert '"name": "Read"' in prompt


async def test_streaming_events_and_parity_with_the_json_response(make_app, asgi_client, tokenizer):
    script = [GOOD_CALL] * 2 + ["Plain answer, no tools."] * 2
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        for _ in range(2):
            plain = (await c.post("/v1/messages", json=body(tools=[ADD_TOOL]), headers=hdr(key))).json()
            r = await c.post("/v1/messages", json=body(tools=[ADD_TOOL], stream=True), headers=hdr(key))
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.text)
            streamed = assemble(events)
            # same content, stop reason and usage as the non-streamed call (ids differ per call)
            for key_ in ("content", "stop_reason", "stop_sequence", "usage", "model", "role", "type"):
                if key_ == "content":
                    strip = [{k: v for k, v in b.items() if k != "id"} for b in streamed["content"]]
                    assert strip == [{k: v for k, v in b.items() if k != "id"} for b in plain["content"]]
                else:
                    assert streamed[key_] == plain[key_], key_
            assert streamed["id"].startswith("msg_") and streamed["id"] != plain["id"]
            # message_start carries the prompt size; message_delta the whole usage (cumulative, as the
            # API sends it: clients that read usage from message_delta alone see the input tokens too)
            assert events[0][1]["message"]["usage"]["input_tokens"] == plain["usage"]["input_tokens"]
            delta = next(d for n, d in events if n == "message_delta")
            assert delta["usage"] == plain["usage"]
            texts = [d["delta"]["text"] for n, d in events if n == "content_block_delta"
                     and d["delta"]["type"] == "text_delta"]
            assert all("<tool_call" not in t and "tool_call>" not in t for t in texts)
    first_stream = [b["type"] for b in plain["content"]]
    assert first_stream == ["text"] and plain["stop_reason"] == "end_turn"


async def test_streamed_tool_use_events(make_app, asgi_client, tokenizer):
    two_calls = GOOD_CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}\n</tool_call>'
    engine = FakeEngine(tokenizer, script=[two_calls])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/messages", json=body(tools=[ADD_TOOL], stream=True), headers=hdr(key))
    events = sse_events(r.text)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[0]["content_block"] == {"type": "text", "text": ""}
    for s in starts[1:]:
        blk = s["content_block"]
        assert blk["type"] == "tool_use" and blk["input"] == {} and blk["id"].startswith("toolu_")
        assert blk["name"] == "add"
    partial = [d["delta"]["partial_json"] for n, d in events
               if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert [json.loads(p) for p in partial] == [{"a": 1, "b": 2}, {"a": 5, "b": 6}]
    msg = assemble(events)
    assert msg["stop_reason"] == "tool_use"
    assert [b["input"] for b in msg["content"][1:]] == [{"a": 1, "b": 2}, {"a": 5, "b": 6}]
    assert msg["content"][1]["id"] != msg["content"][2]["id"]


class _FailsMidStream(FakeEngine):
    """Streams a few tokens, then the backend fails."""

    async def stream(self, request):
        self.requests.append(request)
        ids = self.tokenizer.encode("partial answer that", add_special_tokens=False)
        for pos, tok in enumerate(ids):
            yield TokenDelta([tok], [fake_logprob(tok, pos)], [0], None)
        raise EngineError("backend exploded", status=502)


async def test_error_during_the_stream_is_an_error_event(make_app, asgi_client, tokenizer):
    engine = _FailsMidStream(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/messages", json=body(stream=True), headers=hdr(key))
        assert r.status_code == 200  # the stream had started
        events = sse_events(r.text)
        # the non-streamed form of the same failure is an HTTP error in Anthropic's shape
        r2 = await c.post("/v1/messages", json=body(), headers=hdr(key))
        assert r2.status_code == 502 and r2.json()["error"]["type"] == "api_error"
        exp = await _end_and_export(c, sid, key)
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert "content_block_delta" in names
    assert names[-1] == "error" and names.count("error") == 1
    assert "message_stop" not in names and "message_delta" not in names
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error", "message": "backend exploded"}}
    assert exp["interactions"] == [] and exp["stats"]["failed"] == 2


async def test_sampling_parameters_and_extensions_reach_the_engine(make_app, asgi_client, tokenizer, caplog):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        with caplog.at_level("WARNING"):
            r = await c.post("/v1/messages", headers=hdr(key), json=body(
                temperature=0.7, top_p=0.9, top_k=5, seed=11, max_tokens=4, service_tier="auto",
                metadata={"user_id": "u1"}, my_custom=1, chat_template_kwargs={"enable_thinking": False}))
        assert r.status_code == 200, r.text
        s = engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (0.7, 0.9, 5, 11, 4)
        assert r.headers["x-rlgate-ignored-params"] == "metadata,my_custom,service_tier"
        assert "my_custom" in caplog.text
        # defaults: temperature 1, top_p 1, no top-k
        await c.post("/v1/messages", headers=hdr(key), json=body())
        s = engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (1.0, 1.0, 0, None, 64)
        # store=false is no rlgate parameter on this API: reported, and the call is recorded anyway
        r = await c.post("/v1/messages", headers=hdr(key), json=body(store=False))
        assert r.status_code == 200 and r.headers["x-rlgate-ignored-params"] == "store"
        exp = await _end_and_export(c, sid, key)
    assert len(exp["interactions"]) == 3


async def test_strict_tools_are_reported_not_dropped(make_app, asgi_client):
    """tools[].strict (structured tool inputs) is not enforced: reported, never dropped silently (issue 26)."""
    tool = {"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        for extra, reported in (({"strict": True}, "tools.strict"), ({"strict": False}, None),
                                ({"input_examples": [{"a": 1}]}, "tools.input_examples")):
            r = await c.post("/v1/messages", headers=hdr(key), json=body(tools=[{**tool, **extra}]))
            assert r.status_code == 200, r.text
            assert r.headers.get("x-rlgate-ignored-params") == reported


async def test_assistant_prefill_and_consecutive_user_messages(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["B)"])
    messages = [{"role": "user", "content": "Pick one."}, {"role": "user", "content": "(A) or (B)?"},
                {"role": "assistant", "content": "The answer is ("}]
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/messages", headers=hdr(key), json=body(messages))
        assert r.status_code == 200 and r.json()["content"] == [{"type": "text", "text": "B)"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=True, continue_final_message=True)["input_ids"]
    assert engine.requests[0].input_ids == expected


async def test_text_after_a_tool_call_is_a_further_block_in_both_forms(make_app, asgi_client, tokenizer):
    reply = GOOD_CALL + "\nWaiting for the result."
    engine = FakeEngine(tokenizer, script=[reply, reply])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        plain = (await c.post("/v1/messages", json=body(tools=[ADD_TOOL]), headers=hdr(key))).json()
        r = await c.post("/v1/messages", json=body(tools=[ADD_TOOL], stream=True), headers=hdr(key))
    streamed = assemble(sse_events(r.text))
    assert [b["type"] for b in plain["content"]] == ["text", "tool_use", "text"]
    # blanks between the blocks are kept (in the later block), so that the blocks' texts
    # joined give back exactly the recorded reply text (what prefix matching compares)
    assert plain["content"][2] == {"type": "text", "text": "\n\nWaiting for the result."}
    assert [{k: v for k, v in b.items() if k != "id"} for b in streamed["content"]] == [
        {k: v for k, v in b.items() if k != "id"} for b in plain["content"]]
    assert plain["stop_reason"] == streamed["stop_reason"] == "tool_use"


# The pattern Claude Code 2.1.x matches to read an over-long prompt's size (then it compacts).
CLAUDE_CODE_PROMPT_TOO_LONG = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.IGNORECASE)


@pytest.mark.parametrize("stream", [False, True])
async def test_prompt_too_long_is_worded_as_anthropic_words_it(make_app, asgi_client, tokenizer, stream):
    engine = FakeEngine(tokenizer)
    messages = [{"role": "user", "content": "word " * 3000}]
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        counted = (await c.post("/v1/messages/count_tokens", headers=hdr(key),
                                json={"messages": messages})).json()["input_tokens"]
        r = await c.post("/v1/messages", headers=hdr(key), json=body(messages, stream=stream))
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    m = CLAUDE_CODE_PROMPT_TOO_LONG.search(r.json()["error"]["message"])
    assert m is not None, r.json()
    assert (int(m.group(1)), int(m.group(2))) == (counted, engine.max_context_length)
    assert engine.requests == []
