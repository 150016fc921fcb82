"""LlamaIndex: FunctionAgent (llama-index-core's agent workflow) with OpenAILike."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.llms.openai_like import OpenAILike

url, key = sys.argv[1:3]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    # OpenAI(...) refuses a model name it does not know ("Unknown model"): OpenAILike states what it can do
    llm = OpenAILike(model="tiny", api_base=url + "/v1", api_key=key, is_chat_model=True,
                     is_function_calling_model=True, context_window=65536)
    agent = FunctionAgent(tools=[add], llm=llm, system_prompt="Add numbers with the tool.")
    response = await agent.run("What is 1 + 2?")
    print(json.dumps({"versions": {"llama-index-core": version("llama-index-core"),
                                   "llama-index-llms-openai-like": version("llama-index-llms-openai-like")},
                      "answer": str(response).strip()}))


asyncio.run(main())
