"""AutoGen (autogen-agentchat): AssistantAgent with an OpenAIChatCompletionClient, its defaults."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from autogen_agentchat.agents import AssistantAgent
from autogen_ext.models.openai import OpenAIChatCompletionClient

url, key = sys.argv[1:3]


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    # a model name OpenAI does not list needs its capabilities stated (model_info), else ValueError
    client = OpenAIChatCompletionClient(model="tiny", base_url=url + "/v1", api_key=key, model_info={
        "vision": False, "function_calling": True, "json_output": False, "family": "unknown",
        "structured_output": False})
    agent = AssistantAgent("adder", model_client=client, tools=[add])
    result = await agent.run(task="What is 1 + 2?")
    await client.close()
    print(json.dumps({"versions": {"autogen-agentchat": version("autogen-agentchat"),
                                   "autogen-ext": version("autogen-ext")},
                      "messages": [type(m).__name__ for m in result.messages],
                      "answer": str(result.messages[-1].content)}))


asyncio.run(main())
