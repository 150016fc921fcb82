"""The CLI agent harness with `rlgate train`: a few GRPO steps on the tiny model, each episode a
real Claude Code / Codex process fixing a generated repo (learning is not expected on CPU; the
loop must run, record and train). Also the harness's own mechanics with a stand-in CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from rlgate.agents import CLIAgent
from rlgate.agents.bugfix import BUGS, make_tasks, setup, verify
from rlgate.cli import main

SHORT_PROMPT = "You are a coding agent. Fix the bug, run the tests, answer in one line."


def test_bugfix_tasks_fail_until_fixed(tmp_path):
    for task in make_tasks(6):
        work = tmp_path / task["task_id"]
        work.mkdir()
        setup(work, task)
        assert verify(work, None, task) == 0.0
        fn, good, bad, _ = next(b for b in BUGS if task["files"]["calc.py"].startswith(f"def {b[0]}:"))
        (work / "calc.py").write_text(f"def {fn}:\n    return {good}\n")
        assert verify(work, None, task) == 1.0
        (work / "test_calc.py").write_text("")  # deleting the tests is no fix
        assert verify(work, None, task) == 0.0


class PythonCLI(CLIAgent):
    """A stand-in CLI: a Python one-liner that fixes the bug or sleeps, showing its environment."""

    def __init__(self, code: str, **kw):
        super().__init__(**kw)
        self.code = code

    def command(self, prompt, *, workdir, home, base_url, api_key):
        return [sys.executable, "-c", self.code, prompt], {"GATEWAY": base_url, "KEY": api_key}


async def test_cli_agent_runs_in_its_own_dir_home_and_env(monkeypatch):
    code = ("import os, sys, pathlib; p = pathlib.Path('calc.py'); p.write_text(p.read_text().replace('a - b', 'a + b'));"
            "print(os.getcwd(), os.environ['HOME'], os.environ['GATEWAY'], os.environ['KEY'], "
            "'SECRET' in os.environ, sys.argv[1])")
    monkeypatch.setenv("SECRET", "x")  # the CLI does not inherit this process's environment
    agent = PythonCLI(code, verifier=verify, setup=setup)
    task = make_tasks(1)[0]
    assert await agent.run(task, base_url="http://127.0.0.1:9", api_key="k") == 1.0
    cwd, home, url, key, leaked, prompt = agent.last.stdout.split(" ", 5)
    assert Path(cwd).name == "work" and Path(home).name == "home" and Path(cwd).parent == Path(home).parent
    assert (url, key, leaked, prompt.strip()) == ("http://127.0.0.1:9", "k", "False", task["prompt"])
    assert not Path(cwd).exists()  # removed after the episode


async def test_cli_agent_time_limit_kills_and_scores(tmp_path):
    agent = PythonCLI("import time; time.sleep(60)", verifier=verify, setup=setup, time_limit=0.5)
    assert await agent.run(make_tasks(1)[0], base_url="http://127.0.0.1:9", api_key="k") == 0.0
    assert agent.last.timed_out and agent.last.returncode is None and agent.last.seconds < 30


@pytest.mark.slow
@pytest.mark.timeout(2400)  # 4 real CLI episodes + 2 GRPO steps on a 2-core CPU
@pytest.mark.parametrize("kind", ["claude_code", "codex"])
def test_rlgate_train_runs_cli_agents_for_a_few_grpo_steps(kind, tiny_model_dir, tmp_path):
    from helpers import brief_tiny_model
    from rlgate.agents.npm import CLAUDE_CODE, CODEX, CLINotFound, ensure_cli

    try:
        ensure_cli(CLAUDE_CODE if kind == "claude_code" else CODEX)
    except (CLINotFound, OSError) as exc:
        pytest.skip(f"agent CLI unavailable (npm missing or registry unreachable): {exc}")
    model = brief_tiny_model(tiny_model_dir, tmp_path / "model")  # ends replies early (see helpers)
    data = tmp_path / "bugfix.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in make_tasks(4)))
    if kind == "claude_code":
        agent = {"agent": "rlgate.agents.claude_code:ClaudeCodeAgent",
                 "agent_kwargs": {"extra_args": ["--system-prompt", SHORT_PROMPT, "--tools", "Bash"]}}
    else:
        (tmp_path / "instructions.md").write_text(SHORT_PROMPT)
        agent = {"agent": "rlgate.agents.codex:CodexAgent", "agent_kwargs": {"config": [
            f"model_instructions_file={tmp_path / 'instructions.md'}", "web_search=disabled",
            "features.multi_agent=false", "include_environment_context=false"]}}
    agent["agent_kwargs"].update(setup="rlgate.agents.bugfix:setup", verifier="rlgate.agents.bugfix:verify",
                                 time_limit=600)
    cfg = {
        "model": str(model), "out_dir": str(tmp_path / "run"), "dataset": str(data), **agent,
        "steps": 2, "checkpoint_every": 1,
        "grpo": {"lr": 1e-4, "groups_per_step": 1, "micro_batch_size": 2, "device": "cpu"},
        "rollout": {"group_size": 2, "concurrency": 2, "episode_timeout": 900},
        "gateway": {"context_length": 16384, "max_tokens_cap": 256},  # a cut reply only costs the episode
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(path)]) == 0
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1.0, 2.0]
    assert all(0.0 <= m["reward"] <= 1.0 for m in lines)  # the verifier's scores
    assert (tmp_path / "run" / "checkpoints" / "step-000002" / "model.safetensors").is_file()
