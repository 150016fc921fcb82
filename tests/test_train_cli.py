"""``rlgate train`` / ``check`` / ``eval`` through the real CLI: a tiny run, its artefacts, resume,
Ctrl-C, datasets in three formats, a reward function; and the config loader."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rlgate.train.config import ConfigError, apply_overrides, load_config, suggest
from rlgate.train.loading import load_dataset
from train_helpers import base_config, rlgate, write_workdir


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    return write_workdir(tmp_path, tiny_model_dir)


def test_overrides_are_typed():
    raw = apply_overrides({"grpo": {"lr": 1.0}}, ["grpo.lr=3e-5", "steps=7", "rollout.mode=subprocess",
                                                   "gateway.url=null"])
    assert raw == {"grpo": {"lr": 3e-5}, "steps": 7, "rollout": {"mode": "subprocess"}, "gateway": {"url": None}}


def test_config_validation_and_the_saved_form(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"model": "m", "dataset": "d.jsonl", "agent": "x:y"}))
    cfg = load_config(p, ["grpo.lr=3e-6"])
    saved = yaml.safe_load(cfg.to_yaml())
    # the full resolved config: every section, every default
    assert saved["grpo"]["lr"] == 3e-6 and saved["rollout"]["group_size"] == 8 and saved["tracking"]["tensorboard"]
    assert saved["dataset"] == {"path": "d.jsonl", "split": None, "limit": None}
    for bad in ({"steps": "many"}, {"grpo": {"lr": -1}}, {"agent": "no-colon"}, {"gateway": {"sync_dir": "/x"}}):
        p.write_text(yaml.safe_dump({"model": "m", "dataset": "d.jsonl", "agent": "x:y", **bad}))
        with pytest.raises(ConfigError):
            load_config(p)


def test_the_ray_section_is_strict_and_checked_against_the_gateway(tmp_path):
    base = {"model": "m", "dataset": "d.jsonl", "agent": "x:y"}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**base, "ray": {"replicas": 2, "episode": {"resources": {"sandbox": 1}}},
                                 "gateway": {"sync_dir": "/shared/ckpt"}}))
    cfg = load_config(p, ["ray.replica_num_gpus=1"])
    assert cfg.replicas == 2 and cfg.ray is not None and cfg.ray.replica_num_gpus == 1.0
    assert cfg.ray.episode == {"resources": {"sandbox": 1}}
    assert yaml.safe_load(cfg.to_yaml())["ray"]["address"] is None  # written out in full
    with pytest.raises(ConfigError, match="gateway.sync_dir only applies with gateway.url .* or ray.replicas"):
        load_config(p, ["ray=null"])
    assert load_config(p, ["ray=null", "gateway.sync_dir=null"]).replicas == 0
    p.write_text(yaml.safe_dump({**base, "ray": {"replica": 2, "num_cpus": 0}, "gateway": {"url": "http://h:1"}}))
    with pytest.raises(ConfigError) as err:
        load_config(p, ["ray.adress=auto"])
    msg = str(err.value)
    assert "ray.replica: unknown key in " in msg and "did you mean ray.replicas?" in msg
    assert "ray.adress: unknown key (--set ray.adress=auto); did you mean ray.address?" in msg
    assert "ray.num_cpus:" in msg  # ranges too, all at once
    p.write_text(yaml.safe_dump({**base, "ray": {"replicas": 2}, "gateway": {"url": "http://h:1"}}))
    with pytest.raises(ConfigError, match="ray.replicas .* does not combine with gateway.url"):
        load_config(p)
    assert load_config(p, ["ray.replicas=0"]).gateway.url == "http://h:1"  # episodes on Ray, a running gateway


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a local Ray cluster, a replica with its own engine, torch: minutes on a loaded machine
def test_train_on_ray_replicas_with_episodes_as_ray_tasks(work):
    pytest.importorskip("ray")
    marks = work / "marks"
    marks.mkdir()
    with (work / "ray.jsonl").open("w") as f:
        for a in range(10, 18):
            f.write(json.dumps({"question": f"Which is larger, {a} or {a + 3}?", "marks": str(marks)}) + "\n")
    # skip_no_signal_updates off: the step pushes its weights even when both groups' rewards tie (1 run in 4)
    config = base_config(dataset="ray.jsonl", agent="agents:RayTaskAgent", gateway={"ui": True},
                         grpo={"skip_no_signal_updates": False},
                         ray={"replicas": 1, "num_cpus": 4, "episode": {"num_cpus": 1}})
    r = rlgate(work, "train", "--config", "cfg.yaml", config=config, timeout=3000)
    assert r.code == 0, r.text
    result = json.loads(r.out.strip().splitlines()[-1])
    assert result["steps"] == 1 and result["version"] == 1  # the step's weights reached the replica (router)
    assert len(list(marks.iterdir())) >= 4  # every episode of the step ran as a Ray task (2 groups x 2)
    assert (work / "run" / "replicas").is_dir()  # the replica's durable store
    assert (work / "run" / "checkpoints" / "latest").read_text() == "step-000001"
    # gateway.ui: the router serves the viewer; its key is in a 0600 file, never in the output
    key_file = work / "run" / "admin_key"
    assert "viewer: http://127.0.0.1:" in r.out and (key_file.stat().st_mode & 0o777) == 0o600
    assert key_file.read_text().strip() not in r.text


def test_suggestions_cover_typos_sections_and_other_trainers_names():
    assert suggest("learning_rate", "grpo") == "grpo.lr"
    assert suggest("groupsize", "rollout") == "rollout.group_size"
    assert suggest("num_generations") == "rollout.group_size"
    assert suggest("lr") == "grpo.lr"  # right name, wrong section
    assert suggest("max_staleness", "rollout") == "grpo.max_staleness"
    assert suggest("zzzz") is None


def test_datasets_from_jsonl_parquet_and_a_saved_datasets_dir(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlgate.train.config import DatasetSource

    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(rows[:2])}).save_to_disk(str(tmp_path / "dict"))
    for path in ("d.jsonl", "d.parquet", "single", "dict"):
        assert load_dataset(DatasetSource(path=str(tmp_path / path))) == rows
    assert load_dataset(DatasetSource(path=str(tmp_path / "dict"), split="test")) == rows[:2]
    assert load_dataset(DatasetSource(path=str(tmp_path / "d.parquet"), limit=2)) == rows[:2]
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n{"q": \n')
    with pytest.raises(ConfigError, match="bad.jsonl line 2: not valid JSON"):
        load_dataset(DatasetSource(path=str(tmp_path / "bad.jsonl")))
    with pytest.raises(ConfigError, match=r"has splits \['train', 'test'\]"):
        load_dataset(DatasetSource(path=str(tmp_path / "dict"), split="validation"))


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
@pytest.mark.timeout(3600)  # four CLI runs, each loading torch and the model; generous for a loaded machine
def test_train_run_artifacts_check_eval_and_resume(work):
    config = base_config(steps=2, eval_dataset={"path": "train.jsonl", "limit": 3}, keep_checkpoints=1,
                         tracking={"trajectories": True, "plot": True})
    # --check: one episode, its recorded trajectory, nothing trained
    r = rlgate(work, "train", "--config", "cfg.yaml", "--check", config=config)
    assert r.code == 0, r.text
    assert "generated (loss 1)" in r.out and "prompt    (loss 0)" in r.out and "weight versions [0]" in r.out
    assert "surfaces used: chat (OpenAI Chat Completions)" in r.out
    assert not (work / "run" / "checkpoints").exists()

    r = rlgate(work, "train", "--config", "cfg.yaml")
    assert r.code == 0, r.text
    run = work / "run"
    lines = [ln for ln in r.out.splitlines() if " step " in ln and "/2 reward" in ln]
    assert len(lines) == 2 and all(k in lines[0] for k in ("loss", "kl", "tok/s", "eta")), r.out
    assert lines[0][:4].isdigit()  # a timestamp first
    assert (run / "checkpoints" / "latest").read_text() == "step-000002"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000002"]  # keep_checkpoints: 1
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1.0, 2.0]
    assert (run / "reward_curve.png").stat().st_size > 1000
    assert yaml.safe_load((run / "config.yaml").read_text())["keep_checkpoints"] == 1
    scalars = _scalars(run / "tensorboard")
    assert [s for s, _ in scalars["train/reward"]] == [1, 2] and "train/loss" in scalars
    assert [s for s, _ in scalars["eval/reward_mean"]] == [0, 2]
    from rlgate.trajectory.export import read_samples

    step2 = read_samples(run / "trajectories" / "step-000002.parquet")
    assert step2 and {s.step for s in step2} == {2} and all(s.group_id and s.session_id for s in step2)
    assert {s.episode for s in step2} <= {0, 1}

    # eval: a JSON report of the latest checkpoint, samples per item and temperature as asked
    r = rlgate(work, "eval", "--config", "cfg.yaml", "--samples-per-item", "2", "--temperature", "1.0")
    assert r.code == 0, r.text
    report = json.loads((run / "eval-step-000002.json").read_text())
    assert report["episodes"] == 6 and report["samples_per_item"] == 2 and report["temperature"] == 1.0
    assert [len(i["rewards"]) for i in report["per_item"]] == [2, 2, 2]
    assert 0.0 <= report["reward_mean"] <= 1.0 and report["checkpoint"].endswith("step-000002")

    # resume: one more step, continuing the count
    r = rlgate(work, "train", "--config", "cfg.yaml", "--set", "steps=3")
    assert r.code == 0, r.text
    assert "resuming from run/checkpoints/step-000002 (step 2)" in r.out
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1.0, 2.0, 3.0]
    # the engine resumes at the checkpoint's version; one version per applied update (a step without signal
    # changes no weight, skip_no_signal_updates)
    assert [m["version"] for m in metrics] == list(itertools.accumulate(m["updates"] for m in metrics))
    assert [json.loads(x)["step"] for x in (run / "evals.jsonl").read_text().splitlines()] == [0, 2, 3]  # once each
    assert (run / "checkpoints" / "latest").read_text() == "step-000003"
    assert [s for s, _ in _scalars(run / "tensorboard")["train/reward"]] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_function_agent_and_a_reward_function_from_the_current_directory(work):
    """A production agent that returns text (not a reward) trained through `reward: module:fn`."""
    config = base_config(agent="agents:ReturnsText", reward="agents:reply_length_parity")
    r = rlgate(work, "train", "--config", "cfg.yaml", config=config)
    assert r.code == 0, r.text
    config = base_config(agent="agents:function_agent")
    r = rlgate(work, "check", "--config", "cfg.yaml", config=config)
    assert r.code == 0, r.text


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ctrl_c_saves_a_checkpoint_and_says_where(work):
    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(steps=1000, checkpoint_every=500)))
    # As from a terminal: a suite started in the background (`make test &`) hands its children an
    # ignored SIGINT, which Python then keeps ignoring.
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", "cfg.yaml"], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = work / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 1200
    while not (metrics.is_file() and metrics.read_text().strip()):  # wait for a completed step
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 130, out
    latest = (work / "run" / "checkpoints" / "latest").read_text()
    step = int(latest.removeprefix("step-"))
    assert step >= 1 and (work / "run" / "checkpoints" / latest / "model.safetensors").is_file()
    assert f"interrupted: step {step} saved to run/checkpoints/{latest}" in out
