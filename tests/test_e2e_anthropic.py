"""End-to-end: the official Anthropic SDK against rlgate served on 127.0.0.1.

The Anthropic SDK runs on its own HTTP stack (``httpx2``), so these tests talk to a
real server (:class:`ServerThread`) rather than the in-process ASGI transport.
"""

from __future__ import annotations

import contextlib
import json
import math

import anthropic
import httpx
import openai
import pytest
from anthropic import AsyncAnthropic

from helpers import ADMIN_KEY
from remote_helpers import KINDS
from rlgate.client import GatewayClient
from rlgate.engine.base import EngineError, TokenDelta
from rlgate.engine.fake import FakeEngine, fake_logprob
from rlgate.server.runner import ServerThread

ADD_TOOL = {"name": "add", "description": "Add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}
CALL = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
USER = [{"role": "user", "content": "What is 1 + 2?"}]


@pytest.fixture
def serve():
    """``url = serve(app)``: the app on 127.0.0.1 until the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda app: stack.enter_context(ServerThread(app))


class Episode:
    """One gateway session driven with the Anthropic SDK; ``export`` is filled in at the end."""

    def __init__(self, session, sdk: AsyncAnthropic) -> None:
        self.session = session
        self.sdk = sdk
        self.export: dict = {}


@contextlib.asynccontextmanager
async def episode(url: str, task: str = "e2e"):
    """Start a session, yield an :class:`Episode`; end and export the session afterwards."""
    async with GatewayClient(url, ADMIN_KEY) as gw:
        s = await gw.start_session(task)
        ep = Episode(s, AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0))
        try:
            yield ep
        finally:
            await ep.sdk.close()
            await s.end()
        ep.export = await s.export()


def _comparable(message) -> dict:
    """A Message as a dict, without the ids that differ per call."""
    d = message.model_dump(exclude_none=True)
    d.pop("id")
    for block in d["content"]:
        block.pop("id", None)
    return d


async def test_sdk_create_stream_and_count_tokens(make_app, serve, tokenizer):
    engine = FakeEngine(tokenizer, script=["Hello from the gateway!"] * 3)
    url = serve(make_app(engine))
    async with episode(url) as ep:
        sdk = ep.sdk
        count = await sdk.messages.count_tokens(model="tiny", messages=USER, system="Be brief.")
        created = await sdk.messages.create(model="tiny", max_tokens=32, messages=USER, system="Be brief.")
        assert isinstance(created, anthropic.types.Message)
        assert created.id.startswith("msg_") and created.model == "tiny" and created.role == "assistant"
        assert [b.type for b in created.content] == ["text"]
        assert created.content[0].text == "Hello from the gateway!"
        assert created.stop_reason == "end_turn" and created.stop_sequence is None
        assert created.usage.input_tokens == count.input_tokens == len(engine.requests[0].input_ids)
        assert created.usage.cache_read_input_tokens == 0

        async with sdk.messages.stream(model="tiny", max_tokens=32, messages=USER, system="Be brief.") as stream:
            pieces = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        assert "".join(pieces) == "Hello from the gateway!" and len(pieces) > 1  # real streaming
        assert _comparable(final) == _comparable(created)

        # raw events through create(stream=True)
        raw = await sdk.messages.create(model="tiny", max_tokens=32, messages=USER, system="Be brief.", stream=True)
        types = [ev.type async for ev in raw]
        assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    export = ep.export
    assert [i["id"] for i in export["interactions"]][0] == created.id
    assert len(export["interactions"]) == 3  # count_tokens recorded nothing


async def test_sdk_tool_round_trip(make_app, serve, tokenizer):
    engine = FakeEngine(tokenizer, script=[CALL, "1 + 2 = 3."])
    url = serve(make_app(engine))
    async with episode(url) as ep:
        sdk = ep.sdk
        async with sdk.messages.stream(model="tiny", max_tokens=64, messages=USER, tools=[ADD_TOOL]) as stream:
            first = await stream.get_final_message()
        assert first.stop_reason == "tool_use"
        text, call = first.content
        assert text.type == "text" and text.text == "I will add."
        assert isinstance(call, anthropic.types.ToolUseBlock)
        assert call.id.startswith("toolu_") and call.name == "add" and call.input == {"a": 1, "b": 2}

        history = USER + [
            first.to_param(),
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "3"}]},
        ]
        second = await sdk.messages.create(model="tiny", max_tokens=64, messages=history, tools=[ADD_TOOL])
        assert second.stop_reason == "end_turn" and second.content[0].text == "1 + 2 = 3."
    export = ep.export
    one, two = export["interactions"]
    assert (one["id"], two["id"]) == (first.id, second.id)
    assert one["relation"] == "root"
    assert two["relation"] == "extend" and two["parent_id"] == first.id
    # token-exact: the second prompt starts with the first prompt + the generated tokens
    assert two["input_ids"][: len(one["input_ids"])] == one["input_ids"]
    assert two["messages"][-1] == {"role": "tool", "content": "3", "tool_call_id": call.id, "name": "add"}


async def test_sdk_tool_runner_with_its_defaults(make_app, serve, tokenizer):
    """The SDK's tool runner threads its requests by default (``thread``: the server would keep the
    conversation); rlgate refuses that with ``thread_unsupported_request``, which the runner
    answers by sending the same turn unthreaded. Both turns are recorded, one chain."""
    from anthropic import beta_async_tool

    @beta_async_tool
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    engine = FakeEngine(tokenizer, script=[CALL, "1 + 2 = 3."])
    url = serve(make_app(engine))
    async with episode(url) as ep:
        runner = ep.sdk.beta.messages.tool_runner(model="tiny", max_tokens=64, tools=[add], messages=USER)
        replies = [m async for m in runner]
        assert [m.stop_reason for m in replies] == ["tool_use", "end_turn"]
        assert replies[-1].content[0].text == "1 + 2 = 3."
    one, two = ep.export["interactions"]
    assert (one["relation"], two["relation"]) == ("root", "extend") and two["parent_id"] == one["id"]
    assert two["messages"][-1]["content"] == "3"
    assert len(engine.requests) == 2  # the refused threaded requests never reached the engine


async def test_a_threaded_request_is_refused_in_the_shape_the_sdk_recovers_from(make_app, serve, tokenizer):
    url = serve(make_app(FakeEngine(tokenizer)))
    async with episode(url) as ep:
        with pytest.raises(anthropic.BadRequestError) as exc:
            await ep.sdk.messages.create(model="tiny", max_tokens=8, messages=USER,
                                         extra_body={"thread": {"type": "create"}})
        assert exc.value.body["error"]["details"] == {"error_code": "thread_unsupported_request",
                                                      "unsupported": ["thread"]}
        assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert ep.export["interactions"] == []


class _FailsMidStream(FakeEngine):
    async def stream(self, request):
        self.requests.append(request)
        for pos, tok in enumerate(self.tokenizer.encode("partial answer", add_special_tokens=False)):
            yield TokenDelta([tok], [fake_logprob(tok, pos)], [0], None)
        raise EngineError("backend exploded", status=502)


async def test_sdk_sees_typed_errors(make_app, serve, tokenizer):
    url = serve(make_app(FakeEngine(tokenizer)))
    async with episode(url) as ep:
        sdk = ep.sdk
        with pytest.raises(anthropic.BadRequestError) as bad:
            await sdk.messages.create(model="tiny", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}])
        assert bad.value.status_code == 400
        assert bad.value.body["error"]["type"] == "invalid_request_error"
        assert "toolu_nope" in bad.value.body["error"]["message"]
        with pytest.raises(anthropic.BadRequestError):
            await sdk.messages.create(model="tiny", max_tokens=8, messages=USER,
                                      tools=[{"name": "f", "input_schema": {"type": "object", "properties": 3}}])
        with pytest.raises(anthropic.BadRequestError):  # also raised before the stream starts
            async with sdk.messages.stream(model="tiny", max_tokens=8, messages=[]) as stream:
                await stream.get_final_message()
        wrong = AsyncAnthropic(base_url=url, api_key="not-a-session-key-" + "x" * 30, max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as auth:
            await wrong.messages.create(model="tiny", max_tokens=8, messages=USER)
        assert auth.value.body["type"] == "error" and auth.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError):
            await wrong.messages.count_tokens(model="tiny", messages=USER)
        await wrong.close()
    export = ep.export
    assert export["interactions"] == []

    url2 = serve(make_app(_FailsMidStream(tokenizer)))
    async with episode(url2) as ep2:
        sdk = ep2.sdk
        with pytest.raises(anthropic.APIStatusError) as mid:
            async with sdk.messages.stream(model="tiny", max_tokens=8, messages=USER) as stream:
                async for _ in stream:
                    pass
        assert mid.value.body == {"type": "error", "error": {"type": "api_error", "message": "backend exploded"}}


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_local_engine_streamed_and_plain_record_the_same_tokens(make_app, serve, tiny_model_dir):
    from rlgate.engine.local import LocalEngine

    url = serve(make_app(LocalEngine(tiny_model_dir)))
    request = dict(model="tiny", max_tokens=24, system="You are a calculator.",
                   messages=[{"role": "user", "content": "What is 2 + 2?"}],
                   extra_body={"seed": 1234, "temperature": 1.0})
    async with episode(url, "plain") as plain_ep:
        plain = await plain_ep.sdk.messages.create(**request)
    async with episode(url, "streamed") as streamed_ep:
        async with streamed_ep.sdk.messages.stream(**request) as stream:
            streamed = await stream.get_final_message()
    assert _comparable(streamed) == _comparable(plain)
    (a,) = plain_ep.export["interactions"]
    (b,) = streamed_ep.export["interactions"]
    assert a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"]
    assert a["versions"] == b["versions"]
    assert all(abs(x - y) <= 1e-5 for x, y in zip(a["logprobs"], b["logprobs"], strict=True))
    n_prompt = a["loss_mask"].index(1)
    assert n_prompt == plain.usage.input_tokens
    assert len(a["input_ids"]) - n_prompt == plain.usage.output_tokens
    assert all(math.isfinite(x) and x <= 0 for x in a["logprobs"][n_prompt:])


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_math_agents_against_the_local_engine(make_app, serve, tiny_model_dir):
    from rlgate.demo.math_agent import MathAgent, OpenAIMathAgent, extract_last_number
    from rlgate.engine.local import LocalEngine

    assert extract_last_number("3 apples and 1,234.5 pears") == 1234.5
    url = serve(make_app(LocalEngine(tiny_model_dir)))
    data = {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "7"}
    async with GatewayClient(url, ADMIN_KEY) as gw:
        for agent, base in ((MathAgent(), url), (OpenAIMathAgent(), url + "/v1")):
            async with gw.session("math") as s:
                reward = await agent.run(data, base_url=base, api_key=s.api_key)
                assert reward in (0.0, 1.0)
                await s.set_reward(reward)
            (item,) = (await s.export())["interactions"]
            assert item["reward"] == reward
            assert item["messages"] == [{"role": "user", "content": data["question"]}]
            n_prompt = item["loss_mask"].index(1)
            assert 1 <= len(item["input_ids"]) - n_prompt <= 32  # default max_tokens
            assert json.dumps(item)  # exportable as JSON


async def test_math_agents_contract_with_scripted_replies(make_app, serve, tokenizer):
    from rlgate.demo.math_agent import MathAgent, OpenAIMathAgent, extract_last_number, math_reward

    assert extract_last_number("no digits") is None and extract_last_number("-3 then 1,2") == 2.0
    assert math_reward("so 72.", "Natalia sold 48/2 = 24 clips in May.\n#### 72") == 1.0
    assert math_reward("72.0", 72) == 1.0 and math_reward("7", "72") == 0.0 and math_reward("", "1") == 0.0
    script = ["48 + 24 = 72", "The answer is 71.", "1,234", "72"]
    engine = FakeEngine(tokenizer, script=script)
    url = serve(make_app(engine))
    question = "Natalia sold 48 clips in April and half as many in May. How many altogether?"
    async with GatewayClient(url, ADMIN_KEY) as gw:
        rewards = []
        for agent, base, data in (
            (MathAgent(), url, {"question": question, "answer": 72}),
            (OpenAIMathAgent(), url + "/v1", {"question": question, "answer": "72"}),
            (MathAgent(model="policy", max_tokens=16), url, {"question": "1000 + 234?", "answer": "1234",
                                                            "max_tokens": 8, "temperature": 0.5}),
            (OpenAIMathAgent(), url + "/v1", {"question": question, "answer": "72", "temperature": 0.25}),
        ):
            async with gw.session("math") as s:
                rewards.append(await agent.run(data, base_url=base, api_key=s.api_key))
    assert rewards == [1.0, 0.0, 1.0, 1.0]
    sampling = [(r.sampling.max_new_tokens, r.sampling.temperature) for r in engine.requests]
    assert sampling == [(32, 1.0), (32, 1.0), (8, 0.5), (32, 0.25)]
    user_only = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=True,
                                              add_generation_prompt=True)["input_ids"]
    assert engine.requests[0].input_ids == engine.requests[1].input_ids == user_only


async def test_sdks_do_not_retry_a_session_that_ended(make_app, serve, tokenizer):
    """409 session_ended / 410 session_interrupted are final: they say so (x-should-retry: false), and
    the SDKs, which retry a 409 twice by default, send the request once. Counted on the client's side
    (every request its HTTP client sends), since the server's metric is written after the answer leaves."""
    from openai import AsyncOpenAI

    url = serve(make_app(FakeEngine(tokenizer)))
    sent: list[str] = []

    async def count(request: object) -> None:
        sent.append(str(request.url.path))  # type: ignore[attr-defined]

    async with GatewayClient(url, ADMIN_KEY) as gw:
        s = await gw.start_session("retry")
        await s.end()
        async with httpx.AsyncClient(event_hooks={"request": [count]}) as http:
            oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, http_client=http)  # default retries
            with pytest.raises(openai.ConflictError) as exc:
                await oai.chat.completions.create(model="m", messages=USER, max_tokens=4)
            assert exc.value.response.headers["x-should-retry"] == "false"
        # anthropic's SDK brings its own httpx fork; its default client takes the same event hooks
        async with anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [count]}) as http:
            ant = AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.api_key, http_client=http)
            with pytest.raises(anthropic.ConflictError):
                await ant.messages.create(model="m", max_tokens=4, messages=USER)
    assert [path.rsplit("/", 1)[-1] for path in sent] == ["completions", "messages"]  # once each: no retries
