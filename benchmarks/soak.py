"""Soak: good agents next to hostile traffic, for a bounded time, against `rlgate serve`.

Two runs of ``--duration`` seconds each, side by side on the same machine: *quiet* (the good
agents alone) and *mixed* (the same good agents plus every hostile client below). Each run
starts its own ``rlgate serve --engine fake --store FILE`` subprocess.

Good agents (``--good``): start a session, three turns (chat / messages / responses, streamed
every other turn), a reward, end, export; repeat. Every interaction a client received is
looked up in its export: one that is missing is *lost*.

Hostile clients (mixed run only), each in a loop: unauthenticated 8 MB uploads; 100
connections that never finish their headers (re-opened when closed); bodies trickled a byte a
second; prompts far over the context; client chat templates; 150-level tool schemas; 9 MiB
images on one session; streams dropped after their first chunk; one key sending 64 requests
at once; malformed JSON.

Reported: requests and p50 / p99 latency of the good agents' generations (and the mixed / quiet
ratio), their errors, lost interactions, the gateway's RSS every ``--sample`` seconds, what the
hostile clients got (status counts), and the gateway's exit status after SIGTERM.

    python benchmarks/soak.py [--duration 120] [--good 16] [--src DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from procs import free_port, rss_mib

ADMIN = "soak-admin-key-" + "x" * 32
AH = {"Authorization": f"Bearer {ADMIN}"}
SLOW_TEMPLATE = ("{% for i in range(100000) %}{% for j in range(5) %}{% endfor %}{% endfor %}"
                 "{% for m in messages %}{{ m.content }}{% endfor %}")


def start(model: str, store: str, src: str | None) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="rlgate-soak-", suffix=".log")[1])
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN, "HF_HUB_OFFLINE": "1"}
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake", "--port", str(port),
         "--store", store, "--fake-output-tokens", "24", "--fake-token-delay", "0.005", "--log-level", "warning"],
        env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-2000:])
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


class Run:
    def __init__(self, url: str, deadline: float) -> None:
        self.url = url
        self.deadline = deadline
        self.latencies: list[float] = []
        self.good_errors: Counter[str] = Counter()
        self.lost = 0
        self.verified = 0
        self.episodes = 0
        self.hostile: dict[str, Counter[str]] = {}

    def note(self, kind: str, outcome: Any) -> None:
        self.hostile.setdefault(kind, Counter())[str(outcome)] += 1

    @property
    def running(self) -> bool:
        return time.time() < self.deadline


# --------------------------------------------------------------------------- good agents


async def turn(c: httpx.AsyncClient, run: Run, h: dict[str, str], k: int, messages: list[dict]) -> tuple[str, str]:
    """One generation on surface k % 3 (streamed when k is odd); returns (id, text)."""
    stream = k % 2 == 1
    surface = k % 3
    t0 = time.perf_counter()
    if surface == 0:
        body = {"messages": messages, "max_tokens": 32, "stream": stream}
        if stream:
            async with c.stream("POST", "/v1/chat/completions", json=body, headers=h) as s:
                s.raise_for_status()
                lines = [ln async for ln in s.aiter_lines() if ln.startswith("data: {")]
            chunks = [json.loads(ln[6:]) for ln in lines]
            text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices"))
            iid = chunks[0]["id"]
        else:
            r = await c.post("/v1/chat/completions", json=body, headers=h)
            r.raise_for_status()
            iid, text = r.json()["id"], r.json()["choices"][0]["message"]["content"] or ""
    elif surface == 1:
        body = {"messages": messages, "max_tokens": 32, "stream": stream}
        if stream:
            async with c.stream("POST", "/v1/messages", json=body, headers=h) as s:
                s.raise_for_status()
                events = [json.loads(ln[6:]) async for ln in s.aiter_lines() if ln.startswith("data: ")]
            if events[-1]["type"] != "message_stop":
                raise RuntimeError(f"stream ended with {events[-1]['type']}")
            iid = next(e for e in events if e["type"] == "message_start")["message"]["id"]
            text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        else:
            r = await c.post("/v1/messages", json=body, headers=h)
            r.raise_for_status()
            iid = r.json()["id"]
            text = "".join(b.get("text", "") for b in r.json()["content"])
    else:
        r = await c.post("/v1/responses", json={"input": messages, "max_output_tokens": 32}, headers=h)
        r.raise_for_status()
        iid = r.json()["id"]
        text = "".join(p["text"] for item in r.json()["output"] if item["type"] == "message"
                       for p in item["content"] if p["type"] == "output_text")
    run.latencies.append(time.perf_counter() - t0)
    return iid, text


async def good_agent(run: Run, n: int) -> None:
    async with httpx.AsyncClient(base_url=run.url, timeout=120) as c:
        while run.running:
            try:
                r = await c.post("/rl/start_session", json={"task_id": f"good{n}"}, headers=AH)
                r.raise_for_status()
                sid, h = r.json()["session_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}
                seen = []
                messages: list[dict] = [{"role": "user", "content": f"agent {n}, episode {run.episodes}"}]
                for k in range(3):
                    iid, text = await turn(c, run, h, n + k, messages)
                    seen.append(iid)
                    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"turn {k}"}]
                (await c.post("/rl/set_reward", json={"reward": 1.0}, headers=h)).raise_for_status()
                (await c.post("/rl/end_session", headers=h)).raise_for_status()
                r = await c.post("/export_trajectories", json={"session_id": sid}, headers=AH)
                r.raise_for_status()
                exported = {i["id"] for i in r.json()["interactions"]}
                run.lost += sum(1 for i in seen if i not in exported)
                run.verified += len(seen)
                run.episodes += 1
            except (httpx.HTTPError, RuntimeError, KeyError, StopIteration, json.JSONDecodeError) as exc:
                code = getattr(getattr(exc, "response", None), "status_code", None)
                run.good_errors[f"{type(exc).__name__} {code or ''}".strip()] += 1


# --------------------------------------------------------------------------- hostile clients


async def hostile_http(run: Run, kind: str, concurrency: int, make: Any) -> None:
    async def worker() -> None:
        async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
            while run.running:
                try:
                    r = await make(c)
                    run.note(kind, r.status_code if isinstance(r, httpx.Response) else r)
                except httpx.HTTPError as exc:
                    run.note(kind, type(exc).__name__)
                    await asyncio.sleep(0.2)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def new_key(c: httpx.AsyncClient) -> dict[str, str]:
    r = await c.post("/rl/start_session", json={"task_id": "hostile"}, headers=AH)
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


async def slowloris(run: Run, n: int) -> None:
    host, port = run.url.removeprefix("http://").split(":")
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    while run.running:
        alive = []
        for reader, writer in conns:
            if reader.at_eof() or writer.is_closing():
                run.note("slowloris", "closed by server")
                writer.close()
            else:
                alive.append((reader, writer))
        conns = alive
        while len(conns) < n and run.running:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
                conns.append((reader, writer))
                run.note("slowloris", "opened")
            except OSError as exc:
                run.note("slowloris", type(exc).__name__)
                break
        for reader, _ in conns:  # let EOFs register
            try:
                await asyncio.wait_for(reader.read(1024), 0.001)
            except (TimeoutError, OSError):
                pass
        await asyncio.sleep(0.5)
    for _, writer in conns:
        writer.close()


async def slow_body(run: Run) -> None:
    host, port = run.url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
        h = await new_key(c)
    while run.running:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: {h['Authorization']}\r\n"
                          "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n").encode())
            sent = 0
            while run.running and not reader.at_eof():
                writer.write(b" ")
                sent += 1
                try:
                    head = await asyncio.wait_for(reader.read(64), 1.0)
                    if head:
                        run.note("slow body", head.split(b"\r\n")[0].decode(errors="replace")[9:12])
                        break
                except TimeoutError:
                    continue
            writer.close()
        except OSError as exc:
            run.note("slow body", type(exc).__name__)
            await asyncio.sleep(1)


async def mixed_hostiles(run: Run) -> None:
    huge_image = "Q" * (9 * 1024 * 1024)
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"x": schema}}
    upload = b'{"messages": [{"role": "user", "content": "' + b"u" * (8 * 1024 * 1024) + b'"}]}'
    async with httpx.AsyncClient(base_url=run.url, timeout=30) as c:
        keys = [await new_key(c) for _ in range(7)]

    async def unauth(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/chat/completions", content=upload, headers={"content-type": "application/json"})

    async def huge_prompt(c: httpx.AsyncClient) -> httpx.Response:
        text = "lorem ipsum " * random.randint(100_000, 200_000)
        return await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]},
                            headers=keys[0])

    async def template(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "chat_template_kwargs": {"chat_template": SLOW_TEMPLATE}},
                            headers=keys[1])

    async def deep(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [
            {"type": "function", "function": {"name": "deep", "parameters": schema}}]}, headers=keys[2])

    async def images(c: httpx.AsyncClient) -> httpx.Response:
        msg = {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": f"data:image/png;base64,{huge_image}{random.random()}"}}]}
        return await c.post("/v1/chat/completions", json={"messages": [msg], "max_tokens": 2}, headers=keys[3])

    async def disconnect(c: httpx.AsyncClient) -> str:
        async with c.stream("POST", "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "stream": True}, headers=keys[4]) as s:
            async for _ in s.aiter_lines():
                break
        return f"{s.status_code} dropped"

    async def hog(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                            headers=keys[5])

    async def bad_json(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/chat/completions", content=b'{"messages": [', headers={
            **keys[6], "content-type": "application/json"})

    await asyncio.gather(
        hostile_http(run, "unauthenticated 8 MB upload", 2, unauth),
        slowloris(run, 100),
        slow_body(run),
        hostile_http(run, "prompt far over the context", 1, huge_prompt),
        hostile_http(run, "client chat template", 1, template),
        hostile_http(run, "150-level tool schema", 1, deep),
        hostile_http(run, "9 MiB images, one session", 1, images),
        hostile_http(run, "stream dropped after 1 chunk", 2, disconnect),
        hostile_http(run, "one key, 64 requests at once", 64, hog),
        hostile_http(run, "malformed JSON", 1, bad_json),
    )


# --------------------------------------------------------------------------- runs


async def sample_rss(run: Run, pid: int, every: float, out: list[tuple[float, float]]) -> None:
    t0 = time.time()
    while run.running:
        out.append((round(time.time() - t0, 1), round(rss_mib(pid), 1)))
        await asyncio.sleep(every)
    out.append((round(time.time() - t0, 1), round(rss_mib(pid), 1)))


def one_run(model: str, src: str | None, duration: float, good: int, hostile: bool, sample: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        proc, url, log = start(model, str(Path(d) / "soak.sqlite"), src)
        rss: list[tuple[float, float]] = []
        run = Run(url, time.time() + duration)

        async def main() -> None:
            tasks = [good_agent(run, n) for n in range(good)] + [sample_rss(run, proc.pid, sample, rss)]
            if hostile:
                tasks.append(mixed_hostiles(run))
            await asyncio.gather(*tasks)

        asyncio.run(main())
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = "killed after 120 s"
        log_lines = len(log.read_text(errors="replace").splitlines())
        log.unlink()
    lat = sorted(run.latencies)
    return {
        "hostile": hostile,
        "good generations": len(lat),
        "p50 ms": round(statistics.median(lat) * 1e3, 1) if lat else None,
        "p99 ms": round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 1) if lat else None,
        "good errors": dict(run.good_errors),
        "interactions verified": run.verified,
        "lost interactions": run.lost,
        "episodes": run.episodes,
        "rss MiB (s, MiB)": rss,
        "rss peak MiB": max(m for _, m in rss) if rss else None,
        "hostile outcomes": {k: dict(v) for k, v in run.hostile.items()},
        "exit status": status,
        "log lines": log_lines,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds per run")
    ap.add_argument("--good", type=int, default=16, help="good agents")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--src", default=None, help="serve this source tree's rlgate (PYTHONPATH)")
    ap.add_argument("--model", default=None, help="tiny model directory (default: built in a temp dir)")
    ap.add_argument("--only", choices=["quiet", "mixed"], default=None)
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    results = {}
    for name, hostile in (("quiet", False), ("mixed", True)):
        if args.only and args.only != name:
            continue
        results[name] = one_run(model, args.src, args.duration, args.good, hostile, args.sample)
        r = results[name]
        print(f"{name:>5}: {r['good generations']} good generations, p50 {r['p50 ms']} ms, p99 {r['p99 ms']} ms, "
              f"errors {r['good errors']}, lost {r['lost interactions']} of {r['interactions verified']}, "
              f"RSS peak {r['rss peak MiB']} MiB, exit {r['exit status']}, {r['log lines']} log lines", flush=True)
    if "quiet" in results and "mixed" in results and results["quiet"]["p99 ms"] and results["mixed"]["p99 ms"]:
        print(f"p99 mixed / quiet: {results['mixed']['p99 ms'] / results['quiet']['p99 ms']:.2f}")
    if "mixed" in results:
        for kind, outcomes in results["mixed"]["hostile outcomes"].items():
            print(f"  {kind}: {outcomes}")
        print("  RSS (s, MiB):", results["mixed"]["rss MiB (s, MiB)"])
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
