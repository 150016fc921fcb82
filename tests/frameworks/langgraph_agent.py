"""LangChain 1.x create_agent (a LangGraph graph) with ChatOpenAI (Chat or Responses) or ChatAnthropic."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from langchain.agents import create_agent

url, key, kind = sys.argv[1:4]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main() -> None:
    if kind == "anthropic":
        from langchain_anthropic import ChatAnthropic

        model: object = ChatAnthropic(model="tiny", base_url=url, api_key=key)
    else:
        from langchain_openai import ChatOpenAI

        model = ChatOpenAI(model="tiny", base_url=url + "/v1", api_key=key, use_responses_api=kind == "responses")
    out = await create_agent(model, tools=[add]).ainvoke({"messages": [{"role": "user", "content": "What is 1 + 2?"}]})
    versions = {p: version(p) for p in ("langchain", "langgraph", "langchain-openai", "langchain-anthropic")}
    print(json.dumps({"versions": versions, "answer": out["messages"][-1].text}))


asyncio.run(main())
