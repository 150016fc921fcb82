"""Claude Code (``claude -p``) as an RL agent.

Per episode: ``claude -p PROMPT --output-format stream-json --verbose`` in a fresh working
directory, with ``ANTHROPIC_BASE_URL`` = the gateway root and ``ANTHROPIC_API_KEY`` = the
session key, a throwaway HOME, telemetry, auto-update and non-essential traffic off.
Everything else is Claude Code's default (its ~62k-token system prompt and all its tools)
unless ``extra_args`` says otherwise, e.g. ``["--system-prompt", "...", "--tools", "Bash,Edit"]``
for a short prompt on a small local model.

``permission_mode`` defaults to ``bypassPermissions``: there is no one to approve a tool call
in an RL episode (Claude Code refuses that mode as root unless ``IS_SANDBOX=1``, which is set:
the episode's directory is throwaway; see the security note in ``cli_agent``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlgate.agents.cli_agent import CLIAgent
from rlgate.agents.npm import CLAUDE_CODE, ensure_cli

QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


@dataclass
class ClaudeCodeAgent(CLIAgent):
    executable: str | None = None  # the claude binary; None: the npm cache (installed if missing)
    model: str | None = None  # --model; None: Claude Code's default (the gateway serves any name)
    permission_mode: str | None = "bypassPermissions"

    def command(self, prompt: str, *, workdir: Path, home: Path, base_url: str, api_key: str
                ) -> tuple[list[str], dict[str, str]]:
        argv = [self.executable] if self.executable else list(ensure_cli(CLAUDE_CODE).argv)
        argv += ["-p", prompt, "--output-format", "stream-json", "--verbose"]
        if self.model:
            argv += ["--model", self.model]
        if self.permission_mode:
            argv += ["--permission-mode", self.permission_mode]
        argv += self.extra_args
        env = {**QUIET_ENV, "ANTHROPIC_BASE_URL": base_url.rstrip("/"), "ANTHROPIC_API_KEY": api_key}
        if self.permission_mode == "bypassPermissions":
            env["IS_SANDBOX"] = "1"
        return argv, env
