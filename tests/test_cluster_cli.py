"""``rlgate serve --replicas N``: a local Ray cluster of replicas behind the router, from the command line."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
from openai import OpenAI

from helpers import ADMIN_KEY, admin_headers, free_port, wait_healthy
from rlgate.cluster.keys import session_id_replica

pytestmark = pytest.mark.slow


def test_serve_replicas_from_the_command_line(tiny_model_dir, tmp_path):
    port = free_port()
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY, "RLGATE_STORE": ""}
    env.pop("RLGATE_STORE")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", "fake",
         "--replicas", "2", "--ray-num-cpus", "4", "--data-dir", str(tmp_path), "--store-sync", "normal",
         "--header-timeout", "2", "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=240)
        assert httpx.get(url + "/health").json() == {"status": "ok"}  # anonymous: the status only
        health = httpx.get(url + "/health", headers=admin_headers()).json()
        assert health["total"] == 2 and health["status"] == "ok"
        assert all(r["pid"] > 0 and r["state"] == "healthy" for r in health["replicas"])
        replicas = set()
        for i in range(8):
            r = httpx.post(url + "/rl/start_session", json={"task_id": f"t{i}"}, headers=admin_headers())
            assert r.status_code == 200, r.text
            sid, key = r.json()["session_id"], r.json()["api_key"]
            replicas.add(session_id_replica(sid))
            reply = OpenAI(base_url=url + "/v1", api_key=key, max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].finish_reason == "stop"
        assert replicas == {0, 1}
        # the router faces the clients with a gateway's connection limits (server/connections.py)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (70 * 1024) + b"\r\n\r\n")
            assert s.recv(65536).startswith(b"HTTP/1.1 400")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
            assert s.recv(1) == b""  # closed by the header timeout (2 s), not left open
        # a store each, and Ray's auth token (0600) where no --admin-key-file / --ray-token-file says otherwise
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ray-auth-token", "replica-0", "replica-1"]
        assert (tmp_path / "ray-auth-token").stat().st_mode & 0o777 == 0o600
        assert (tmp_path / "replica-0" / "rlgate.sqlite").is_file()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
