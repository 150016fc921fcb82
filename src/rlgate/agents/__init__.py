"""Black-box CLI agents (Claude Code, Codex, ...) as RL agents: one subprocess per episode.

* :mod:`~rlgate.agents.cli_agent` — :class:`CLIAgent`: working directory, throwaway HOME,
  gateway URL + session key in the environment, time limit, reward from a verifier;
* :mod:`~rlgate.agents.claude_code` / :mod:`~rlgate.agents.codex` — the two CLIs;
* :mod:`~rlgate.agents.mini_swe_agent` — mini-swe-agent (``mini``, from its own venv);
* :mod:`~rlgate.agents.npm` — find or install the CLIs from npm;
* :mod:`~rlgate.agents.bugfix` — a tiny generated-repo bug-fix task and its test verifier.

See docs/agents.md.
"""

from rlgate.agents.claude_code import ClaudeCodeAgent
from rlgate.agents.cli_agent import CLIAgent, Transcript
from rlgate.agents.codex import CodexAgent
from rlgate.agents.mini_swe_agent import MiniSweAgent

__all__ = ["CLIAgent", "ClaudeCodeAgent", "CodexAgent", "MiniSweAgent", "Transcript"]
