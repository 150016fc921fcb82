"""Keep-alive events while a stream is quiet (a long prefill): every surface sends its own kind,
clients parse the stream as usual, and the trajectory is recorded exactly as without them."""

from __future__ import annotations

import asyncio
import json

import pytest

from helpers import key_headers, start_session
from rlgate.api.keepalive import KEEPALIVE, with_keepalive
from rlgate.engine.fake import FakeEngine
from test_api_responses import check_stream
from wire import sse_events

PREFILL = 0.6  # seconds before the first token
INTERVAL = 0.05  # keep-alive interval; several fit in the prefill even on a loaded machine


async def test_with_keepalive_passes_items_and_errors_through():
    async def source():
        yield 1
        await asyncio.sleep(0.3)
        yield 2
        raise ValueError("boom")

    seen = []
    with pytest.raises(ValueError, match="boom"):
        async for x in with_keepalive(source(), 0.02):
            seen.append(x)
    assert seen[0] == 1 and seen[-1] == 2 and KEEPALIVE in seen[1:-1]
    assert [x for x in seen if x is not KEEPALIVE] == [1, 2]


async def test_with_keepalive_closes_the_source_when_the_consumer_stops():
    closed = asyncio.Event()

    async def source():
        try:
            yield 1
            await asyncio.sleep(30)
            yield 2
        finally:
            closed.set()

    stream = with_keepalive(source(), 0.01)
    assert await stream.__anext__() == 1
    assert await stream.__anext__() is KEEPALIVE
    await stream.aclose()
    assert closed.is_set()


async def _records(c, sid, key):
    from test_api_responses import export

    return (await export(c, sid, key))["interactions"]


async def test_anthropic_stream_pings_during_prefill(make_app, asgi_client, tokenizer):
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    engine = FakeEngine(tokenizer, script=["hello there"], prefill_delay=PREFILL)
    async with asgi_client(make_app(engine, stream_keepalive_interval=INTERVAL)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/messages", headers={"x-api-key": key}, json={
            "model": "m", "max_tokens": 32, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        recorded = await _records(c, sid, key)
    events = [(b.split("\n")[0][len("event: "):], json.loads(b.split("\n")[1][len("data: "):]))
              for b in r.text.strip().split("\n\n")]
    names = [n for n, _ in events]
    first_block = names.index("content_block_start")
    assert names[0] == "message_start" and names[1:first_block].count("ping") >= 3
    adapter = TypeAdapter(RawMessageStreamEvent)
    for name, data in events:
        if name != "ping":
            adapter.validate_python(data)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "hello there" and recorded[0]["finish_reason"] == "stop"


async def test_responses_stream_repeats_in_progress_during_prefill(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["hello there"], prefill_delay=PREFILL)
    async with asgi_client(make_app(engine, stream_keepalive_interval=INTERVAL)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/responses", headers=key_headers(key), json={"input": "hi", "stream": True})
        recorded = await _records(c, sid, key)
    events = sse_events(r.text)
    final = check_stream(events)  # every event parses as the SDK's type; sequence numbers in order
    names = [n for n, _ in events]
    assert names.count("response.in_progress") >= 3
    assert names.index("response.output_item.added") > names.index("response.in_progress")
    assert final["output"][0]["content"][0]["text"] == "hello there" and recorded[0]["finish_reason"] == "stop"


async def test_chat_stream_sends_comments_during_prefill(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["hello there"], prefill_delay=PREFILL)
    async with asgi_client(make_app(engine, stream_keepalive_interval=INTERVAL)) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key), json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True})
        recorded = await _records(c, sid, key)
    blocks = r.text.strip().split("\n\n")
    assert sum(b == ": keepalive" for b in blocks) >= 3 and blocks[-1] == "data: [DONE]"
    text = "".join(json.loads(b[len("data: "):])["choices"][0]["delta"].get("content") or ""
                   for b in blocks if b.startswith("data: {") and json.loads(b[len("data: "):])["choices"])
    assert text == "hello there" and recorded[0]["finish_reason"] == "stop"


async def test_sdks_stream_through_keepalives(make_app, tokenizer):
    """The real SDKs over a socket: Anthropic, Responses and Chat streams with keep-alives parse as usual."""
    import httpx
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI

    from rlgate.server.runner import ServerThread

    engine = FakeEngine(tokenizer, script=["one two", "three four", "five six"], prefill_delay=PREFILL)
    with ServerThread(make_app(engine, stream_keepalive_interval=INTERVAL)) as url:
        async with httpx.AsyncClient(base_url=url) as c:
            _, key = await start_session(c)
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key)
        async with client.responses.stream(model="m", input="hi") as stream:
            final = await stream.get_final_response()
        assert final.output_text == "one two"
        chunks = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                      stream=True)
        assert "".join([ch.choices[0].delta.content or "" async for ch in chunks if ch.choices]) == "three four"
        anthropic = AsyncAnthropic(base_url=url, api_key=key)
        async with anthropic.messages.stream(model="m", max_tokens=16,
                                             messages=[{"role": "user", "content": "hi"}]) as stream:
            message = await stream.get_final_message()
        assert message.content[0].text == "five six"
