"""Gateway overhead: chat completions through rlgate (fake engine, zero generation time)
vs. a bare FastAPI route that returns a canned completion (the floor of the HTTP stack).

Both servers run as separate processes (uvicorn, one worker) on 127.0.0.1; the load
generator is an asyncio httpx client with N concurrent workers, each with its own
session key. Prints requests/s, p50 and p99 latency for both and their ratios, measured
side by side in one run.

    python benchmarks/gateway_overhead.py [--requests 2000] [--concurrency 1 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

ADMIN = "bench-admin-key-" + "x" * 32
BODY = {"model": "m", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": "What is the capital of France? Answer briefly."}],
        "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_app():
    """The floor: parse the JSON body, return a canned ChatCompletion."""
    app = FastAPI()
    canned = {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "the quick brown fox"},
                           "finish_reason": "stop", "logprobs": None}],
              "usage": {"prompt_tokens": 30, "completion_tokens": 16, "total_tokens": 46}}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        await request.json()
        return JSONResponse(canned)

    return app


def wait_up(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            httpx.get(url + "/health", timeout=0.5)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(url)


async def load(url: str, keys: list[str], n_requests: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    errors = 0
    per_worker = n_requests // len(keys)
    limits = httpx.Limits(max_connections=len(keys) + 4, max_keepalive_connections=len(keys) + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def worker(key: str) -> None:
            nonlocal errors
            headers = {"Authorization": f"Bearer {key}"}
            for _ in range(per_worker):
                t0 = time.perf_counter()
                r = await client.post(url + "/v1/chat/completions", json=BODY, headers=headers)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

        # warm-up
        await asyncio.gather(*(client.post(url + "/v1/chat/completions", json=BODY,
                                           headers={"Authorization": f"Bearer {k}"}) for k in keys))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in keys))
        wall = time.perf_counter() - t0
    return wall, latencies, errors


def start_sessions(url: str, n: int) -> list[str]:
    keys = []
    for i in range(n):
        r = httpx.post(url + "/rl/start_session", json={"task_id": f"bench{i}"},
                       headers={"Authorization": f"Bearer {ADMIN}"})
        keys.append(r.json()["api_key"])
    return keys


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--model", default=None, help="tokenizer directory (default: build the tiny model)")
    ap.add_argument("--serve-bare", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_bare is not None:
        import uvicorn

        app = bare_app()
        app.add_api_route("/health", lambda: {"ok": True}, methods=["GET"])
        uvicorn.run(app, host="127.0.0.1", port=args.serve_bare, log_level="warning", access_log=False)
        return

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = tempfile.mkdtemp()
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tmp) / "tiny"))
    gw_port, bare_port = free_port(), free_port()
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN}
    gw = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake",
                           "--port", str(gw_port), "--log-level", "warning"], env=env)
    bare = subprocess.Popen([sys.executable, __file__, "--serve-bare", str(bare_port)])
    gw_url, bare_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{bare_port}"
    try:
        wait_up(gw_url, gw)
        wait_up(bare_url, bare)
        rows = []
        for conc in args.concurrency:
            keys = start_sessions(gw_url, conc)
            g_wall, g_lat, g_err = asyncio.run(load(gw_url, keys, args.requests))
            b_wall, b_lat, b_err = asyncio.run(load(bare_url, ["k"] * conc, args.requests))
            n = (args.requests // conc) * conc
            rows.append({
                "concurrency": conc,
                "gateway_rps": round(n / g_wall, 1), "bare_rps": round(n / b_wall, 1),
                "gateway_p50_ms": round(pct(g_lat, 0.5), 2), "bare_p50_ms": round(pct(b_lat, 0.5), 2),
                "gateway_p99_ms": round(pct(g_lat, 0.99), 2), "bare_p99_ms": round(pct(b_lat, 0.99), 2),
                "rps_ratio_gateway_over_bare": round((n / g_wall) / (n / b_wall), 3),
                "p50_added_ms": round(pct(g_lat, 0.5) - pct(b_lat, 0.5), 2),
                "errors": g_err + b_err,
            })
        print(f"{'conc':>5} {'gw req/s':>9} {'bare req/s':>10} {'ratio':>6} {'gw p50':>7} {'bare p50':>8} "
              f"{'gw p99':>7} {'bare p99':>8} errors")
        for r in rows:
            print(f"{r['concurrency']:>5} {r['gateway_rps']:>9} {r['bare_rps']:>10} "
                  f"{r['rps_ratio_gateway_over_bare']:>6} {r['gateway_p50_ms']:>7} {r['bare_p50_ms']:>8} "
                  f"{r['gateway_p99_ms']:>7} {r['bare_p99_ms']:>8} {r['errors']}")
        print(json.dumps(rows))
    finally:
        for p in (gw, bare):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
