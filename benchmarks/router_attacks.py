"""Issue 23's attacks on the cluster router, measured against `rlgate serve --replicas 2`.

Starts `rlgate serve --model DIR --engine fake --replicas 2` (the router runs in that process,
the replicas in Ray workers) and, with default settings:

1. **uploads**: 20 concurrent 30 MB request bodies with no key; the router's RSS before, at its
   peak and after, and what the uploads were answered;
2. **trickle**: connections that each send 10 of 1,000 announced body bytes, no key, held open;
   then legitimate requests (a session and a chat call) at 5 s and at 70 s: how many got 200;
3. **health**: what an anonymous `GET /health` shows.

``--src DIR`` runs another checkout's code (``git archive <commit> src | tar -x -C /tmp/base``),
so before / after are measured side by side with the same client::

    python benchmarks/router_attacks.py --model /tmp/tiny
    python benchmarks/router_attacks.py --model /tmp/tiny --src /tmp/base/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from procs import free_port, rss_mib, wait_healthy

ADMIN = "router-attacks-admin-key-" + "x" * 32
AH = {"Authorization": f"Bearer {ADMIN}"}


class Cluster:
    def __init__(self, model: str, src: str | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="rlgate-router-", suffix=".log")[1])
        env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if src:
            env["PYTHONPATH"] = src
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake", "--replicas", "2",
             "--port", str(self.port), "--store", ":memory:"],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_healthy(self.url, self.proc, timeout=600, log=self.log)
        self.peak = 0.0
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.proc.pid))
            time.sleep(0.05)

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        self.log.unlink(missing_ok=True)


def _upload(url: str, size: int) -> str:
    host, port = url.removeprefix("http://").split(":")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    chunk = b" " * (1024 * 1024)
    try:
        with socket.create_connection((host, int(port)), timeout=120) as s:
            s.sendall(head)
            sent = 0
            while sent < size:
                s.sendall(chunk)
                sent += len(chunk)
            return s.recv(64)[:12].decode("latin-1")
    except OSError as exc:  # refused early: the server closed while we were still sending
        return type(exc).__name__


def uploads(c: Cluster) -> dict[str, object]:
    before = c.rss()
    c.peak = before
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(_upload(c.url, 30 * 1024 * 1024))) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(2)  # let the allocator settle before the "after" sample (a measurement, not a test)
    answers = {a: results.count(a) for a in set(results)}
    return {"rss_before_mib": round(before), "rss_peak_mib": round(c.peak), "rss_after_mib": round(c.rss()),
            "answers": answers}


async def _legit(url: str) -> bool:
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as h:
            r = await h.post("/rl/start_session", json={"task_id": "legit"}, headers=AH)
            if r.status_code != 200:
                return False
            key = r.json()["api_key"]
            r = await h.post("/v1/chat/completions", json={"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "hi"}]}, headers={"Authorization": f"Bearer {key}"})
            return r.status_code == 200
    except httpx.HTTPError:
        return False


async def _legit_batch(url: str) -> list[bool]:
    return list(await asyncio.wait_for(asyncio.gather(*(_legit(url) for _ in range(10))), 60))


def trickle(c: Cluster, n: int) -> dict[str, object]:
    host, port = c.url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n" + b"{" * 10)
            socks.append(s)
        except OSError:
            break
    out: dict[str, object] = {"attack_connections": len(socks)}
    try:
        for at in (5, 70):
            time.sleep(max(0.0, at - (5 if at == 70 else 0)))
            ok = asyncio.run(_legit_batch(c.url))
            out[f"legit_ok_at_{at}s"] = f"{sum(ok)}/10"
    except TimeoutError:
        out["legit"] = "timed out"
    finally:
        for s in socks:
            s.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a checkpoint / tokenizer directory (rlgate tiny-model DIR)")
    p.add_argument("--src", help="run this checkout's src/ instead")
    p.add_argument("--trickle", type=int, default=2100, help="connections of the trickle attack")
    args = p.parse_args()
    c = Cluster(args.model, args.src)
    try:
        report: dict[str, object] = {"health_anonymous": httpx.get(c.url + "/health", timeout=10).json()}
        report["uploads"] = uploads(c)
        report["trickle"] = trickle(c, args.trickle)
    finally:
        c.stop()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
