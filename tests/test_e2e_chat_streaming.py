"""Chat Completions streaming and agent frameworks against a live gateway on 127.0.0.1."""

from __future__ import annotations

import json

import httpx
import pytest
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, eventually
from remote_helpers import KINDS
from rlgate.client import GatewayClient
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread
from wire import sse_data

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
CALL = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


@pytest.mark.parametrize("include_usage", [False, True])
async def test_raw_sse_chunk_invariants(make_app, tokenizer, include_usage):
    engine = FakeEngine(tokenizer, script=[CALL])
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            s = await client.start_session("sse")
            body = {"messages": [{"role": "user", "content": "2+3"}], "tools": TOOLS, "stream": True}
            if include_usage:
                body["stream_options"] = {"include_usage": True}
            async with httpx.AsyncClient() as h:
                r = await h.post(url + "/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {s.api_key}"})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = sse_data(r.text, done=True)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert "usage" in chunks[-1] and chunks[-1]["usage"]["completion_tokens"] > 0
    if include_usage:
        assert chunks[-1]["choices"] == []
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Let me add." and "<tool_call>" not in text
    calls = [tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    assert len(calls) == 1 and json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_sdk_stream_reassembles_tool_call_deltas(make_app, tokenizer):
    engine = FakeEngine(tokenizer, script=[CALL, "The sum is 5."], token_delay=0.001)
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            async with client.session("stream") as s:
                oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
                messages = [{"role": "user", "content": "What is 2+3?"}]
                stream = await oai.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                           stream_options={"include_usage": True})
                content, calls, finish, usage, ids = "", {}, None, None, set()
                async for chunk in stream:
                    ids.add(chunk.id)
                    usage = chunk.usage or usage
                    if not chunk.choices:
                        continue
                    d = chunk.choices[0].delta
                    content += d.content or ""
                    for tc in d.tool_calls or []:
                        slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += (tc.function.name or "") if tc.function else ""
                        slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
                    finish = chunk.choices[0].finish_reason or finish
                assert len(ids) == 1 and finish == "tool_calls" and content == "Let me add."
                assert usage is not None and usage.completion_tokens > 0
                (call,) = calls.values()
                assert call["name"] == "add" and json.loads(call["arguments"]) == {"a": 2, "b": 3}
                messages += [{"role": "assistant", "content": content, "tool_calls": [
                    {"id": call["id"], "type": "function", "function": {"name": "add", "arguments": call["arguments"]}}]},
                    {"role": "tool", "tool_call_id": call["id"], "content": "5"}]
                r = await oai.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                assert r.choices[0].message.content == "The sum is 5."
                await oai.close()
            exp = await s.export()
    assert [i["relation"] for i in exp["interactions"]] == ["root", "extend"]


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_disconnect_mid_stream_keeps_an_aborted_interaction(make_app, tokenizer):
    engine = FakeEngine(tokenizer, output_tokens=400, token_delay=0.05)  # 20 s unless aborted
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            s = await client.start_session("disc")
            async with httpx.AsyncClient() as h:
                async with h.stream("POST", url + "/v1/chat/completions", headers={"Authorization": f"Bearer {s.api_key}"},
                                    json={"messages": [{"role": "user", "content": "talk"}], "stream": True}) as r:
                    seen = 0
                    async for line in r.aiter_lines():
                        seen += line.startswith("data: ")
                        if seen >= 5:
                            break  # leave: the connection closes with the block
            # the server notices the disconnect and records the abort
            await eventually(lambda: engine.aborted, what="the engine request aborted")
            assert engine.aborted == 1
            await s.end()
            exp = await s.export(wait_timeout=10)
    (item,) = exp["interactions"]
    assert item["finish_reason"] == "abort"
    n_out = sum(item["loss_mask"])
    assert 3 <= n_out < 400
    assert item["output_message"]["role"] == "assistant"


@pytest.mark.slow
@pytest.mark.parametrize("engine_kind", KINDS)
async def test_stream_and_non_stream_record_the_same_trajectory(make_app, tiny_model_dir):
    from rlgate.engine.local import LocalEngine

    with ServerThread(make_app(LocalEngine(tiny_model_dir))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            exports = []
            for stream in (False, True):
                async with client.session(f"parity-{stream}") as s:
                    oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
                    kw = dict(model="m", messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=24,
                              seed=1234, temperature=1.0)
                    if stream:
                        async for _ in await oai.chat.completions.create(stream=True, **kw):
                            pass
                    else:
                        await oai.chat.completions.create(**kw)
                    await oai.close()
                exports.append((await s.export())["interactions"][0])
    a, b = exports
    assert a["input_ids"] == b["input_ids"] and a["versions"] == b["versions"]
    assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=False)) < 1e-5
    assert a["output_message"] == b["output_message"]


async def test_openai_agents_sdk_with_a_function_tool(make_app, tokenizer):
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # tracing would upload to OpenAI's servers

    calls = []

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    engine = FakeEngine(tokenizer, script=[CALL, "The answer is 5."])
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            async with client.session("agents") as s:
                oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
                agent = Agent(name="calc", instructions="Use the add tool.", tools=[add],
                              model=OpenAIChatCompletionsModel(model="policy", openai_client=oai),
                              model_settings=ModelSettings(temperature=1.0))
                result = await Runner.run(agent, "What is 2 + 3?")
                await oai.close()
            exp = await s.export(style="concat")
    assert calls == [(2, 3)]
    assert result.final_output == "The answer is 5."
    assert exp["stats"]["completed"] == 2 and exp["stats"]["extend"] == 1
    (sample,) = exp["interactions"]
    assert len(sample["chain"]) == 2


async def test_langchain_chat_openai_bound_tool_round_trip(make_app, tokenizer):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    engine = FakeEngine(tokenizer, script=[CALL, "It is 5."])
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            async with client.session("langchain") as s:
                llm = ChatOpenAI(model="policy", base_url=s.base_url, api_key=s.api_key, max_retries=0,
                                 temperature=1.0).bind_tools([add])
                history = [HumanMessage("What is 2 + 3?")]
                ai = await llm.ainvoke(history)
                assert ai.tool_calls and ai.tool_calls[0]["name"] == "add"
                assert ai.tool_calls[0]["args"] == {"a": 2, "b": 3}
                result = add.invoke(ai.tool_calls[0]["args"])
                history += [ai, ToolMessage(str(result), tool_call_id=ai.tool_calls[0]["id"])]
                final = await llm.ainvoke(history)
                assert final.content == "It is 5."
            exp = await s.export()
    assert [i["relation"] for i in exp["interactions"]] == ["root", "extend"]
