"""OpenAI Responses API through the app in-process (fake engine): conversion, output, streaming, errors."""

from __future__ import annotations

import json
import re

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.fake import FakeEngine
from wire import sse_events

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
TOOLS = [{"type": "function", "name": "add", "description": "Add two numbers", "strict": False,
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k not in ("type", "strict")}}
              for t in TOOLS]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
TEXT_AND_CALL = "Let me add.\n" + CALL
BAD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'
PNG = "data:image/png;base64,iVBORw0KGgo="


def rendered(tokenizer, messages, tools=None):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)["input_ids"]


async def create(c, key, **body):
    r = await c.post("/v1/responses", json=body, headers=key_headers(key))
    assert r.status_code == 200, r.text
    return r.json()


async def export(c, sid, key):
    await c.post("/rl/end_session", headers=key_headers(key))
    r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


def normalized(resp: dict) -> dict:
    """A response with ids and timestamps replaced by placeholders (in order of appearance)."""
    text = json.dumps(resp, sort_keys=True)
    seen: dict[str, str] = {}
    text = re.sub(r'"(resp|rs|msg|fc|call)_[0-9a-f]+"', lambda m: seen.setdefault(m.group(0), f'"ID{len(seen)}"'),
                  text)
    out = json.loads(text)
    out["created_at"] = out["completed_at"] = 0
    return out


# --------------------------------------------------------------------------- response object


async def test_text_response_validates_with_the_sdk(make_app, asgi_client, tokenizer, stop_ids):
    engine = FakeEngine(tokenizer, script=["Hello there!"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        body = await create(c, key, model="tiny", input="hi", instructions="Be brief.", metadata={"k": "v"},
                            max_output_tokens=50)
        resp = Response.model_validate(body)
        assert resp.output_text == "Hello there!"
        assert resp.id.startswith("resp_") and resp.object == "response" and resp.status == "completed"
        assert resp.model == "tiny" and resp.instructions == "Be brief." and resp.metadata == {"k": "v"}
        assert resp.max_output_tokens == 50 and resp.error is None and resp.incomplete_details is None
        (msg,) = body["output"]
        assert msg["type"] == "message" and msg["id"].startswith("msg_") and msg["role"] == "assistant"
        assert msg["status"] == "completed"
        assert msg["content"][0] == {"type": "output_text", "text": "Hello there!", "annotations": [], "logprobs": []}
        prompt = rendered(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
        out = tokenizer.encode("Hello there!", add_special_tokens=False) + [stop_ids[0]]
        assert engine.requests[0].input_ids == prompt
        assert body["usage"] == {"input_tokens": len(prompt), "output_tokens": len(out),
                                 "total_tokens": len(prompt) + len(out),
                                 "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                                 "output_tokens_details": {"reasoning_tokens": 0}}
        r = await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
        assert r.json()["interaction_id"] == body["id"]
        (item,) = (await export(c, sid, key))["interactions"]
    assert item["id"] == body["id"] and item["input_ids"] == prompt + out and item["reward"] == 1.0
    assert item["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


async def test_both_routes(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        for path in ("/responses", "/v1/responses"):
            r = await c.post(path, json={"input": "hi", "max_output_tokens": 3}, headers=key_headers(key))
            assert r.status_code == 200 and r.json()["object"] == "response"


async def test_output_items_text_tool_calls_and_parse_failure(make_app, asgi_client, tokenizer):
    two_calls = CALL + "\n" + CALL.replace('"a": 1', '"a": 5')
    engine = FakeEngine(tokenizer, script=[TEXT_AND_CALL, two_calls, BAD_CALL, TEXT_AND_CALL])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        body = await create(c, key, input="add 1 and 2", tools=TOOLS)
        resp = Response.model_validate(body)
        assert [o["type"] for o in body["output"]] == ["message", "function_call"]
        assert resp.output_text == "Let me add." and body["status"] == "completed"
        call = body["output"][1]
        assert call["id"].startswith("fc_") and call["call_id"].startswith("call_") and call["status"] == "completed"
        assert call["name"] == "add" and json.loads(call["arguments"]) == {"a": 1, "b": 2}
        assert body["tools"] == [{**TOOLS[0]}] and body["tool_choice"] == "auto"
        # only calls: no message item; ids distinct
        body = await create(c, key, input="add", tools=TOOLS)
        assert [o["type"] for o in body["output"]] == ["function_call", "function_call"]
        assert len({o["call_id"] for o in body["output"]}) == 2 and len({o["id"] for o in body["output"]}) == 2
        assert [json.loads(o["arguments"])["a"] for o in body["output"]] == [1, 5]
        # unparsable call: the text is kept verbatim, no function_call item
        body = await create(c, key, input="add", tools=TOOLS)
        assert [o["type"] for o in body["output"]] == ["message"] and body["status"] == "completed"
        assert Response.model_validate(body).output_text == BAD_CALL
        # tool_choice none: no parsing at all
        body = await create(c, key, input="add", tools=TOOLS, tool_choice="none")
        assert [o["type"] for o in body["output"]] == ["message"]
        assert body["output"][0]["content"][0]["text"] == TEXT_AND_CALL and body["tool_choice"] == "none"


async def test_reasoning_item(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["<think>I should add.</think>Let me add.\n" + CALL])
    async with asgi_client(make_app(engine, reasoning_parser="think")) as c:
        _, key = await start_session(c)
        body = await create(c, key, input="add", tools=TOOLS)
    Response.model_validate(body)
    assert [o["type"] for o in body["output"]] == ["reasoning", "message", "function_call"]
    rs = body["output"][0]
    assert rs["id"].startswith("rs_") and rs["summary"] == []
    assert rs["content"] == [{"type": "reasoning_text", "text": "I should add."}]
    assert 0 < body["usage"]["output_tokens_details"]["reasoning_tokens"] < body["usage"]["output_tokens"]


async def test_incomplete_on_length(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["one two three four five six seven"])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        body = await create(c, key, input="count", max_output_tokens=3)
    resp = Response.model_validate(body)
    assert resp.status == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["usage"]["output_tokens"] == 3
    assert resp.output_text and "five" not in resp.output_text


async def test_sampling_parameters_and_extensions_reach_the_engine(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        body = await create(c, key, input="hi", temperature=0.7, top_p=0.9, top_k=5, seed=11, max_output_tokens=4)
        s = engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (0.7, 0.9, 5, 11, 4)
        assert (body["temperature"], body["top_p"]) == (0.7, 0.9)
        prompt_len = len(engine.requests[-1].input_ids)
        await create(c, key, input="hi", max_total_tokens=prompt_len + 2)
        assert engine.requests[-1].sampling.max_new_tokens == 2
        body = await create(c, key, input="hi")
        s = engine.requests[-1].sampling
        # no max tokens: up to the rest of the context, as the OpenAI API and vLLM do (no hidden 512)
        assert (s.temperature, s.top_p, s.top_k) == (1.0, 1.0, 0)
        assert s.max_new_tokens == engine.max_context_length - len(engine.requests[-1].input_ids)
        assert (body["temperature"], body["top_p"], body["parallel_tool_calls"], body["truncation"]) == (
            1.0, 1.0, True, "disabled")


async def test_ignored_params_are_reported(make_app, asgi_client, caplog):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        with caplog.at_level("WARNING"):
            r = await c.post("/v1/responses", headers=key_headers(key), json={
                "input": "hi", "user": "u1", "truncation": "auto", "reasoning": {"effort": "low"},
                "include": ["message.output_text.logprobs"], "parallel_tool_calls": False, "my_custom": 1,
                "text": {"format": {"type": "text"}}, "store": True, "metadata": {"a": "b"}})
        assert r.status_code == 200, r.text
        assert r.headers["x-rlgate-ignored-params"].split(",") == [
            "include:message.output_text.logprobs", "my_custom", "parallel_tool_calls", "reasoning", "truncation",
            "user"]
        assert "my_custom" in caplog.text
        assert r.json()["reasoning"] == {"effort": "low", "summary": None} and r.json()["user"] == "u1"
        r = await c.post("/v1/responses", headers=key_headers(key), json={"input": "hi"})
        assert "x-rlgate-ignored-params" not in r.headers


async def test_forced_tool_choice_is_echoed_and_reported(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[CALL, CALL])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        for choice in ({"type": "function", "name": "add"}, "required"):
            r = await c.post("/v1/responses", headers=key_headers(key),
                             json={"input": "add", "tools": TOOLS, "tool_choice": choice})
            assert r.status_code == 200, r.text
            assert r.json()["tool_choice"] == choice and r.json()["output"][0]["type"] == "function_call"
            assert "tool_choice" in r.headers["x-rlgate-ignored-params"].split(",")


async def test_openapi_documents_the_request(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        doc = (await c.get("/openapi.json")).json()
    for path in ("/responses", "/v1/responses"):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert {"input", "instructions", "tools", "previous_response_id", "seed"} <= set(schema["properties"])
    assert "FunctionCallItem" in doc["components"]["schemas"]


# --------------------------------------------------------------------------- input conversion


async def test_every_item_kind_renders_like_the_equivalent_chat(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer)
    items = [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Look: "}, {"type": "input_image", "image_url": PNG, "detail": "auto"},
            {"type": "input_text", "text": " then add."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "ignored summary"}],
         "content": [{"type": "reasoning_text", "text": "Need the tool."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": [
            {"type": "output_text", "text": "Adding.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
        {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "add", "arguments": '{"a": 3, "b": 4}'},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "7"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Sum up."}]},
        {"type": "function_call", "call_id": "c3", "name": "add", "arguments": '{"a": 3, "b": 7}'},
        {"type": "function_call_output", "call_id": "c3", "output": "10"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No more."}]},
        {"role": "user", "content": "ok"},
    ]
    chat = [
        {"role": "system", "content": "Be helpful."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "Look: "},
                                     {"type": "image_url", "image_url": {"url": PNG}},
                                     {"type": "text", "text": " then add."}]},
        {"role": "assistant", "content": "Adding.", "reasoning_content": "Need the tool.", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
            {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]},
        {"role": "tool", "content": "3"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "", "reasoning_content": "Sum up.", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 7}}}]},
        {"role": "tool", "content": "10"},
        {"role": "assistant", "content": "No more."},
        {"role": "user", "content": "ok"},
    ]
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        await create(c, key, instructions="Be helpful.", input=items, tools=TOOLS)
        expected = rendered(tokenizer, chat, CHAT_TOOLS)
        assert engine.requests[0].input_ids == expected
        assert "<image>" in tokenizer.decode(expected)
        # a plain string input is one user message
        await create(c, key, input="just text")
        assert engine.requests[1].input_ids == rendered(tokenizer, [{"role": "user", "content": "just text"}])
        (first, _) = (await export(c, sid, key))["interactions"]
    msgs = first["messages"]
    assert [m["role"] for m in msgs] == [m["role"] for m in chat]
    assert [tc["id"] for tc in msgs[3]["tool_calls"]] == ["c1", "c2"]
    assert (msgs[4]["tool_call_id"], msgs[4]["name"]) == ("c1", "add")


BAD = [
    ("input number", {"input": 42}, "input"),
    ("input object", {"input": {"role": "user", "content": "hi"}}, "input"),
    ("missing input", {"model": "x"}, "input"),
    ("empty input list", {"input": []}, "input"),
    ("unknown item type", {"input": [{"type": "mcp_call", "id": "mcp_1"}]}, "input"),
    ("unknown item_reference", {"input": [{"type": "item_reference", "id": "rs_nope"}]}, "input[0].id"),
    ("item without type or role", {"input": [{"content": "hi"}]}, "input"),
    ("tool role message", {"input": [{"role": "tool", "content": "x"}]}, "input"),
    ("content number", {"input": [{"role": "user", "content": 5}]}, "input"),
    ("input_file part", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input"),
    ("image without url", {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].image_url"),
    ("orphan function_call_output", {"input": [{"role": "user", "content": "hi"},
                                               {"type": "function_call_output", "call_id": "nope", "output": "1"}]},
     "input[1].call_id"),
    ("function_call without call_id", {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input"),
    ("bad tool schema", {"input": "hi", "tools": [{"type": "function", "name": "f",
                                                   "parameters": {"type": "object", "properties": 5}}]},
     "tools[0].parameters"),
    ("bad tool_choice", {"input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
    ("tool_choice of unknown function", {"input": "hi", "tools": TOOLS,
                                         "tool_choice": {"type": "function", "name": "mul"}}, "tool_choice.name"),
    ("hosted tool_choice", {"input": "hi", "tools": TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice"),
    ("unknown previous_response_id", {"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ("background", {"input": "hi", "background": True}, "background"),
    ("conversation", {"input": "hi", "conversation": "conv_1"}, "conversation"),
    ("zero max_output_tokens", {"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ("negative temperature", {"input": "hi", "temperature": -1}, "temperature"),
    ("metadata not strings", {"input": "hi", "metadata": {"a": 1}}, "metadata.a"),
]
# A prompt longer than the context: a 400 when not streamed, an in-stream response.failed when
# streamed (what Codex reads): test_api_responses_tools.py::test_context_length_error_as_openai_clients_read_it


@pytest.mark.parametrize("name,body,param", BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_400_openai_shaped_and_records_nothing(make_app, asgi_client, tokenizer, name, body,
                                                                  param):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        for stream in (False, True):
            r = await c.post("/v1/responses", json={**body, "stream": stream}, headers=key_headers(key))
            assert r.status_code == 400, r.text
            assert r.headers["content-type"].startswith("application/json")
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert err["type"] == "invalid_request_error"
            assert (err["param"] or "").startswith(param), err
        assert engine.requests == []
        ok = await c.post("/v1/responses", json={"input": "hi"}, headers=key_headers(key))
        assert ok.status_code == 200
        exp = await export(c, sid, key)
    assert len(exp["interactions"]) == 1 and exp["stats"]["failed"] == 0


async def test_bad_input_messages_name_the_problem(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)

        async def message(body):
            r = await c.post("/v1/responses", json=body, headers=key_headers(key))
            assert r.status_code == 400
            return r.json()["error"]["message"]

        assert "mcp_call" in await message({"input": [{"type": "mcp_call", "id": "x"}]})
        assert "'rs_x' not found" in await message({"input": [{"type": "item_reference", "id": "rs_x"}]})
        assert "'nope'" in await message({"input": [{"type": "function_call_output", "call_id": "nope",
                                                    "output": "1"}]})
        assert "not found" in await message({"input": "hi", "previous_response_id": "resp_x"})


# --------------------------------------------------------------------------- multi-turn


def _generated(item):
    return [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=False) if m]


async def test_function_call_round_trip_extends(make_app, asgi_client, tokenizer):
    script = ["<think>I should add.</think>Let me add.\n" + CALL, "The sum is 3."]
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine, reasoning_parser="think")) as c:
        sid, key = await start_session(c)
        conversation: list = [{"role": "user", "content": "What is 1 + 2?"}]
        first = await create(c, key, instructions="Use tools.", input=conversation, tools=TOOLS)
        assert [o["type"] for o in first["output"]] == ["reasoning", "message", "function_call"]
        conversation += first["output"]  # what SDK users do: input += response.output
        conversation.append({"type": "function_call_output", "call_id": first["output"][2]["call_id"], "output": "3"})
        second = await create(c, key, instructions="Use tools.", input=conversation, tools=TOOLS)
        assert Response.model_validate(second).output_text == "The sum is 3."
        exp = await export(c, sid, key)
    parent, child = exp["interactions"]
    assert (parent["id"], child["id"]) == (first["id"], second["id"])
    assert child["relation"] == "extend" and child["parent_id"] == parent["id"]
    assert child["input_ids"][: len(parent["input_ids"])] == parent["input_ids"]
    assert exp["stats"]["extend"] == 1 and exp["stats"]["fork"] == 0
    assert child["messages"][-1] == {"role": "tool", "content": "3", "tool_call_id": first["output"][2]["call_id"],
                                     "name": "add"}


async def test_previous_response_id_round_trip_extends(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[TEXT_AND_CALL, "It is 3.", "Bye."])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r1 = await create(c, key, instructions="Use tools.", input="What is 1 + 2?", tools=TOOLS)
        call_id = r1["output"][1]["call_id"]
        r2 = await create(c, key, instructions="Use tools.", previous_response_id=r1["id"], tools=TOOLS,
                          input=[{"type": "function_call_output", "call_id": call_id, "output": "3"}])
        assert r2["previous_response_id"] == r1["id"]
        # instructions not re-sent: the previous ones are kept (documented)
        r3 = await create(c, key, previous_response_id=r2["id"], tools=TOOLS, input="Thanks!")
        # the same input without previous_response_id is the same conversation, token for token
        full = [{"role": "user", "content": "What is 1 + 2?"}, *r1["output"],
                {"type": "function_call_output", "call_id": call_id, "output": "3"}]
        await create(c, key, instructions="Use tools.", input=full, tools=TOOLS)
        assert engine.requests[3].input_ids == engine.requests[1].input_ids
        # a response of another session is unknown here
        _, other_key = await start_session(c, "other")
        r = await c.post("/v1/responses", json={"input": "x", "previous_response_id": r1["id"]},
                         headers=key_headers(other_key))
        assert r.status_code == 400 and r.json()["error"]["code"] == "previous_response_not_found"
        # a response sent with store=false cannot be continued
        unstored = await create(c, key, input="x", store=False)
        assert unstored["store"] is False
        r = await c.post("/v1/responses", json={"input": "y", "previous_response_id": unstored["id"]},
                         headers=key_headers(key))
        assert r.status_code == 400 and r.json()["error"]["param"] == "previous_response_id"
        exp = await export(c, sid, key)
    items = {i["id"]: i for i in exp["interactions"]}
    assert unstored["id"] in items  # recorded for training all the same; only not referenceable
    a, b, c3 = items[r1["id"]], items[r2["id"]], items[r3["id"]]
    assert (b["relation"], b["parent_id"]) == ("extend", a["id"])
    assert (c3["relation"], c3["parent_id"]) == ("extend", b["id"])
    assert b["input_ids"][: len(a["input_ids"])] == a["input_ids"]
    assert c3["input_ids"][: len(b["input_ids"])] == b["input_ids"]
    assert c3["messages"][0] == {"role": "system", "content": "Use tools."}


# --------------------------------------------------------------------------- streaming


async def _stream(c, key, **body) -> list[tuple[str, dict]]:
    r = await c.post("/v1/responses", json={**body, "stream": True}, headers=key_headers(key))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return sse_events(r.text)


def check_stream(events: list[tuple[str, dict]], markup_in_text: bool = False) -> dict:
    """Invariants of a well-formed stream; returns the terminal response."""
    for name, data in events:
        assert name == data["type"]
        STREAM_EVENT.validate_python(data)  # every event parses as the SDK's type
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    terminal = [n for n in names if n in ("response.completed", "response.incomplete", "response.failed")]
    assert len(terminal) == 1 and names[-1] == terminal[0]
    rid = events[0][1]["response"]["id"]
    assert all(d["response"]["id"] == rid for n, d in events if "response" in d)
    # every output item is added, then done, at increasing indices; text deltas add up to the done text
    added = [d for n, d in events if n == "response.output_item.added"]
    finished = [d for n, d in events if n == "response.output_item.done"]
    assert [d["output_index"] for d in added] == list(range(len(added)))
    assert [d["output_index"] for d in finished] == [d["output_index"] for d in added]
    assert [d["item"]["id"] for d in added] == [d["item"]["id"] for d in finished]
    for n, d in events:
        if n == "response.output_text.delta" and not markup_in_text:  # (an unparsable call stays text)
            assert "<tool_call>" not in d["delta"] and "</tool_call>" not in d["delta"]
        if n == "response.output_text.delta":
            assert "<think>" not in d["delta"] and "</think>" not in d["delta"]
    for kind, delta_event, done_event, field in [
        ("message", "response.output_text.delta", "response.output_text.done", "text"),
        ("reasoning", "response.reasoning_text.delta", "response.reasoning_text.done", "text"),
        ("function_call", "response.function_call_arguments.delta", "response.function_call_arguments.done",
         "arguments"),
    ]:
        for a in (d for d in added if d["item"]["type"] == kind):
            item_id = a["item"]["id"]
            deltas = "".join(d["delta"] for n, d in events if n == delta_event and d["item_id"] == item_id)
            (done,) = [d for n, d in events if n == done_event and d["item_id"] == item_id]
            assert deltas == done[field]
    final = events[-1][1]["response"]
    if names[-1] != "response.failed":
        assert final["output"] == [d["item"] for d in finished]
    return final


STREAM_CASES = [
    ("text", ["Hello there, friend."], {}),
    ("text and calls", [TEXT_AND_CALL + "\n" + CALL], {"tools": TOOLS}),
    ("only a call", [CALL], {"tools": TOOLS}),
    ("text after a call", [CALL + " done"], {"tools": TOOLS}),
    ("parse failure", [BAD_CALL], {"tools": TOOLS}),
    ("reasoning", ["<think>Let me think.</think>Answer: 3\n" + CALL], {"tools": TOOLS}),
    ("reasoning only, cut", ["<think>Let me think for a long long while"], {"max_output_tokens": 4}),
    ("length", ["one two three four five six"], {"max_output_tokens": 3}),
]


@pytest.mark.parametrize("name,script,body", STREAM_CASES, ids=[s[0] for s in STREAM_CASES])
async def test_stream_matches_non_streamed(make_app, asgi_client, tokenizer, name, script, body):
    engine = FakeEngine(tokenizer, script=script * 2)
    async with asgi_client(make_app(engine, reasoning_parser="think")) as c:
        sid, key = await start_session(c)
        plain = await create(c, key, input="go", **body)
        events = await _stream(c, key, input="go", **body)
        exp = await export(c, sid, key)
    final = check_stream(events, markup_in_text=name == "parse failure")
    Response.model_validate(final)
    assert normalized(final) == normalized(plain)
    assert events[-1][0] == ("response.completed" if plain["status"] == "completed" else "response.incomplete")
    a, b = exp["interactions"]
    assert a["input_ids"] == b["input_ids"] and a["logprobs"] == b["logprobs"]
    assert engine.requests[0].input_ids == engine.requests[1].input_ids


async def test_stream_event_order_for_text_and_call(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["<think>Hm.</think>Let me add.\n" + CALL])
    async with asgi_client(make_app(engine, reasoning_parser="think")) as c:
        _, key = await start_session(c)
        events = await _stream(c, key, input="go", tools=TOOLS)
    names = [n for n, _ in events]
    collapsed = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert collapsed == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    # the items announce themselves in progress, and finish completed
    added = [d["item"] for n, d in events if n == "response.output_item.added"]
    assert [i["status"] for i in added] == ["in_progress"] * 3
    assert added[2]["arguments"] == ""


async def test_stream_error_after_start_is_reported_in_band(make_app, asgi_client, tokenizer):
    from rlgate.engine.base import EngineError

    engine = FakeEngine(tokenizer, fail_with=EngineError("backend exploded", status=502))
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        events = await _stream(c, key, input="go")
        engine.fail_with = None
        await create(c, key, input="go")
        exp = await export(c, sid, key)
    check_stream(events)
    assert [n for n, _ in events] == ["response.created", "response.in_progress", "error", "response.failed"]
    err = events[2][1]
    assert "backend exploded" in err["message"] and err["code"]
    failed = events[3][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    Response.model_validate(failed)
    assert exp["stats"]["failed"] == 1 and len(exp["interactions"]) == 1
