"""Agent frameworks with their default settings against a gateway on 127.0.0.1 (docs/agents.md).

Each test runs the real package (skipped, saying why, when it is not installed), plays one tool
round with the fake engine and counts the conversations the session records: one conversation
per episode is the goal (a fork breaks the token chain the trainer learns from).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.engine.base import GenerateRequest
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread


def call_text(name: str, args: dict[str, Any]) -> str:
    """A Hermes tool call as the tiny model's template writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


class Turns:
    """Replies by turn: the n-th request of the session gets ``replies[n]`` (the last one after that)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = replies
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, request: GenerateRequest) -> str:
        with self.lock:
            reply = self.replies[min(self.n, len(self.replies) - 1)]
            self.n += 1
        return reply


@contextlib.asynccontextmanager
async def gateway(app):
    """``(url, admin client, session id, session key)`` on a live server."""
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin, "framework")
            yield url, admin, sid, key


async def export(admin, sid, key) -> dict:
    await admin.post("/rl/end_session", headers=key_headers(key))
    r = await admin.post("/export_trajectories", json={"session_id": sid, "style": "concat"},
                         headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


# --------------------------------------------------------------------------- smolagents


async def test_smolagents_tool_calling_agent_is_one_conversation(make_app, tokenizer):
    """smolagents 1.26 ToolCallingAgent re-sends the model's tool calls as assistant text
    ("Calling tools:\\n[{'id': ..., 'function': {...}}]") and the results as user messages
    ("Observation:\\n..."): the smolagents matcher finds the model's own calls in that text by their
    ids, so every turn extends its parent (before: every follow-up forked with no_prefix_match)."""
    smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install smolagents)")
    import asyncio

    engine = FakeEngine(tokenizer, script=Turns([
        "I will add.\n" + call_text("add", {"a": 1, "b": 2}), call_text("add", {"a": 3, "b": 4}),
        call_text("final_answer", {"answer": "3 and 7"})]), max_context_length=65536)
    async with gateway(make_app(engine)) as (url, admin, sid, key):

        @smolagents.tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first integer
                b: the second integer
            """
            return a + b

        model = smolagents.OpenAIModel(model_id="tiny", api_base=url + "/v1", api_key=key)
        agent = smolagents.ToolCallingAgent(tools=[add], model=model, max_steps=5, verbosity_level=0)
        answer = await asyncio.to_thread(agent.run, "What are 1 + 2 and 3 + 4?")
        exp = await export(admin, sid, key)
    assert answer == "3 and 7"
    stats = exp["stats"]
    assert (stats["completed"], stats["fork"], stats["conversations"]) == (3, 0, 1), stats
    (sample,) = exp["interactions"]
    assert len(sample["chain"]) == 3
    # one token sequence: each prompt is the previous prompt + the model's own call tokens + the observation
    # rendered as the user turn smolagents sent; every generated token under loss
    ids, mask = sample["input_ids"], sample["loss_mask"]
    runs = [k for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1])]
    assert runs == [len(r.input_ids) for r in engine.requests]
    assert all(ids[: len(r.input_ids)] == r.input_ids for r in engine.requests)
    ends = [k for k in range(1, len(mask)) if mask[k - 1] and not mask[k]]
    assert all("Observation:" in tokenizer.decode(ids[e:r]) for e, r in zip(ends, runs[1:], strict=True))
    # recorded as sent: the reply's text and its calls as one assistant text
    assert sample["messages"][2]["content"].startswith("I will add.\nCalling tools:\n[{'id': 'call_")


# --------------------------------------------------------------------------- mini-swe-agent


def _mini() -> list[str]:
    from rlgate.agents.mini_swe_agent import MiniNotFound, ensure_mini

    try:  # not installed by the tests: it pulls LiteLLM (~380 MB, minutes)
        return ensure_mini(install=False)
    except (MiniNotFound, OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"{exc} (python -m rlgate.agents.mini_swe_agent installs it)")


async def test_mini_swe_agent_episode_with_its_defaults(make_app, tokenizer):
    """mini-swe-agent 2.4 (the real package, its own venv) plays one episode with the harness: one bash
    command, then it submits. Offline, without a terminal, with its default config (issue 26: its setup
    wizard aborted without a terminal, and the first call raised a cost-calculation error)."""
    from rlgate.agents.mini_swe_agent import MiniSweAgent

    exe = _mini()
    engine = FakeEngine(tokenizer, script=Turns([
        "I will look.\n" + call_text("bash", {"command": "echo hi > made_by_agent.txt && ls"}),
        "Done.\n" + call_text("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]),
        max_context_length=65536)
    seen: dict[str, Any] = {}

    def verify(workdir, transcript, data):
        seen["file"] = (workdir / "made_by_agent.txt").read_text() if (workdir / "made_by_agent.txt").exists() else None
        seen["transcript"] = transcript
        return 1.0 if seen["file"] == "hi\n" else 0.0

    agent = MiniSweAgent(verifier=verify, executable=exe, model="tiny", time_limit=300)
    async with gateway(make_app(engine)) as (url, admin, sid, key):
        reward = await agent.run({"prompt": "Create made_by_agent.txt."}, base_url=url, api_key=key)
        exp = await export(admin, sid, key)
    t = seen["transcript"]
    assert reward == 1.0, (t.returncode, t.stdout[-3000:], t.stderr[-3000:])
    assert t.returncode == 0 and not t.timed_out
    stats = exp["stats"]
    assert (stats["completed"], stats["fork"], stats["conversations"]) == (2, 0, 1), stats


# --------------------------------------------------------------------------- Python frameworks

ADD_CALL = call_text("add", {"a": 1, "b": 2})
THINK_CALL = "<think>I should add.</think>" + ADD_CALL


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _stats(exp: dict) -> tuple[int, int, int]:
    s = exp["stats"]
    return s["completed"], s["fork"], s["conversations"]


async def test_openai_agents_sdk_defaults_with_tracing_off(make_app, tokenizer):
    """The Agents SDK with its default model (Responses API), no token limit (the gateway now allows the
    rest of the context), tracing off (set_tracing_disabled / OPENAI_AGENTS_DISABLE_TRACING=1: else it
    sends the session key to api.openai.com's trace endpoint)."""
    agents = pytest.importorskip("agents", reason="openai-agents is not installed")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key):
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key)
        model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
        agent = agents.Agent(name="adder", instructions="Use the tool.", model=model,
                             tools=[agents.function_tool(add)])
        result = await agents.Runner.run(agent, "What is 1 + 2?")
        exp = await export(admin, sid, key)
    assert result.final_output == "It is 3."
    assert _stats(exp) == (2, 0, 1)


async def test_pydantic_ai_defaults(make_app, tokenizer):
    """pydantic-ai 2.68 (OpenAI Chat model, strict tools: reported, not enforced) and its Anthropic model."""
    pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed (pip install 'pydantic-ai-slim[openai,anthropic]')")
    import httpx2
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.anthropic import AnthropicProvider
    from pydantic_ai.providers.openai import OpenAIProvider

    ignored: list[str | None] = []

    async def note(response: Any) -> None:
        ignored.append(response.headers.get("x-rlgate-ignored-params"))

    for kind in ("openai", "anthropic"):
        engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))

        async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key):
            if kind == "openai":  # its tools carry strict: true, which the gateway reports (not enforced)
                client = httpx2.AsyncClient(event_hooks={"response": [note]})
                model: Any = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=url + "/v1", api_key=key,
                                                                             http_client=client))
            else:
                model = AnthropicModel("tiny", provider=AnthropicProvider(base_url=url, api_key=key))
            agent = Agent(model, tools=[add])
            result = await agent.run("What is 1 + 2?")
            exp = await export(admin, sid, key)
        assert result.output == "It is 3.", kind
        assert _stats(exp) == (2, 0, 1), kind
        if kind == "openai":
            assert ignored == ["tools.function.strict"] * 2


@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
async def test_langgraph_agent_defaults(make_app, tokenizer, kind):
    """LangChain 1.x create_agent (a LangGraph graph) with ChatOpenAI (Chat and Responses) and ChatAnthropic."""
    lc_agents = pytest.importorskip("langchain.agents", reason="langchain / langgraph are not installed")
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key):
        if kind == "anthropic":
            chat_anthropic = pytest.importorskip("langchain_anthropic", reason="langchain-anthropic is not installed")
            model: Any = chat_anthropic.ChatAnthropic(model="tiny", base_url=url, api_key=key)
        else:
            from langchain_openai import ChatOpenAI

            model = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key=key, use_responses_api=kind == "responses")
        agent = lc_agents.create_agent(model, tools=[add])
        out = await agent.ainvoke({"messages": [{"role": "user", "content": "What is 1 + 2?"}]})
        exp = await export(admin, sid, key)
    assert out["messages"][-1].text == "It is 3."
    assert _stats(exp) == (2, 0, 1)


# --------------------------------------------------------------------------- LiteLLM (mini-swe-agent's venv)

LITELLM_ROUND = r'''
import json, sys
import litellm
url, key, kind = sys.argv[1:4]
tools = [{"type": "function", "function": {"name": "add", "description": "Add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
model, base = {"openai": ("openai/tiny", url + "/v1"), "anthropic": ("anthropic/tiny", url),
               "anthropic_v1": ("anthropic/tiny", url + "/v1")}[kind]
messages = [{"role": "user", "content": "What is 1 + 2?"}]
try:
    r = litellm.completion(model=model, api_base=base, api_key=key, messages=messages, tools=tools)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "status": getattr(exc, "status_code", None)}))
    sys.exit(0)
msg = r.choices[0].message
call = msg.tool_calls[0]
messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "3"}]
r2 = litellm.completion(model=model, api_base=base, api_key=key, messages=messages, tools=tools)
print(json.dumps({"version": litellm._version.version if hasattr(litellm, "_version") else "",
                  "call": call.function.name, "answer": r2.choices[0].message.content}))
'''


@pytest.mark.parametrize("kind", ["openai", "anthropic", "anthropic_v1"])
async def test_litellm_openai_and_anthropic_providers(make_app, tokenizer, kind, tmp_path):
    """LiteLLM (from mini-swe-agent's venv: 380 MB, not a test dependency) with its defaults. ``anthropic/``
    takes the gateway ROOT as api_base (it appends /v1/messages itself): with ``…/v1`` it calls
    /v1/v1/messages, a 404 (documented in docs/agents.md, not served as an alias)."""
    import asyncio

    exe = _mini()
    python = str(Path(exe[0]).parent / "python")
    script = tmp_path / "round.py"
    script.write_text(LITELLM_ROUND)
    engine = FakeEngine(tokenizer, script=Turns([ADD_CALL, "It is 3."]))
    async with gateway(make_app(engine)) as (url, admin, sid, key):
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        proc = await asyncio.create_subprocess_exec(python, str(script), url, key, kind, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        exp = await export(admin, sid, key)
    if kind == "anthropic_v1":
        assert result == {"error": "NotFoundError", "status": 404}
        return
    assert (result["call"], result["answer"]) == ("add", "It is 3."), result
    assert _stats(exp) == (2, 0, 1)


# --------------------------------------------------------------------------- Vercel AI SDK (npm)

AI_SDK_ROUND = r'''
const prefix = process.env.SDK_PREFIX + "/node_modules/";
const { generateText, tool, stepCountIs, jsonSchema } = require(prefix + "ai");
const { createOpenAI } = require(prefix + "@ai-sdk/openai");
const { createAnthropic } = require(prefix + "@ai-sdk/anthropic");
const [url, key, kind] = process.argv.slice(2);
const model = kind === "openai" ? createOpenAI({ baseURL: url + "/v1", apiKey: key })("tiny")  // Responses API
  : kind === "openai_chat" ? createOpenAI({ baseURL: url + "/v1", apiKey: key }).chat("tiny")
  : createAnthropic({ baseURL: url + "/v1", apiKey: key })("tiny");
const add = tool({
  description: "Add two integers",
  inputSchema: jsonSchema({ type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } },
                            required: ["a", "b"] }),
  execute: async ({ a, b }) => a + b,
});
(async () => {
  const r = await generateText({ model, tools: { add }, stopWhen: stepCountIs(3), prompt: "What is 1 + 2?" });
  console.log(JSON.stringify({ text: r.text, steps: r.steps.length }));
})().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(0); });
'''
SDK_PREFIX = Path.home() / ".cache" / "rlgate-npm-sdk"


def _ai_sdk() -> Path:
    """The npm prefix holding ai, @ai-sdk/openai and @ai-sdk/anthropic (installed if npm can)."""
    import shutil

    if not (SDK_PREFIX / "node_modules" / "@ai-sdk" / "anthropic").is_dir():
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            pytest.skip("node / npm are not installed")
        proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(SDK_PREFIX), "ai@6",
                               "@ai-sdk/openai@3", "@ai-sdk/anthropic@3"], capture_output=True, text=True, timeout=600,
                              check=False)
        if proc.returncode != 0:
            pytest.skip(f"npm could not install the AI SDK: {proc.stderr.strip()[-500:]}")
    return SDK_PREFIX


@pytest.mark.xdist_group("npm-ai-sdk")  # one npm install into the shared prefix at a time
@pytest.mark.parametrize("kind", ["openai", "openai_chat", "anthropic"])
async def test_vercel_ai_sdk_defaults(make_app, tokenizer, kind, tmp_path):
    """The Vercel AI SDK (ai 6, @ai-sdk/openai 3, @ai-sdk/anthropic 3) with its defaults: openai() is the
    Responses API with store on, and sends the reasoning item it received back as an item_reference
    (issue 26: answered 400 before); .chat() is Chat Completions; the Anthropic provider Messages."""
    import asyncio

    prefix = _ai_sdk()
    script = tmp_path / "round.js"
    script.write_text(AI_SDK_ROUND)
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key):
        proc = await asyncio.create_subprocess_exec("node", str(script), url, key, kind,
                                                    env={"SDK_PREFIX": str(prefix), "PATH": "/usr/bin:/bin"},
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        result = json.loads(out.decode().strip().splitlines()[-1])
        exp = await export(admin, sid, key)
    assert result == {"text": "It is 3.", "steps": 2}, (result, err.decode()[-2000:])
    assert _stats(exp) == (2, 0, 1)
    if kind == "openai":  # the second request named the reasoning item by reference
        second = exp["interactions"][0]["messages"]
        assert any(m.get("reasoning_content") == "I should add." for m in second if m["role"] == "assistant")


# --------------------------------------------------------------------------- Claude Agent SDK (own venv)

CLAUDE_AGENT_ROUND = r'''
import asyncio, json, sys
from claude_agent_sdk import ClaudeAgentOptions, query
url, key, workdir, home = sys.argv[1:5]
async def main():
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "HOME": home, "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    kinds = []
    async for m in query(prompt="List the files here.", options=ClaudeAgentOptions(cwd=workdir, env=env)):
        kinds.append(type(m).__name__)
        if type(m).__name__ == "ResultMessage":
            print(json.dumps({"kinds": kinds, "is_error": m.is_error, "result": m.result}))
asyncio.run(main())
'''
CLAUDE_AGENT_VENV = Path.home() / ".cache" / "rlgate-venvs" / "claude-agent-sdk"


async def test_claude_agent_sdk_defaults(make_app, tokenizer, tmp_path):
    """The Claude Agent SDK (it runs the Claude Code CLI it bundles; 178 MB, so its own venv, not a test
    dependency) with its default options: one Bash tool round, recorded as one chain."""
    import asyncio

    from rlgate.engine.fake import ToolRoundScript

    python = CLAUDE_AGENT_VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"claude-agent-sdk is not installed in {CLAUDE_AGENT_VENV} (python -m venv it; pip install "
                    "claude-agent-sdk: a 178 MB wheel)")
    script = ToolRoundScript(tokenizer, prefer=("Bash",), text="ls", answer="Listed.")
    engine = FakeEngine(tokenizer, script=script, max_context_length=400_000)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text("hi\n")
    (tmp_path / "round.py").write_text(CLAUDE_AGENT_ROUND)
    async with gateway(make_app(engine)) as (url, admin, sid, key):
        proc = await asyncio.create_subprocess_exec(
            str(python), str(tmp_path / "round.py"), url, key, str(work), str(home),
            env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 600)
        exp = await export(admin, sid, key)
    lines = out.decode().strip().splitlines()
    assert lines, err.decode()[-3000:]
    result = json.loads(lines[-1])
    assert not result["is_error"] and result["result"] == "Listed.", (result, err.decode()[-2000:])
    assert [c["name"] for c in script.calls] == ["Bash"]
    assert _stats(exp) == (2, 0, 1), exp["stats"]


# --------------------------------------------------------------------------- opencode (npm)

OPENCODE_PREFIX = Path.home() / ".cache" / "rlgate-npm-opencode"


async def test_opencode_defaults(make_app, tokenizer, tmp_path):
    """opencode 1.18 (npm opencode-ai; skipped when absent) with an OpenAI-compatible provider pointed at the
    gateway: its bash tool round is one chain; its title request is a conversation of its own."""
    import asyncio

    from rlgate.engine.fake import ToolRoundScript

    exe = OPENCODE_PREFIX / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
    if not exe.is_file():
        pytest.skip(f"opencode is not installed under {OPENCODE_PREFIX} (npm install --prefix it opencode-ai)")
    script = ToolRoundScript(tokenizer, prefer=("bash",), text="ls", answer="Listed.")
    engine = FakeEngine(tokenizer, script=script, max_context_length=400_000)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text("hi\n")
    async with gateway(make_app(engine)) as (url, admin, sid, key):
        (work / "opencode.json").write_text(json.dumps({
            "provider": {"rlgate": {"npm": "@ai-sdk/openai-compatible", "name": "rlgate",
                                    "options": {"baseURL": url + "/v1", "apiKey": key},
                                    "models": {"tiny": {"name": "tiny"}}}},
            "model": "rlgate/tiny"}))
        proc = await asyncio.create_subprocess_exec(
            str(exe), "run", "List the files here.", cwd=work, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin", "HOME": str(home),
                                                 "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"})
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        exp = await export(admin, sid, key)
    if proc.returncode != 0 and not script.calls:
        pytest.skip(f"opencode could not start here (it fetches its provider package from npm): {err.decode()[-500:]}")
    assert "Listed." in out.decode(), (out.decode()[-2000:], err.decode()[-2000:])
    assert [c["name"] for c in script.calls] == ["bash"]
    chains = [i for i in exp["interactions"] if len(i["chain"]) > 1]
    assert len(chains) == 1 and len(chains[0]["chain"]) == 2, exp["stats"]
    assert exp["stats"]["conversations"] == len(exp["interactions"]), exp["stats"]  # + its side request(s)
