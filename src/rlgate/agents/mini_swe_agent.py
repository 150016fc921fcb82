"""mini-swe-agent (``mini``) as an RL agent: one process per episode, its defaults working offline.

mini-swe-agent (the SWE harness rLLM, verifiers and others use) talks to its model through
LiteLLM. Per episode ``mini`` runs in the working directory with:

* ``--yolo --exit-immediately``: no one confirms commands, and it exits when the agent submits
  (``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``) instead of asking for a next task;
* ``-m openai/<model>`` and ``-c mini.yaml -c model.model_kwargs.api_base=<gateway>/v1``: LiteLLM's
  OpenAI provider (Chat Completions, its tool calls) pointed at the gateway; the session key is
  ``OPENAI_API_KEY``;
* ``MSWEA_CONFIGURED=true``: without a terminal its first-run setup wizard aborts the run;
  ``MSWEA_COST_TRACKING=ignore_errors``: a model LiteLLM has no price for (any gateway model name)
  raised "Error calculating cost" after the first call; ``LITELLM_LOCAL_MODEL_COST_MAP=True``: LiteLLM
  reads its bundled price list instead of fetching one from GitHub at import; its config directory
  is in the episode's throwaway HOME.

The package lives in its own virtual environment (``$RLGATE_VENV_CACHE``, default
``~/.cache/rlgate-venvs/mini-swe-agent``), installed with pip on first use: it pulls LiteLLM
(~380 MB), which rlgate itself does not need.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path

from rlgate.agents.cli_agent import CLIAgent

PACKAGE = "mini-swe-agent"
VERSION = "2.4.6"  # tested (tests/test_agent_frameworks.py)


class MiniNotFound(RuntimeError):
    pass


def venv_dir() -> Path:
    base = os.environ.get("RLGATE_VENV_CACHE") or Path.home() / ".cache" / "rlgate-venvs"
    return Path(base) / PACKAGE


def ensure_mini(prefix: Path | None = None, *, install: bool = True, version: str = VERSION,
                timeout: float = 1800.0) -> list[str]:
    """The argv that starts ``mini`` from its virtual environment, installing it with pip if missing."""
    prefix = prefix or venv_dir()
    exe = prefix / "bin" / "mini"
    if not exe.is_file() and install:
        venv.create(prefix, with_pip=True)
        proc = subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", f"{PACKAGE}=={version}"],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise MiniNotFound(f"pip install {PACKAGE}=={version} failed: {proc.stderr.strip()[-2000:]}")
    if not exe.is_file():
        raise MiniNotFound(f"{PACKAGE} is not installed under {prefix}")
    return [str(exe)]


@dataclass
class MiniSweAgent(CLIAgent):
    executable: list[str] | None = None  # argv prefix that starts mini; None: its venv (installed if missing)
    model: str = "rlgate"  # sent as openai/<model> (the gateway serves any name)
    config: list[str] = field(default_factory=list)  # more -c KEY=VALUE (after mini.yaml and the api base)

    def command(self, prompt: str, *, workdir: Path, home: Path, base_url: str, api_key: str
                ) -> tuple[list[str], dict[str, str]]:
        api_base = base_url.rstrip("/") + "/v1"
        argv = list(self.executable) if self.executable else ensure_mini()
        argv += ["--yolo", "--exit-immediately", "-m", f"openai/{self.model}", "-t", prompt,
                 "-o", str(home / "trajectory.json"), "-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={api_base}"]
        for item in self.config:
            argv += ["-c", item]
        argv += self.extra_args
        config_dir = home / ".config" / "mini-swe-agent"
        config_dir.mkdir(parents=True, exist_ok=True)
        return argv, {
            "OPENAI_API_KEY": api_key,
            "OPENAI_API_BASE": api_base,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_GLOBAL_CONFIG_DIR": str(config_dir),
            "MSWEA_SILENT_STARTUP": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONUNBUFFERED": "1",
        }


if __name__ == "__main__":  # python -m rlgate.agents.mini_swe_agent: install it (make agent-clis)
    print(" ".join(ensure_mini()), file=sys.stderr)
