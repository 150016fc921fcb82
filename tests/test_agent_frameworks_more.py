"""The agent frameworks users asked for next (issue 39), with their defaults, against a gateway on 127.0.0.1:
CrewAI, AutoGen, AG2, LlamaIndex, DSPy, the Google ADK (through LiteLLM) and Strands Agents.

Each runs from its environment (tests/framework_envs.py) as a script in tests/frameworks/ and plays one
tool round with the scripted engine; the test checks the answer the framework returned, the
conversations the session recorded (one chain per conversation is the goal) and what the gateway
reported as not acted on (``x-rlgate-ignored-params``). docs/agents.md's table has the results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import framework_envs
from framework_helpers import ADD_CALL, Turns, export, gateway, record, run_script, stats
from rlgate.engine.fake import FakeEngine

pytestmark = pytest.mark.slow  # each needs a framework environment (make framework-envs) and imports a framework

LITELLM_OFFLINE = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # else LiteLLM fetches its price list at import

# DSPy's ReAct: no tool calling API, its ChatAdapter's fields in text (a step, then "finish", then the
# extraction of the answer by a ChainOfThought over the trajectory)
DSPY_STEP = ("[[ ## next_thought ## ]]\nI add them.\n\n[[ ## next_tool_name ## ]]\nadd\n\n"
             "[[ ## next_tool_args ## ]]\n{\"a\": 1, \"b\": 2}\n\n[[ ## completed ## ]]")
DSPY_FINISH = ("[[ ## next_thought ## ]]\nI have it.\n\n[[ ## next_tool_name ## ]]\nfinish\n\n"
               "[[ ## next_tool_args ## ]]\n{}\n\n[[ ## completed ## ]]")
DSPY_EXTRACT = "[[ ## reasoning ## ]]\n1 + 2 = 3.\n\n[[ ## answer ## ]]\n3\n\n[[ ## completed ## ]]"


@dataclass(frozen=True)
class Case:
    framework: str
    env: str
    script: str
    replies: list[str]
    answer: str | int
    stats: tuple[int, int, int]  # completed calls, forks, conversations
    ignored: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)


CASES = {
    # CrewAI sends its telemetry (OpenTelemetry) to telemetry.crewai.com unless told not to
    "crewai": Case("CrewAI", "agents-openai2", "crewai_crew.py", [ADD_CALL, "It is 3."], "It is 3.", (2, 0, 1),
                   ["tools.function.strict"], {"CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true"}),
    # AssistantAgent's default reflect_on_tool_use=False: the tool's result is the answer, one model call
    "autogen": Case("AutoGen AssistantAgent", "agents", "autogen_assistant.py", [ADD_CALL], "3", (1, 0, 1)),
    "ag2": Case("AG2 Agent", "agents", "ag2_agent.py", [ADD_CALL, "It is 3."], "It is 3.", (2, 0, 1)),
    # OpenAILike sends parallel_tool_calls (not enforced: the model may make several calls in one reply)
    "llamaindex": Case("LlamaIndex FunctionAgent", "agents-openai2", "llamaindex_agent.py", [ADD_CALL, "It is 3."],
                       "It is 3.", (2, 0, 1), ["parallel_tool_calls"]),
    "dspy": Case("DSPy ReAct", "agents", "dspy_react.py", [DSPY_STEP, DSPY_FINISH, DSPY_EXTRACT], 3, (3, 2, 3),
                 env_vars=LITELLM_OFFLINE),
    "adk": Case("Google ADK LlmAgent + LiteLlm", "agents", "adk_agent.py", [ADD_CALL, "It is 3."], "It is 3.",
                (2, 0, 1), env_vars=LITELLM_OFFLINE),
    "strands": Case("Strands Agents", "agents-openai2", "strands_agent.py", [ADD_CALL, "It is 3."], "It is 3.",
                    (2, 0, 1)),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_framework_defaults(make_app, tokenizer, name, tmp_path, record_property):
    case = CASES[name]
    python = framework_envs.python(case.env)
    engine = FakeEngine(tokenizer, script=Turns(case.replies), max_context_length=65536)
    async with gateway(make_app(engine)) as (url, admin, sid, key, log):
        out = await run_script(python, case.script, url, key, home=tmp_path, env=case.env_vars)
        exp = await export(admin, sid, key)
    assert out["answer"] == case.answer, out
    assert stats(exp) == case.stats, exp["stats"]
    assert set(log.statuses()) == {200}, log.seen
    assert log.ignored() == case.ignored, log.seen
    record(record_property, case.framework, out["versions"], case.env)
