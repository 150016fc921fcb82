"""Scale-out: requests through the router to 3 gateway replicas (Ray) vs one gateway, same workload.

Both run as ``rlgate serve`` processes on 127.0.0.1 with the fake engine (``--fake-output-tokens``
tokens, no generation time), so what is measured is the HTTP + gateway + router path:

1. throughput and latency: C concurrent workers, each with its own session, send chat
   completions for ``--seconds`` to (a) one gateway and (b) the router in front of 3 replicas;
2. the router's added latency: one session, requests sent one at a time alternately straight
   to its replica's port and through the router (same replica, same key); the difference of
   the medians is what the router adds.

    python benchmarks/scale_out.py [--replicas 3] [--concurrency 1 32] [--seconds 10]

On a 2-core machine the replicas, the router and the load generator share two cores, so the
cluster cannot be faster than one gateway here; the numbers to read are the router's added
latency and the per-replica capacity (docs/scale-out.md extrapolates them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from procs import cpu_seconds, free_port, wait_healthy

ADMIN = "bench-admin-key-" + "x" * 32
BODY = {"model": "m", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": "What is the capital of France? Answer briefly."}],
        "max_tokens": 16}


def start_server(model: str, extra: list[str]) -> tuple[str, subprocess.Popen]:
    port = free_port()
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN, "RLGATE_STORE": ":memory:", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake",
                             "--port", str(port), "--log-level", "warning", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=900)
    except BaseException:
        proc.kill()
        raise
    return url, proc


async def session_key(c: httpx.AsyncClient, url: str, task: str) -> tuple[str, str]:
    r = await c.post(url + "/rl/start_session", json={"task_id": task}, headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return r.json()["session_id"], r.json()["api_key"]


async def load(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """``concurrency`` workers, each with its own session and connection, for ``seconds``.

    The client is aiohttp with the body encoded once (as in hot_path.py): httpx's client cost
    several ms of CPU per request and was the bottleneck of this benchmark at 32 workers."""
    import aiohttp

    async with httpx.AsyncClient(timeout=60) as c:
        keys = [(await session_key(c, url, f"w{i}"))[1] for i in range(concurrency)]
    body = json.dumps(BODY).encode()
    lat: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def post(headers: dict[str, str]) -> bool:
            async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                await r.read()
                return r.status == 200

        async def worker(key: str) -> None:
            nonlocal errors
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            await post(headers)  # warm-up: the connection, the first render
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                ok = await post(headers)
                lat.append(time.perf_counter() - t0)
                errors += not ok

        stop = time.perf_counter() + seconds
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in keys))
        elapsed = time.perf_counter() - t0
    lat.sort()
    return {"rps": len(lat) / elapsed, "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3,
            "errors": errors}


async def added_latency(router: str, n: int) -> dict[str, float]:
    import aiohttp

    async with httpx.AsyncClient(timeout=60) as c:
        sid, key = await session_key(c, router, "latency")
        m = (await c.get(router + "/rl/metrics", headers={"Authorization": f"Bearer {ADMIN}"})).json()
    replica = int(sid.split(".")[0][1:])
    direct = m["replicas"][replica]["url"]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps(BODY).encode()
    via: list[float] = []
    straight: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for i in range(n):  # alternate, so that machine noise hits both alike
            for base, out in ((router, via), (direct, straight)) if i % 2 else ((direct, straight), (router, via)):
                t0 = time.perf_counter()
                async with session.post(base + "/v1/chat/completions", data=body, headers=headers) as r:
                    await r.read()
                out.append(time.perf_counter() - t0)
                r.raise_for_status()
    return {"direct_p50_ms": statistics.median(straight) * 1e3, "router_p50_ms": statistics.median(via) * 1e3,
            "added_p50_ms": (statistics.median(via) - statistics.median(straight)) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--latency-requests", type=int, default=1000)
    args = ap.parse_args()
    from rlgate.demo.tiny import build_tiny_model

    model = str(build_tiny_model(tempfile.mkdtemp(prefix="rlgate-bench-"), seed=0))
    procs: list[subprocess.Popen] = []
    try:
        single, p = start_server(model, [])
        procs.append(p)
        router, p = start_server(model, ["--replicas", str(args.replicas), "--ray-num-cpus", str(args.replicas + 1)])
        procs.append(p)
        print(f"{'concurrency':>11} {'target':>16} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        for conc in args.concurrency:
            for name, url in (("1 gateway", single), (f"router+{args.replicas} replicas", router)):
                r = asyncio.run(load(url, conc, args.seconds))
                print(f"{conc:>11} {name:>16} {r['rps']:>8.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>6}")
        cpu0 = cpu_seconds(procs[1].pid)
        lat = asyncio.run(added_latency(router, args.latency_requests))
        router_cpu_ms = (cpu_seconds(procs[1].pid) - cpu0) * 1000 / (args.latency_requests + 3)
        print(f"router added latency (one request at a time, {args.latency_requests} each way): "
              f"direct p50 {lat['direct_p50_ms']:.3f} ms, via router {lat['router_p50_ms']:.3f} ms, "
              f"added {lat['added_p50_ms']:.3f} ms")
        print(f"router CPU per forwarded request: {router_cpu_ms:.3f} ms (what the router costs whatever else "
              "runs; on a 2-core machine shared by the client, 3 replicas and Ray, the wall-clock difference above "
              "also holds the wake-ups of one more process per request)")
    finally:
        for p in procs:
            p.terminate()
            p.wait(120)


if __name__ == "__main__":
    main()
