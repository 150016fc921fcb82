"""AG2 1.x (``import ag2``; AG2 Classic's ``autogen`` namespace is a separate package now): Agent with a
@tool and its OpenAIConfig (Chat Completions), ``ask()``."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from ag2 import Agent, tool
from ag2.config import OpenAIConfig

url, key = sys.argv[1:3]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    agent = Agent("adder", prompt="Add numbers with the tool.",
                  config=OpenAIConfig(model="tiny", base_url=url + "/v1", api_key=key), tools=[add])
    reply = await agent.ask("What is 1 + 2?")
    print(json.dumps({"versions": {"ag2": version("ag2"), "openai": version("openai")}, "answer": reply.body}))


asyncio.run(main())
