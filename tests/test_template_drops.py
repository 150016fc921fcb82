"""Nothing a request carries is dropped silently (issue 40): what a chat template cannot render is
named in the response, the metrics, the log and the exported samples' flags; ``tool_prompt: auto``
describes the tools to a template that renders none.

The model is the tiny tokenizer with SmolLM2's own chat template (``role + content``, no tools), the
engine a scripted fake; the clients are the official SDKs over a socket on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re

import httpx
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from helpers import ADMIN_KEY
from rlgate.chat.conversation import ImagePart, Message, ToolCall, ToolSpec
from rlgate.chat.families.registry import resolve_family
from rlgate.chat.template_support import TemplateSupport, dropped, probe
from rlgate.client import GatewayClient
from rlgate.server.runner import ServerThread

# SmolLM2-135M-Instruct's chat template, as its GGUF file carries it
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
REVERSE = {"type": "function", "function": {"name": "reverse", "description": "Reverse a word.", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}
CALL = '<tool_call>[{"name": "reverse", "arguments": {"word": "apple"}}]</tool_call>'
USER = [{"role": "user", "content": "Reverse the word apple."}]


@pytest.fixture(scope="module")
def smol_tokenizer(tiny_tokenizer_dir):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(tiny_tokenizer_dir)
    tok.chat_template = SMOLLM2_TEMPLATE
    return tok


@pytest.fixture
def gateway(smol_tokenizer):
    """``url, engine, app = gateway(**config)``: SmolLM2's template, a fake engine replying from ``script``."""
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    with contextlib.ExitStack() as stack:
        def start(script=None, **config):
            engine = FakeEngine(smol_tokenizer, script=script)
            app = create_app(GatewayConfig(admin_key=ADMIN_KEY, **config), engine, MemoryStore(), smol_tokenizer,
                             stop_token_ids=stop_token_ids(smol_tokenizer))
            return stack.enter_context(ServerThread(app)), engine, app
        yield start


def _metric(text: str, name: str, **labels: str) -> float:
    found = 0.0
    for match in re.finditer(rf"^{name}{{([^}}]*)}} (\S+)$", text, flags=re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(match.group(2))
    return found


def test_the_probe_finds_what_smollm2s_template_renders(smol_tokenizer, tokenizer):
    smol = resolve_family(smol_tokenizer)
    assert smol.name == "smollm2"
    assert probe(smol.renderer(smol_tokenizer), smol_tokenizer) == TemplateSupport(
        tools=False, tool_calls=False, tool_results=True, reasoning=False)
    tiny = resolve_family(tokenizer)  # ChatML with tools: everything shows
    assert probe(tiny.renderer(tokenizer), tokenizer) == TemplateSupport()


def test_dropped_names_only_what_the_rendered_messages_carry():
    none = TemplateSupport(tools=False, tool_calls=False, tool_results=False, reasoning=False)
    tool = ToolSpec("reverse")
    reply = Message(role="assistant", tool_calls=[ToolCall("c", "reverse", "{}")], reasoning="hmm")
    result = Message.of("tool", "elppa", tool_call_id="c")
    picture = Message(role="user", content=[ImagePart(url="https://example.com/a.png")])
    assert dropped(none, [Message.of("user", "hi")], []) == []
    assert dropped(none, [Message.of("user", "hi")], [tool]) == ["tools"]
    assert dropped(none, [reply, result, picture], [tool]) == ["tools", "tool_calls", "tool_results", "reasoning",
                                                              "images"]
    assert dropped(TemplateSupport(), [reply, result, picture], [tool]) == ["images"]  # never pixels


async def test_dropped_tools_are_named_in_the_response_the_metrics_the_log_and_the_samples(gateway, caplog):
    """Friction 3: with SmolLM2's template an agent's tools= vanished from the prompt, silently."""
    url, engine, _ = gateway(script=["Sure.", "Sure.", "Sure."])
    async with GatewayClient(url, ADMIN_KEY) as gw:
        s = await gw.start_session("drops")
        oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
        ant = AsyncAnthropic(base_url=s.anthropic_base_url, api_key=s.api_key, max_retries=0)
        with caplog.at_level(logging.WARNING, logger="rlgate.generation"):
            for _ in range(2):
                raw = await oai.chat.completions.with_raw_response.create(model="m", messages=USER, tools=[REVERSE])
                assert raw.headers["x-rlgate-template-dropped"] == "tools"
            raw = await ant.messages.with_raw_response.create(
                model="m", max_tokens=8, messages=USER, tools=[{"name": "reverse", "description": "Reverse a word.",
                                                                "input_schema": REVERSE["function"]["parameters"]}])
            assert raw.headers["x-rlgate-template-dropped"] == "tools"
            plain = await oai.chat.completions.with_raw_response.create(model="m", messages=USER)
            assert "x-rlgate-template-dropped" not in plain.headers
        await oai.close()
        await ant.close()
        warnings = [r.getMessage() for r in caplog.records if "does not render" in r.getMessage()]
        assert len(warnings) == 1 and "tool_prompt" in warnings[0], warnings  # once per gateway
        assert "reverse" not in engine.tokenizer.decode(engine.requests[0].input_ids)  # the model never saw it
        async with httpx.AsyncClient() as h:
            metrics = (await h.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN_KEY}"})).text
        assert _metric(metrics, "rlgate_template_dropped_total", part="tools", api="chat") == 2
        assert _metric(metrics, "rlgate_template_dropped_total", part="tools", api="messages") == 1
        await s.end()
        samples = (await s.export())["interactions"]
    assert [("dropped_tools" in x["flags"]) for x in samples] == [True, True, True, False]


async def test_tool_prompt_auto_shows_the_tools_and_a_tool_round_stays_one_token_chain(gateway):
    url, engine, app = gateway(script=[CALL, "elppa"], tool_prompt="auto")
    assert app.state.gateway.generation.template_support.tools
    async with GatewayClient(url, ADMIN_KEY) as gw:
        s = await gw.start_session("tool-prompt")
        oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
        raw = await oai.chat.completions.with_raw_response.create(model="m", messages=USER, tools=[REVERSE])
        assert "x-rlgate-template-dropped" not in raw.headers
        call = raw.parse().choices[0].message
        assert call.tool_calls and call.tool_calls[0].function.name == "reverse"
        assert json.loads(call.tool_calls[0].function.arguments) == {"word": "apple"}
        messages = [*USER, call.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "elppa"}]
        raw = await oai.chat.completions.with_raw_response.create(model="m", messages=messages, tools=[REVERSE])
        assert "x-rlgate-template-dropped" not in raw.headers and raw.parse().choices[0].message.content == "elppa"
        await oai.close()
        await s.end()
        export = await s.export(style="concat")
    first = engine.tokenizer.decode(engine.requests[0].input_ids)
    assert '<tools>[{"name": "reverse", "description": "Reverse a word."' in first
    assert "<tool_call>[{" in first and "SmolLM" not in first  # the description replaced the default system prompt
    second = engine.requests[1].input_ids
    assert second[:len(engine.requests[0].input_ids)] == engine.requests[0].input_ids  # bridged, not re-rendered
    assert engine.tokenizer.decode(second).count("<tools>") == 1
    assert export["stats"]["fork"] == 0 and len(export["interactions"]) == 1
    assert not [f for f in export["interactions"][0]["flags"] if f.startswith("dropped_")]


async def test_a_fresh_rendering_with_tool_prompt_auto_writes_earlier_calls_as_the_model_did(gateway):
    """A history the gateway renders afresh (here: a session in rerender mode) keeps the assistant's
    tool call, which SmolLM2's template would drop, as the <tool_call> text the model produced."""
    url, engine, _ = gateway(script=["elppa"], tool_prompt="auto")
    async with GatewayClient(url, ADMIN_KEY) as gw:
        s = await gw.start_session("fresh", mode="rerender")
        oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
        messages = [*USER, {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "reverse", "arguments": '{"word": "apple"}'}}]}, {"role": "tool", "tool_call_id": "c1",
                                                                       "content": "elppa"}]
        raw = await oai.chat.completions.with_raw_response.create(model="m", messages=messages, tools=[REVERSE])
        assert "x-rlgate-template-dropped" not in raw.headers
        await oai.close()
    prompt = engine.tokenizer.decode(engine.requests[0].input_ids)
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n<|im_start|>tool\nelppa<|im_end|>" in prompt


def test_tool_prompt_auto_refuses_a_parser_that_cannot_read_its_format(smol_tokenizer):
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    with pytest.raises(ValueError, match="renders no tools and its tool parser"):
        create_app(GatewayConfig(admin_key=ADMIN_KEY, tool_prompt="auto", tool_parser="llama3_json"),
                   FakeEngine(smol_tokenizer), MemoryStore(), smol_tokenizer)


@pytest.mark.torch  # the in-process gateway imports the local engine, scripted or not
@pytest.mark.timeout(600)
async def test_rlgate_check_warns_loudly_when_the_model_never_saw_the_agents_tools(tiny_model_dir, tmp_path,
                                                                                   monkeypatch):
    """Friction 3: `rlgate check` said "check passed" while SmolLM2's template dropped the agent's tools."""
    import shutil

    import yaml

    from rlgate.train.check import check
    from rlgate.train.config import load_config
    from test_run_frictions import TOOL_AGENT

    shutil.copytree(tiny_model_dir, tmp_path / "smol")
    (tmp_path / "smol" / "chat_template.jinja").write_text(SMOLLM2_TEMPLATE)
    (tmp_path / "tool_agent.py").write_text(TOOL_AGENT)
    (tmp_path / "words.jsonl").write_text(json.dumps({"word": "apple"}) + "\n")
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({
        "model": "smol", "out_dir": "run", "dataset": "words.jsonl", "agent": "tool_agent:LookupAgent",
        "gateway": {"engine": "scripted"}, "rollout": {"export_style": "concat"}}))
    monkeypatch.chdir(tmp_path)
    for overrides, warned in (([], True), (["gateway.tool_prompt=auto"], False)):
        lines: list[str] = []
        assert await check(load_config("cfg.yaml", overrides), print_fn=lines.append) == 0
        out = "\n".join(lines)
        assert ("check passed WITH WARNINGS" in out) is warned and ("check passed:" in out) is not warned, out
        assert ("WARNING: the chat template of smol left part of the agent's requests out" in out) is warned, out
        assert ("tools: in 1 sample(s) (flag dropped_tools)" in out) is warned
        assert "gateway.tool_prompt=auto" in out or not warned
        assert ("<tool_call>" in out) is not warned, out  # auto: the scripted engine sees the tool and calls it
