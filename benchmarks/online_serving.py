"""What ``rlgate serve --online`` costs per request, side by side in one run (docs/online.md, "Costs").

In-process ASGI client, fake engine (8 tokens), the durable SQLite store (sync ``full``), rounds that
alternate the variants so that load changes hit them alike:

* a chat completion with a harness session key (the RL path as before) vs with a tenant key and an
  ``X-Conversation-Id`` (a session per conversation) vs with a tenant key and no header (the tenant's
  shared session, parent matching): conversations of 10 turns, each turn extending the one before;
* ``POST /v1/feedback`` (a thumbs on a turn): CPU and wall time per request;
* deleting sessions from the store with ``PRAGMA secure_delete`` on (as shipped) and off;
* what a deletion request waits for: its writes made durable, and the WAL checkpointed and truncated
  (``forget_deleted``, as shipped) or not.

    python benchmarks/online_serving.py [--requests 200] [--rounds 3]
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

from rlgate.config import GatewayConfig, OnlineConfig  # noqa: E402
from rlgate.demo.tiny import build_tiny_tokenizer  # noqa: E402
from rlgate.engine.fake import FakeEngine  # noqa: E402
from rlgate.model import load_tokenizer, stop_token_ids  # noqa: E402
from rlgate.server.app import create_app  # noqa: E402
from rlgate.store.sqlite import SQLiteStore  # noqa: E402
from rlgate.trajectory.interaction import Interaction, Session  # noqa: E402

ADMIN = "bench-admin-key-0123456789abcdefghijklmnop"
A = {"Authorization": f"Bearer {ADMIN}"}


async def timed(n: int, one) -> tuple[float, float]:
    """(CPU ms, wall ms) per call of ``one(i)``, n calls one after the other."""
    c0, w0 = time.process_time(), time.perf_counter()
    for i in range(n):
        await one(i)
    return (time.process_time() - c0) * 1000 / n, (time.perf_counter() - w0) * 1000 / n


async def serving(directory: Path, requests: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    tok_dir = build_tiny_tokenizer(directory / "tok", seed=0)
    tok = load_tokenizer(str(tok_dir))
    app = create_app(GatewayConfig(admin_key=ADMIN, max_interactions_per_session=100_000),
                     FakeEngine(tok, output_tokens=8), SQLiteStore(directory / "s.sqlite"), tok,
                     stop_token_ids=stop_token_ids(tok, tok_dir),
                     online=OnlineConfig(online=True, implicit_scan_interval=3600))
    out: dict[str, list[tuple[float, float]]] = {"session key": [], "tenant + header": [], "tenant, no header": [],
                                                 "feedback": []}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c, \
            app.router.lifespan_context(app):
        tenant = {"Authorization": "Bearer " + (await c.post("/v1/tenants", json={"name": "b"}, headers=A)).json()[
            "api_key"]}
        for r in range(rounds):
            key = (await c.post("/rl/start_session", json={"task_id": f"b{r}"}, headers=A)).json()["api_key"]
            turns: list[str] = []

            def conversations(headers_for, turns=turns):
                """Conversations of 10 turns each (each turn extends the one before)."""
                msgs: list[dict] = []

                async def one(i: int) -> None:
                    if i % 10 == 0:
                        msgs[:] = [{"role": "user", "content": f"start {i}"}]
                    resp = await c.post("/v1/chat/completions", headers=headers_for(i),
                                        json={"model": "m", "messages": msgs, "max_tokens": 8})
                    assert resp.status_code == 200, resp.text
                    turns.append(resp.json()["id"])
                    msgs.extend([resp.json()["choices"][0]["message"], {"role": "user", "content": f"and {i}?"}])

                return one

            harness = {"Authorization": f"Bearer {key}"}
            out["session key"].append(await timed(requests, conversations(lambda i, h=harness: h)))
            out["tenant + header"].append(await timed(requests, conversations(
                lambda i, r=r: {**tenant, "X-Conversation-Id": f"c{r}-{i // 10}"})))
            out["tenant, no header"].append(await timed(requests, conversations(lambda i: tenant)))
            rated = turns[-requests:]

            async def thumbs(i: int, rated=rated) -> None:
                resp = await c.post("/v1/feedback", headers=tenant,
                                    json={"kind": "thumbs", "value": i % 2 == 0, "interaction_id": rated[i]})
                assert resp.status_code == 200, resp.text

            out["feedback"].append(await timed(requests, thumbs))
    return out


def _fill(store: SQLiteStore, sessions: int) -> None:
    """``sessions`` sessions of 5 turns of 600 prompt tokens each, flushed."""
    for s in range(sessions):
        store.save_session(Session(id=f"s{s}", task_id="t", key_hash="0" * 64))
        parent = None
        for t in range(5):
            i = Interaction(id=f"s{s}-{t}", session_id=f"s{s}", api="chat", messages=[], tools=[],
                            prompt_ids=list(range(600 * (t + 1))), parent_id=parent, status="completed",
                            output_ids=list(range(40)), output_logprobs=[0.0] * 40, output_versions=[0] * 40)
            store.save_interaction(i)
            parent = i.id
    store.flush()


def deletes(directory: Path, sessions: int, secure: bool) -> float:
    """ms per deleted session (5 turns of 600 prompt tokens each), flushed."""
    store = SQLiteStore(directory / f"d-{secure}.sqlite")
    store._commits.conn.execute(f"PRAGMA secure_delete={'ON' if secure else 'OFF'}")
    _fill(store, sessions)
    t0 = time.perf_counter()
    for s in range(sessions):
        store.delete_session(f"s{s}")
    store.flush()
    took = (time.perf_counter() - t0) * 1000 / sessions
    store.close()
    return took


def deletion_requests(directory: Path, sessions: int, forget: bool) -> tuple[float, float]:
    """What a deletion request waits for, ms per deleted session (as ``deletes``): its writes made durable
    (flush), then - with ``forget`` - the WAL checkpointed and truncated (``forget_deleted``); and the longest
    time a truncation held the write connection (a commit on the event loop meanwhile waits that long)."""
    store = SQLiteStore(directory / f"f-{forget}.sqlite")
    _fill(store, sessions)
    longest = 0.0
    t0 = time.perf_counter()
    for s in range(sessions):
        store.delete_session(f"s{s}")
        store.flush()
        if forget:
            store.forget_deleted()
            longest = max(longest, store._commits.truncation_lock_s)
    took = (time.perf_counter() - t0) * 1000 / sessions
    store.close()
    return took, longest * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        results = asyncio.run(serving(Path(d), args.requests, args.rounds))
        print(f"load average before: {os.getloadavg()[0]:.1f}")
        base = statistics.median(cpu for cpu, _ in results["session key"])
        for name, runs in results.items():
            cpus = [cpu for cpu, _ in runs]
            walls = [wall for _, wall in runs]
            ratio = f"  ({statistics.median(cpus) / base:.2f}x the session key's CPU)" if name != "feedback" else ""
            print(f"{name:18s} CPU ms/request {' / '.join(f'{x:.3f}' for x in cpus)}; wall ms "
                  f"{' / '.join(f'{x:.3f}' for x in walls)}{ratio}")
        pairs = [(deletes(Path(d), args.sessions, True), deletes(Path(d), args.sessions, False))
                 for _ in range(args.rounds)]
        print("delete a session (5 turns), ms: secure_delete on " + " / ".join(f"{a:.3f}" for a, _ in pairs)
              + "; off " + " / ".join(f"{b:.3f}" for _, b in pairs))
        fw = [(deletion_requests(Path(d), args.sessions // 3, True), deletion_requests(Path(d), args.sessions // 3, False))
              for _ in range(args.rounds)]
        print("a deletion request's wait, ms per session: durable + WAL truncated " + " / ".join(
            f"{a[0]:.3f} (longest truncation {a[1]:.1f})" for a, _ in fw) + "; durable only " + " / ".join(
            f"{b[0]:.3f}" for _, b in fw))
        print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
