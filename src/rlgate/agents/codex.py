"""Codex (``codex exec``) as an RL agent.

Codex speaks only the Responses API. Per episode a ``$CODEX_HOME/config.toml`` (in the
throwaway HOME) declares the gateway as the model provider::

    model = "<model>"
    model_provider = "rlgate"
    [model_providers.rlgate]
    name = "rlgate"
    base_url = "<gateway>/v1"
    env_key = "RLGATE_SESSION_KEY"      # the session key is in this variable, not in the file
    wire_api = "responses"

and ``codex exec --json --skip-git-repo-check --sandbox workspace-write PROMPT`` runs in the
working directory. Everything else is Codex's default unless ``config`` overrides it (each
item becomes ``-c KEY=VALUE``), e.g. ``["model_instructions_file=/path/short.md",
"web_search=disabled"]`` for a short prompt on a small local model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlgate.agents.cli_agent import CLIAgent
from rlgate.agents.npm import CODEX, ensure_cli

KEY_VARIABLE = "RLGATE_SESSION_KEY"


def config_toml(base_url: str, model: str) -> str:
    q = json.dumps  # a TOML basic string is a JSON string for these values
    return (f"model = {q(model)}\nmodel_provider = \"rlgate\"\n\n[model_providers.rlgate]\nname = \"rlgate\"\n"
            f"base_url = {q(base_url.rstrip('/') + '/v1')}\nenv_key = {q(KEY_VARIABLE)}\nwire_api = \"responses\"\n")


@dataclass
class CodexAgent(CLIAgent):
    executable: list[str] | None = None  # argv prefix that starts codex; None: the npm cache
    model: str = "rlgate"  # the model name Codex sends (the gateway serves any name)
    sandbox: str = "workspace-write"  # codex's sandbox: the agent may edit its working directory
    config: list[str] = field(default_factory=list)  # -c KEY=VALUE overrides

    def command(self, prompt: str, *, workdir: Path, home: Path, base_url: str, api_key: str
                ) -> tuple[list[str], dict[str, str]]:
        codex_home = home / ".codex"
        codex_home.mkdir(parents=True, exist_ok=True)
        (codex_home / "config.toml").write_text(config_toml(base_url, self.model))
        argv = list(self.executable) if self.executable else list(ensure_cli(CODEX).argv)
        argv += ["exec", "--json", "--skip-git-repo-check", "--sandbox", self.sandbox]
        for item in self.config:
            argv += ["-c", item]
        argv += [*self.extra_args, prompt]
        return argv, {"CODEX_HOME": str(codex_home), KEY_VARIABLE: api_key}
