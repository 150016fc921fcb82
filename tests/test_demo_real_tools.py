"""``rlgate demo --task tools`` on SmolLM2-135M-Instruct (``src/rlgate/demo/real_tools.py``).

Torch-free: the reward (right answer *and* obtained through a tool round), the three-digit task,
``--device cuda`` refused in one line without CUDA (here torch is hidden: ``make test-core``).
Torch, slow, SmolLM2 fetched (``rlgate models fetch smollm2-135m-instruct``; skipped otherwise):
a very small run end to end — a short warm start, SmolLM2's ``<tool_call>[...]`` replies parsed
into real tool calls for both SDK agents, tool rounds recorded as one token chain (0 forks), one
GRPO step.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SMOLLM2 = "smollm2-135m-instruct"


def test_tool_round_reward_needs_the_answer_and_a_tool_round():
    from rlgate.demo.calculator_agent import tool_round_reward

    assert tool_round_reward("347 * 582 = 201954", "201954", ["201954"]) == 1.0
    assert tool_round_reward("The answer is 201,954.", "201954", ["error: bad", "201954"]) == 1.0
    assert tool_round_reward("201954", "201954", []) == 0.0  # right, but not from the tool
    assert tool_round_reward("201954", "201954", ["201955"]) == 0.0  # the tool computed something else
    assert tool_round_reward("201955", "201954", ["201954"]) == 0.0  # the result was not used


def test_the_agents_refuse_an_unknown_reward():
    from rlgate.demo.agents import EitherSDKCalculatorAgent

    with pytest.raises(ValueError, match="tool_round"):
        EitherSDKCalculatorAgent(reward="closeness")


def test_multiply_task_is_three_digit_products_with_a_disjoint_heldout_split():
    from rlgate.demo.tasks import multiply_task

    split = multiply_task(seed=0, n_train=300, n_heldout=50)
    assert len(split.train) == 300 and len(split.heldout) == 50
    assert not {d["question"] for d in split.train} & {d["question"] for d in split.heldout}
    for d in split.train + split.heldout:
        a, b = (int(x) for x in d["expression"].split(" * "))
        assert 100 <= a <= 999 and 100 <= b <= 999 and int(d["answer"]) == a * b


def test_device_cuda_is_refused_in_one_line_without_cuda(tmp_path):
    """Before any model is resolved or loaded: a clear line, no traceback (torch hidden or no GPU)."""
    proc = subprocess.run([sys.executable, "-m", "rlgate.cli", "demo", "--task", "tools", "--device", "cuda",
                           "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "--device cuda" in proc.stderr and "--device cpu" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
    bad = subprocess.run([sys.executable, "-m", "rlgate.cli", "demo", "--device", "tpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "expected cpu, cuda or cuda:N" in bad.stderr


def test_the_tool_prompt_lists_each_tool_and_the_call_format():
    from rlgate.chat.parsers import ParsedToolCall, get_tool_parser
    from rlgate.demo.calculator_agent import CALCULATOR_TOOL
    from rlgate.demo.tool_sft import call_text, tool_system_prompt

    prompt = tool_system_prompt([dict(CALCULATOR_TOOL)])
    assert "calculator(expression: string): Evaluate an arithmetic expression" in prompt
    assert '<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>' in prompt
    # what the warm start teaches is what the SmolLM2 family's parser reads back as a call
    parser = get_tool_parser("hermes")
    (call,) = parser.feed(call_text("calculator", {"expression": "347 * 582"})) + parser.finish()
    assert isinstance(call, ParsedToolCall)
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "347 * 582"}


@pytest.mark.torch
def test_device_reaches_the_trainer_and_the_agents_get_the_tool_prompt(tmp_path):
    from rlgate.demo.real_tools import RealToolsSettings, demo_config

    cfg = demo_config(RealToolsSettings(), model_dir=tmp_path, out=tmp_path, url="http://127.0.0.1:1", admin_key="k",
                      seed=0, system="SYSTEM", device="cuda")
    assert cfg.grpo.device == "cuda" and cfg.rollout.export_style == "concat"
    assert cfg.agent == "rlgate.demo.agents:EitherSDKCalculatorAgent"
    assert cfg.agent_kwargs["system"] == "SYSTEM" and cfg.agent_kwargs["reward"] == "tool_round"


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(3600)  # ~3 min on a quiet machine; a 135M model trained on 2 shared cores can take 30
def test_the_tools_demo_runs_end_to_end_on_smollm2(tmp_path):
    from rlgate.checkpoints import registry

    if registry.local_file(SMOLLM2) is None:
        pytest.skip(f"{SMOLLM2} is not fetched (rlgate models fetch {SMOLLM2})")
    from rlgate.demo.real_tools import run_real_tools_demo
    from rlgate.trajectory.export import read_samples

    # a warm start far shorter (and steeper) than the demo's: enough for SmolLM2 to write the call format
    small = {"warm_start_steps": 10, "warm_start_lr": 3e-4, "warm_start_batch": 4, "warm_start_items": 40,
             "groups_per_step": 2, "group_size": 4, "eval_items": 4, "eval_every": 1, "final_eval_samples": 1,
             "concurrency": 8, "episode_timeout": 1800}
    assert run_real_tools_demo(tmp_path, steps=1, overrides=small) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and len(summary["reward_per_step"]) == 1
    assert set(summary["table"]) == {"before_t1", "before_greedy", "after_t1", "after_greedy"}
    chains = summary["chains"]
    assert chains["samples"] == 8 and chains["forks"] == 0, chains
    assert chains["tool_rounds"] >= 1, chains  # a reply parsed into a tool call, its result sent back
    samples = read_samples(tmp_path / "trajectories.parquet")
    rounds = [s for s in samples if len(s.chain or []) >= 2]
    assert rounds and all(s.relation != "fork" for s in samples)
    # the tool call reached the SDK agent as a real call: the next request carries it and its result
    msgs = rounds[0].messages
    call = next(m for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
    assert call["tool_calls"][0]["function"]["name"] == "calculator"
    assert any(m["role"] == "tool" for m in msgs)
    for name in ("reward_curve.png", "trajectories.parquet", "view.html", "final/model.safetensors"):
        assert (tmp_path / name).is_file(), name
