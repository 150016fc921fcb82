"""The hot path: rlgate beside AReaL 1.0.4's proxy and a bare FastAPI app, same workload.

Workload (the same for all three, measured side by side in one run): non-streamed chat
completions with a 38-token prompt (the tiny model's tokenizer and chat template) and a
16-token reply from an instant fake engine; 2,000 requests at 32 and at 128 concurrent
clients, each client with its own session key. rlgate runs ``rlgate serve --engine fake``
with the durable SQLite store (``--store-sync full``); the bare app parses the JSON body and
returns a canned completion (the floor of the HTTP stack); AReaL's proxy
(``areal.experimental.openai.proxy.proxy_rollout_server``) gets the same kind of instant
fake engine in its module globals, as its own workers would set them.

Each server is its own process (uvicorn, one worker) on 127.0.0.1; the load generator is
an asyncio aiohttp client in this process (one connection per client), cheap enough that it
is not the bottleneck: it drives the bare app at 1,800-4,000 req/s here (an httpx client,
used before, held every server to ~250 req/s and hid the differences). Prints requests/s,
p50 and p99 latency and the server's CPU time per request (from /proc: what a request
costs, whatever else the machine runs), and the ratios the
targets are stated in: rlgate / AReaL req/s at 32, rlgate / bare req/s, and rlgate / AReaL
p99 at 128.

AReaL runs from its own virtual environment (it pins other versions of transformers etc.);
see docs/architecture.md ("The hot path") for how to create it. Without it the script
prints a note and measures rlgate and the bare app only.

    python benchmarks/hot_path.py [--requests 2000] [--concurrency 32 128]
                                  [--areal-python /work/areal-venv/bin/python]
    python benchmarks/hot_path.py --profile [--requests 2000]   # cProfile of rlgate in-process

This file is also the AReaL server (``--serve areal``): it then runs under AReaL's Python
and imports nothing from rlgate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ADMIN = "hot-path-admin-key-" + "x" * 32
PROMPT = "What is the capital of France? Please answer briefly."  # 38 tokens with the tiny template
BODY = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 16}
PATH = "/chat/completions"  # AReaL's path (it has no /v1 prefix); rlgate serves both
REPLY_TOKENS = 16
DEFAULT_AREAL_PYTHON = "/work/areal-venv/bin/python"


# --------------------------------------------------------------------------- servers


def serve_bare(port: int) -> None:
    """The floor: parse the JSON body, return a canned ChatCompletion."""
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI()
    canned = {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris is the capital."},
                           "finish_reason": "stop", "logprobs": None}],
              "usage": {"prompt_tokens": 38, "completion_tokens": REPLY_TOKENS, "total_tokens": 38 + REPLY_TOKENS}}

    async def chat(request: Request) -> JSONResponse:
        await request.json()
        return JSONResponse(canned)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app.add_route(PATH, chat, methods=["POST"])  # plain Starlette routes: the request as is
    app.add_route("/health", health, methods=["GET"])

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def serve_areal(port: int, model: str) -> None:
    """AReaL 1.0.4's proxy with an instant fake engine (runs under AReaL's own Python)."""
    import uvicorn
    from areal.api.io_struct import ModelResponse
    from areal.experimental.openai.client import ArealOpenAI
    from areal.experimental.openai.proxy import proxy_rollout_server as proxy
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    eos = tokenizer.eos_token_id
    body_ids = tokenizer.encode(" Paris is the capital of France, the answer in one word.", add_special_tokens=False)
    reply = (body_ids * REPLY_TOKENS)[: REPLY_TOKENS - 1] + [eos]

    class InstantEngine:
        """What the proxy needs from an engine: ``agenerate`` (no generation time)."""

        def get_version(self) -> int:
            return 0

        async def agenerate(self, req: Any) -> Any:
            return ModelResponse(input_tokens=list(req.input_ids), output_tokens=list(reply),
                                 output_logprobs=[-0.5] * len(reply), output_versions=[0] * len(reply),
                                 stop_reason="stop", tokenizer=tokenizer)

    engine = InstantEngine()
    proxy._engine = engine
    proxy._openai_client = ArealOpenAI(engine=engine, tokenizer=tokenizer)
    proxy._admin_api_key = ADMIN
    uvicorn.run(proxy.app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class Server:
    """A server process on a free port (the load side only: never under AReaL's Python)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        from procs import free_port

        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([*argv, "--port", str(self.port)], env=env or dict(os.environ))

    def wait_up(self, timeout: float = 600.0) -> None:
        from procs import wait_healthy

        wait_healthy(self.url, self.proc, timeout)

    def cpu_seconds(self) -> float:
        """CPU time the server process has used so far (user + system)."""
        from procs import cpu_seconds

        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --------------------------------------------------------------------------- load


def session_keys(server: Server, n: int) -> list[str]:
    """One session key per client (none for the bare app)."""
    import httpx

    if server.name == "bare":
        return ["none"] * n
    admin = {"Authorization": f"Bearer {ADMIN}"}
    keys = []
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for i in range(n):
            if server.name == "areal":
                c.post("/grant_capacity", headers=admin).raise_for_status()
            r = c.post("/rl/start_session", json={"task_id": f"hot{i}"}, headers=admin)
            r.raise_for_status()
            keys.append(r.json()["api_key"])
    return keys


async def drive(url: str, keys: list[str], n_requests: int) -> tuple[float, list[float], int]:
    """``len(keys)`` clients send ``n_requests`` in all; returns wall time, latencies, errors.

    The client is aiohttp with the body encoded once: it costs about 0.3 ms of CPU per request,
    as much as the bare app, where httpx's AsyncClient cost several ms and was the bottleneck
    (it held the bare app to ~250 req/s on this machine).
    """
    import aiohttp

    conc = len(keys)
    per_client = n_requests // conc
    latencies: list[float] = []
    errors = 0
    body = json.dumps(BODY).encode()
    headers = [{"Authorization": f"Bearer {k}", "Content-Type": "application/json"} for k in keys]

    async with aiohttp.ClientSession(base_url=url, connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        async def send(i: int) -> bool:
            async with session.post(PATH, data=body, headers=headers[i]) as r:
                payload = await r.read()
                return r.status == 200 and json.loads(payload)["usage"]["completion_tokens"] == REPLY_TOKENS

        async def client(i: int) -> None:
            nonlocal errors
            for _ in range(per_client):
                t0 = time.perf_counter()
                ok = await send(i)
                latencies.append(time.perf_counter() - t0)
                errors += not ok

        await asyncio.gather(*(send(i) for i in range(conc)))  # warm-up: connections, first renders
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(conc)))
        wall = time.perf_counter() - t0
    return wall, latencies, errors


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


# --------------------------------------------------------------------------- profile


def profile(model: str, n_requests: int) -> None:
    """cProfile of rlgate serving ``n_requests`` in-process (no sockets), SQLite store on."""
    import cProfile
    import pstats

    import httpx

    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.sqlite import SQLiteStore

    tok = load_tokenizer(model)
    store = SQLiteStore(Path(tempfile.mkdtemp()) / "profile.sqlite")
    app = create_app(GatewayConfig(admin_key=ADMIN), FakeEngine(tok, output_tokens=REPLY_TOKENS), store, tok,
                     stop_token_ids=stop_token_ids(tok, model))

    async def run() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
            keys = []
            for i in range(32):
                r = await c.post("/rl/start_session", json={"task_id": f"p{i}"},
                                 headers={"Authorization": f"Bearer {ADMIN}"})
                keys.append(r.json()["api_key"])

            async def client(k: str) -> None:
                for _ in range(n_requests // len(keys)):
                    r = await c.post(PATH, json=BODY, headers={"Authorization": f"Bearer {k}"})
                    assert r.status_code == 200, r.text

            await asyncio.gather(*(client(k) for k in keys[:1]))  # warm-up
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            await asyncio.gather(*(client(k) for k in keys))
            prof.disable()
            wall = time.perf_counter() - t0
            print(f"{n_requests} requests in {wall:.2f} s in-process under cProfile "
                  f"({wall / n_requests * 1000:.2f} ms each, client included)")
            stats = pstats.Stats(prof)
            stats.sort_stats("cumulative").print_stats(r"rlgate", 40)
            stats.sort_stats("tottime").print_stats(25)

    asyncio.run(run())
    store.close()


# --------------------------------------------------------------------------- main


def areal_available(python: str) -> bool:
    if not Path(python).exists():
        return False
    check = subprocess.run([python, "-c", "import areal.experimental.openai.proxy.proxy_rollout_server"],
                           capture_output=True, timeout=600)
    return check.returncode == 0


def build_model(tmp: Path) -> str:
    from rlgate.demo.tiny import build_tiny_model

    return str(build_tiny_model(tmp / "tiny"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--areal-python", default=DEFAULT_AREAL_PYTHON,
                    help="python of the virtual environment AReaL 1.0.4 is installed in")
    ap.add_argument("--model", default=None, help="tokenizer directory (default: build the tiny model)")
    ap.add_argument("--profile", action="store_true", help="profile rlgate in-process instead")
    ap.add_argument("--serve", choices=["bare", "areal"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve == "bare":
        serve_bare(args.port)
        return
    if args.serve == "areal":
        serve_areal(args.port, args.model)
        return

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="rlgate-hot-path-"))
    model = args.model or build_model(tmp)
    if args.profile:
        profile(model, args.requests)
        return

    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN}
    servers = [
        Server("rlgate", [sys.executable, "-m", "rlgate.cli", "serve", "--model", model, "--engine", "fake",
                          "--fake-output-tokens", str(REPLY_TOKENS), "--store", str(tmp / "rlgate.sqlite"),
                          "--store-sync", "full", "--max-sessions", "100000", "--log-level", "warning"], env),
        Server("bare", [sys.executable, __file__, "--serve", "bare"]),
    ]
    if areal_available(args.areal_python):
        servers.append(Server("areal", [args.areal_python, __file__, "--serve", "areal", "--model", model],
                              {**os.environ, "AREAL_PROXY_WARN_ONCE": "1"}))
    else:
        print(f"note: AReaL 1.0.4's proxy does not import with {args.areal_python} (see docs/architecture.md, "
              "'The hot path', for its environment); measuring rlgate and the bare app only")
    try:
        for s in servers:
            s.wait_up()
        results: dict[tuple[str, int], dict[str, float]] = {}
        for conc in args.concurrency:
            for s in servers:  # side by side: each concurrency level runs every server in turn
                keys = session_keys(s, conc)
                cpu0 = s.cpu_seconds()
                wall, lat, errors = asyncio.run(drive(s.url, keys, args.requests))
                n = len(lat)
                cpu_ms = (s.cpu_seconds() - cpu0) * 1000 / (n + conc)  # the warm-up's requests too
                results[(s.name, conc)] = {"rps": n / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                                           "cpu_ms": cpu_ms, "errors": errors}
        print(f"{args.requests} non-streamed chat completions per run, 38-token prompt, {REPLY_TOKENS}-token reply, "
              "instant engine; rlgate with the SQLite store (sync full)")
        print(f"{'server':>8} {'conc':>5} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10} {'errors':>6}")
        for (name, conc), r in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            print(f"{name:>8} {conc:>5} {r['rps']:>8.0f} {r['p50']:>8.1f} {r['p99']:>8.1f} {r['cpu_ms']:>10.3f} "
                  f"{r['errors']:>6}")
        ratios: dict[str, float] = {}
        for conc in args.concurrency:
            g, b = results[("rlgate", conc)], results[("bare", conc)]
            ratios[f"rlgate/bare req/s @{conc}"] = g["rps"] / b["rps"]
            ratios[f"bare/rlgate CPU per request @{conc}"] = b["cpu_ms"] / g["cpu_ms"]
            if ("areal", conc) in results:
                a = results[("areal", conc)]
                ratios[f"rlgate/areal req/s @{conc}"] = g["rps"] / a["rps"]
                ratios[f"rlgate/areal p99 @{conc}"] = g["p99"] / a["p99"]
        for k, v in ratios.items():
            print(f"{k:>28}: {v:.2f}")
        print(json.dumps({"results": {f"{n}@{c}": r for (n, c), r in results.items()}, "ratios": ratios}))
    finally:
        for s in servers:
            s.stop()


if __name__ == "__main__":
    main()
