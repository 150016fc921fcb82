"""``rlgate train --config``: a tiny run, checkpoints, and resume."""

from __future__ import annotations

import json

import pydantic
import pytest
import yaml

from rlgate.cli import main
from rlgate.train.run import apply_overrides, load_config


def test_overrides_are_typed():
    raw = apply_overrides({"grpo": {"lr": 1.0}}, ["grpo.lr=3e-5", "steps=7", "rollout.mode=subprocess",
                                                   "gateway.url=null"])
    assert raw == {"grpo": {"lr": 3e-5}, "steps": 7, "rollout": {"mode": "subprocess"}, "gateway": {"url": None}}


def test_config_validation(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"model": "m", "dataset": "d.jsonl", "agent": "x:y", "grpo": {"lr": -1}}))
    cfg = load_config(p)
    assert cfg.grpo.lr == -1  # values are the user's; types are checked
    p.write_text(yaml.safe_dump({"model": "m", "dataset": "d.jsonl", "agent": "x:y", "steps": "many"}))
    with pytest.raises(pydantic.ValidationError):
        load_config(p)


@pytest.mark.slow
def test_train_run_checkpoints_and_resumes(tiny_model_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"Which is larger, {a} or {a + 3}?", "answer": str(a + 3)}) + "\n"
                            for a in range(10, 30)))
    cfg = {
        "model": str(tiny_model_dir), "out_dir": str(tmp_path / "run"), "dataset": str(data),
        "eval_dataset": str(data), "agent": "rlgate.demo.math_agent:OpenAIMathAgent",
        "agent_kwargs": {"max_tokens": 4}, "steps": 2, "checkpoint_every": 1,
        "grpo": {"lr": 1e-4, "groups_per_step": 2, "micro_batch_size": 8, "device": "cpu"},
        "rollout": {"group_size": 2, "concurrency": 8},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(path)]) == 0
    run = tmp_path / "run"
    assert (run / "checkpoints" / "latest").read_text() == "step-000002"
    assert (run / "checkpoints" / "step-000001" / "model.safetensors").is_file()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1.0, 2.0]
    # resume: one more step, continuing the count
    assert main(["train", "--config", str(path), "--set", "steps=3"]) == 0
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1.0, 2.0, 3.0]
    assert (run / "checkpoints" / "latest").read_text() == "step-000003"
