"""Gateway overhead: chat completions through rlgate (fake engine, zero generation time)
vs. a bare FastAPI route that returns a canned completion (the floor of the HTTP stack).

Both servers run as separate processes (uvicorn, one worker) on 127.0.0.1; the load
generator is an asyncio httpx client with N concurrent workers, each with its own
session key. Prints requests/s, p50 and p99 latency for both and their ratios, measured
side by side in one run.

    python benchmarks/gateway_overhead.py [--requests 2000] [--concurrency 1 32]
    python benchmarks/gateway_overhead.py --remote sglang|vllm [--concurrency 1 32 128]

``--remote``: the gateway drives a fake SGLang / vLLM server (``rlgate.testing``) that
answers instantly with ``--output-tokens`` tokens; compared with sending the same token-id
request to that server directly, this is the latency the gateway adds per request.
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
    ap.add_argument("--remote", choices=["sglang", "vllm"], default=None,
                    help="measure the gateway driving a fake SGLang / vLLM server (zero generation time) "
                         "against calling that server directly")
    ap.add_argument("--output-tokens", type=int, default=16, help="--remote: tokens per answer")
    args = ap.parse_args()
    if args.remote is not None:
        if args.concurrency == [1, 32]:
            args.concurrency = [1, 32, 128]
        run_remote(args)
        return
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
                           "--store", ":memory:", "--port", str(gw_port), "--log-level", "warning"], env=env)
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


# --------------------------------------------------------------------------- remote mode


def backend_request(kind: str, prompt_ids: list[int], max_tokens: int, stop_ids: list[int]) -> tuple[str, dict]:
    """The request the gateway's remote engine sends for BODY (path, JSON), built the same way."""
    from rlgate.engine.base import GenerateRequest, SamplingParams
    from rlgate.engine.remote import Backend

    req = GenerateRequest(prompt_ids, SamplingParams(max_new_tokens=max_tokens, stop_token_ids=tuple(stop_ids)))
    if kind == "sglang":
        from rlgate.engine.remote.sglang import SGLangEngine

        engine = SGLangEngine(["http://unused:1"])
    else:
        from rlgate.engine.remote.vllm import VLLMEngine

        engine = VLLMEngine(["http://unused:1"])
    return engine.generate_path, engine.payload(Backend("http://unused:1", 0), req)


async def load_sharded(url: str, conc: int, n_requests: int, send) -> tuple[float, list[float], int]:
    """``conc`` workers, each doing ``send(client, worker_index)`` in a loop; the workers share httpx
    clients of at most 16 connections each (one big httpx pool costs O(connections) per request,
    which at 128 connections would make the load generator the bottleneck)."""
    latencies: list[float] = []
    errors = 0
    per_worker = n_requests // conc
    shards = [httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=16, max_keepalive_connections=16))
              for _ in range(-(-conc // 16))]
    try:
        async def worker(i: int) -> None:
            nonlocal errors
            for _ in range(per_worker):
                t0 = time.perf_counter()
                ok = await send(shards[i % len(shards)], i)
                latencies.append(time.perf_counter() - t0)
                errors += not ok

        await asyncio.gather(*(send(shards[i % len(shards)], i) for i in range(conc)))  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(conc)))
        wall = time.perf_counter() - t0
    finally:
        for c in shards:
            await c.aclose()
    return wall, latencies, errors


async def load_direct(url: str, path: str, payload: dict, conc: int, n_requests: int
                      ) -> tuple[float, list[float], int]:
    """Call the backend itself: the same streamed request the gateway makes, read to [DONE]."""
    async def send(client: httpx.AsyncClient, i: int) -> bool:
        async with client.stream("POST", url + path, json=payload) as r:
            body = await r.aread()
        return r.status_code == 200 and body.rstrip().endswith(b"[DONE]")

    return await load_sharded(url, conc, n_requests, send)


async def load_gateway(url: str, keys: list[str], n_requests: int) -> tuple[float, list[float], int]:
    """Chat completions through the gateway, one session key per worker."""
    async def send(client: httpx.AsyncClient, i: int) -> bool:
        r = await client.post(url + "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {keys[i]}"})
        return r.status_code == 200

    return await load_sharded(url, len(keys), n_requests, send)


def run_remote(args: argparse.Namespace) -> None:
    """Gateway + fake backend (zero generation time) vs the fake backend called directly."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RLGATE_STORE", ":memory:")
    from transformers import AutoTokenizer

    from rlgate.model import stop_token_ids

    tmp = tempfile.mkdtemp()
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tmp) / "tiny"))
    tok = AutoTokenizer.from_pretrained(model)
    prompt = tok.apply_chat_template(BODY["messages"], tokenize=True, add_generation_prompt=True)["input_ids"]
    path, payload = backend_request(args.remote, prompt, BODY["max_tokens"], stop_token_ids(tok, model))
    be_port, gw_port = free_port(), free_port()
    backend = subprocess.Popen([sys.executable, "-m", f"rlgate.testing.fake_{args.remote}", "--model", model,
                                "--port", str(be_port), "--zero-latency", "--output-tokens", str(args.output_tokens)])
    be_url, gw_url = f"http://127.0.0.1:{be_port}", f"http://127.0.0.1:{gw_port}"
    gw = None
    try:
        wait_up(be_url, backend)
        env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN}
        gw = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine",
                               args.remote, "--backend-url", be_url, "--port", str(gw_port), "--log-level",
                               "warning", "--max-sessions", "100000"], env=env)
        wait_up(gw_url, gw)
        rows = []
        for conc in args.concurrency:
            keys = start_sessions(gw_url, conc)
            g_wall, g_lat, g_err = asyncio.run(load_gateway(gw_url, keys, args.requests))
            d_wall, d_lat, d_err = asyncio.run(load_direct(be_url, path, payload, conc, args.requests))
            n = (args.requests // conc) * conc
            rows.append({
                "concurrency": conc,
                "gateway_rps": round(n / g_wall, 1), "direct_rps": round(n / d_wall, 1),
                "gateway_p50_ms": round(pct(g_lat, 0.5), 2), "direct_p50_ms": round(pct(d_lat, 0.5), 2),
                "gateway_p99_ms": round(pct(g_lat, 0.99), 2), "direct_p99_ms": round(pct(d_lat, 0.99), 2),
                "p50_added_ms": round(pct(g_lat, 0.5) - pct(d_lat, 0.5), 2),
                "p99_added_ms": round(pct(g_lat, 0.99) - pct(d_lat, 0.99), 2),
                "errors": g_err + d_err,
            })
        print(f"remote engine: {args.remote} (fake server, zero generation time, {args.output_tokens} tokens "
              f"per answer; direct = the same token-id request sent to the server itself)")
        print(f"{'conc':>5} {'gw req/s':>9} {'direct req/s':>12} {'gw p50':>7} {'dir p50':>7} {'+p50':>6} "
              f"{'gw p99':>7} {'dir p99':>7} {'+p99':>6} errors")
        for r in rows:
            print(f"{r['concurrency']:>5} {r['gateway_rps']:>9} {r['direct_rps']:>12} {r['gateway_p50_ms']:>7} "
                  f"{r['direct_p50_ms']:>7} {r['p50_added_ms']:>6} {r['gateway_p99_ms']:>7} "
                  f"{r['direct_p99_ms']:>7} {r['p99_added_ms']:>6} {r['errors']}")
        print(json.dumps(rows))
    finally:
        for p in (gw, backend):
            if p is not None:
                p.terminate()
                p.wait(10)


if __name__ == "__main__":
    main()
