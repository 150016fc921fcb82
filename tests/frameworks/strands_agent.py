"""Strands Agents: Agent with its OpenAIModel (the default model is Bedrock's, which needs AWS)."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from strands import Agent, tool
from strands.models.openai import OpenAIModel

url, key = sys.argv[1:3]


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


model = OpenAIModel(client_args={"base_url": url + "/v1", "api_key": key}, model_id="tiny")
agent = Agent(model=model, tools=[add], callback_handler=None)
result = agent("What is 1 + 2?")
print(json.dumps({"versions": {"strands-agents": version("strands-agents"), "openai": version("openai")},
                  "answer": str(result).strip(), "stop_reason": str(result.stop_reason)}))
