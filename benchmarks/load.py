"""Load: N concurrent sessions x T turns against `rlgate serve --engine fake`, and the cost
of durability.

Each run starts `rlgate serve` as a subprocess with one store (``:memory:``, then a SQLite
file with ``--store-sync full``, then ``normal``) and drives it through raw HTTP (httpx):
every session starts, holds a T-turn conversation (each turn re-sends the history plus the
reply, as agents do; every other session streams), sets a reward, ends and is exported.
Checks: zero errors; every interaction the client saw is in the export, with the same
prompt / completion token counts as the response's ``usage`` and output tokens that decode
to the returned text. Prints throughput, p50 / p99 latency of the generation requests per
store and the ratios against ``:memory:`` (the cost of durability), measured side by side.

    python benchmarks/load.py [--sessions 500] [--turns 5] [--stores memory full normal]
    python benchmarks/load.py --measure-encoding     # token list encodings: bytes and speed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ADMIN = "load-admin-key-" + "x" * 32
AH = {"Authorization": f"Bearer {ADMIN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, store: str, sync: str, output_tokens: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake", "--port", str(port),
           "--store", store, "--store-sync", sync, "--fake-output-tokens", str(output_tokens),
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN})
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError("server exited")
        try:
            httpx.get(url + "/health", timeout=0.5)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(url)


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (Linux /proc), or NaN."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


async def chat_turn(c: httpx.AsyncClient, key: str, messages: list[dict], stream: bool) -> dict:
    h = {"Authorization": f"Bearer {key}"}
    body = {"model": "m", "messages": messages, "max_tokens": 64}
    if not stream:
        r = await c.post("/v1/chat/completions", json=body, headers=h)
        r.raise_for_status()
        j = r.json()
        return {"id": j["id"], "text": j["choices"][0]["message"]["content"] or "",
                "prompt": j["usage"]["prompt_tokens"], "completion": j["usage"]["completion_tokens"]}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    text, ident, usage = [], None, None
    async with c.stream("POST", "/v1/chat/completions", json=body, headers=h) as s:
        s.raise_for_status()
        async for line in s.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            if "error" in ch:
                raise RuntimeError(ch["error"])
            ident = ch["id"]
            if ch.get("usage"):
                usage = ch["usage"]
            for choice in ch["choices"]:
                text.append(choice["delta"].get("content") or "")
    assert usage is not None
    return {"id": ident, "text": "".join(text), "prompt": usage["prompt_tokens"],
            "completion": usage["completion_tokens"]}


async def drive(url: str, n_sessions: int, turns: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    seen: dict[str, list[dict]] = {}
    limits = httpx.Limits(max_connections=n_sessions + 8, max_keepalive_connections=n_sessions + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        async def session(k: int) -> None:
            try:
                r = await c.post("/rl/start_session", json={"task_id": f"load{k}"}, headers=AH)
                r.raise_for_status()
                sid, key = r.json()["session_id"], r.json()["api_key"]
                seen[sid] = []
                messages = [{"role": "system", "content": "You are a terse assistant."},
                            {"role": "user", "content": f"Episode {k}: what is {k} + 1?"}]
                for turn in range(turns):
                    t0 = time.perf_counter()
                    got = await chat_turn(c, key, messages, stream=k % 2 == 1)
                    latencies.append(time.perf_counter() - t0)
                    seen[sid].append(got)
                    messages += [{"role": "assistant", "content": got["text"]},
                                 {"role": "user", "content": f"and then turn {turn}?"}]
                (await c.post("/rl/set_reward", json={"reward": 1.0}, headers={"Authorization": f"Bearer {key}"})
                 ).raise_for_status()
                (await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})).raise_for_status()
            except Exception as exc:  # noqa: BLE001 - counted
                errors.append(repr(exc))

        t0 = time.perf_counter()
        await asyncio.gather(*(session(k) for k in range(n_sessions)))
        wall = time.perf_counter() - t0

        exports: dict[str, dict] = {}

        async def export(sid: str) -> None:
            r = await c.post("/export_trajectories", json={"session_id": sid}, headers=AH)
            if r.status_code != 200:
                errors.append(f"export {sid}: {r.status_code}")
            else:
                exports[sid] = r.json()

        sem = asyncio.Semaphore(32)

        async def bounded(sid: str) -> None:
            async with sem:
                await export(sid)

        t1 = time.perf_counter()
        await asyncio.gather(*(bounded(sid) for sid in seen))
        export_wall = time.perf_counter() - t1
    return {"wall": wall, "latencies": latencies, "errors": errors, "seen": seen, "exports": exports,
            "export_wall": export_wall}


def verify(tokenizer, seen: dict[str, list[dict]], exports: dict[str, dict]) -> tuple[int, list[str]]:
    problems = []
    checked = 0
    for sid, interactions in seen.items():
        exp = exports.get(sid)
        if exp is None:
            problems.append(f"{sid}: no export")
            continue
        by_id = {i["id"]: i for i in exp["interactions"]}
        if len(by_id) != len(interactions):
            problems.append(f"{sid}: exported {len(by_id)} interactions, the client saw {len(interactions)}")
        for got in interactions:
            item = by_id.get(got["id"])
            if item is None:
                problems.append(f"{sid}: {got['id']} missing")
                continue
            out = [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=False) if m]
            if len(item["input_ids"]) - len(out) != got["prompt"] or len(out) != got["completion"]:
                problems.append(f"{got['id']}: token counts differ from usage")
            if tokenizer.decode(out, skip_special_tokens=True).strip() != got["text"].strip():
                problems.append(f"{got['id']}: exported tokens do not decode to the returned text")
            checked += 1
    return checked, problems


def run_one(model: str, tokenizer, store_kind: str, args: argparse.Namespace, tmp: Path) -> dict:
    if store_kind == "memory":
        store, sync = ":memory:", "full"
    else:
        store, sync = str(tmp / f"load-{store_kind}.sqlite"), store_kind
    proc, url = start_server(model, store, sync, args.output_tokens)
    try:
        cpu0 = cpu_seconds(proc.pid)
        res = asyncio.run(drive(url, args.sessions, args.turns))
        server_cpu = cpu_seconds(proc.pid) - cpu0
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    checked, problems = verify(tokenizer, res["seen"], res["exports"])
    n = len(res["latencies"])
    row = {
        "store": store_kind if store_kind == "memory" else f"sqlite/{store_kind}",
        "requests": n,
        "rps": round(n / res["wall"], 1),
        "p50_ms": round(pct(res["latencies"], 0.5), 1),
        "p99_ms": round(pct(res["latencies"], 0.99), 1),
        "wall_s": round(res["wall"], 2),
        "server_cpu_ms_per_req": round(1000 * server_cpu / n, 2),
        "export_s": round(res["export_wall"], 2),
        "errors": len(res["errors"]) + len(problems),
        "verified_interactions": checked,
        "exit_code": code,
    }
    for e in (res["errors"] + problems)[:5]:
        print("  error:", e, file=sys.stderr)
    return row


def measure_encoding() -> None:
    """bytes per token and encode+decode time: int32 array vs JSON (what SQLiteStore chose and why)."""
    import random
    import timeit
    from array import array

    ids = [random.randrange(0, 151_000) for _ in range(4096)]
    lps = [-random.random() * 10 for _ in range(4096)]
    rows = []
    for name, enc, dec, data in [
        ("ids int32 array", lambda x: array("i", x).tobytes(), lambda b: array("i", b).tolist(), ids),
        ("ids JSON", lambda x: json.dumps(x, separators=(",", ":")), json.loads, ids),
        ("logprobs float64 array", lambda x: array("d", x).tobytes(), lambda b: array("d", b).tolist(), lps),
        ("logprobs JSON", lambda x: json.dumps(x, separators=(",", ":")), json.loads, lps),
    ]:
        blob = enc(data)
        assert dec(blob) == data
        t_enc = min(timeit.repeat(lambda enc=enc, data=data: enc(data), number=50, repeat=3)) / 50
        t_dec = min(timeit.repeat(lambda dec=dec, blob=blob: dec(blob), number=50, repeat=3)) / 50
        rows.append((name, len(blob) / len(data), t_enc * 1e6, t_dec * 1e6))
    print(f"{'encoding (4096 values)':<24} {'bytes/value':>11} {'encode us':>10} {'decode us':>10}")
    for name, b, e, d in rows:
        print(f"{name:<24} {b:>11.2f} {e:>10.1f} {d:>10.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--output-tokens", type=int, default=16, help="fake engine tokens per reply")
    ap.add_argument("--stores", nargs="+", default=["memory", "full", "normal"], choices=["memory", "full", "normal"])
    ap.add_argument("--repeat", type=int, default=1, help="rounds; stores are interleaved, medians reported")
    ap.add_argument("--model", default=None, help="tokenizer directory (default: build the tiny model)")
    ap.add_argument("--measure-encoding", action="store_true")
    args = ap.parse_args()
    if args.measure_encoding:
        measure_encoding()
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp())
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(tmp / "tiny"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    runs: dict[str, list[dict]] = {kind: [] for kind in args.stores}
    for _ in range(args.repeat):  # interleaved, so that background load hits every store alike
        for kind in args.stores:
            runs[kind].append(run_one(model, tokenizer, kind, args, tmp))
    rows = []
    for rs in runs.values():
        med = dict(rs[0])
        for field in ("rps", "p50_ms", "p99_ms", "wall_s", "export_s", "server_cpu_ms_per_req"):
            med[field] = sorted(r[field] for r in rs)[len(rs) // 2]
        med["errors"] = sum(r["errors"] for r in rs)
        med["exit_code"] = max(r["exit_code"] for r in rs)
        med["rounds"] = len(rs)
        rows.append(med)
    print(f"{args.sessions} concurrent sessions x {args.turns} turns, fake engine, {args.output_tokens} tokens/reply"
          f"{f', median of {args.repeat} interleaved rounds' if args.repeat > 1 else ''}")
    print(f"{'store':<14} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'wall s':>7} {'export s':>8} "
          f"{'srv cpu ms/req':>14} {'errors':>6} {'verified':>8} {'exit':>4}")
    for r in rows:
        print(f"{r['store']:<14} {r['rps']:>7} {r['p50_ms']:>7} {r['p99_ms']:>7} {r['wall_s']:>7} "
              f"{r['export_s']:>8} {r['server_cpu_ms_per_req']:>14} {r['errors']:>6} "
              f"{r['verified_interactions']:>8} {r['exit_code']:>4}")
    base = next((r for r in rows if r["store"] == "memory"), None)
    if base is not None:
        for r in rows:
            if r is base:
                continue
            print(f"cost of durability ({r['store']} vs :memory:): throughput x{r['rps'] / base['rps']:.3f}, "
                  f"p50 x{r['p50_ms'] / base['p50_ms']:.3f}, p99 x{r['p99_ms'] / base['p99_ms']:.3f}, "
                  f"server CPU per request x{r['server_cpu_ms_per_req'] / base['server_cpu_ms_per_req']:.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
