"""CrewAI: one Agent with one tool, one Task, Crew.kickoff(), the native OpenAI provider."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

url, key = sys.argv[1:3]


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


llm = LLM(model="openai/tiny", base_url=url + "/v1", api_key=key)
agent = Agent(role="adder", goal="Add numbers with the tool", backstory="You add numbers.", tools=[add], llm=llm)
task = Task(description="What is 1 + 2?", expected_output="The sum", agent=agent)
out = Crew(agents=[agent], tasks=[task]).kickoff()
print(json.dumps({"versions": {"crewai": version("crewai"), "openai": version("openai")}, "answer": out.raw}))
