"""Pieces of the demo: synthetic task splits, warm-start sequences, warm-start caching."""

from __future__ import annotations

import json

import pytest

from rlgate.chat.render import ChatRenderer
from rlgate.demo.sft import math_sequence, tools_sequence, warm_start
from rlgate.demo.tasks import TASKS


@pytest.mark.parametrize("task", ["math", "tools"])
def test_task_splits_are_disjoint_and_deterministic(task):
    a, b = TASKS[task](seed=0), TASKS[task](seed=0)
    assert a.heldout == b.heldout and a.train[:50] == b.train[:50]
    assert len(a.heldout) == 200
    held = {d["question"] for d in a.heldout}
    assert not held & {d["question"] for d in a.train}
    for d in a.heldout[:50]:
        nums = [int(x) for x in d["question"].rstrip("?").replace(",", "").split() if x.isdigit()]
        if task == "math":
            expected = max(nums) if "larger" in d["question"] else min(nums)
        else:
            expected = nums[0] + nums[1] if "+" in d["question"] else nums[0] - nums[1]
        assert d["answer"] == str(expected)


def test_math_sequence_trains_only_the_answer(tokenizer, stop_ids):
    renderer = ChatRenderer(tokenizer)
    item = TASKS["math"](seed=0).train[0]
    ids, mask = math_sequence(renderer, item, stop_ids[0])
    trained = [t for t, m in zip(ids, mask, strict=False) if m]
    assert trained[-1] == stop_ids[0]
    assert tokenizer.decode(trained[:-1]) == item["answer"]
    assert ids[: mask.index(1)] == renderer.render_ids([_user(item["question"])])


def test_tools_sequence_is_the_conversation_the_gateway_renders(tokenizer, stop_ids):
    from rlgate.demo.calculator_agent import CALCULATOR_TOOL

    renderer = ChatRenderer(tokenizer)
    item = TASKS["tools"](seed=0).train[0]
    ids, mask = tools_sequence(renderer, item, stop_ids[0], CALCULATOR_TOOL)
    # two trained spans: the tool call, then the answer, each ending in the stop token
    spans, cur = [], []
    for t, m in zip(ids, mask, strict=False):
        if m:
            cur.append(t)
        elif cur:
            spans.append(cur)
            cur = []
    spans.append(cur)
    assert len(spans) == 2 and all(s[-1] == stop_ids[0] for s in spans)
    call = tokenizer.decode(spans[0][:-1])
    assert "<tool_call>" in call and json.dumps(item["expression"]) in call
    assert tokenizer.decode(spans[1][:-1]) == item["answer"]
    # the tool result sits in the untrained bridge between the two spans
    bridge_text = tokenizer.decode([t for t, m in zip(ids, mask, strict=False) if not m])
    assert item["answer"] in bridge_text and item["question"] in bridge_text


def test_warm_start_writes_a_checkpoint_and_caches_it(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    items = TASKS["math"](seed=0).train[:64]
    out = tmp_path / "ws"
    logs: list[str] = []
    first = warm_start(tiny_model_dir, out, items, task="math", steps=2, seed=0, batch_size=8, log=logs.append)
    assert first["steps_run"] == 2 and first["final_loss"] == first["final_loss"]  # not NaN
    model = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    changed = any((p - q).abs().max() > 0 for p, q in zip(model.parameters(), base.parameters(), strict=False))
    assert changed
    assert (out / "tokenizer.json").is_file()
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    again = warm_start(tiny_model_dir, out, items, task="math", steps=2, seed=0, batch_size=8, log=logs.append)
    assert again == first and "cached" in logs[-1]
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    # other settings are not served from the cache
    third = warm_start(tiny_model_dir, out, items, task="math", steps=3, seed=0, batch_size=8, log=logs.append)
    assert third["steps_run"] == 3


def test_warm_start_stops_early_at_the_target(tiny_model_dir, tmp_path):
    items = TASKS["math"](seed=0).train[:64]
    # a target of 0 is met at the first check
    res = warm_start(tiny_model_dir, tmp_path / "ws", items, task="math", steps=50, seed=0, batch_size=8,
                     target_accuracy=0.0, validation=items[:8], check_every=2, min_steps=2, log=lambda m: None)
    assert res["steps_run"] == 2 and res["validation_accuracy"] is not None


def _user(text):
    from rlgate.chat.conversation import Message

    return Message.of("user", text)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(1200)
def test_the_demo_end_to_end_with_tiny_settings(tmp_path):
    """The demo's wiring (a TrainConfig + hooks through run_training, gateway subprocess, outputs),
    with settings small enough to run in a test."""
    from rlgate.demo.rl import run_demo

    small = {"warm_start_steps": 2, "warm_start_target": None, "warm_start_batch": 8, "group_size": 2,
             "groups_per_step": 2, "eval_every": 1, "eval_items": 4, "eval_samples": 1, "final_eval_samples": 1,
             "concurrency": 8}
    assert run_demo(tmp_path, steps=2, overrides=small) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 2 and len(summary["history"]) == 2
    # one version per applied update (a step whose groups all tied changes no weight: skip_no_signal_updates)
    assert summary["final_version"] == sum(h["updates"] for h in summary["history"])
    assert [s for s, _ in summary["evals"]] == [0, 1, 2]
    assert 0.0 <= summary["accuracy_before"] <= 1.0 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert summary["samples"] > 0 and summary["failed_episodes"] == 0
    for name in ("reward_curve.png", "trajectories.parquet", "final/model.safetensors", "final/tokenizer.json",
                 "config.yaml", "metrics.jsonl"):
        assert (tmp_path / name).is_file(), name
    from rlgate.trajectory.export import read_samples

    samples = read_samples(tmp_path / "trajectories.parquet")
    assert {s.step for s in samples} == {1, 2} and all(s.group_id for s in samples)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(1800)
def test_ctrl_c_in_a_terminal_stops_the_demo_with_one_line_and_its_gateway(tiny_model_dir, tmp_path):
    """A terminal's Ctrl+C reaches the whole foreground process group. It used to reach the demo's
    gateway subprocess too, so the episodes in flight each failed with a ReadError (one printed with its
    traceback) before the demo's own KeyboardInterrupt traceback. Now: one line, exit 130, the gateway
    stopped by the demo (its port closed), nothing left running. The demo runs the default (real-model)
    path on the toy's checkpoint directory: its gateway and episodes start at once, where ``--model tiny``
    first spends minutes on a warm start (the same command code and gateway start either way)."""
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    # SIGINT as a terminal delivers it: pytest-xdist's workers ignore SIGINT, and an ignored signal is
    # inherited across exec (Python then installs no KeyboardInterrupt handler), so restore the default
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "demo", "--model", str(tiny_model_dir),
                             "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    assert proc.stdout is not None
    url = None
    try:
        deadline = time.monotonic() + 1500
        while url is None:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "".join(lines)
            lines.append(line)
            if m := re.search(r"gateway on http://127\.0\.0\.1:(\d+)", line):
                url = int(m.group(1))
        # Ctrl+C once the "before" evaluation's episodes are in flight (the demo's event loop running, its
        # SDK clients connected to the gateway); as a terminal sends it: to the whole group
        while _established(url) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # a failed run: SIGTERM, on which the demo stops its gateway too
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=120)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    assert "rlgate demo: stopped (Ctrl+C)" in out
    for noise in ("Traceback", "ReadError", "KeyboardInterrupt"):
        assert noise not in out, out
    with socket.socket() as s:  # the demo stopped its gateway before exiting
        assert s.connect_ex(("127.0.0.1", url)) != 0
    assert "Traceback" not in (tmp_path / "gateway.log").read_text()


def _established(port: int) -> int:
    """Open TCP connections to 127.0.0.1:``port`` (Linux: /proc/net/tcp; state 01 = ESTABLISHED)."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return sum(1 for r in rows if r[3] == "01" and int(r[1].split(":")[1], 16) == port)
