"""``ray.trainer``: ``rlgate train`` runs the whole run (gateway, model, optimiser, GRPO loop) as one
Ray actor on a local Ray cluster and only waits: the run is in another process, its artefacts are
the usual ones, its output and its end (done, error, Ctrl-C) reach the driver."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rlgate.cli import main
from rlgate.rollout.errors import RunError
from rlgate.train.config import ConfigError, TrainerSettings, load_config
from rlgate.train.remote import check_feasible
from train_helpers import base_config, write_workdir


@pytest.fixture
def work(tmp_path, tiny_model_dir):
    return write_workdir(tmp_path, tiny_model_dir)


def _remote(**over):
    # 4 CPUs in the local Ray cluster: 1 for the trainer, the rest for episode tasks
    return base_config(ray={"num_cpus": 4, "trainer": {"num_cpus": 1}}, **over)


def _popen(work, config):
    (work / "cfg.yaml").write_text(yaml.safe_dump(config))
    # a default SIGINT, as from a terminal (a suite run in the background hands down an ignored one)
    return subprocess.Popen([sys.executable, "-m", "rlgate.cli", "train", "--config", "cfg.yaml"], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_the_trainer_section_is_strict_and_fails_before_anything_is_submitted(work, capsys):
    p = work / "cfg.yaml"
    p.write_text(yaml.safe_dump(_remote()))
    cfg = load_config(p, ["ray.trainer.num_gpus=1", "ray.trainer.resources={trainer_node: 1}"])
    assert cfg.ray is not None and cfg.ray.trainer == TrainerSettings(num_cpus=1, num_gpus=1,
                                                                      resources={"trainer_node": 1})
    assert yaml.safe_load(cfg.to_yaml())["ray"]["trainer"]["memory_gb"] is None  # written out in full
    assert load_config(p, ["ray.trainer=null"]).ray.trainer is None  # type: ignore[union-attr]
    with pytest.raises(ConfigError) as err:
        load_config(p, ["ray.trainer.num_cpu=2", "ray.trainer.memory_gb=0"])
    assert "ray.trainer.num_cpu: unknown key (--set ray.trainer.num_cpu=2); did you mean ray.trainer.num_cpus?" \
        in str(err.value)
    assert "ray.trainer.memory_gb:" in str(err.value)  # ranges too, all at once
    # through the CLI: exit 2 with the message, and no run started (no Ray, no out_dir)
    assert main(["train", "--config", str(p), "--set", "ray.trainer.gpus=1"]) == 2
    captured = capsys.readouterr()
    assert "ray.trainer.gpus: unknown key" in captured.err and "did you mean ray.trainer.num_gpus?" in captured.err
    assert "trainer: on the Ray cluster" not in captured.out and not (work / "run").exists()


def test_a_request_no_node_can_hold_fails_at_once():
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "memory": 16 * 1024**3}},
             {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # a dead node holds nothing
             {"Alive": True, "Resources": {"CPU": 2.0, "GPU": 1.0, "trainer_node": 1.0}}]
    check_feasible(TrainerSettings(num_cpus=2, num_gpus=1, resources={"trainer_node": 1}), nodes)
    check_feasible(TrainerSettings(num_cpus=8, memory_gb=16), nodes)
    with pytest.raises(RunError, match=r"no node of the Ray cluster has CPU=4, GPU=1 \(the most any node has: "
                                       r"CPU=8, GPU=1\)"):
        check_feasible(TrainerSettings(num_cpus=4, num_gpus=1), nodes)
    with pytest.raises(RunError, match="sandbox=1"):
        check_feasible(TrainerSettings(resources={"sandbox": 1}), nodes)


def test_a_gateway_on_every_interface_is_advertised_at_the_nodes_ip():
    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from rlgate.server.runner import ServerThread
    from rlgate.train.gateway import advertised_url

    assert advertised_url("http://127.0.0.1:8000", "127.0.0.1") == "http://127.0.0.1:8000"
    app = Starlette(routes=[Route("/health", lambda r: PlainTextResponse("ok"))])
    with ServerThread(app, host="0.0.0.0") as bound:
        assert bound.startswith("http://0.0.0.0:")
        url = advertised_url(bound, "0.0.0.0")
        assert not url.startswith("http://0.0.0.0:") and url.endswith(":" + bound.rsplit(":", 1)[1])
        assert httpx.get(url + "/health").text == "ok"  # what an episode on another node would use


@pytest.mark.slow
@pytest.mark.timeout(3600)  # a local Ray cluster, torch and the tiny model in a Ray worker: minutes on a busy machine
def test_rlgate_train_runs_the_trainer_as_a_ray_actor(work):
    # the gateway on every interface, as on a multi-node cluster: the episodes (Ray tasks) are
    # given the node's IP, not 0.0.0.0, and reach it
    proc = _popen(work, _remote(steps=2, gateway={"host": "0.0.0.0"}))
    out, err = proc.communicate(timeout=3000)
    assert proc.returncode == 0, out + err
    trainer = json.loads((work / "run" / "trainer.json").read_text())
    # the loop ran in another process than the driver (the CLI) and this test
    assert trainer["pid"] not in (proc.pid, os.getpid()) and trainer["node_id"]
    assert f"trainer: on the Ray cluster, pid {trainer['pid']} on " in out
    result = json.loads(out.strip().splitlines()[-1])  # printed by the driver from the actor's answer
    assert result["steps"] == 2
    assert result["checkpoint"] == "run/checkpoints/step-000002"
    lines = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1.0, 2.0]
    # one version per applied update (a step whose groups all tied changes no weight: skip_no_signal_updates)
    assert result["version"] == sum(m["updates"] for m in lines) == lines[-1]["version"]
    assert (work / "run" / "checkpoints" / "latest").read_text() == "step-000002"
    assert (work / "run" / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert (work / "run" / "config.yaml").is_file()
    # the actor's stdout, forwarded by Ray (step 1 is printed long before the run ends)
    assert re.search(rf"\(TrainerActor pid={trainer['pid']}\).* step 1/2 reward ", out), out


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_failing_remote_run_ends_with_its_message_and_exit_code(work):
    proc = _popen(work, _remote(agent="agents:CrashingAgent", steps=50))
    out, err = proc.communicate(timeout=3000)
    assert proc.returncode == 1, out + err
    mine = [line for line in err.splitlines() if line.startswith("rlgate train: error:")]  # the driver's own
    assert len(mine) == 1 and "4 episodes failed in a row (rollout.max_consecutive_failures = 4)" in mine[0]
    assert "ValueError: the tool server is down" in mine[0]
    # the driver's own lines (not the actor's, forwarded with its prefix): the run's message, no Ray traceback
    own = "\n".join(line for line in err.splitlines() if "(TrainerActor pid=" not in line)
    assert "RayTaskError" not in own and "Traceback" not in own
    assert "step 1/" not in out


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)")],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_the_remote_run_and_it_saves_its_last_step(work, sig, code, said):
    proc = _popen(work, _remote(steps=1000, checkpoint_every=500))
    metrics = work / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 2400
    while not (metrics.is_file() and metrics.read_text().strip()):  # wait for a completed step
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    pid = json.loads((work / "run" / "trainer.json").read_text())["pid"]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == code, out + err
    assert "stopping the trainer on the Ray cluster" in err
    latest = (work / "run" / "checkpoints" / "latest").read_text()
    step = int(latest.removeprefix("step-"))
    assert step >= 1 and (work / "run" / "checkpoints" / latest / "model.safetensors").is_file()
    assert f"{said}: step {step} saved to run/checkpoints/{latest}" in out  # the driver says where
    deadline = time.monotonic() + 120
    while _alive(pid):  # the actor's process ended with the driver
        assert time.monotonic() < deadline, f"trainer process {pid} outlived the driver"
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_trainer_joins_an_existing_cluster(work, tmp_path_factory):
    from helpers import free_port
    from rlgate.cluster.ray_security import write_token_file

    port = free_port()
    head_dir = tmp_path_factory.mktemp("ray-head")
    log = head_dir / "head.log"
    token = write_token_file(head_dir / "ray-auth-token")  # the cluster requires its token: rlgate joins no other
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # Ray's single-machine mode keeps the head on 127.0.0.1 (every port on loopback)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token), RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    with log.open("w") as f:  # `ray start --block` ends its cluster when terminated
        head = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "ray"), "start", "--head", "--block",
                                 "--port", str(port), "--node-ip-address", "127.0.0.1", "--num-cpus", "4",
                                 "--include-dashboard=false", "--object-store-memory", str(128 * 1024 * 1024)],
                                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        config = base_config(steps=1, ray={"address": f"127.0.0.1:{port}", "token_file": str(token),
                                           "trainer": {"num_cpus": 1}})
        proc = _popen(work, config)
        out, err = proc.communicate(timeout=3000)
        assert proc.returncode == 0, out + err
        assert re.search(rf"Connecting to existing Ray cluster at address: [0-9.]+:{port}\b", err), err
        trainer = json.loads((work / "run" / "trainer.json").read_text())
        assert trainer["pid"] != proc.pid and f"pid {trainer['pid']} on " in out
        assert (work / "run" / "checkpoints" / "latest").read_text() == "step-000001"
    finally:
        head.terminate()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
