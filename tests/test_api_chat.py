"""Chat Completions through the app in-process (fake engine): semantics, errors, export."""

from __future__ import annotations

import json

import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.fake import FakeEngine, Scripted, fake_logprob

USER = [{"role": "user", "content": "hi"}]


async def _export(c, sid, **kw):
    r = await c.post("/export_trajectories", json={"session_id": sid, **kw}, headers=admin_headers())
    return r


async def test_completion_and_export_format(make_app, asgi_client, tokenizer, stop_ids):
    engine = FakeEngine(tokenizer, script=["Hello there!"])
    app = make_app(engine)
    async with asgi_client(app) as c:
        sid, key = await start_session(c, "t")
        r = await c.post("/v1/chat/completions", json={"model": "x", "messages": USER}, headers=key_headers(key))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
        assert body["model"] == "x"
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": "Hello there!", "refusal": None}
        assert choice["finish_reason"] == "stop"
        prompt = tokenizer.apply_chat_template(USER, tokenize=True, add_generation_prompt=True)["input_ids"]
        out = tokenizer.encode("Hello there!", add_special_tokens=False) + [stop_ids[0]]
        assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(out),
                                 "total_tokens": len(prompt) + len(out)}
        assert engine.requests[0].input_ids == prompt

        r = await c.post("/rl/set_reward", json={"reward": 0.5}, headers=key_headers(key))
        assert r.json()["interaction_id"] == body["id"]
        assert (await c.post("/rl/end_session", headers=key_headers(key))).json()["interaction_count"] == 1
        exp = (await _export(c, sid)).json()
    assert exp["session_id"] == sid and exp["style"] == "individual"
    (item,) = exp["interactions"]
    assert item["id"] == body["id"] and item["parent_id"] is None and item["relation"] == "root"
    assert item["input_ids"] == prompt + out
    assert item["loss_mask"] == [0] * len(prompt) + [1] * len(out)
    assert item["logprobs"] == [0.0] * len(prompt) + [fake_logprob(t, i) for i, t in enumerate(out)]
    assert item["versions"] == [-1] * len(prompt) + [0] * len(out)
    assert item["reward"] == 0.5 and item["finish_reason"] == "stop"
    assert item["messages"] == [{"role": "user", "content": "hi"}]
    assert item["output_message"] == {"role": "assistant", "content": "Hello there!"}


async def test_both_route_prefixes_and_models(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        for path in ("/chat/completions", "/v1/chat/completions"):
            r = await c.post(path, json={"messages": USER}, headers=key_headers(key))
            assert r.status_code == 200, r.text
        for path in ("/models", "/v1/models"):
            r = await c.get(path, headers=key_headers(key))
            assert r.status_code == 200 and r.json()["data"][0]["id"] == "rlgate"
        assert (await c.get("/health")).json()["status"] == "ok"


BAD_REQUESTS = [
    ("non-json body", dict(content=b"{not json", headers={"content-type": "application/json"}), 400),
    ("wrong content type", dict(content=b"messages=hi", headers={"content-type": "application/x-www-form-urlencoded"}), 415),
    ("json array body", dict(json=[1, 2]), 400),
    ("empty messages", dict(json={"messages": []}), 400),
    ("missing messages", dict(json={"model": "x"}), 400),
    ("unknown role", dict(json={"messages": [{"role": "wizard", "content": "x"}]}), 400),
    ("n=2", dict(json={"messages": USER, "n": 2}), 400),
    ("both max tokens", dict(json={"messages": USER, "max_tokens": 5, "max_completion_tokens": 5}), 400),
    ("negative max_tokens", dict(json={"messages": USER, "max_tokens": -1}), 400),
    ("zero max_tokens", dict(json={"messages": USER, "max_tokens": 0}), 400),
    ("negative temperature", dict(json={"messages": USER, "temperature": -0.5}), 400),
    ("top_p zero", dict(json={"messages": USER, "top_p": 0}), 400),
    ("prompt longer than context", dict(json={"messages": [{"role": "user", "content": "word " * 3000}]}), 400),
    ("bad tool schema", dict(json={"messages": USER, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": 5}}}]}), 400),
    ("bad tool_choice", dict(json={"messages": USER, "tool_choice": "sometimes"}), 400),
    ("content wrong type", dict(json={"messages": [{"role": "user", "content": 42}]}), 400),
    ("tool_calls on user", dict(json={"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}), 400),
    ("max_total_tokens too small", dict(json={"messages": USER, "max_total_tokens": 3}), 400),
]


@pytest.mark.parametrize("name,kwargs,status", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
async def test_bad_input_is_4xx_openai_shaped_and_records_nothing(make_app, asgi_client, tokenizer, name, kwargs, status):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        headers = {**key_headers(key), **kwargs.pop("headers", {})}
        r = await c.post("/v1/chat/completions", headers=headers, **kwargs)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "invalid_request_error" and err["message"]
        assert engine.requests == []
        if name == "prompt longer than context":
            assert err["code"] == "context_length_exceeded"
        # the server keeps serving, and nothing was recorded
        ok = await c.post("/v1/chat/completions", json={"messages": USER}, headers=key_headers(key))
        assert ok.status_code == 200
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = (await _export(c, sid)).json()
        assert len(exp["interactions"]) == 1 and exp["stats"]["failed"] == 0


async def test_unknown_and_ignored_params_are_reported(make_app, asgi_client, caplog):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        with caplog.at_level("WARNING"):
            r = await c.post("/v1/chat/completions", headers=key_headers(key),
                             json={"messages": USER, "frequency_penalty": 0.5, "my_custom": 1})
        assert r.status_code == 200
        assert r.headers["x-rlgate-ignored-params"] == "frequency_penalty,my_custom"
        assert "frequency_penalty" in caplog.text and "my_custom" in caplog.text


async def test_strict_tools_are_reported_not_dropped(make_app, asgi_client):
    """pydantic-ai and the Agents SDK send tools[].function.strict; the arguments are not constrained to the
    schema (no schema-constrained decoding), so it is reported like every field without effect (issue 26)."""
    fn = {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        for extra, reported in (({"strict": True}, "tools.function.strict"), ({"strict": False}, None),
                                ({"x_hint": 1}, "tools.function.x_hint")):
            r = await c.post("/v1/chat/completions", headers=key_headers(key), json={
                "messages": USER, "tools": [{"type": "function", "function": {**fn, **extra}}]})
            assert r.status_code == 200, r.text
            assert r.headers.get("x-rlgate-ignored-params") == reported


async def test_extensions_reach_the_engine(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={
            "messages": USER, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 11, "max_tokens": 4})
        assert r.status_code == 200
        s = engine.requests[-1].sampling
        assert (s.temperature, s.top_p, s.top_k, s.seed, s.max_new_tokens) == (0.7, 0.9, 5, 11, 4)
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 4
        prompt_len = len(engine.requests[-1].input_ids)
        r = await c.post("/v1/chat/completions", headers=key_headers(key),
                         json={"messages": USER, "max_total_tokens": prompt_len + 2})
        assert engine.requests[-1].sampling.max_new_tokens == 2
        # defaults: temperature 1, top_p 1, no top-k
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        s = engine.requests[-1].sampling
        # no max tokens: up to the rest of the context, as the OpenAI API and vLLM do (no hidden 512)
        assert (s.temperature, s.top_p, s.top_k) == (1.0, 1.0, 0)
        assert s.max_new_tokens == engine.max_context_length - len(engine.requests[-1].input_ids)


async def test_default_and_capped_max_tokens(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine, default_max_tokens=7, max_tokens_cap=5)) as c:
        _, key = await start_session(c)
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        assert engine.requests[-1].sampling.max_new_tokens == 5
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER, "max_tokens": 3})
        assert engine.requests[-1].sampling.max_new_tokens == 3


async def test_stop_strings(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["one two three four five"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER, "stop": ["three"]})
        assert r.json()["choices"][0]["message"]["content"] == "one two"
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        await c.post("/rl/end_session", headers=key_headers(key))
        item = (await _export(c, sid)).json()["interactions"][0]
    out = [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=False) if m]
    # kept tokens end with the token that completed the stop string
    assert tokenizer.decode(out).endswith("three")
    assert "four" not in tokenizer.decode(out)


async def test_tool_calls_and_parse_failure(make_app, asgi_client, tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    good = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    bad = '<tool_call>\n{"name": "add", "arguments": {"a": 1,\n</tool_call>'
    engine = FakeEngine(tokenizer, script=[good, bad, good])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        r = (await c.post("/v1/chat/completions", headers=key_headers(key),
                          json={"messages": USER, "tools": tools})).json()
        msg = r["choices"][0]["message"]
        assert r["choices"][0]["finish_reason"] == "tool_calls"
        assert msg["content"] == "Let me add."
        (call,) = msg["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
        # unparsable call: text unchanged, finish reason unchanged
        r = (await c.post("/v1/chat/completions", headers=key_headers(key),
                          json={"messages": USER, "tools": tools})).json()
        assert r["choices"][0]["finish_reason"] == "stop"
        assert r["choices"][0]["message"]["content"] == bad and "tool_calls" not in r["choices"][0]["message"]
        # tool_choice none: no parsing
        r = (await c.post("/v1/chat/completions", headers=key_headers(key),
                          json={"messages": USER, "tools": tools, "tool_choice": "none"})).json()
        assert r["choices"][0]["message"]["content"] == good and r["choices"][0]["finish_reason"] == "stop"


async def test_tools_are_rendered_into_the_prompt(make_app, asgi_client, tokenizer):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a thing",
                                               "parameters": {"type": "object", "properties": {}}}}]
    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER, "tools": tools})
    expected = tokenizer.apply_chat_template(USER, tools=tools, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert engine.requests[0].input_ids == expected
    assert '"name": "lookup"' in tokenizer.decode(expected)


async def test_store_false_is_recorded_all_the_same(make_app, asgi_client):
    """Capture does not depend on the client's store flag: every call made with a session key
    is training data."""
    async with asgi_client(make_app()) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER, "store": False})
        assert r.status_code == 200
        completion_id = r.json()["id"]
        r = await c.post("/rl/set_reward", json={"reward": 1}, headers=key_headers(key))
        assert r.status_code == 200 and r.json()["interaction_id"] == completion_id
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = (await _export(c, sid)).json()
    assert [(i["id"], i["reward"]) for i in exp["interactions"]] == [(completion_id, 1)]


async def test_session_lifecycle(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        sid, key = await start_session(c, "job")
        sid2, _ = await start_session(c, "job")
        assert (sid, sid2) == ("job-0", "job-1")
        # rewards before any interaction -> 400
        assert (await c.post("/rl/set_reward", json={"reward": 1}, headers=key_headers(key))).status_code == 400
        r1 = (await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})).json()
        r2 = (await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})).json()
        assert (await c.post("/rl/set_reward", json={"reward": 2, "interaction_id": r1["id"]},
                             headers=key_headers(key))).status_code == 200
        bad = await c.post("/rl/set_reward", json={"reward": 2, "interaction_id": "nope"}, headers=key_headers(key))
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "interaction_id"
        assert (await c.post("/rl/set_reward", json={"reward": 3}, headers=key_headers(key))).json()[
            "interaction_id"] == r2["id"]
        # export of an active session: 409 right away, not a hang
        r = await _export(c, sid)
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_active"
        # end is idempotent
        for _ in range(2):
            r = await c.post("/rl/end_session", headers=key_headers(key))
            assert r.json() == {"message": "success", "session_id": sid, "interaction_count": 2}
        # after end: generation and session-key rewards answer 409; the admin may still reward
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        assert r.status_code == 409 and "ended" in r.json()["error"]["message"]
        assert (await c.post("/rl/set_reward", json={"reward": 1}, headers=key_headers(key))).status_code == 409
        r = await c.post("/rl/set_reward", json={"reward": 5, "session_id": sid, "interaction_id": r1["id"]},
                         headers=admin_headers())
        assert r.status_code == 200
        exp = (await _export(c, sid, keep=True)).json()
        assert [i["reward"] for i in exp["interactions"]] == [5.0, 3.0]
        exp2 = (await _export(c, sid, discount=0.5)).json()
        assert [i["reward"] for i in exp2["interactions"]] == [5.0, 3.0]  # individual: no tree, no discount
        assert (await _export(c, sid)).status_code == 404  # exported without keep: gone
        assert (await _export(c, "never-0")).status_code == 404
        # the key is retired with the session
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        assert r.status_code == 401


async def test_export_waits_for_the_session_to_end(make_app, asgi_client):
    import asyncio

    async with asgi_client(make_app()) as c:
        sid, key = await start_session(c)
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        export = asyncio.create_task(_export(c, sid, wait_timeout=600))
        for _ in range(50):  # let the export request run up to its wait (event-loop turns, not time)
            await asyncio.sleep(0)
        assert not export.done()  # the session is active: the export waits
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await export
        assert r.status_code == 200 and len(r.json()["interactions"]) == 1


async def test_start_session_key_rules(make_app, asgi_client):
    from helpers import ADMIN_KEY

    async with asgi_client(make_app()) as c:
        mine = "k" * 40
        r = await c.post("/rl/start_session", json={"task_id": "a", "api_key": mine}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["api_key"] == mine
        r = await c.post("/rl/start_session", json={"task_id": "b", "api_key": mine}, headers=admin_headers())
        assert r.status_code == 409
        r = await c.post("/rl/start_session", json={"task_id": "b", "api_key": ADMIN_KEY}, headers=admin_headers())
        assert r.status_code == 400
        r = await c.post("/rl/start_session", json={"task_id": "b", "api_key": "short"}, headers=admin_headers())
        assert r.status_code == 400 and r.json()["error"]["param"] == "api_key"
        r = await c.post("/rl/start_session", json={}, headers=admin_headers())
        assert r.status_code == 422
        # a key of an ended session may be reused; it then maps to the new session
        await c.post("/rl/end_session", headers=key_headers(mine))
        r = await c.post("/rl/start_session", json={"task_id": "c", "api_key": mine}, headers=admin_headers())
        assert r.status_code == 200
        r = await c.post("/v1/chat/completions", headers=key_headers(mine), json={"messages": USER})
        assert r.status_code == 200
        # the ended session stays exportable
        assert (await _export(c, "a-0")).status_code == 200
        # generated keys are long and distinct
        _, k1 = await start_session(c)
        _, k2 = await start_session(c)
        assert k1 != k2 and len(k1) >= 40


async def test_capacity_modes(make_app, asgi_client):
    async with asgi_client(make_app(capacity_mode="granted")) as c:
        r = await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())
        assert r.status_code == 429
        assert (await c.post("/grant_capacity", headers=admin_headers())).json() == {"capacity": 1}
        assert (await c.post("/grant_capacity", headers=admin_headers())).json() == {"capacity": 2}
        for _ in range(2):
            assert (await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())).status_code == 200
        assert (await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())).status_code == 429
    async with asgi_client(make_app()) as c:  # unlimited by default
        for _ in range(5):
            assert (await c.post("/rl/start_session", json={"task_id": "t"}, headers=admin_headers())).status_code == 200


async def test_engine_failure_is_counted_not_exported(make_app, asgi_client, tokenizer):
    from rlgate.engine.base import EngineError

    engine = FakeEngine(tokenizer)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        engine.fail_with = EngineError("backend exploded", status=502)
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        assert r.status_code == 502 and "backend exploded" in r.json()["error"]["message"]
        engine.fail_with = None
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = (await _export(c, sid)).json()
        assert len(exp["interactions"]) == 1 and exp["stats"]["failed"] == 1
        m = (await c.get("/rl/metrics", headers=admin_headers())).json()
        assert m["interactions_failed"] == 1 and m["interactions_completed"] == 1


async def test_non_finite_reward_rejected(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})
        r = await c.post("/rl/set_reward", content=b'{"reward": NaN}',
                         headers={**key_headers(key), "content-type": "application/json"})
        assert r.status_code == 422


async def test_scripted_token_ids_roundtrip(make_app, asgi_client, tokenizer, stop_ids):
    ids = tokenizer.encode("abc", add_special_tokens=False) + [stop_ids[0]]
    engine = FakeEngine(tokenizer, script=[Scripted(ids=ids)])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        r = (await c.post("/v1/chat/completions", headers=key_headers(key), json={"messages": USER})).json()
        assert r["choices"][0]["message"]["content"] == "abc"
        await c.post("/rl/end_session", headers=key_headers(key))
        item = (await _export(c, sid)).json()["interactions"][0]
        assert [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=False) if m] == ids
