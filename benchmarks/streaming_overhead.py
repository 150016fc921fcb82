"""Streaming through the gateway vs. the engine's own streaming interface, same tiny model.

Baseline: ``LocalEngine.stream()`` called in-process. Gateway: ``rlgate serve --engine
local`` in a subprocess, streamed chat completion over SSE (raw httpx client). Same prompt
tokens, same seed, so both generate the same tokens. Reports time to first token and
tokens/s (median over repeats) and the gateway/engine ratio, measured in one run.

    python benchmarks/streaming_overhead.py [--tokens 256] [--repeats 5]
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

ADMIN = "bench-admin-key-" + "y" * 32
MESSAGES = [{"role": "user", "content": "Tell me a long story about a fox."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def engine_run(engine, prompt, stops, n, seed) -> tuple[float, float, int]:
    from rlgate.engine.base import GenerateRequest, SamplingParams

    req = GenerateRequest(prompt, SamplingParams(max_new_tokens=n, stop_token_ids=tuple(stops), seed=seed))
    t0 = time.perf_counter()
    first = None
    count = 0
    async for d in engine.stream(req):
        if d.token_ids and first is None:
            first = time.perf_counter() - t0
        count += len(d.token_ids)
    return first or 0.0, time.perf_counter() - t0, count


async def gateway_run(url, key, n, seed) -> tuple[float, float, int]:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": n, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(timeout=120) as client:
        t0 = time.perf_counter()
        first = None
        count = 0
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key}"}) as r:
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    count = chunk["usage"]["completion_tokens"]
                if first is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
        return first or 0.0, time.perf_counter() - t0, count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or str(__import__("rlgate.demo.tiny", fromlist=["x"]).build_tiny_model(
        Path(tempfile.mkdtemp()) / "tiny"))

    from rlgate.engine.local import LocalEngine
    from rlgate.model import load_tokenizer, stop_token_ids

    tok = load_tokenizer(model)
    stops = stop_token_ids(tok, model)
    prompt = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)["input_ids"]

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "local",
                             "--store", ":memory:", "--port", str(port), "--log-level", "warning"],
                            env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(url + "/health", timeout=0.5)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        # find a seed whose generation runs the full length (the random model may stop early)
        engine = LocalEngine(model)

        async def pick_seed() -> int:
            for seed in range(200):
                _, _, n = await engine_run(engine, prompt, stops, args.tokens, seed)
                if n == args.tokens:
                    return seed
            return 0

        seed = asyncio.run(pick_seed())
        asyncio.run(engine.close())
        key = httpx.post(url + "/rl/start_session", json={"task_id": "bench"},
                         headers={"Authorization": f"Bearer {ADMIN}"}).json()["api_key"]
        eng_rows, gw_rows = [], []
        for _ in range(args.repeats):
            # engine in this process (the gateway subprocess is idle meanwhile), then gateway
            engine = LocalEngine(model)
            asyncio.run(engine_run(engine, prompt, stops, 8, seed))  # warm-up
            eng_rows.append(asyncio.run(engine_run(engine, prompt, stops, args.tokens, seed)))
            asyncio.run(engine.close())
            asyncio.run(gateway_run(url, key, 8, seed))
            gw_rows.append(asyncio.run(gateway_run(url, key, args.tokens, seed)))
    finally:
        proc.terminate()
        proc.wait(10)

    def summary(rows):
        ttft = statistics.median(r[0] for r in rows) * 1e3
        tps = statistics.median(r[2] / r[1] for r in rows)
        return ttft, tps, rows[0][2]

    e_ttft, e_tps, e_n = summary(eng_rows)
    g_ttft, g_tps, g_n = summary(gw_rows)
    print(f"{'':>10} {'TTFT ms':>8} {'tokens/s':>9} {'tokens':>7}")
    print(f"{'engine':>10} {e_ttft:>8.1f} {e_tps:>9.1f} {e_n:>7}")
    print(f"{'gateway':>10} {g_ttft:>8.1f} {g_tps:>9.1f} {g_n:>7}")
    print(f"gateway tokens/s = {g_tps / e_tps:.3f} x engine ({(1 - g_tps / e_tps) * 100:+.1f}% lower); "
          f"TTFT +{g_ttft - e_ttft:.1f} ms")
    print(json.dumps({"engine_ttft_ms": round(e_ttft, 2), "engine_tps": round(e_tps, 1),
                      "gateway_ttft_ms": round(g_ttft, 2), "gateway_tps": round(g_tps, 1),
                      "ratio": round(g_tps / e_tps, 4), "tokens": g_n}))


if __name__ == "__main__":
    main()
