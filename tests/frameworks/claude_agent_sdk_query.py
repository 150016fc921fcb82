"""The Claude Agent SDK: query() with its default options (it runs the Claude Code CLI it bundles)."""

from __future__ import annotations

import asyncio
import json
import sys
from importlib.metadata import version

from claude_agent_sdk import ClaudeAgentOptions, query

url, key, workdir = sys.argv[1:4]


async def main() -> None:
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "DISABLE_TELEMETRY": "1",
           "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    kinds = []
    async for m in query(prompt="List the files here.", options=ClaudeAgentOptions(cwd=workdir, env=env)):
        kinds.append(type(m).__name__)
        if type(m).__name__ == "ResultMessage":
            print(json.dumps({"versions": {"claude-agent-sdk": version("claude-agent-sdk")}, "kinds": kinds,
                              "is_error": m.is_error, "answer": m.result}))


asyncio.run(main())
