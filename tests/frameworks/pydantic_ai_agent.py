"""pydantic-ai: Agent with its OpenAIChatModel (Chat) or AnthropicModel (Messages)."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

url, key, kind = sys.argv[1:4]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    if kind == "openai":
        model: object = OpenAIChatModel("tiny", provider=OpenAIProvider(base_url=url + "/v1", api_key=key))
    else:
        model = AnthropicModel("tiny", provider=AnthropicProvider(base_url=url, api_key=key))
    result = await Agent(model, tools=[add]).run("What is 1 + 2?")
    print(json.dumps({"versions": {"pydantic-ai-slim": version("pydantic-ai-slim")}, "answer": result.output}))


asyncio.run(main())
