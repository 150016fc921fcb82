"""Issue 27's training features: LR schedule, LoRA (PEFT), precision, seeded sampling, tracker contents."""

from __future__ import annotations

import itertools
import json

import pytest

torch = pytest.importorskip("torch")


def test_lr_schedules_warm_up_then_decay_to_zero_at_the_last_step():
    from rlgate.train.config import GRPOConfig
    from rlgate.train.grpo import GRPOTrainer

    def factors(schedule, warmup, total=6):
        t = GRPOTrainer(torch.nn.Linear(2, 2), GRPOConfig(lr_schedule=schedule, warmup_steps=warmup, device="cpu"),
                        total_steps=total)
        return [round(t.lr_factor(k), 4) for k in range(total)]

    assert factors("constant", 0) == [1.0] * 6
    assert factors("constant", 2) == [0.3333, 0.6667, 1, 1, 1, 1]
    assert factors("linear", 2) == [0.3333, 0.6667, 1, 0.75, 0.5, 0.25]
    assert factors("cosine", 0) == [1.0, 0.9330, 0.75, 0.5, 0.25, 0.067]
    # a resumed trainer continues the schedule where the run was
    from rlgate.train.config import GRPOConfig as C

    t = GRPOTrainer(torch.nn.Linear(2, 2), C(lr_schedule="linear", device="cpu"), total_steps=4, steps_done=2)
    assert t.lr_factor(t.steps_done) == 0.5


def test_lora_serving_weights_are_the_merged_model(tiny_model_dir, tmp_path):
    """What the engine gets from a LoRA policy equals PEFT's own merge, under the base model's keys."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from rlgate.train.config import TrainConfig
    from rlgate.train.policy import load_policy, save_for_serving, serving_state_dict

    cfg = TrainConfig.model_validate({"model": str(tiny_model_dir), "dataset": "x.jsonl", "agent": "a:b",
                                      "train": {"lora": {"r": 4, "alpha": 8}}})
    model = load_policy(cfg, tiny_model_dir)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < total / 10
    with torch.no_grad():  # as after some training: B != 0
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    served = serving_state_dict(model)
    base_keys = set(AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict())
    assert set(served) == base_keys
    merged = model.merge_and_unload().state_dict()  # PEFT's merge (in place: last)
    assert max(float((served[k] - merged[k]).abs().max()) for k in base_keys) < 1e-5
    save_for_serving(model, tmp_path / "served")  # loads as a plain checkpoint
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "served").state_dict()
    assert max(float((again[k] - merged[k]).abs().max()) for k in base_keys) < 1e-5


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    from train_helpers import write_workdir

    return write_workdir(tmp_path, tiny_model_dir)


def _samples(path):
    from rlgate.trajectory.export import read_samples

    return sorted((s.session_id, tuple(s.input_ids), tuple(round(x, 4) for x in s.logprobs))
                  for f in sorted(path.glob("step-*.parquet")) for s in read_samples(f))


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_lora_run_with_a_schedule_seeded_sampling_and_the_trackers(work):
    pytest.importorskip("peft")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from train_helpers import base_config, rlgate

    cfg = base_config(steps=2, grpo={"lr": 1e-3, "lr_schedule": "linear", "warmup_steps": 1},
                      rollout={"seed": 11, "concurrency": 8}, train={"lora": {"r": 4, "alpha": 8}},
                      tracking={"trajectories": True})
    for out in ("run1", "run2"):
        r = rlgate(work, "train", "--config", "cfg.yaml", "--set", f"out_dir={out}", config=cfg)
        assert r.code == 0, r.text
    # seeded: the second run sampled exactly what the first did (tokens and logprobs), concurrency 8
    assert _samples(work / "run1" / "trajectories") == _samples(work / "run2" / "trajectories")
    run = work / "run1"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["lr"] for m in metrics] == [5e-4, 1e-3]  # warmup, then the linear decay's first value
    for m in metrics:
        assert m["entropy"] > 0 and 0 < m["completion_len_mean"] <= m["completion_len_max"]
        assert "clip_fraction" in m and "approx_kl" in m
        assert m["behav_logprob_abs_err"] < 1e-3  # the engine serves the merged adapter
    ckpt = run / "checkpoints" / "step-000002"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert {"train/lr", "train/entropy", "train/completion_len_mean"} <= set(acc.Tags()["scalars"])
    texts = acc.Tags()["tensors"]
    assert any("samples" in t for t in texts) and any("config" in t for t in texts), texts
    # resume: the base model + the adapter, the schedule continues
    r = rlgate(work, "train", "--config", "cfg.yaml", "--set", "out_dir=run1", "--set", "steps=3", config=cfg)
    assert r.code == 0, r.text
    assert "resuming from run1/checkpoints/step-000002 (step 2)" in r.out
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == list(itertools.accumulate(m["updates"] for m in metrics))
    assert metrics[-1]["lr"] == pytest.approx(1e-3 / 2)
    assert metrics[-1]["behav_logprob_abs_err"] < 1e-3
    # rlgate eval serves the base with the latest adapter merged in
    r = rlgate(work, "eval", "--config", "cfg.yaml", "--set", "out_dir=run1", "--dataset", "train.jsonl",
               "--limit", "2", config=cfg)
    assert r.code == 0, r.text
    assert "is a LoRA adapter: serving" in r.out
    report = json.loads((run / "eval-step-000003.json").read_text())
    assert report["episodes"] == 2 and report["checkpoint"].endswith("step-000003")
    # rlgate serve takes the adapter checkpoint: its base (recorded in it) with the adapter merged
    import subprocess
    import sys

    from helpers import free_port, wait_healthy

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", "run1/checkpoints/step-000003",
                             "--port", str(port), "--store", ":memory:", "--admin-key", "k" * 40], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    assert "is a LoRA adapter: serving" in out and (run / "checkpoints" / "step-000003" / "merged").is_dir()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_training_step_in_bfloat16_and_with_gradient_checkpointing(tiny_model_dir, dtype):
    """train.dtype holds the weights (and AdamW's state) in that dtype; gradient checkpointing runs the
    step in training mode with every dropout off; the step's new metrics are there."""
    from rlgate.train.config import GRPOConfig, TrainConfig
    from rlgate.train.grpo import GRPOTrainer
    from rlgate.train.policy import load_policy
    from rlgate.trajectory.sample import Sample

    cfg = TrainConfig.model_validate({"model": str(tiny_model_dir), "dataset": "x.jsonl", "agent": "a:b",
                                      "train": {"dtype": dtype, "gradient_checkpointing": True}})
    model = load_policy(cfg, tiny_model_dir)
    assert model.dtype == getattr(torch, dtype) and model.is_activation_checkpointing
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-3, device="cpu", micro_batch_size=2))
    assert trainer.model.training and not any(m.training for m in model.modules()
                                              if isinstance(m, torch.nn.Dropout))
    samples = [Sample(id=f"s{i}", input_ids=[5, 6, 7, 8 + i, 9], loss_mask=[0, 0, 1, 1, 1],
                      logprobs=[0.0, 0.0, -3.0, -3.0, -3.0], versions=[-1, -1, 0, 0, 0], reward=float(i % 2))
               for i in range(4)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = trainer.step(samples, ["g", "g", "h", "h"], 0)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["entropy"] > 0 and metrics["completion_len_mean"] == 3.0 and metrics["lr"] == 1e-3
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it learned
    state = next(iter(trainer.optimizer.state.values()))
    assert state["exp_avg"].dtype == getattr(torch, dtype)


def test_wandb_and_mlflow_get_the_samples_table_and_the_config(tmp_path, monkeypatch):
    """The trackers' calls, against stand-ins for the wandb and mlflow modules (neither is installed here)."""
    import sys
    import types

    from rlgate.train.config import TrainConfig
    from rlgate.train.tracking import Trackers
    from rlgate.trajectory.sample import Sample

    calls: list[tuple] = []

    class Run:
        def log(self, data, step=None):
            calls.append(("wandb.log", data, step))

        def finish(self):
            calls.append(("wandb.finish",))

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    wandb = types.SimpleNamespace(init=lambda **kw: calls.append(("wandb.init", kw)) or Run(), Table=Table)
    mlflow = types.SimpleNamespace(
        set_tracking_uri=lambda uri: None, set_experiment=lambda name: None,
        start_run=lambda run_name=None: calls.append(("mlflow.start_run", run_name)),
        log_params=lambda params: calls.append(("mlflow.log_params", params)),
        log_metrics=lambda metrics, step=None: calls.append(("mlflow.log_metrics", metrics, step)),
        log_text=lambda text, path: calls.append(("mlflow.log_text", text, path)),
        end_run=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    cfg = TrainConfig.model_validate({"model": "m", "dataset": "x.jsonl", "agent": "a:b", "out_dir": str(tmp_path),
                                      "tracking": {"wandb": True, "mlflow": True, "tensorboard": False,
                                                   "stdout": False}, "grpo": {"lr_schedule": "cosine"}})
    trackers = Trackers(cfg, tmp_path, 10)
    samples = [Sample(id=f"s{i}", input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1], versions=[-1, 0],
                      reward=float(i), group_id="g0", episode=i,
                      output_message={"role": "assistant", "content": f"answer {i} | with a pipe"}) for i in range(3)]
    trackers.log(1, {"entropy": 2.5, "completion_len_mean": 1.0, "lr": 1e-5})
    trackers.log_samples(1, samples)
    trackers.close()
    init = next(c for c in calls if c[0] == "wandb.init")
    assert init[1]["config"]["grpo"]["lr_schedule"] == "cosine"  # the config, once
    params = next(c for c in calls if c[0] == "mlflow.log_params")[1]
    assert params["grpo.lr_schedule"] == "cosine"
    logged = [c for c in calls if c[0] == "wandb.log"]
    assert logged[0][1]["train/entropy"] == 2.5
    table = logged[1][1]["samples"]
    assert table.columns == ["group", "episode", "reward", "tokens", "completion"]
    assert [row[2] for row in table.data] == [2.0, 0.0]  # the best and the worst episode of the group
    text = next(c for c in calls if c[0] == "mlflow.log_text")
    assert text[2] == "samples/step-000001.md" and "answer 2 \\| with a pipe" in text[1]
