"""Ray's own ports (``cluster/ray_security.py``): the cluster ``rlgate serve --replicas N`` starts
requires Ray's token, keeps the token in a 0600 file (never in a log, an environment or ~/.ray),
binds every port to loopback; joining a cluster needs its token and refuses one without
authentication unless the operator opts out.

The slow tests start ``rlgate serve --replicas 1`` in a subprocess and attack it from other
processes that have no token (only over 127.0.0.1: nothing here touches another interface).
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import free_port
from rlgate.cluster.ray_security import (
    TOKEN_FILE_NAME,
    default_token_file,
    listening_sockets,
    process_tree,
    write_token_file,
)

RAY_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
START_TIMEOUT_S = 600  # only stops a hung test; the cluster starts in ~20 s on this 2-core machine


def clean_env(home: Path, **more: str) -> dict[str, str]:
    """This environment without any Ray authentication setting (the test process's own Ray
    cluster, if one ran, set some), with HOME elsewhere (no ~/.ray/auth_token to fall back on)."""
    env = {k: v for k, v in os.environ.items() if k not in RAY_ENV}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", **more)
    return env


# --------------------------------------------------------------------------- quick: the helpers


def test_the_token_file_is_written_0600_without_following_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "new" / "dir" / TOKEN_FILE_NAME
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    path = write_token_file(target)
    assert path == target and not path.is_symlink() and victim.read_text() == "keep"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", first)  # Ray's own format: 256 bits
    assert write_token_file(target).read_text() != first  # a new token at each start
    deeper = write_token_file(tmp_path / "a" / "b" / TOKEN_FILE_NAME)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE(deeper.parent.stat().st_mode) == 0o700
    private = write_token_file(None)  # no path: a private temporary directory
    assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700


def test_where_rlgate_serve_puts_the_token(tmp_path):
    assert default_token_file(str(tmp_path / "keys" / "admin.key"), str(tmp_path / "data")) == \
        (tmp_path / "keys" / TOKEN_FILE_NAME).resolve()
    assert default_token_file(None, str(tmp_path / "data")) == tmp_path / "data" / TOKEN_FILE_NAME
    assert default_token_file(None, None) is None


def test_listening_sockets_of_a_process_tree(tmp_path):
    """The measurement the startup report and the tests below rely on: a listener of this process
    and one of a grandchild, each with its bind address and the process that holds it."""
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import socket, subprocess, sys
                code = "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); " \\
                       "print(s.getsockname()[1], flush=True); sys.stdin.read()"
                g = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
                print(g.stdout.readline().strip(), flush=True)
                sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(child.stdout.readline())
            found = {(s.host, s.port): s for s in listening_sockets()}
            assert ("127.0.0.1", mine.getsockname()[1]) in found
            assert found[("127.0.0.1", mine.getsockname()[1])].pid == os.getpid()
            theirs = found[("127.0.0.1", port)]
            assert theirs.pid in process_tree(child.pid) and theirs.pid != child.pid
            assert theirs.loopback and not theirs.every_interface
        finally:
            child.stdin.close()
            child.wait(timeout=60)


def test_the_train_config_carries_the_token_and_the_opt_out():
    from rlgate.train.config import RaySettings
    from rlgate.train.gateway import ray_cluster_config

    cfg = ray_cluster_config(RaySettings(address="10.0.0.1:6379", token_file="/k/t", allow_unauthenticated=True),
                             replicas=2)
    assert (cfg.ray_address, cfg.ray_token_file, cfg.ray_allow_unauthenticated, cfg.replicas) == \
        ("10.0.0.1:6379", "/k/t", True, 2)
    assert RaySettings().allow_unauthenticated is False


def test_the_flags(capsys):
    from rlgate.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--ray-token-file PATH" in out
    assert "--ray-allow-unauthenticated, --no-ray-allow-unauthenticated" in out


# --------------------------------------------------------------------------- slow: a real cluster


@dataclass
class Served:
    proc: subprocess.Popen
    log: Path
    token_file: Path
    home: Path
    gcs: str
    url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("ray")
    work = tmp_path_factory.mktemp("served")
    home, keys = work / "home", work / "keys"
    home.mkdir()
    keys.mkdir()
    port = free_port()
    log = work / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", "fake",
             "--replicas", "1", "--ray-num-cpus", "2", "--data-dir", str(work / "data"),
             "--admin-key-file", str(keys / "admin.key"), "--port", str(port),
             "--log-level", "debug", "--access-log"],
            env=clean_env(home), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # until the router answers: the report is printed before it binds
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        gcs = re.search(r"(127\.0\.0\.1:\d+) +Ray GCS server", log.read_text())
        assert gcs, log.read_text()
        yield Served(proc, log, keys / TOKEN_FILE_NAME, home, gcs.group(1), url)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_the_token_is_private_and_never_logged(served):
    token = served.token_file.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert stat.S_IMODE(served.token_file.stat().st_mode) == 0o600  # beside --admin-key-file
    out = served.output()
    assert f"token in {served.token_file} (mode 0600" in out  # its path is printed, never the token
    assert token not in out
    logs = re.search(r"Ray logs in (\S+)", out)
    assert logs, out
    files = [p for p in Path(logs.group(1)).rglob("*") if p.is_file()]
    assert len(files) > 5
    assert not [p for p in files if token in p.read_text(errors="replace")]
    # Ray gets the token's path, not the token: no process of the cluster has it in its environment
    pids = process_tree(served.proc.pid)
    assert len(pids) > 5
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue  # ended meanwhile
        assert token not in environ
    assert not (served.home / ".ray").exists()  # nothing written to $HOME


@pytest.mark.slow
def test_every_ray_port_binds_loopback_only(served):
    sockets = listening_sockets(served.proc.pid)
    assert served.gcs in {s.address for s in sockets}
    assert len({s.pid for s in sockets}) >= 5  # rlgate serve, the GCS, the raylet, the workers, the agents
    wide = [s for s in sockets if not s.loopback]
    assert not wide, wide  # none of them is documented as impossible to bind to loopback
    table = [line for line in served.output().splitlines() if re.match(r"rlgate:   \S+:\d+ ", line)]
    assert len(table) >= 8 and all("127.0.0.1:" in line for line in table), table
    assert "every Ray port above binds loopback only" in served.output()


GRPC_METHODS = ("/ray.rpc.NodeInfoGcsService/CheckAlive", "/ray.rpc.NodeManagerService/GetNodeStats",
                "/ray.rpc.ObjectManagerService/Pull", "/ray.rpc.CoreWorkerService/PushTask")


def _answer_without_token(port: int) -> str:
    """What a port answers to a client without a token: an HTTP status, or the gRPC status of the
    first of GRPC_METHODS the server implements (UNAUTHENTICATED is what token auth answers)."""
    import grpc

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            return f"HTTP {r.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, http.client.HTTPException):
        pass  # not HTTP/1: a gRPC server (HTTP/2)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for method in GRPC_METHODS:
            try:
                channel.unary_unary(method)(b"", timeout=10)
                return f"gRPC OK ({method})"
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    return f"gRPC {exc.code().name}"
    return "gRPC UNIMPLEMENTED"


@pytest.mark.slow
def test_every_port_refuses_a_client_without_the_token(served):
    answers = {}
    for s in listening_sockets(served.proc.pid):
        answers[s] = _answer_without_token(s.port)
    for s, answer in answers.items():
        if s.process == "autoscaler monitor":
            assert answer == "HTTP 200"  # read-only Prometheus gauges, on loopback (docs/security.md)
        elif s.address == served.url.removeprefix("http://") or (
                s.process.startswith("ray::GatewayReplica") and answer.startswith("HTTP")):
            assert answer == "HTTP 404"  # the router, a replica's gateway: rlgate's own keys guard every route
        elif s.process == "ray::RuntimeEnvAgent":
            assert answer == "HTTP 401", s
        else:
            assert answer == "gRPC UNAUTHENTICATED", (s, answer)
    assert sum(a == "gRPC UNAUTHENTICATED" for a in answers.values()) >= 5  # GCS, raylet x2, workers, driver


JOIN = textwrap.dedent("""
    import os, sys, time
    import ray
    t = time.monotonic()
    try:
        ray.init(address=sys.argv[1], log_to_driver=False, namespace="rlgate")
        actor = ray.get_actor("rlgate-replica-0", namespace="rlgate")
        print("JOINED; replica 0 answers:", ray.get(actor.info.remote(), timeout=60)["state"])
    except Exception as exc:
        print(f"REFUSED after {time.monotonic() - t:.1f} s: {type(exc).__name__}: {exc}")
""")


@pytest.mark.slow
def test_a_process_without_the_token_cannot_join(served, tmp_path):
    # the strongest attacker on this machine: Ray's single-machine switch keeps 127.0.0.1 as given
    env = clean_env(tmp_path, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    r = subprocess.run([sys.executable, "-c", JOIN, served.gcs], env=env, capture_output=True, text=True,
                       timeout=600)
    assert "REFUSED" in r.stdout and "JOINED" not in r.stdout, r.stdout + r.stderr
    assert "Authentication token is missing or incorrect" in r.stderr, r.stderr
    # the same process with the token joins and reaches the replica: the token is what kept it out
    r = subprocess.run([sys.executable, "-c", JOIN, served.gcs], capture_output=True, text=True, timeout=600,
                       env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(served.token_file)})
    assert "JOINED; replica 0 answers: healthy" in r.stdout, r.stdout + r.stderr


PREPARE_JOIN = textwrap.dedent("""
    import sys
    from rlgate.cluster.ray_security import prepare_join
    address, token_file, allow = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "1"
    try:
        joined = prepare_join(address, token_file=token_file, allow_unauthenticated=allow)
    except SystemExit as exc:
        print("EXIT", exc)
    else:
        print("READY", joined)
""")


def prepare_join_in(env: dict[str, str], address: str, token_file: str = "", allow: bool = False
                    ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PREPARE_JOIN, address, token_file, "1" if allow else "0"],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_joining_needs_the_clusters_token(served, tmp_path):
    env = clean_env(tmp_path)
    r = prepare_join_in(env, served.gcs)
    assert r.stdout.startswith(f"EXIT rlgate: the Ray cluster at {served.gcs} requires its authentication token"), \
        r.stdout + r.stderr
    wrong = tmp_path / "wrong-token"
    wrong.write_text("0" * 64)
    wrong.chmod(0o600)
    r = prepare_join_in(env, served.gcs, str(wrong))
    assert r.stdout.strip() == f"EXIT rlgate: the Ray cluster at {served.gcs} refused the token from {wrong} " \
                               "(not this cluster's token)", r.stdout + r.stderr
    r = prepare_join_in(env, served.gcs, str(served.token_file))
    assert r.stdout.strip() == f"READY {served.gcs}", r.stdout + r.stderr
    assert served.token_file.read_text() not in r.stdout + r.stderr


@pytest.fixture(scope="module")
def unauthenticated_cluster(tmp_path_factory):
    """A local Ray cluster without authentication (as rlgate started them before), on loopback."""
    pytest.importorskip("ray")
    home = tmp_path_factory.mktemp("unauth-home")
    code = textwrap.dedent("""
        import sys, ray
        ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1",
                 object_store_memory=80 * 1024 * 1024, log_to_driver=False)
        print(ray._private.worker.global_worker.node.address_info["gcs_address"], flush=True)
        sys.stdin.read()
        ray.shutdown()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env=clean_env(home, RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
    try:
        address = proc.stdout.readline().strip()  # blocks until the cluster is up (or the process died)
        assert re.fullmatch(r"127\.0\.0\.1:\d+", address), f"no cluster: {address!r}"
        yield address
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_rlgate_serve_refuses_to_join_a_cluster_without_authentication(unauthenticated_cluster, tiny_model_dir,
                                                                      tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", "fake",
         "--replicas", "1", "--ray-address", unauthenticated_cluster, "--store", ":memory:", "--port",
         str(free_port())], env=clean_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"rlgate: refusing to join the Ray cluster at {unauthenticated_cluster}: it runs without authentication "
        "(anyone who reaches its ports can run code as its user and read the gateway's admin key); restart it "
        "with RAY_AUTH_MODE=token, or accept the risk with --ray-allow-unauthenticated (rlgate train: "
        "ray.allow_unauthenticated: true)")
    assert "replicas up" not in r.stdout


@pytest.mark.slow
def test_the_opt_out_joins_with_a_loud_warning(unauthenticated_cluster, tmp_path):
    r = prepare_join_in(clean_env(tmp_path), unauthenticated_cluster, allow=True)
    assert r.stdout.strip() == f"READY {unauthenticated_cluster}", r.stdout + r.stderr
    assert f"WARNING: joining the Ray cluster at {unauthenticated_cluster}, which runs WITHOUT authentication" \
        in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("trainer", [False, True], ids=["episodes-on-ray", "trainer-on-ray"])
def test_rlgate_train_refuses_to_join_a_cluster_without_authentication(unauthenticated_cluster, tiny_model_dir,
                                                                       tmp_path, trainer):
    import yaml

    from train_helpers import base_config, write_workdir

    (tmp_path / "work").mkdir()
    work = write_workdir(tmp_path / "work", tiny_model_dir)
    ray: dict[str, object] = {"address": unauthenticated_cluster}
    if trainer:
        ray["trainer"] = {"num_cpus": 1}
    (work / "cfg.yaml").write_text(yaml.safe_dump(base_config(ray=ray)))
    r = subprocess.run([sys.executable, "-m", "rlgate.cli", "train", "--config", "cfg.yaml"], cwd=work,
                       env=clean_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"rlgate: refusing to join the Ray cluster at {unauthenticated_cluster}: it runs without authentication" \
        in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert not (work / "run" / "checkpoints").exists()
