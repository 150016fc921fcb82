"""``gateway.policy``: several ``rlgate train`` runs share one ``rlgate serve``, each training its own LoRA
adapter policy and pushing only the adapter; one run's pushes never change another's versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
import yaml

from helpers import ADMIN_KEY, admin_headers, serve_gateway
from rlgate.train.config import ConfigError, load_config
from train_helpers import base_config, write_workdir


def test_gateway_policy_needs_a_running_gateway_and_lora(tmp_path) -> None:
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(base_config(gateway={"policy": "a"})))
    with pytest.raises(ConfigError, match="gateway.policy .* needs gateway.url and train.lora"):
        load_config(p)
    p.write_text(yaml.safe_dump(base_config(gateway={"policy": "a", "url": "http://h:1"})))
    with pytest.raises(ConfigError, match="needs gateway.url and train.lora"):
        load_config(p)
    p.write_text(yaml.safe_dump(base_config(gateway={"policy": "a", "url": "http://h:1"}, train={"lora": {"r": 4}})))
    assert load_config(p).gateway.policy == "a"


def _run(work, name: str, url: str, steps: int, out_dir: str | None = None) -> subprocess.Popen:
    cfg = base_config(out_dir=out_dir or f"run-{name}", steps=steps, gateway={"url": url, "policy": name},
                      rollout={"group_size": 4},  # a step without reward variance pushes nothing: 1 in 64 here
                      train={"lora": {"r": 4, "alpha": 8}}, tracking={"plot": False, "trajectories": True})
    (work / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", f"{name}.yaml"], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY})


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_two_runs_train_their_own_adapters_on_one_gateway(tmp_path, tiny_model_dir) -> None:
    import pyarrow.parquet as pq

    work = write_workdir(tmp_path, tiny_model_dir)
    with serve_gateway(tiny_model_dir) as url:
        runs = {name: _run(work, name, url, steps=2) for name in ("a", "b")}
        outputs = {name: proc.communicate(timeout=3000)[0] for name, proc in runs.items()}
        for name, proc in runs.items():
            assert proc.returncode == 0, outputs[name]
        listed = httpx.get(url + "/rl/policies", headers=admin_headers()).json()
        versions = {p["name"]: p["version"] for p in listed["policies"]}
        # each policy at its own run's last version (0 at the start, one push per step that learned something:
        # a step without reward variance pushes nothing); the base untouched
        finals = {name: json.loads(outputs[name].strip().splitlines()[-1])["version"] for name in runs}
        assert versions == {listed["default"]: 0, **finals} and min(finals.values()) >= 1
        for name in ("a", "b"):
            out = work / f"run-{name}"
            steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            assert [s["step"] for s in steps] == [1.0, 2.0]
            assert all(s["failed_episodes"] == 0 for s in steps), outputs[name]
            # every trained token is this run's policy's, at one of its own versions
            for step in (1, 2):
                table = pq.read_table(out / "trajectories" / f"step-{step:06d}.parquet").to_pylist()
                assert table and {row["policy"] for row in table} == {name}
                generated = {v for row in table for v, m in zip(row["versions"], row["loss_mask"], strict=True) if m}
                assert generated <= set(range(finals[name] + 1))
            # the pushes were the adapter alone: a few hundred kB, no full checkpoint
            pushed = sorted((out / "sync").iterdir())
            assert pushed and all((d / "adapter_model.safetensors").is_file() for d in pushed)
            assert not any((d / "model.safetensors").exists() for d in pushed)
            assert max((d / "adapter_model.safetensors").stat().st_size for d in pushed) < 2 * 1024 * 1024
        # a new run may not take a policy another run trains; the same run resumed pushes to its own
        other = _run(work, "a", url, steps=1, out_dir="run-other")
        out = other.communicate(timeout=3000)[0]
        assert other.returncode == 1 and "serves a policy 'a' already" in out, out
        resumed = _run(work, "a", url, steps=2)  # run-a again: nothing left to train, its adapter pushed once
        out = resumed.communicate(timeout=3000)[0]
        assert resumed.returncode == 0 and json.loads(out.strip().splitlines()[-1])["version"] == finals["a"] + 1, out
