"""``rlgate serve --online-train --online-train-config FILE``: the online trainer takes rlgate train's
``grpo:`` and ``train:`` sections (KL, clipping, warmup, micro-batches, dtype, LoRA), checked as strictly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from helpers import admin_headers, serve_gateway
from rlgate.train.config import ConfigError, load_online_train_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "online.yaml"
    path.write_text(text)
    return path


def test_the_sections_of_rlgate_train_are_read(tmp_path):
    cfg = load_online_train_config(_write(tmp_path, """
grpo:
  kl_coef: 0.05
  clip_low: 0.1
  warmup_steps: 3
  micro_batch_size: 4
train:
  dtype: mixed
  lora: {r: 4, alpha: 8}
"""), lr=2e-4)
    assert (cfg.grpo.kl_coef, cfg.grpo.clip_low, cfg.grpo.warmup_steps, cfg.grpo.micro_batch_size) == (0.05, 0.1, 3, 4)
    assert cfg.grpo.lr == 2e-4  # --online-lr, the file sets none
    assert cfg.train.dtype == "mixed" and cfg.train.lora is not None and cfg.train.lora.r == 4
    assert load_online_train_config(_write(tmp_path, "grpo: {lr: 3.0e-5}\n"), lr=2e-4).grpo.lr == 3e-5  # the file's
    assert load_online_train_config(_write(tmp_path, ""), lr=1e-5).train.lora is None  # an empty file: defaults


def test_every_problem_is_named_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_online_train_config(_write(tmp_path, """
rollout: {group_size: 4}
grpo:
  groups_per_step: 4
  max_staleness: 2
  lr_schedule: cosine
  kl: 0.1
  clip_low: 7
train:
  dtype: float16
"""), lr=1e-5)
    text = str(err.value)
    assert text.startswith(f"--online-train-config {tmp_path / 'online.yaml'}: invalid:")
    assert "rollout: not read online (only grpo: and train: are" in text
    assert "grpo.groups_per_step: the offline loop's; online, a step takes --train-batch rewarded samples" in text
    assert "grpo.max_staleness: the offline loop's; online, --max-staleness-versions" in text
    assert "grpo.lr_schedule: 'cosine' decays to 0 at a run's last step" in text
    assert "grpo.kl: unknown key" in text and "did you mean grpo.kl_coef?" in text
    assert "grpo.clip_low:" in text and "train.dtype:" in text
    assert len(text.splitlines()) == 8  # the heading and seven problems


def test_a_file_that_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_online_train_config(tmp_path / "missing.yaml", lr=1e-5)
    with pytest.raises(ConfigError, match="expected a mapping with grpo: and train:, got list"):
        load_online_train_config(_write(tmp_path, "- 1\n- 2\n"), lr=1e-5)
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_online_train_config(_write(tmp_path, "grpo: {lr: [\n"), lr=1e-5)


@pytest.mark.torch
def test_a_lora_trainer_with_kl_trains_only_its_adapters_and_publishes_merged_weights(tiny_model_dir, tokenizer):
    """The online trainer holds the model as ``train:`` says (LoRA here): a step moves only the adapters, the
    candidate it publishes is the base plus the merged adapters, and the KL term is computed against the start."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.config import OnlineConfig
    from rlgate.train.config import GRPOConfig, LoraSettings, ModelSettings, OnlineTrainConfig
    from rlgate.train.online import build_online_training
    from rlgate.trajectory.sample import Sample

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    base = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = OnlineTrainConfig(grpo=GRPOConfig(lr=5e-2, kl_coef=0.1, device="cpu"),
                            train=ModelSettings(lora=LoraSettings(r=4, alpha=8)))
    training = build_online_training(model, OnlineConfig(train=True), tokenizer, train_config=cfg)
    assert training.trainer is not None and training.engines is not None
    policy = training.trainer.stepper
    trainable = {n for n, p in policy.trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert policy.trainer.config.kl_coef == 0.1 and policy.trainer.ref_model is not None
    assert training.snapshot()["trainer_settings"]["train"]["lora"]["r"] == 4

    samples = [Sample(id=f"s{i}", input_ids=[5, 6, 7, 8 + i, 9], loss_mask=[0, 0, 1, 1, 1],
                      logprobs=[0.0, 0.0, -2.0, -2.0, -2.0], versions=[-1, -1, 0, 0, 0], reward=float(i % 2))
               for i in range(4)]
    metrics = policy.step(samples, ["g", "g", "g", "g"], 0)
    assert metrics["updates"] == 1 and metrics["kl_ref"] >= 0

    async def publish() -> int | None:
        await training.engines.start()
        try:
            return await policy.publish()
        finally:
            await training.engines.close()

    assert asyncio.run(publish()) == 1
    served = training.engines.slot_of(1).model.state_dict()  # the candidate's slot
    changed = [k for k, v in served.items() if not torch.equal(v, base[k])]
    assert changed and all(k.endswith(".weight") and ("proj" in k) for k in changed)  # adapted layers only
    base_now = policy.trainer.model.get_base_model().state_dict()
    assert all(torch.equal(v, base[k.replace(".base_layer", "")]) for k, v in base_now.items() if "lora_" not in k)


@pytest.mark.torch
def test_serve_reads_the_file_and_shows_the_settings(tiny_model_dir, tmp_path):
    """From another process: the settings reach the trainer (GET /rl/online); a bad file stops serve at once."""
    good = _write(tmp_path, "grpo: {kl_coef: 0.02, clip_low: 0.15}\ntrain: {dtype: mixed}\n")
    with serve_gateway(tiny_model_dir, "--online", "--online-train", "--online-train-config", str(good)) as url:
        r = httpx.get(url + "/rl/online", headers=admin_headers(), timeout=60)
        assert r.status_code == 200, r.text
        shown = r.json()["trainer_settings"]
        assert shown["grpo"]["kl_coef"] == 0.02 and shown["grpo"]["clip_low"] == 0.15
        assert shown["grpo"]["lr"] == 1e-5 and shown["train"]["dtype"] == "mixed"
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: {groups_per_step: 2}\n")
    done = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--port", "0",
                           "--online", "--online-train", "--online-train-config", str(bad)],
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                               "RLGATE_ADMIN_KEY": "k" * 32})
    assert done.returncode != 0
    assert "grpo.groups_per_step: the offline loop's" in done.stderr, done.stderr


def test_the_example_in_the_docs_is_a_valid_file(tmp_path):
    """docs/online.md's example file (a YAML block, which the docs test does not run) loads as written."""
    import re

    text = (Path(__file__).parent.parent / "docs" / "online.md").read_text()
    section = text[text.index("**The trainer's settings are `rlgate train`'s.**"):]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    cfg = load_online_train_config(_write(tmp_path, block.group(1)), lr=1e-4)
    assert cfg.grpo.kl_coef == 0.02 and cfg.train.lora is not None and cfg.train.lora.r == 16
