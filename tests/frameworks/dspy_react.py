"""DSPy: dspy.ReAct over dspy.LM("openai/...") (LiteLLM), its default ChatAdapter."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import dspy

url, key = sys.argv[1:3]


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


dspy.configure(lm=dspy.LM("openai/tiny", api_base=url + "/v1", api_key=key))
prediction = dspy.ReAct("question -> answer: int", tools=[add])(question="What is 1 + 2?")
print(json.dumps({"versions": {"dspy": version("dspy"), "litellm": version("litellm")},
                  "answer": prediction.answer,
                  "tools": [prediction.trajectory.get(f"tool_name_{i}") for i in range(3)]}))
