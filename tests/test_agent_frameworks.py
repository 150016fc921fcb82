"""Agent frameworks with their default settings against a gateway on 127.0.0.1 (docs/agents.md).

Each test runs the real package, plays one tool round with the fake engine and counts the conversations the
session records: one conversation per episode is the goal (a fork breaks the token chain the trainer
learns from). smolagents and the OpenAI Agents SDK run in the project's venv; the others in their own
environments (tests/framework_envs.py, installed by ``make framework-envs``), as scripts in
tests/frameworks/, and are marked slow (``make test-fast`` needs no framework environment);
tests/test_agent_frameworks_more.py has the frameworks added by issue 39.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import framework_envs
from framework_helpers import ADD_CALL, THINK_CALL, Turns, call_text, export, gateway, record, run_script, stats
from rlgate.engine.fake import FakeEngine, ToolRoundScript

# --------------------------------------------------------------------------- smolagents


async def test_smolagents_tool_calling_agent_is_one_conversation(make_app, tokenizer, record_property):
    """smolagents 1.26 ToolCallingAgent re-sends the model's tool calls as assistant text
    ("Calling tools:\\n[{'id': ..., 'function': {...}}]") and the results as user messages
    ("Observation:\\n..."): the smolagents matcher finds the model's own calls in that text by their
    ids, so every turn extends its parent (before: every follow-up forked with no_prefix_match)."""
    smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install smolagents)")
    import asyncio

    engine = FakeEngine(tokenizer, script=Turns([
        "I will add.\n" + call_text("add", {"a": 1, "b": 2}), call_text("add", {"a": 3, "b": 4}),
        call_text("final_answer", {"answer": "3 and 7"})]), max_context_length=65536)
    async with gateway(make_app(engine)) as (url, admin, sid, key, _):

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
    record(record_property, "smolagents ToolCallingAgent", {"smolagents": smolagents.__version__}, "project venv")
    assert stats(exp) == (3, 0, 1), exp["stats"]
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


# --------------------------------------------------------------------------- mini-swe-agent (agents env)


@pytest.mark.slow
async def test_mini_swe_agent_episode_with_its_defaults(make_app, tokenizer, record_property):
    """mini-swe-agent 2.4 (the real package, from the agents environment) plays one episode with the harness:
    one bash command, then it submits. Offline, without a terminal, with its default config (issue 26: its
    setup wizard aborted without a terminal, and the first call raised a cost-calculation error)."""
    from rlgate.agents.mini_swe_agent import VERSION, MiniSweAgent

    assert framework_envs.pinned("agents", "mini-swe-agent") == VERSION  # the harness installs the version tested
    exe = framework_envs.require("agents") / "bin" / "mini"
    engine = FakeEngine(tokenizer, script=Turns([
        "I will look.\n" + call_text("bash", {"command": "echo hi > made_by_agent.txt && ls"}),
        "Done.\n" + call_text("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]),
        max_context_length=65536)
    seen: dict[str, Any] = {}

    def verify(workdir, transcript, data):
        seen["file"] = (workdir / "made_by_agent.txt").read_text() if (workdir / "made_by_agent.txt").exists() else None
        seen["transcript"] = transcript
        return 1.0 if seen["file"] == "hi\n" else 0.0

    agent = MiniSweAgent(verifier=verify, executable=[str(exe)], model="tiny", time_limit=300)
    async with gateway(make_app(engine)) as (url, admin, sid, key, _):
        reward = await agent.run({"prompt": "Create made_by_agent.txt."}, base_url=url, api_key=key)
        exp = await export(admin, sid, key)
    t = seen["transcript"]
    assert reward == 1.0, (t.returncode, t.stdout[-3000:], t.stderr[-3000:])
    assert t.returncode == 0 and not t.timed_out
    assert stats(exp) == (2, 0, 1), exp["stats"]
    record(record_property, "mini-swe-agent (harness MiniSweAgent)", {"mini-swe-agent": VERSION}, "agents")


# --------------------------------------------------------------------------- Python frameworks


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_openai_agents_sdk_defaults_with_tracing_off(make_app, tokenizer, record_property):
    """The Agents SDK with its default model (Responses API), no token limit (the gateway now allows the
    rest of the context), tracing off (set_tracing_disabled / OPENAI_AGENTS_DISABLE_TRACING=1: else it
    sends the session key to api.openai.com's trace endpoint)."""
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key, log):
        client = AsyncOpenAI(base_url=url + "/v1", api_key=key)
        model = agents.OpenAIResponsesModel(model="tiny", openai_client=client)
        agent = agents.Agent(name="adder", instructions="Use the tool.", model=model,
                             tools=[agents.function_tool(add)])
        result = await agents.Runner.run(agent, "What is 1 + 2?")
        exp = await export(admin, sid, key)
    assert result.final_output == "It is 3."
    assert stats(exp) == (2, 0, 1)
    assert log.ignored() == ["tools.strict"]
    from importlib.metadata import version

    record(record_property, "OpenAI Agents SDK", {"openai-agents": version("openai-agents")}, "project venv")


@pytest.mark.slow  # a framework environment (make framework-envs)
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_pydantic_ai_defaults(make_app, tokenizer, kind, tmp_path, record_property):
    """pydantic-ai 2.68: its OpenAI Chat model (strict tools: reported, not enforced) and its Anthropic model."""
    python = framework_envs.python("agents")
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key, log):
        out = await run_script(python, "pydantic_ai_agent.py", url, key, kind, home=tmp_path)
        exp = await export(admin, sid, key)
    assert out["answer"] == "It is 3.", out
    assert stats(exp) == (2, 0, 1)
    assert log.statuses() == [200, 200]
    assert log.ignored() == (["tools.function.strict"] if kind == "openai" else [])
    record(record_property, f"pydantic-ai ({kind})", out["versions"], "agents")


@pytest.mark.slow  # a framework environment (make framework-envs)
@pytest.mark.parametrize("kind", ["chat", "responses", "anthropic"])
async def test_langgraph_agent_defaults(make_app, tokenizer, kind, tmp_path, record_property):
    """LangChain 1.x create_agent (a LangGraph graph) with ChatOpenAI (Chat and Responses) and ChatAnthropic."""
    python = framework_envs.python("agents")
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key, log):
        out = await run_script(python, "langgraph_agent.py", url, key, kind, home=tmp_path)
        exp = await export(admin, sid, key)
    assert out["answer"] == "It is 3.", out
    assert stats(exp) == (2, 0, 1)
    assert log.ignored() == []
    record(record_property, f"LangChain create_agent ({kind})", out["versions"], "agents")


# --------------------------------------------------------------------------- LiteLLM (agents env)


@pytest.mark.slow  # a framework environment (make framework-envs)
@pytest.mark.parametrize("kind", ["openai", "anthropic", "anthropic_v1"])
async def test_litellm_openai_and_anthropic_providers(make_app, tokenizer, kind, tmp_path, record_property):
    """LiteLLM (mini-swe-agent's, DSPy's and the ADK's client: 380 MB, not a test dependency) with its
    defaults. ``anthropic/`` takes the gateway ROOT as api_base (it appends /v1/messages itself): with
    ``…/v1`` it calls /v1/v1/messages, a 404 (documented in docs/agents.md, not served as an alias)."""
    python = framework_envs.python("agents")
    engine = FakeEngine(tokenizer, script=Turns([ADD_CALL, "It is 3."]))
    async with gateway(make_app(engine)) as (url, admin, sid, key, _):
        result = await run_script(python, "litellm_round.py", url, key, kind, home=tmp_path,
                                  env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        exp = await export(admin, sid, key)
    if kind == "anthropic_v1":
        assert result == {"error": "NotFoundError", "status": 404}
        return
    assert (result["call"], result["answer"]) == ("add", "It is 3."), result
    assert stats(exp) == (2, 0, 1)
    record(record_property, f"LiteLLM ({kind}/)", result["versions"], "agents")


# --------------------------------------------------------------------------- Vercel AI SDK (npm env)

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


def _npm_versions(prefix: Path, *packages: str) -> dict[str, str]:
    return {p: json.loads((prefix / "node_modules" / p / "package.json").read_text())["version"] for p in packages}


@pytest.mark.slow  # a framework environment (make framework-envs)
@pytest.mark.parametrize("kind", ["openai", "openai_chat", "anthropic"])
async def test_vercel_ai_sdk_defaults(make_app, tokenizer, kind, tmp_path, record_property):
    """The Vercel AI SDK (ai 6, @ai-sdk/openai 3, @ai-sdk/anthropic 3) with its defaults: openai() is the
    Responses API with store on, and sends the reasoning item it received back as an item_reference
    (issue 26: answered 400 before); .chat() is Chat Completions; the Anthropic provider Messages."""
    import asyncio

    prefix = framework_envs.require("ai-sdk")
    script = tmp_path / "round.js"
    script.write_text(AI_SDK_ROUND)
    engine = FakeEngine(tokenizer, script=Turns([THINK_CALL, "It is 3."]))
    async with gateway(make_app(engine, reasoning_parser="think")) as (url, admin, sid, key, _):
        proc = await asyncio.create_subprocess_exec("node", str(script), url, key, kind,
                                                    env={"SDK_PREFIX": str(prefix), "PATH": "/usr/bin:/bin"},
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        result = json.loads(out.decode().strip().splitlines()[-1])
        exp = await export(admin, sid, key)
    assert result == {"text": "It is 3.", "steps": 2}, (result, err.decode()[-2000:])
    assert stats(exp) == (2, 0, 1)
    if kind == "openai":  # the second request named the reasoning item by reference
        second = exp["interactions"][0]["messages"]
        assert any(m.get("reasoning_content") == "I should add." for m in second if m["role"] == "assistant")
    record(record_property, f"Vercel AI SDK ({kind})", _npm_versions(prefix, "ai", "@ai-sdk/openai", "@ai-sdk/anthropic"),
           "ai-sdk")


# --------------------------------------------------------------------------- Claude Agent SDK (agents env)


@pytest.mark.slow
async def test_claude_agent_sdk_defaults(make_app, tokenizer, tmp_path, record_property):
    """The Claude Agent SDK (it runs the Claude Code CLI it bundles; 178 MB, so not a test dependency) with its
    default options: one Bash tool round, recorded as one chain."""
    python = framework_envs.python("agents")
    script = ToolRoundScript(tokenizer, prefer=("Bash",), text="ls", answer="Listed.")
    engine = FakeEngine(tokenizer, script=script, max_context_length=400_000)
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("hi\n")
    async with gateway(make_app(engine)) as (url, admin, sid, key, _):
        result = await run_script(python, "claude_agent_sdk_query.py", url, key, str(work), home=tmp_path / "home")
        exp = await export(admin, sid, key)
    assert not result["is_error"] and result["answer"] == "Listed.", result
    assert [c["name"] for c in script.calls] == ["Bash"]
    assert stats(exp) == (2, 0, 1), exp["stats"]
    record(record_property, "Claude Agent SDK", result["versions"], "agents")


# --------------------------------------------------------------------------- opencode (npm env)


@pytest.mark.slow
async def test_opencode_defaults(make_app, tokenizer, tmp_path, record_property):
    """opencode 1.18 (npm opencode-ai) with an OpenAI-compatible provider pointed at the gateway: its bash tool
    round is one chain; its title request is a conversation of its own. The provider package it loads is
    bundled (npm is pointed at a closed port here: nothing is fetched at run time)."""
    import asyncio

    prefix = framework_envs.require("opencode")
    exe = prefix / "node_modules" / "opencode-linux-x64" / "bin" / "opencode"
    script = ToolRoundScript(tokenizer, prefer=("bash",), text="ls", answer="Listed.")
    engine = FakeEngine(tokenizer, script=script, max_context_length=400_000)
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    (work / "notes.txt").write_text("hi\n")
    async with gateway(make_app(engine)) as (url, admin, sid, key, _):
        (work / "opencode.json").write_text(json.dumps({
            "provider": {"rlgate": {"npm": "@ai-sdk/openai-compatible", "name": "rlgate",
                                    "options": {"baseURL": url + "/v1", "apiKey": key},
                                    "models": {"tiny": {"name": "tiny"}}}},
            "model": "rlgate/tiny"}))
        proc = await asyncio.create_subprocess_exec(
            str(exe), "run", "List the files here.", cwd=work, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**framework_envs.opencode_env(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
                                                 "HOME": str(home)})
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        exp = await export(admin, sid, key)
    assert "Listed." in out.decode(), (out.decode()[-2000:], err.decode()[-2000:])
    assert [c["name"] for c in script.calls] == ["bash"]
    chains = [i for i in exp["interactions"] if len(i["chain"]) > 1]
    assert len(chains) == 1 and len(chains[0]["chain"]) == 2, exp["stats"]
    assert exp["stats"]["conversations"] == len(exp["interactions"]), exp["stats"]  # + its side request(s)
    record(record_property, "opencode", _npm_versions(prefix, "opencode-ai"), "opencode")
