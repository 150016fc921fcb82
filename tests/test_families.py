"""Model families on real vocabularies and real chat templates: detection, parity, one chain per conversation.

Every family's tiny checkpoint (rlgate.testing.families) is built once per test session. The
conversation tests drive the app in-process with the official OpenAI SDK (streamed and not),
with the fake engine replaying what the family's model writes (tests/family_scripts.py), so tool
calls and reasoning happen on every turn; the logprob test runs the local engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import ADMIN_KEY, admin_headers, key_headers, start_session
from rlgate.chat.conversation import Message, ToolCall, ToolSpec
from rlgate.testing.family_scripts import FORMATS, script_ids

FAMILIES = list(FORMATS)
# Families in the fast suite: one on the real Qwen vocabulary (the slow BPE build happens once)
# and the cheap synthetic-vocabulary ones; the other Qwen-vocabulary families run with -m slow.
FAST = {"qwen3", "llama3", "gpt_oss", "glm45", "kimi_k2"}


def _params(families: list[str]) -> list[Any]:
    return [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in families]


REAL_TEMPLATES = {"qwen3", "qwen3_2507_thinking", "qwen3_2507_instruct", "deepseek_r1", "llama3", "gpt_oss"}
# Families whose template renders every earlier turn as it was generated (no history rewriting).
STABLE_HISTORY = {"llama3", "kimi_k2"}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
# Llama 3's template puts today's date in the system turn; pin it.
KWARGS = {"llama3": {"date_string": "26 Jul 2024"}, "gpt_oss": {}}


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory: pytest.TempPathFactory):
    """``family_dirs(name) -> checkpoint dir`` (built on first use, shared by the whole session)."""
    from rlgate.testing.families import build_family_checkpoint

    built: dict[str, Path] = {}
    bpe_cache: dict[str, Any] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = build_family_checkpoint(name, tmp_path_factory.mktemp(name), bpe_cache=bpe_cache)
        return built[name]

    return get


@pytest.fixture(scope="session")
def family_tokenizer():
    """``family_tokenizer(dir)``: the checkpoint's tokenizer as ``from_pretrained`` loads it, once per directory."""
    from transformers import AutoTokenizer

    loaded: dict[Path, Any] = {}

    def get(path: Path) -> Any:
        if path not in loaded:
            loaded[path] = AutoTokenizer.from_pretrained(path)
        return loaded[path]

    return get


# --------------------------------------------------------------------------- detection


@pytest.mark.parametrize("family", _params(FAMILIES))
def test_detection_from_the_checkpoint(family_dirs, family_tokenizer, family):
    from rlgate.chat.families.registry import resolve_family

    path = family_dirs(family)
    tok = family_tokenizer(path)
    assert resolve_family(tok).name == family  # the directory name plays no part (pytest's tmp name)
    assert resolve_family(tok, "jinja").name == "generic"  # --renderer jinja forces the generic renderer


def test_unknown_template_gets_the_generic_renderer(tokenizer):
    from rlgate.chat.families.registry import resolve_family

    fam = resolve_family(tokenizer)  # the demo's tiny ChatML model
    assert fam.name == "generic" and fam.tool_parser == "hermes" and fam.reasoning_parser == "think"
    with pytest.raises(ValueError, match="unknown renderer"):
        resolve_family(tokenizer, "no-such-family")


# --------------------------------------------------------------------------- parity


def _conversations() -> dict[str, list[Message]]:
    call = ToolCall("call_1", "add", json.dumps({"a": 1, "b": 2}))
    return {
        "plain": [Message.of("system", "Be brief."), Message.of("user", "hi"), Message.of("assistant", "Hello!"),
                  Message.of("user", "2+2?")],
        "reasoning": [Message.of("user", "hi"), Message.of("assistant", "Hello!", reasoning="greet"),
                      Message.of("user", "2+2?")],
        "tools": [Message.of("user", "add 1 2"), Message(role="assistant", tool_calls=[call]),
                  Message.of("tool", "3", tool_call_id="call_1"), Message.of("assistant", "It is 3."),
                  Message.of("user", "thanks")],
    }


@pytest.mark.parametrize("family", _params(FAMILIES))
def test_fresh_rendering_matches_the_chat_template(family_dirs, family_tokenizer, family):
    """The family's renderer == the checkpoint's own template (official for the six real ones)."""
    from rlgate.chat.families.registry import resolve_family
    from rlgate.chat.render import ChatRenderer

    tok = family_tokenizer(family_dirs(family))
    fam = resolve_family(tok)
    renderer = fam.renderer(tok)
    jinja = ChatRenderer(tok)
    kwargs = KWARGS.get(family) or None
    checked = 0
    for name, msgs in _conversations().items():
        tools = [ToolSpec("add", "Add two integers", TOOLS[0]["function"]["parameters"])] if name == "tools" else None
        if family == "gpt_oss":  # its template writes today's date
            continue
        if family not in REAL_TEMPLATES and name == "tools":  # stand-in templates: plain turns only
            continue
        assert renderer.render_ids(msgs, tools, kwargs) == jinja.render_ids(msgs, tools, kwargs), (family, name)
        checked += 1
    assert checked or family == "gpt_oss"


def _hf_ids(tok, msgs: list[Message], tools: list[ToolSpec] | None, kwargs: dict[str, Any]) -> list[int]:
    """Hugging Face ``apply_chat_template`` with the checkpoint's template (what vLLM and SGLang serve)."""
    from rlgate.chat.render import message_to_template

    text = tok.apply_chat_template([message_to_template(m) for m in msgs], tools=[t.to_openai() for t in tools or []]
                                   or None, tokenize=False, add_generation_prompt=True, **kwargs)
    return tok.encode(text, add_special_tokens=False)


def _thinking_variants(tok, family: str) -> list[dict[str, Any]]:
    base = KWARGS.get(family) or {}
    if "enable_thinking" not in tok.chat_template:
        return [base]
    return [base, {**base, "enable_thinking": False}, {**base, "enable_thinking": True}]


@pytest.mark.parametrize("family", _params(FAMILIES))
def test_fresh_rendering_is_apply_chat_template_thinking_and_tools_on_and_off(family_dirs, family_tokenizer, family):
    """A fresh rendering (rerender mode, first turns, forks) == HF apply_chat_template with the family's template,
    byte for byte, with thinking on and off and tools on and off, earlier turns with and without reasoning
    (issue 26: Qwen3 with enable_thinking false wrote an empty <think> block on every earlier turn)."""
    from rlgate.chat.families.registry import resolve_family

    tok = family_tokenizer(family_dirs(family))
    renderer = resolve_family(tok).renderer(tok)
    spec = [ToolSpec("add", "Add two integers", TOOLS[0]["function"]["parameters"])]
    call = ToolCall("call_1", "add", json.dumps({"a": 1, "b": 2}))
    conversations = {**_conversations(), "reasoning then tools": [
        Message.of("user", "add 1 2"), Message(role="assistant", tool_calls=[call], reasoning="I add."),
        Message.of("tool", "3", tool_call_id="call_1"), Message.of("assistant", "It is 3.", reasoning="Done."),
        Message.of("user", "thanks")]}
    checked = 0
    for kwargs in _thinking_variants(tok, family):
        for name, msgs in conversations.items():
            if family == "gpt_oss" or (family not in REAL_TEMPLATES and "tools" in name):
                continue  # gpt-oss writes today's date; stand-in templates: plain turns only
            for tools in (None, spec):
                ours = renderer.render_ids(msgs, tools, kwargs or None)
                assert ours == _hf_ids(tok, msgs, tools, kwargs), (family, name, kwargs, bool(tools), tok.decode(ours))
                checked += 1
    assert checked or family == "gpt_oss"


async def test_rerender_mode_prompts_are_the_checkpoint_template(family_dirs, family_tokenizer):
    """The issue's case: real Qwen3 template, enable_thinking false, trajectory_mode rerender: every turn's
    prompt is apply_chat_template of the conversation so far (no empty <think> block on earlier turns)."""
    import httpx

    from rlgate.chat.conversation import message_from_openai
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    path = family_dirs("qwen3")
    tok = family_tokenizer(path)
    engine = FakeEngine(tok, script=["Hello!", '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
                                     "It is 3."])
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tok,
                     stop_token_ids=stop_token_ids(tok, path))
    kwargs = {"enable_thinking": False}
    spec = [ToolSpec("add", "Add two integers", TOOLS[0]["function"]["parameters"])]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        _, key = await start_session(c, mode="rerender")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        for turn, follow in enumerate([{"role": "user", "content": "Add 1 and 2."}, None, None]):
            r = await c.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS,
                                                           "chat_template_kwargs": kwargs}, headers=key_headers(key))
            assert r.status_code == 200, r.text
            expected = _hf_ids(tok, [message_from_openai(m) for m in messages], spec, kwargs)
            assert engine.requests[turn].input_ids == expected, tok.decode(engine.requests[turn].input_ids)
            msg = r.json()["choices"][0]["message"]
            messages.append({k: v for k, v in msg.items() if v is not None and k in ("role", "content", "tool_calls")})
            for tc in msg.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "3"})
            if follow:
                messages.append(follow)
    assert "<think>\n\n</think>\n\nHello!" not in tok.decode(engine.requests[2].input_ids)


# --------------------------------------------------------------------------- conversations


def _turns(family: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, kwargs) of the five replies of the scripted conversation."""
    return [
        ("think_call", {"reasoning": "I should add 1 and 2.", "args": {"a": 1, "b": 2}}),
        ("think_answer", {"reasoning": "The tool said 3.", "answer": "1 + 2 = 3."}),
        ("call", {"args": {"a": 3, "b": 4}, "index": 1}),
        ("answer", {"answer": "3 + 4 = 7."}),
        ("think_answer", {"reasoning": "Polite.", "answer": "You are welcome!"}),
    ]


def _script(tok, family: str) -> list[list[int]]:
    return script_ids(tok, family, _turns(family))


def _openai(app):
    import httpx2
    from openai import AsyncOpenAI

    def client(key: str) -> AsyncOpenAI:
        return AsyncOpenAI(api_key=key, base_url="http://gateway/v1",
                           http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)))

    return client


async def _ask(oai, messages, *, stream: bool, kwargs: dict[str, Any]) -> dict[str, Any]:
    extra = {"chat_template_kwargs": kwargs} if kwargs else {}
    if not stream:
        r = await oai.chat.completions.create(model="m", messages=messages, tools=TOOLS, extra_body=extra)
        return r.choices[0].message.model_dump(exclude_none=True)
    content, reasoning, calls = "", "", {}
    stream_ = await oai.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                extra_body=extra)
    async for chunk in stream_:
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] = tc.id or slot["id"]
            slot["function"]["name"] += (tc.function.name or "") if tc.function else ""
            slot["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


async def _conversation(app, family: str, *, echo_reasoning: bool) -> tuple[str, list[dict[str, Any]]]:
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        sid, key = await start_session(c)
        oai = _openai(app)(key)
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You add numbers."},
                                          {"role": "user", "content": "Add 1 and 2."}]
        replies = []
        for turn in range(5):
            msg = await _ask(oai, messages, stream=turn % 2 == 1, kwargs=KWARGS.get(family, {}))
            replies.append(msg)
            echoed = {k: v for k, v in msg.items() if k in ("role", "content", "tool_calls")
                      or (k == "reasoning_content" and echo_reasoning)}
            messages.append(echoed)
            for tc in msg.get("tool_calls") or []:
                a = json.loads(tc["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": str(a["a"] + a["b"])})
            if not msg.get("tool_calls") and turn < 4:
                messages.append({"role": "user", "content": "And 3 + 4?" if turn == 1 else "Thanks."})
        r = await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
        assert r.status_code == 200, r.text
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/export_trajectories", json={"session_id": sid, "style": "concat", "discount": 0.5,
                                                       "keep": True}, headers=admin_headers())
        assert r.status_code == 200, r.text
        concat = r.json()
        r = await c.post("/export_trajectories", json={"session_id": sid, "style": "individual"},
                         headers=admin_headers())
        individual = r.json()
    return json.dumps({"concat": concat, "individual": individual}), replies


@pytest.mark.parametrize("echo_reasoning", [True, False], ids=["reasoning-echoed", "reasoning-dropped"])
@pytest.mark.parametrize("family", _params(FAMILIES))
async def test_one_chain_per_conversation(family_dirs, family_tokenizer, family, echo_reasoning):
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    path = family_dirs(family)
    tok = family_tokenizer(path)
    script = _script(tok, family)
    engine = FakeEngine(tok, script=list(script))
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tok,
                     stop_token_ids=stop_token_ids(tok, path))
    raw, replies = await _conversation(app, family, echo_reasoning=echo_reasoning)
    out = json.loads(raw)
    concat, individual = out["concat"], out["individual"]

    # the replies were parsed: tool calls on turns 1 and 3, reasoning where the format has it
    assert [bool(r.get("tool_calls")) for r in replies] == [True, False, True, False, False]
    assert json.loads(replies[0]["tool_calls"][0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert replies[1]["content"] == "1 + 2 = 3." and replies[4]["content"] == "You are welcome!"
    if FORMATS[family].reasoning:
        assert replies[0]["reasoning_content"] == "I should add 1 and 2."
        assert replies[1]["reasoning_content"] == "The tool said 3."

    # one chain, no fork; every generated token under loss; the final reward reaches every turn
    assert concat["stats"]["fork"] == 0 and concat["stats"]["extend"] == 4, concat["stats"]
    (sample,) = concat["interactions"]
    assert len(sample["chain"]) == 5
    generated = sum(len(s["input_ids"]) - s["loss_mask"].index(1) for s in individual["interactions"])
    assert sum(sample["loss_mask"]) == generated == sum(len(s) for s in script)
    assert sample["turn_rewards"] == pytest.approx([0.0625, 0.125, 0.25, 0.5, 1.0])
    # each prompt is the previous prompt + its exact output + the new messages' tokens
    reqs = engine.requests
    for k in range(1, 5):
        prev = reqs[k - 1].input_ids + script[k - 1]
        assert reqs[k].input_ids[: len(prev)] == prev
        if replies[k - 1].get("tool_calls"):  # the call is in the parent's output: the bridge does not repeat it
            bridge = tok.decode(reqs[k].input_ids[len(prev):])
            assert '"a"' not in bridge and '"b"' not in bridge, (family, bridge)
    assert sample["input_ids"] == reqs[4].input_ids + script[4]


@pytest.mark.parametrize("family", _params(sorted(STABLE_HISTORY | {"qwen3_2507_instruct"})))
async def test_prompts_equal_the_family_rendering(family_dirs, family_tokenizer, family):
    """Where the template does not rewrite history, every bridged prompt == a fresh rendering."""
    from rlgate.chat.families.registry import resolve_family
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    path = family_dirs(family)
    tok = family_tokenizer(path)
    renderer = resolve_family(tok).renderer(tok)
    engine = FakeEngine(tok, script=_script(tok, family))
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tok,
                     stop_token_ids=stop_token_ids(tok, path))
    import httpx

    from rlgate.chat.conversation import message_from_openai

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        _, key = await start_session(c)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Add 1 and 2."}]
        for turn in range(3):
            r = await c.post("/v1/chat/completions", json={"messages": messages, "tools": TOOLS,
                             "chat_template_kwargs": KWARGS.get(family, {})}, headers=key_headers(key))
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            expected = renderer.render_ids([message_from_openai(m) for m in messages],
                                [ToolSpec("add", "Add two integers", TOOLS[0]["function"]["parameters"])],
                                KWARGS.get(family) or None)
            assert engine.requests[turn].input_ids == expected, f"turn {turn}"
            messages.append({k: v for k, v in msg.items() if v is not None and k in ("role", "content", "tool_calls")})
            for tc in msg.get("tool_calls") or []:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "3"})
            if not msg.get("tool_calls"):
                messages.append({"role": "user", "content": "next"})


# --------------------------------------------------------------------------- logprobs


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
async def test_local_engine_logprobs_match_teacher_forcing(family_dirs, family_tokenizer, family):
    """Multi-turn on the local engine: the concat sample's logprobs == a forward pass over it (1e-4)."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.config import GatewayConfig
    from rlgate.engine.local import LocalEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    path = family_dirs(family)
    tok = family_tokenizer(path)
    engine = LocalEngine(str(path), device="cpu", max_batch_size=4)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tok,
                     stop_token_ids=stop_token_ids(tok, path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        sid, key = await start_session(c)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Say something."}]
        for turn in range(3):
            r = await c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 8, "seed": turn,
                             "chat_template_kwargs": KWARGS.get(family, {})}, headers=key_headers(key))
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            messages += [{k: v for k, v in msg.items() if v is not None and k in ("role", "content")},
                         {"role": "user", "content": f"More {turn}."}]
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/export_trajectories", json={"session_id": sid, "style": "concat"}, headers=admin_headers())
    exp = r.json()
    assert exp["stats"]["fork"] == 0
    (sample,) = exp["interactions"]
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ids = torch.tensor([sample["input_ids"]])
    with torch.no_grad():
        logp = model(ids).logits.float().log_softmax(-1)[0]
    diffs = [abs(logp[i - 1, t].item() - lp)
             for i, (t, m, lp) in enumerate(zip(sample["input_ids"], sample["loss_mask"], sample["logprobs"], strict=True)) if m]
    assert len(diffs) == sum(sample["loss_mask"]) > 0
    assert max(diffs) < 1e-4


# --------------------------------------------------------------------------- rlgate serve


@pytest.mark.parametrize("family", _params(["llama3", "qwen3"]))
def test_serve_detects_and_prints_the_family(family_dirs, family):
    """``rlgate serve --model DIR`` picks the family's renderer and parsers and says so; --renderer overrides."""
    import os
    import subprocess
    import sys

    import httpx

    from helpers import free_port, wait_healthy
    from rlgate.chat.families.registry import get_family

    path = family_dirs(family)
    fam = get_family(family)
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(path), "--engine", "fake",
         "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        line = ""
        for _ in range(50):  # warnings may come first; "" once the process has exited
            line = proc.stdout.readline()
            if not line or "model family" in line:
                break
        assert f"model family {fam.title} ({family})" in line, line
        assert f"tool parser {fam.tool_parser}" in line and f"reasoning parser {fam.reasoning_parser or 'none'}" in line
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        r = httpx.post(url + "/rl/start_session", json={"task_id": "x"}, headers=admin_headers())
        assert r.status_code == 200, r.text
        r = httpx.post(url + "/v1/chat/completions", headers=key_headers(r.json()["api_key"]), timeout=60,
                       json={"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

    r = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(path), "--engine", "fake",
                        "--port", str(free_port()), "--renderer", "no-such-family"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown renderer 'no-such-family'" in r.stderr + r.stdout


@pytest.mark.parametrize("family", _params(["qwen3", "qwen3_2507_thinking", "qwen3_5"]))
async def test_a_reply_that_ends_inside_its_reasoning_is_extended(family_dirs, family_tokenizer, family):
    """The ``renderers`` package declines to bridge a Qwen3 turn that ended inside an unclosed
    <think> block; the checkpoint's template bridges it, instead of a fork (template_not_incremental)."""
    import httpx

    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    path = family_dirs(family)
    tok = family_tokenizer(path)
    end = [tok.convert_tokens_to_ids("<|im_end|>")]
    pre = "<think>\n" if family == "qwen3" else ""  # the others' generation prompt opens it
    first = tok.encode(pre + "Thinking forever", add_special_tokens=False) + end
    second = tok.encode(pre + "x\n</think>\n\nHi.", add_special_tokens=False) + end
    engine = FakeEngine(tok, script=[first, second])
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tok,
                     stop_token_ids=stop_token_ids(tok, path))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        sid, key = await start_session(c)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
        r = await c.post("/v1/chat/completions", json={"messages": messages}, headers=key_headers(key))
        reply = r.json()["choices"][0]["message"]
        assert reply["reasoning_content"] and not reply["content"]
        messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "again"}]
        r = await c.post("/v1/chat/completions", json={"messages": messages}, headers=key_headers(key))
        assert r.status_code == 200, r.text
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    turns = r.json()["interactions"]
    assert [(t["relation"], t.get("fork_reason")) for t in turns] == [("root", None), ("extend", None)]
    prev = engine.requests[0].input_ids + first
    assert engine.requests[1].input_ids[: len(prev)] == prev
    assert tok.decode(engine.requests[1].input_ids[len(prev):]).startswith("\n<|im_start|>user\nagain<|im_end|>")
