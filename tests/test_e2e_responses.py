"""End-to-end: the official OpenAI SDK's Responses client against rlgate on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from helpers import admin_headers, eventually, key_headers, start_session
from remote_helpers import KINDS
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread

TOOLS = [{"type": "function", "name": "add", "description": "Add two integers", "strict": False,
          "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                         "required": ["a", "b"]}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@contextlib.asynccontextmanager
async def gateway(app, task: str = "e2e"):
    """``(admin client, session id, SDK client)`` for a fresh session on a live server."""
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin, task)
            oai = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)
            try:
                yield admin, sid, key, oai
            finally:
                await oai.close()


async def export(admin, sid, key):
    await admin.post("/rl/end_session", headers=key_headers(key))
    r = await admin.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


async def test_sdk_create_stream_and_stream_helper(make_app, tokenizer):
    text = "Hello from the gateway."
    engine = FakeEngine(tokenizer, script=[text] * 3)
    async with gateway(make_app(engine)) as (admin, sid, key, oai):
        r = await oai.responses.create(model="tiny", input="hi", instructions="Be brief.", max_output_tokens=64)
        assert r.output_text == text and r.status == "completed" and r.id.startswith("resp_")
        assert r.usage.input_tokens == len(engine.requests[0].input_ids) and r.usage.output_tokens > 0

        stream = await oai.responses.create(model="tiny", input="hi", instructions="Be brief.", stream=True)
        events = [ev async for ev in stream]
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
        assert events[-1].response.output_text == text

        async with oai.responses.stream(model="tiny", input="hi", instructions="Be brief.") as s:
            deltas = [ev.delta async for ev in s if ev.type == "response.output_text.delta"]
            final = await s.get_final_response()
        assert "".join(deltas) == text and final.output_text == text
        exp = await export(admin, sid, key)
    assert [i["id"] for i in exp["interactions"]] == [r.id, events[-1].response.id, final.id]
    inputs = {tuple(i["input_ids"]) for i in exp["interactions"]}
    assert len(inputs) == 1  # streamed and non-streamed record the same tokens


async def test_sdk_function_call_round_trip(make_app, tokenizer):
    engine = FakeEngine(tokenizer, script=["<think>Use add.</think>Let me add.\n" + CALL, "The sum is 3."])
    async with gateway(make_app(engine, reasoning_parser="think")) as (admin, sid, key, oai):
        conversation: list = [{"role": "user", "content": "What is 1 + 2?"}]
        r1 = await oai.responses.create(model="tiny", input=conversation, tools=TOOLS)
        assert [o.type for o in r1.output] == ["reasoning", "message", "function_call"]
        call = r1.output[2]
        assert r1.output_text == "Let me add." and call.name == "add" and json.loads(call.arguments) == {"a": 1, "b": 2}
        conversation += r1.output  # SDK models go back as input items
        conversation.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
        async with oai.responses.stream(model="tiny", input=conversation, tools=TOOLS) as s:
            r2 = await s.get_final_response()
        assert r2.output_text == "The sum is 3."
        exp = await export(admin, sid, key)
    parent, child = exp["interactions"]
    assert child["relation"] == "extend" and child["parent_id"] == parent["id"] == r1.id
    assert child["input_ids"][: len(parent["input_ids"])] == parent["input_ids"]


async def test_item_references_resolve_to_the_items_returned_before(make_app, tokenizer):
    """The Vercel AI SDK's default openai() provider (store on) sends back each output item it received as
    {"type": "item_reference", "id": ...}: resolved within the session to the item rlgate returned, the
    turn extends its parent; an id that names no stored item of the session is a 400 (issue 26)."""
    engine = FakeEngine(tokenizer, script=["<think>Use add.</think>Let me add.\n" + CALL, "The sum is 3.",
                                           "<think>Again.</think>" + CALL, "3 again.", "x", "y"])
    async with gateway(make_app(engine, reasoning_parser="think")) as (admin, sid, key, oai):
        user = {"role": "user", "content": "What is 1 + 2?"}
        r1 = await oai.responses.create(model="tiny", input=[user], tools=TOOLS)
        rs, msg, call = r1.output
        assert (rs.type, msg.type, call.type) == ("reasoning", "message", "function_call")
        # every item by reference (what the SDK sends with store on), then the tool result
        refs = [{"type": "item_reference", "id": o.id} for o in r1.output]
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "3"}
        r2 = await oai.responses.create(model="tiny", input=[user, *refs, result], tools=TOOLS)
        assert r2.output_text == "The sum is 3."
        # the reasoning by reference, the call echoed in full (the SDK's mix); streamed this time
        second = {"role": "user", "content": "Once more?"}
        h2 = [*refs, result, {"type": "item_reference", "id": r2.output[0].id}, second]
        stream = await oai.responses.create(model="tiny", input=[user, *h2], tools=TOOLS, stream=True)
        r3 = [ev async for ev in stream][-1].response
        rs3, call3 = r3.output
        mixed = [{"type": "item_reference", "id": rs3.id}, call3.model_dump(exclude_none=True),
                 {"type": "function_call_output", "call_id": call3.call_id, "output": "3"}]
        r4 = await oai.responses.create(model="tiny", input=[user, *h2, *mixed], tools=TOOLS)
        assert r4.output_text == "3 again."
        for bad in ("rs_unknown", rs.id + "0", f"fc_{r1.id[5:]}0007", f"msg_{r3.id[5:]}"):  # r3 has no message
            with pytest.raises(openai.BadRequestError) as info:
                await oai.responses.create(model="tiny", input=[user, {"type": "item_reference", "id": bad}])
            err = info.value.body
            assert info.value.status_code == 400 and err["param"] == "input[1].id" and bad in err["message"], err
        # a response stored with store=false cannot be referenced (as previous_response_id cannot)
        r5 = await oai.responses.create(model="tiny", input=[user], store=False)
        with pytest.raises(openai.BadRequestError):
            await oai.responses.create(model="tiny", input=[user, {"type": "item_reference", "id": r5.output[0].id}])
        exp = await export(admin, sid, key)
    a, b, c, d, _ = exp["interactions"]
    assert [i["relation"] for i in (a, b, c, d)] == ["root", "extend", "extend", "extend"]
    assert (b["parent_id"], c["parent_id"], d["parent_id"]) == (a["id"], b["id"], c["id"])
    assert d["input_ids"][: len(a["input_ids"])] == a["input_ids"]


async def test_sdk_previous_response_id(make_app, tokenizer):
    engine = FakeEngine(tokenizer, script=["Let me add.\n" + CALL, "It is 3.", "You're welcome."])
    async with gateway(make_app(engine)) as (admin, sid, key, oai):
        r1 = await oai.responses.create(model="tiny", instructions="Use tools.", input="What is 1 + 2?", tools=TOOLS)
        (call,) = [o for o in r1.output if o.type == "function_call"]
        r2 = await oai.responses.create(model="tiny", instructions="Use tools.", previous_response_id=r1.id,
                                        tools=TOOLS, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                             "output": "3"}])
        assert r2.output_text == "It is 3." and r2.previous_response_id == r1.id
        stream = await oai.responses.create(model="tiny", instructions="Use tools.", previous_response_id=r2.id,
                                            tools=TOOLS, input="Thanks!", stream=True)
        r3 = [ev async for ev in stream][-1].response
        assert r3.output_text == "You're welcome."
        with pytest.raises(openai.BadRequestError) as info:
            await oai.responses.create(model="tiny", previous_response_id="resp_unknown", input="x")
        assert info.value.status_code == 400 and "not found" in info.value.message
        exp = await export(admin, sid, key)
    a, b, c = exp["interactions"]
    assert [i["relation"] for i in (a, b, c)] == ["root", "extend", "extend"]
    assert b["input_ids"][: len(a["input_ids"])] == a["input_ids"]
    assert c["input_ids"][: len(b["input_ids"])] == b["input_ids"]


async def test_sdk_bad_requests(make_app):
    async with gateway(make_app()) as (admin, sid, key, oai):
        # a hosted tool is not refused: dropped (the model cannot call it) and named in a header
        raw = await oai.responses.with_raw_response.create(model="tiny", input="hi", tools=[{"type": "web_search"}])
        assert raw.headers["x-rlgate-ignored-params"] == "tools:web_search"
        with pytest.raises(openai.BadRequestError):
            await oai.responses.create(model="tiny", input=[{"type": "function_call_output", "call_id": "x",
                                                             "output": "1"}], stream=True)


@pytest.mark.slow
@pytest.mark.parametrize("engine_kind", KINDS)
async def test_local_engine_streamed_and_non_streamed_record_the_same(make_app, tiny_model_dir):
    from rlgate.engine.local import LocalEngine

    app = make_app(LocalEngine(tiny_model_dir, device="cpu"))
    request = dict(model="tiny", instructions="You are terse.", input="Say something.", extra_body={"seed": 1234},
                   temperature=1.0, max_output_tokens=24, tools=TOOLS)
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as admin:
            results = []
            for stream in (False, True):
                sid, key = await start_session(admin, f"parity-{stream}")
                async with AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120) as oai:
                    if stream:
                        async with oai.responses.stream(**request) as s:
                            # the tiny model rarely stops by itself: a response.incomplete ends the
                            # stream then (get_final_response() wants response.completed)
                            terminal = [ev async for ev in s if ev.type in ("response.completed",
                                                                            "response.incomplete")]
                            resp = terminal[-1].response
                    else:
                        resp = await oai.responses.create(**request)
                (item,) = (await export(admin, sid, key))["interactions"]
                results.append((resp, item))
    (plain, a), (streamed, b) = results
    assert plain.output_text == streamed.output_text and plain.status == streamed.status
    assert plain.usage.output_tokens == streamed.usage.output_tokens >= 1
    assert a["input_ids"] == b["input_ids"] and a["versions"] == b["versions"] and a["loss_mask"] == b["loss_mask"]
    assert len(a["logprobs"]) == len(b["logprobs"])
    assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=False)) < 1e-5
    assert sum(a["loss_mask"]) == plain.usage.output_tokens


async def test_client_disconnect_aborts_and_keeps_the_partial_reply(make_app, tokenizer):

    engine = FakeEngine(tokenizer, output_tokens=400, token_delay=0.05)  # 20 s unless aborted
    async with gateway(make_app(engine)) as (admin, sid, key, oai):
        stream = await oai.responses.create(model="tiny", input="go on and on", stream=True)
        async for ev in stream:
            if ev.type == "response.output_text.delta":
                break
        await stream.close()
        await eventually(lambda: engine.aborted, what="the engine request aborted")
        assert engine.aborted == 1
        (item,) = (await export(admin, sid, key))["interactions"]
    assert item["finish_reason"] == "abort" and 0 < sum(item["loss_mask"]) < 400
