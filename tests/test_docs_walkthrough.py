"""docs/training.md's walk-through runs as written: an agent that is not in examples/, then
check, train, TensorBoard, eval and resume, each through the real CLI in a scratch directory.

Code blocks whose first line is ``# NAME`` (Python, YAML) are saved under that name; bash blocks
run in order and must succeed, except the one starting TensorBoard, which is started like a
server (in the background, on a free ``TB_PORT``) and must answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from helpers import free_port

DOC = Path(__file__).resolve().parents[1] / "docs" / "training.md"


REAL = "### The same agent on a real model"


def walkthrough_blocks(part: str = "tiny") -> list[tuple[str, str]]:
    """The code blocks of §0: the tiny model's walk-through, or (``part="real"``) its SmolLM2 part."""
    section = DOC.read_text().split("## 0. Walk-through", 1)[1].split("\n## ", 1)[0]
    tiny, real = section.split(REAL, 1)
    return re.findall(r"```(\w+)\n(.*?)```", tiny if part == "tiny" else real, flags=re.S)


def test_the_walkthrough_uses_its_own_agent_and_every_command():
    blocks = walkthrough_blocks()
    agent = next(code for kind, code in blocks if code.startswith("# reverse_agent.py"))
    assert "from anthropic import" in agent and "rlgate_examples" not in agent
    commands = "\n".join(code for kind, code in blocks if kind == "bash")
    for command in ("rlgate check", "rlgate train --config reverse.yaml", "tensorboard --logdir", "rlgate eval",
                    "--set steps=4"):
        assert command in commands, command


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else proc.returncode
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(3600)  # six CLI runs on a tiny model; generous for a loaded 2-core machine
def test_the_training_walkthrough_runs_verbatim(tmp_path):
    tb_port = free_port()
    env = _env(TB_PORT=str(tb_port))
    outputs: list[str] = []
    tensorboard = None
    try:
        for kind, code in walkthrough_blocks():
            if kind != "bash":
                name = code.splitlines()[0].removeprefix("#").strip()
                (tmp_path / name).write_text(code)
            elif "tensorboard --logdir" in code:
                tensorboard = subprocess.Popen(["bash", "-c", code.replace("&", "").strip()], cwd=tmp_path, env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                               start_new_session=True)
                _wait_http(f"http://127.0.0.1:{tb_port}/data/runs", tensorboard, timeout=300)
                runs = httpx.get(f"http://127.0.0.1:{tb_port}/data/runs", timeout=10).json()
                assert runs, "TensorBoard found no run in runs/reverse/tensorboard"
            else:
                done = subprocess.run(["bash", "-ec", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                                      timeout=900)
                assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
    finally:
        if tensorboard is not None:
            os.killpg(tensorboard.pid, signal.SIGTERM)
            tensorboard.communicate(timeout=60)
    run = tmp_path / "runs" / "reverse"
    check_out = next(o for o in outputs if "check passed" in o)
    assert "messages (Anthropic Messages)" in check_out and "generated (loss 1)" in check_out
    assert (run / "checkpoints" / "latest").read_text() == "step-000004"  # trained 3, resumed to 4
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert json.loads((run / "eval.json").read_text())["episodes"] == 4
    assert yaml.safe_load((run / "config.yaml").read_text())["rollout"]["export_style"] == "concat"
    assert len(list((run / "trajectories").glob("step-*.parquet"))) == 4


# The SmolLM2 part, shortened: 1 RL step (not 10) and 1 evaluation sample per word (not 4); the warm start,
# the check and the config as written. Its measured 10-step runs are in the doc.
SHORTEN = {"steps: 10\n": "steps: 1\n", "eval_samples_per_item: 4\n": "eval_samples_per_item: 1\n",
           "checkpoint_every: 10\n": "checkpoint_every: 1\n"}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(3600)
def test_the_real_model_part_warm_starts_and_records_a_tool_round(tmp_path, smollm2_dir):
    for kind, code in walkthrough_blocks():  # the agent and train.jsonl come from the tiny part
        if kind != "bash" and not code.startswith("# reverse.yaml"):
            (tmp_path / code.splitlines()[0].removeprefix("#").strip()).write_text(code)
    subprocess.run([sys.executable, "make_data.py"], cwd=tmp_path, check=True)
    outputs = []
    for kind, code in walkthrough_blocks("real"):
        if kind != "bash":
            for a, b in SHORTEN.items():
                assert a in code or not code.startswith("# reverse-smollm2.yaml"), a
                code = code.replace(a, b)
            (tmp_path / code.splitlines()[0].removeprefix("#").strip()).write_text(code)
        else:
            done = subprocess.run(["bash", "-ec", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                                  timeout=1800)
            assert done.returncode == 0, f"{code}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
    check_out = next(o for o in outputs if "check passed" in o)
    assert "warm start: saved runs/reverse-smollm2/warm-start" in check_out
    # the generated call (loss 1), then the tool's result bridged into the same chain (loss 0)
    assert re.search(r"generated \(loss 1\) +\d+ tokens: '<tool_call>\[\{\"name\": \"reverse\"", check_out), check_out
    assert re.search(r"prompt +\(loss 0\) +\d+ tokens: '\\n<\|im_start\|>tool\\n[a-z]+<\|im_end\|>", check_out), check_out
    train_out = next(o for o in outputs if "done: step 1" in o)
    assert "made earlier with these settings" in train_out  # train reuses check's warm start
    run = tmp_path / "runs" / "reverse-smollm2"
    assert yaml.safe_load((run / "config.yaml").read_text())["warm_start"]["steps"] == 4
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
