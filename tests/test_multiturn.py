"""Token-exact multi-turn trajectories through the gateway (fake engine, scripted outputs)."""

from __future__ import annotations

import json

import pytest

from helpers import ADMIN_KEY, admin_headers, key_headers, start_session
from remote_helpers import KINDS
from rlgate.engine.fake import FakeEngine, Scripted
from wire import chat


@pytest.fixture(params=KINDS)
def engine_kind(request):
    """Every test here runs with the engine in the gateway and behind fake SGLang / vLLM servers."""
    return request.param


TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


def call_text(name: str, args: dict) -> str:
    """Exactly what the tiny template renders for a tool call (so outputs are re-render stable)."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


async def export(c, sid, **kw):
    r = await c.post("/export_trajectories", json={"session_id": sid, **kw}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


def rendered(tokenizer, messages, tools=None):
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)["input_ids"]


@pytest.mark.parametrize("system", [True, False], ids=["with-system", "no-system"])
@pytest.mark.parametrize("kind", ["plain", "tools"])
async def test_token_exact_prompt_equals_fresh_rendering(make_app, asgi_client, tokenizer, system, kind):
    """Outputs that re-tokenize stably: the bridged prompt must equal the full template rendering."""
    if kind == "plain":
        script = ["The answer is 4.", "Sure, 10.", "Goodbye!"]
        tools = None
    else:
        script = [call_text("add", {"a": 1, "b": 2}),
                  "Adding both.\n" + call_text("add", {"a": 3, "b": 4}) + "\n" + call_text("add", {"a": 5, "b": 6}),
                  "The sums are 3, 7 and 11."]
        tools = TOOLS
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        messages = ([{"role": "system", "content": "You are exact."}] if system else [])
        messages.append({"role": "user", "content": "Add things."})
        for turn in range(3):
            r = await chat(c, key, messages, **({"tools": tools} if tools else {}))
            msg = r["choices"][0]["message"]
            # exact prompt check for this turn
            assert engine.requests[turn].input_ids == rendered(tokenizer, messages, tools), f"turn {turn}"
            messages.append({k: v for k, v in msg.items() if v is not None and k != "refusal"})
            for i, tc in enumerate(msg.get("tool_calls") or []):
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(10 + i)})
            if not msg.get("tool_calls"):
                messages.append({"role": "user", "content": f"next {turn}"})
        for k in range(1, 3):  # each prompt begins with the previous full token list
            prev = engine.requests[k - 1].input_ids
            assert engine.requests[k].input_ids[: len(prev)] == prev
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = await export(c, sid, style="concat")
    assert exp["stats"]["extend"] == 2 and len(exp["interactions"]) == 1


async def test_four_turn_tool_conversation_concat(make_app, asgi_client, tokenizer, stop_ids):
    script = [call_text("add", {"a": 1, "b": 2}), call_text("add", {"a": 3, "b": 3}),
              call_text("add", {"a": 6, "b": 4}), "The total is 10."]
    engine = FakeEngine(tokenizer, script=script)
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "user", "content": "Add 1, 2, 3 and 4 step by step."}]
        ids = []
        for _ in range(4):
            r = await chat(c, key, messages, tools=TOOLS)
            ids.append(r["id"])
            msg = r["choices"][0]["message"]
            messages.append(msg)
            for tc in msg.get("tool_calls") or []:
                args = json.loads(tc["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(args["a"] + args["b"])})
        await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = await export(c, sid, style="concat", discount=0.9)
    (sample,) = exp["interactions"]
    assert sample["chain"] == ids and sample["reward"] == 1.0
    assert sample["turn_rewards"] == pytest.approx([0.729, 0.81, 0.9, 1.0])
    reqs = engine.requests
    first_out = tokenizer.encode(script[0], add_special_tokens=False) + [stop_ids[0]]
    assert sample["input_ids"][: len(reqs[0].input_ids) + len(first_out)] == reqs[0].input_ids + first_out
    # loss mask: exactly the four generated segments, each where its turn put it
    spans = []
    for k, req in enumerate(reqs):
        out = tokenizer.encode(script[k], add_special_tokens=False) + [stop_ids[0]]
        spans.append((len(req.input_ids), len(req.input_ids) + len(out)))
        assert sample["input_ids"][spans[-1][0]:spans[-1][1]] == out
        if k:
            prev = reqs[k - 1].input_ids + tokenizer.encode(script[k - 1], add_special_tokens=False) + [stop_ids[0]]
            assert req.input_ids[: len(prev)] == prev  # each prompt began with the previous full token list
    expected_mask = [0] * len(sample["input_ids"])
    for a, b in spans:
        expected_mask[a:b] = [1] * (b - a)
    assert sample["loss_mask"] == expected_mask
    assert [v for v, m in zip(sample["versions"], sample["loss_mask"], strict=False) if not m] == [-1] * expected_mask.count(0)


@pytest.mark.parametrize("mode", ["token_exact", "rerender"])
async def test_retokenization_drift(make_app, asgi_client, tokenizer, stop_ids, mode):
    """A reply generated as single characters keeps its exact ids only in token_exact mode."""
    text = "hello world"
    char_ids = [tokenizer.convert_tokens_to_ids(ch) for ch in ["h", "e", "l", "l", "o", "Ġ", "w", "o", "r", "l", "d"]]
    assert tokenizer.decode(char_ids) == text
    assert tokenizer.encode(text, add_special_tokens=False) != char_ids  # drift exists
    engine = FakeEngine(tokenizer, script=[Scripted(ids=char_ids + [stop_ids[0]]), "ok"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c, mode=mode)
        messages = [{"role": "user", "content": "say hello"}]
        r = await chat(c, key, messages)
        messages += [r["choices"][0]["message"], {"role": "user", "content": "again"}]
        await chat(c, key, messages)
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = await export(c, sid, style="concat")
    first, second = engine.requests[0].input_ids, engine.requests[1].input_ids
    parent_tokens = first + char_ids + [stop_ids[0]]
    if mode == "token_exact":
        assert second[: len(parent_tokens)] == parent_tokens
        assert exp["stats"]["unaligned_turns"] == 0
        ok = len(tokenizer.encode("ok", add_special_tokens=False)) + 1
        assert sum(exp["interactions"][0]["loss_mask"]) == len(char_ids) + 1 + ok
    else:
        clean = [{"role": "user", "content": "say hello"}, {"role": "assistant", "content": text},
                 {"role": "user", "content": "again"}]
        assert second == rendered(tokenizer, clean)
        assert second[: len(parent_tokens)] != parent_tokens
        assert exp["stats"]["unaligned_turns"] == 1  # the first reply is not in the leaf's tokens
    assert exp["interactions"][0]["relation"] == "extend"


async def test_length_stopped_parent_gets_template_glue(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["one two three four five six", "fine"])
    async with asgi_client(make_app(engine)) as c:
        _, key = await start_session(c)
        messages = [{"role": "user", "content": "count"}]
        r = await chat(c, key, messages, max_tokens=3)
        assert r["choices"][0]["finish_reason"] == "length"
        messages += [r["choices"][0]["message"], {"role": "user", "content": "go on"}]
        await chat(c, key, messages)
    first = engine.requests[0].input_ids
    out3 = tokenizer.encode("one two three four five six", add_special_tokens=False)[:3]
    second = engine.requests[1].input_ids
    assert second[: len(first) + 3] == first + out3
    assert tokenizer.decode(second[len(first) + 3:]) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


async def test_canonicalization_keeps_the_chain(make_app, asgi_client, tokenizer):
    """Harmless differences in how the client echoes history do not break the match."""
    engine = FakeEngine(tokenizer, script=[call_text("add", {"a": 1, "b": 2}), "done", "ok"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "user", "content": "add"}]
        r = await chat(c, key, messages, tools=TOOLS)
        msg = r["choices"][0]["message"]
        tc = msg["tool_calls"][0]
        echoed = {  # None content, args as an object, another id, extra None fields, other key order
            "tool_calls": [{"type": "function", "id": "renamed-by-client",
                            "function": {"arguments": {"b": 2, "a": 1}, "name": "add"}}],
            "content": None, "role": "assistant", "name": None,
        }
        messages = [{"role": "user", "content": [{"type": "text", "text": "add"}]}, echoed,
                    {"role": "tool", "tool_call_id": "renamed-by-client", "content": "3"}]
        await chat(c, key, messages, tools=TOOLS)
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = await export(c, sid)
    assert [i["relation"] for i in exp["interactions"]] == ["root", "extend"]
    assert tc["id"] != "renamed-by-client"


async def test_forks_and_branches_export_separately(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["A1", "A2", "B2", "edited", "Title: Adding"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        base = [{"role": "user", "content": "hello"}]
        r1 = await chat(c, key, base)
        turn1 = base + [r1["choices"][0]["message"]]
        r2 = await chat(c, key, turn1 + [{"role": "user", "content": "continue"}])
        r3 = await chat(c, key, turn1 + [{"role": "user", "content": "something else"}])  # branch at turn 1
        r4 = await chat(c, key, [{"role": "user", "content": "hello, edited"}])  # edited history: fork
        r5 = await chat(c, key, [{"role": "system", "content": "Write a title."},
                                 {"role": "user", "content": "hello"}])  # side request: fork
        await c.post("/rl/end_session", headers=key_headers(key))
        ind = await export(c, sid, keep=True)
        con = await export(c, sid, style="concat")
    rel = {i["id"]: (i["relation"], i["parent_id"]) for i in ind["interactions"]}
    assert rel[r1["id"]] == ("root", None)
    assert rel[r2["id"]] == ("extend", r1["id"]) and rel[r3["id"]] == ("extend", r1["id"])
    assert rel[r4["id"]] == ("fork", None) and rel[r5["id"]] == ("fork", None)
    assert ind["stats"] | {} == {**ind["stats"], "root": 1, "extend": 2, "fork": 2}
    leaves = {s["id"]: s["chain"] for s in con["interactions"]}
    assert leaves == {r2["id"]: [r1["id"], r2["id"]], r3["id"]: [r1["id"], r3["id"]],
                      r4["id"]: [r4["id"]], r5["id"]: [r5["id"]]}


async def test_reward_crosses_a_fork_within_the_conversation(make_app, asgi_client, tokenizer):
    """Turn 2 changes the tools (a fork: new token root); lineage by messages keeps it in turn 1's
    conversation, so its reward reaches turn 1, and the sample says why it forked."""
    engine = FakeEngine(tokenizer, script=["A1", "A2", "T"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "user", "content": "hello"}]
        r1 = await chat(c, key, messages)
        messages += [r1["choices"][0]["message"], {"role": "user", "content": "add 1 and 2"}]
        r2 = await chat(c, key, messages, tools=TOOLS)
        r3 = await chat(c, key, [{"role": "user", "content": "Write a title."}])  # side request
        await c.post("/rl/set_reward", json={"interaction_id": r2["id"], "reward": 4.0}, headers=key_headers(key))
        await c.post("/rl/end_session", headers=key_headers(key))
        con = await export(c, sid, style="concat", discount=0.5)
    by_leaf = {s["id"]: s for s in con["interactions"]}
    assert con["stats"]["fork"] == 2 and con["stats"]["conversations"] == 2
    first, forked, side = by_leaf[r1["id"]], by_leaf[r2["id"]], by_leaf[r3["id"]]
    assert forked["relation"] == "fork" and forked["fork_reason"] == "no_prefix_match"
    assert forked["lineage_parent_id"] == r1["id"] and forked["parent_id"] is None
    assert first["conversation_id"] == forked["conversation_id"] == r1["id"] != side["conversation_id"]
    assert first["reward"] == pytest.approx(2.0) and forked["reward"] == 4.0 and side["reward"] is None


async def test_two_exports_with_different_gamma(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["a", "b", "c"])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "user", "content": "go"}]
        for k in range(3):
            r = await chat(c, key, messages)
            messages += [r["choices"][0]["message"], {"role": "user", "content": f"more {k}"}]
        await c.post("/rl/set_reward", json={"reward": 10}, headers=key_headers(key))
        await c.post("/rl/end_session", headers=key_headers(key))
        e1 = await export(c, sid, discount=0.9, keep=True)
        e2 = await export(c, sid, discount=0.5)
        assert (await c.post("/export_trajectories", json={"session_id": sid},
                             headers=admin_headers())).status_code == 404
    assert [i["reward"] for i in e1["interactions"]] == pytest.approx([8.1, 9.0, 10.0])
    assert [i["reward"] for i in e2["interactions"]] == pytest.approx([2.5, 5.0, 10.0])


async def test_session_mode_override_and_default(make_app, asgi_client):
    async with asgi_client(make_app(trajectory_mode="rerender")) as c:
        sid, _ = await start_session(c)
        sid2, _ = await start_session(c, mode="token_exact")
        r = await c.post("/rl/end_session", headers=admin_headers())
        assert r.status_code == 401
        for s, expected in ((sid, "rerender"), (sid2, "token_exact")):
            await c.post("/rl/set_reward", json={"reward": 1, "session_id": s}, headers=admin_headers())
            mgr = c._transport.app.state.gateway.sessions  # type: ignore[attr-defined]
            assert mgr.sessions[s].mode == expected


async def test_openai_sdk_four_turn_tool_conversation(make_app, tokenizer, stop_ids):
    """Acceptance: the same 4-turn tool conversation through the real OpenAI SDK over a socket."""
    from openai import AsyncOpenAI

    from rlgate.client import GatewayClient
    from rlgate.server.runner import ServerThread

    script = [call_text("add", {"a": 1, "b": 2}), call_text("add", {"a": 3, "b": 3}),
              call_text("add", {"a": 6, "b": 4}), "The total is 10."]
    engine = FakeEngine(tokenizer, script=script)
    with ServerThread(make_app(engine)) as url:
        client = GatewayClient(url, ADMIN_KEY)
        async with client.session("sdk") as s:
            oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
            messages: list = [{"role": "user", "content": "Add 1, 2, 3 and 4."}]
            for _ in range(4):
                r = await oai.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                for tc in msg.tool_calls or []:
                    args = json.loads(tc.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(args["a"] + args["b"])})
            await oai.close()
        exp = await s.export(style="concat")
        await client.aclose()
    (sample,) = exp["interactions"]
    assert len(sample["chain"]) == 4
    first = engine.requests[0].input_ids + tokenizer.encode(script[0], add_special_tokens=False) + [stop_ids[0]]
    assert sample["input_ids"][: len(first)] == first
    segments = sum(1 for i, m in enumerate(sample["loss_mask"]) if m and (i == 0 or not sample["loss_mask"][i - 1]))
    assert segments == 4
    for k in range(1, 4):
        prev = engine.requests[k - 1].input_ids
        assert engine.requests[k].input_ids[: len(prev)] == prev
