"""The Google Agent Development Kit: an LlmAgent with ADK's LiteLlm model ("openai/..."), InMemoryRunner."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from google.adk.agents import LlmAgent
from google.adk.models.lite_llm import LiteLlm
from google.adk.runners import InMemoryRunner
from google.genai import types

url, key = sys.argv[1:3]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    agent = LlmAgent(name="adder", model=LiteLlm(model="openai/tiny", api_base=url + "/v1", api_key=key),
                     instruction="Add numbers with the tool.", tools=[add])
    runner = InMemoryRunner(agent=agent, app_name="rlgate")
    session = await runner.session_service.create_session(app_name="rlgate", user_id="u")
    answer, calls = None, []
    message = types.Content(role="user", parts=[types.Part(text="What is 1 + 2?")])
    async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
        calls += [c.name for c in event.get_function_calls()]
        if event.is_final_response() and event.content and event.content.parts:
            answer = "".join(p.text or "" for p in event.content.parts)
    print(json.dumps({"versions": {"google-adk": version("google-adk"), "litellm": version("litellm")},
                      "answer": answer, "calls": calls}))


asyncio.run(main())
