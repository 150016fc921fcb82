"""What the Prometheus metrics and guards cost per request, side by side in one run.

The same chat completions (fake engine, 16 tokens, in-process ASGI client) with the metrics
recording as shipped, and with every ``GatewayMetrics.record_*`` replaced by a no-op; plus
the cost of the recording calls alone, and of one scrape of ``/metrics``.

    python benchmarks/metrics_overhead.py [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402

from rlgate.config import GatewayConfig  # noqa: E402
from rlgate.demo.tiny import build_tiny_model  # noqa: E402
from rlgate.engine.fake import FakeEngine  # noqa: E402
from rlgate.metrics.gateway import GatewayMetrics, GenerationOutcome  # noqa: E402
from rlgate.model import load_tokenizer, stop_token_ids  # noqa: E402
from rlgate.server.app import create_app  # noqa: E402
from rlgate.store.base import MemoryStore  # noqa: E402

ADMIN = "bench-admin-key-" + "0" * 24


async def requests_per_s(tokenizer, stops, n: int, silent: bool) -> float:
    app = create_app(GatewayConfig(admin_key=ADMIN), FakeEngine(tokenizer), MemoryStore(), tokenizer,
                     stop_token_ids=stops)
    metrics = app.state.gateway.metrics
    if silent:
        for name in ("record_request", "record_generation", "record_export"):
            setattr(metrics, name, lambda *a, **k: None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        r = await c.post("/rl/start_session", json={"task_id": "b"}, headers={"Authorization": f"Bearer {ADMIN}"})
        h = {"Authorization": f"Bearer {r.json()['api_key']}"}
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "store": False}
        for _ in range(20):
            await c.post("/v1/chat/completions", json=body, headers=h)
        t0 = time.perf_counter()
        for _ in range(n):
            await c.post("/v1/chat/completions", json=body, headers=h)
        return n / (time.perf_counter() - t0)


def recording_us(k: int = 20_000) -> tuple[float, float]:
    m = GatewayMetrics(GatewayConfig(admin_key=ADMIN))
    o = GenerationOutcome(api="chat", streamed=False, finish_reason="stop", prompt_tokens=20, completion_tokens=16,
                          ttft_s=0.01, total_s=0.02, parser="hermes", relation="extend")
    t0 = time.perf_counter()
    for _ in range(k):
        m.record_request("chat", 200, False)
        m.record_generation(o)
    per_call = 1e6 * (time.perf_counter() - t0) / k
    t0 = time.perf_counter()
    for _ in range(50):
        m.exposition()
    return per_call, 1e6 * (time.perf_counter() - t0) / 50


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = build_tiny_model(Path(tempfile.mkdtemp()) / "model", seed=0)
    tokenizer = load_tokenizer(str(model))
    stops = stop_token_ids(tokenizer, model)
    on, off = [], []
    for _ in range(args.rounds):  # interleaved, so drift on a busy machine hits both
        on.append(asyncio.run(requests_per_s(tokenizer, stops, args.requests, silent=False)))
        off.append(asyncio.run(requests_per_s(tokenizer, stops, args.requests, silent=True)))
    a, b = statistics.median(on), statistics.median(off)
    rec, scrape = recording_us()
    print(f"chat completions/s with metrics {a:.0f}, without {b:.0f}: {a / b:.3f}x "
          f"({1e3 / a - 1e3 / b:+.3f} ms per request; medians of {args.rounds} interleaved rounds)")
    print(f"record_request + record_generation alone: {rec:.1f} us per request; one /metrics scrape: {scrape:.0f} us")


if __name__ == "__main__":
    main()
