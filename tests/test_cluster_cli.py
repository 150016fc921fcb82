"""``rlgate serve --replicas N``: a local Ray cluster of replicas behind the router, from the command line."""

from __future__ import annotations

import os
import signal
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
         "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=240)
        health = httpx.get(url + "/health").json()
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
        assert sorted(p.name for p in tmp_path.iterdir()) == ["replica-0", "replica-1"]  # a store each
        assert (tmp_path / "replica-0" / "rlgate.sqlite").is_file()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
