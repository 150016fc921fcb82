"""``warm_start:`` (train/warm_start.py): supervised steps on example conversations before RL.

The tokens a warm start trains on must be the ones the gateway serves and records, or the model
learns a layout it never sees. The tiny model memorises one tool conversation; played greedily
through the gateway by an unmodified Anthropic SDK agent, the recorded sample (one token chain,
``concat``) must hold exactly the warm start's token ids and loss mask, and the tool round must
happen. Errors in the data name the item and are config errors, before any model loads.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

TOOLS = [{"type": "function", "function": {"name": "reverse", "description": "Reverse a word.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]

AGENT = '''
from anthropic import AsyncAnthropic

TOOLS = [{"name": "reverse", "description": "Reverse a word.",
          "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}]


class ReverseAgent:
    async def run(self, data, *, base_url, api_key, http_client=None):
        client = AsyncAnthropic(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        messages = [{"role": "user", "content": f"Reverse the word {data['word']}."}]
        try:
            for _ in range(2):
                reply = await client.messages.create(model="policy", max_tokens=48, messages=messages, tools=TOOLS,
                                                     extra_body={"temperature": 0.0})
                calls = [b for b in reply.content if b.type == "tool_use"]
                if not calls:
                    break
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": str(c.input.get("word", ""))[::-1]}
                    for c in calls]})
        finally:
            if http_client is None:
                await client.close()
        return float(data["word"][::-1] in "".join(b.text for b in reply.content if b.type == "text"))
'''


def _conversation(word: str) -> dict:
    return {"messages": [
        {"role": "user", "content": f"Reverse the word {word}."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "reverse", "arguments": json.dumps({"word": word})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": word[::-1]},
        {"role": "assistant", "content": f"The reverse of {word} is {word[::-1]}."}], "tools": TOOLS}


def _config(tmp_path: Path, model: Path, **extra):
    from rlgate.train.config import validate_config

    (tmp_path / "train.jsonl").write_text(json.dumps({"word": "apple"}) + "\n")
    raw = {"model": str(model), "out_dir": str(tmp_path / "run"), "dataset": str(tmp_path / "train.jsonl"),
           "agent": "reverse_ws_agent:ReverseAgent", "gateway": {"tool_prompt": "auto"},
           "rollout": {"group_size": 2, "export_style": "concat"},
           "warm_start": {"dataset": str(tmp_path / "demos.jsonl"), "steps": 120, "lr": 3e-3, "batch_size": 1},
           **extra}
    return validate_config(raw)


def test_a_warm_start_trains_the_tokens_the_gateway_records(tiny_model_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from rlgate.chat.conversation import ToolSpec
    from rlgate.core.generation import serving_renderer
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.train.gateway import GatewayPlan, open_gateway, served_config
    from rlgate.train.run import make_runner, prepare_start
    from rlgate.train.warm_start import conversation_sequence

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "reverse_ws_agent.py").write_text(AGENT)
    (tmp_path / "demos.jsonl").write_text(json.dumps(_conversation("apple")) + "\n")
    cfg = _config(tmp_path, tiny_model_dir)
    logs: list[str] = []

    async def play():
        prep = await prepare_start(cfg, log=logs.append)
        gw = await open_gateway(GatewayPlan.of(cfg), prep.model, prep.model)
        runner = make_runner(cfg, gw.client, prep.agent, prep.reward_fn)
        try:
            await gw.client.grant_capacity(1)
            return prep, await runner.episode("ws-0", 0, {"word": "apple"}, admit=False)
        finally:
            await runner.aclose()
            await gw.close()

    prep, ep = asyncio.run(play())
    assert prep.model == tmp_path / "run" / "warm-start"
    assert any("warm start: saved" in line for line in logs), logs
    assert ep.ok and ep.reward == 1.0, ep.error
    [sample] = ep.samples  # concat: the whole conversation, one token chain
    assert sample.generated_tokens > 0

    # the same conversation, tokenised by the warm start: the very tokens the gateway recorded
    from rlgate.api.openai_chat.protocol import ChatCompletionRequest
    from rlgate.api.openai_chat.serving import to_chat_request

    tok = load_tokenizer(prep.model)
    _, _, renderer, _ = serving_renderer(served_config(GatewayPlan.of(cfg), "-"), tok)
    chat = to_chat_request(ChatCompletionRequest.model_validate({"model": "m", **_conversation("apple")}))
    assert all(isinstance(t, ToolSpec) for t in chat.tools)
    ids, mask = conversation_sequence(renderer, chat.messages, chat.tools, stop_token_ids(tok, prep.model)[0])
    assert sample.input_ids == ids
    assert sample.loss_mask == mask
    assert sum(mask) == sample.generated_tokens  # both replies, each with its stop token

    # reused while the settings and data are the same; made again when the data changes
    marker = tmp_path / "run" / "warm-start" / "warm_start.json"
    made = marker.read_text()
    logs.clear()
    again = asyncio.run(prepare_start(cfg, log=logs.append))
    assert again.model == prep.model and marker.read_text() == made
    assert logs and "made earlier" in logs[0]
    (tmp_path / "demos.jsonl").write_text(json.dumps(_conversation("grape")) + "\n")
    logs.clear()
    asyncio.run(prepare_start(_config(tmp_path, tiny_model_dir, warm_start={
        "dataset": str(tmp_path / "demos.jsonl"), "steps": 2}), log=logs.append))
    assert any("warm start: saved" in line for line in logs) and marker.read_text() != made


@pytest.mark.parametrize(("item", "message"), [
    ({"prompt": "hi"}, 'item 1: needs "messages"'),
    ({"messages": [{"role": "user", "content": "hi"}]}, "item 1: has no assistant message"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                   {"role": "assistant", "content": "b"}]}, "two assistant messages in a row"),
    ({"messages": [{"role": "user", "content": 3}]}, "item 1: messages.0"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "item 1: only assistant messages may carry tool_calls"),
])
def test_bad_conversations_are_config_errors_naming_the_item(tiny_model_dir: Path, tmp_path: Path, item: dict,
                                                              message: str) -> None:
    from rlgate.train.config import ConfigError
    from rlgate.train.warm_start import starting_model

    (tmp_path / "demos.jsonl").write_text(json.dumps(item) + "\n")
    cfg = _config(tmp_path, tiny_model_dir)
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        starting_model(cfg, tiny_model_dir, log=lambda _: None)
    assert not (tmp_path / "run" / "warm-start").exists()  # nothing half made


def test_a_warm_start_only_runs_with_the_in_process_gateway(tiny_model_dir: Path, tmp_path: Path) -> None:
    from rlgate.train.config import ConfigError

    with pytest.raises(ConfigError, match="warm_start trains the model the in-process gateway serves"):
        _config(tmp_path, tiny_model_dir, gateway={"url": "http://127.0.0.1:9"}, train={"lora": {"r": 4}})
