"""The reproductions of issue 15's twelve defects, measured against `rlgate serve`.

Each reproduction starts `rlgate serve` (tiny model, fake or local engine) as a subprocess,
attacks it over HTTP the way the issue describes (scaled to a small machine) and prints what
it measured. ``--src DIR`` runs another checkout's code (e.g. the landed code before the fix,
``git archive <commit> src | tar -x -C /tmp/base``), so before / after are measured side by
side with the same client:

    python benchmarks/hardening.py                       # this checkout
    python benchmarks/hardening.py --src /tmp/base/src   # another one
    python benchmarks/hardening.py --only 2 4            # some defects

Flags that only the fixed gateway has are never passed: every reproduction uses defaults.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from procs import free_port, rss_mib, wait_healthy

ADMIN = "hardening-admin-key-" + "x" * 32
AH = {"Authorization": f"Bearer {ADMIN}"}
USER = [{"role": "user", "content": "hi"}]


class Server:
    """`rlgate serve` in a subprocess, with its log and its peak RSS (sampled every 50 ms)."""

    def __init__(self, ctx: Ctx, *args: str, store: str = ":memory:", engine: str = "fake",
                 preexec: Callable[[], None] | None = None, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="rlgate-hardening-", suffix=".log")[1])
        cmd = [sys.executable, "-m", "rlgate.cli", "serve", "--model", ctx.model, "--engine", engine, "--port",
               str(self.port), "--store", store, *args]
        self.proc = subprocess.Popen(cmd, env={**ctx.env, **(env or {})}, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, preexec_fn=preexec)
        self.peak = 0.0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            try:
                self.peak = max(self.peak, rss_mib(self.proc.pid))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                return
            self._stop.wait(0.05)

    def wait_healthy(self, timeout: float = 300) -> None:
        wait_healthy(self.url, self.proc, timeout, self.log)

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


class Ctx:
    def __init__(self, model: str, src: str | None) -> None:
        self.model = model
        self.env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.env.pop("RLGATE_STORE", None)
        if src:
            self.env["PYTHONPATH"] = src


@contextmanager
def serving(ctx: Ctx, *args: str, **kw: Any) -> Iterator[Server]:
    s = Server(ctx, *args, **kw)
    try:
        s.wait_healthy()
        yield s
    finally:
        s.stop()
        s.log.unlink(missing_ok=True)


def session(c: httpx.Client, task: str = "t") -> tuple[str, dict[str, str]]:
    r = c.post("/rl/start_session", json={"task_id": task}, headers=AH)
    r.raise_for_status()
    return r.json()["session_id"], {"Authorization": f"Bearer {r.json()['api_key']}"}


def health_latency_during(url: str, busy: Callable[[], Any]) -> tuple[float, int, Any]:
    """Run ``busy`` in a thread; poll /health meanwhile. Returns (worst latency s, polls, busy's result)."""
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", busy()))
    t.start()
    worst, polls = 0.0, 0
    with httpx.Client(base_url=url, timeout=600) as c:
        while t.is_alive():
            t0 = time.perf_counter()
            try:
                c.get("/health")
            except httpx.HTTPError:
                pass
            worst = max(worst, time.perf_counter() - t0)
            polls += 1
            time.sleep(0.05)
    t.join()
    return worst, polls, out.get("r")


# --------------------------------------------------------------------------- the defects


def d1_client_template(ctx: Ctx) -> dict[str, Any]:
    """A client chat template: the event loop frozen while it renders; its suffix cached for ever."""
    slow = ("{% for i in range(100000) %}{% for j in range(20) %}{% endfor %}{% endfor %}"
            "{% for m in messages %}{{ m.content }}{% endfor %}")
    big_suffix = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                  "{% if m.role == 'assistant' %}{% for i in range(20000) %}padding-padding-padding-padding-"
                  "padding-padding{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}"
                  "<|im_start|>assistant\n{% endif %}")
    with serving(ctx) as s, httpx.Client(base_url=s.url, timeout=600) as c:
        _, h = session(c)

        def attack() -> int:
            return c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1,
                                                        "chat_template_kwargs": {"chat_template": slow}},
                          headers=h).status_code

        worst, _, status = health_latency_during(s.url, attack)
        before = s.rss()
        statuses = []
        for k in range(20):
            sid, h = session(c)
            msgs = [{"role": "user", "content": f"q{k}"}]
            kw = {"chat_template": big_suffix, "k": k}
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, "chat_template_kwargs": kw},
                       headers=h)
            statuses.append(r.status_code)
            if r.status_code == 200:
                msgs += [r.json()["choices"][0]["message"], USER[0]]
                statuses.append(c.post("/v1/chat/completions", json={
                    "messages": msgs, "max_tokens": 2, "chat_template_kwargs": kw}, headers=h).status_code)
            c.post("/rl/end_session", headers=h)
            c.post("/export_trajectories", json={"session_id": sid}, headers=AH)
        return {"slow template status": status, "worst /health latency s": round(worst, 2),
                "20 big-suffix episodes, statuses": sorted(set(statuses)),
                "RSS kept after export MiB": round(s.rss() - before, 1)}


def d2_bodies_and_connections(ctx: Ctx) -> dict[str, Any]:
    """Unauthenticated uploads; slow headers; the open-file limit."""
    out: dict[str, Any] = {}
    with serving(ctx) as s:
        base = s.rss()
        body = b'{"messages": [{"role": "user", "content": "' + b"x" * (30 * 1024 * 1024) + b'"}]}'

        async def uploads() -> list[int | str]:
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as c:
                async def one() -> int | str:
                    try:
                        r = await c.post("/v1/chat/completions", content=body,
                                         headers={"content-type": "application/json"})
                        return r.status_code
                    except httpx.HTTPError as exc:
                        return type(exc).__name__
                return list(await asyncio.gather(*(one() for _ in range(20))))

        got = asyncio.run(uploads())
        time.sleep(1)
        out["20 unauthenticated 30 MB uploads"] = sorted({str(g) for g in got})
        out["peak RSS growth MiB"] = round(s.peak - base, 1)
        out["RSS growth kept MiB"] = round(s.rss() - base, 1)
        socks = []
        for _ in range(200):
            sk = socket.create_connection(("127.0.0.1", s.port))
            sk.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(sk)
        time.sleep(15)
        open_ = 0
        for sk in socks:
            sk.settimeout(0.01)
            try:
                open_ += sk.recv(1) != b""
            except TimeoutError:
                open_ += 1
            except OSError:
                pass
            sk.close()
        out["slow-header connections open after 15 s (of 200)"] = open_

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    s = Server(ctx, preexec=limit)
    try:
        s.wait_healthy()
        socks = []
        for _ in range(400):
            sk = socket.socket()
            sk.settimeout(2)
            try:
                sk.connect(("127.0.0.1", s.port))
                sk.sendall(b"GET /health HTTP/1.1\r\n")
                socks.append(sk)
            except OSError:
                sk.close()
        t0 = time.time()
        answered = None
        while time.time() - t0 < 30 and answered is None:
            try:
                if httpx.get(s.url + "/health", timeout=1).status_code == 200:
                    answered = round(time.time() - t0, 1)
            except httpx.HTTPError:
                time.sleep(0.5)
        time.sleep(max(0.0, 30 - (time.time() - t0)))
        for sk in socks:
            sk.close()
    finally:
        s.stop()
    out["fd limit 256, 400 idle connections: /health answered after s"] = answered
    out["log lines in 30 s"] = len(s.log_text().splitlines())
    s.log.unlink(missing_ok=True)
    return out


@contextmanager
def disk_full(pid: int) -> Iterator[None]:
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
    try:
        yield
    finally:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def d3_d9_disk_full(ctx: Ctx) -> dict[str, Any]:
    """A turn and a start_session during a disk-full episode (RLIMIT_FSIZE), then a reward and a restart."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        store = str(Path(d) / "gw.sqlite")
        with serving(ctx, "--capacity-mode", "granted", store=store) as s, httpx.Client(base_url=s.url, timeout=60) as c:
            c.post("/grant_capacity", json={"count": 2}, headers=AH)
            sid, h = session(c)
            msgs = list(USER)
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8}, headers=h)
            first = r.json()["id"]
            msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
            with disk_full(s.proc.pid):
                out["turn during disk full"] = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8},
                                                      headers=h).status_code
                out["start_session during disk full"] = c.post("/rl/start_session", json={"task_id": "o"},
                                                               headers=AH).status_code
            m = c.get("/rl/metrics", headers=AH).json()
            out["after: open sessions (1 expected)"] = m["open_sessions"]
            out["after: capacity (1 expected)"] = m["capacity"]
            r = c.post("/rl/set_reward", json={"reward": 7.0}, headers=h)
            out["set_reward after"] = r.status_code
            out["reward landed on the stored interaction"] = r.json().get("interaction_id") == first
            c.post("/rl/end_session", headers=h)
        with serving(ctx, store=store) as s, httpx.Client(base_url=s.url, timeout=60) as c:
            e = c.post("/export_trajectories", json={"session_id": sid}, headers=AH).json()
            out["reward after restart"] = [i["reward"] for i in e["interactions"]]
    return out


def d4_big_prompt(ctx: Ctx) -> dict[str, Any]:
    """A prompt far over the context: other requests wait for its tokenization; count_tokens with an ended key."""
    out: dict[str, Any] = {}
    with serving(ctx) as s, httpx.Client(base_url=s.url, timeout=900) as c:
        _, h = session(c)
        base = s.rss()
        text = "lorem ipsum dolor 12345 " * 40_000  # ~1 MB (the issue: 30 MB, 118 s)

        def attack() -> int:
            return c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}],
                                                        "max_tokens": 1}, headers=h).status_code

        worst, _, status = health_latency_during(s.url, attack)
        out["1 MB prompt status"] = status
        out["worst /health latency s"] = round(worst, 2)
        out["peak RSS growth MiB"] = round(s.peak - base, 1)
        c.post("/rl/end_session", headers=h)
        out["count_tokens with an ended key"] = c.post("/v1/messages/count_tokens", json={"messages": USER},
                                                       headers=h).status_code
    return out


def d5_images(ctx: Ctx) -> dict[str, Any]:
    """25 MiB images on one key: memory and store growth."""
    with tempfile.TemporaryDirectory() as d:
        store = Path(d) / "gw.sqlite"
        with serving(ctx, store=str(store)) as s, httpx.Client(base_url=s.url, timeout=300) as c:
            _, h = session(c)
            base = s.rss()
            statuses = []
            for k in range(8):
                data = (str(k) * (25 * 1024 * 1024))[: 25 * 1024 * 1024]
                msg = {"role": "user", "content": [{"type": "image_url", "image_url": {
                    "url": f"data:image/png;base64,{data}"}}, {"type": "text", "text": "what is it?"}]}
                statuses.append(c.post("/v1/chat/completions", json={"messages": [msg], "max_tokens": 2},
                                       headers=h).status_code)
            size = sum(p.stat().st_size for p in Path(d).iterdir())
            return {"8 x 25 MiB image requests": sorted(set(statuses)), "RSS growth MiB": round(s.rss() - base, 1),
                    "store size MiB": round(size / 2**20, 1)}


def d6_shutdown_timeout(ctx: Ctx) -> dict[str, Any]:
    """Non-streamed requests cut by --shutdown-timeout: what the clients get, what the store keeps."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        store = str(Path(d) / "gw.sqlite")
        s = Server(ctx, "--fake-token-delay", "0.2", "--fake-output-tokens", "500", "--shutdown-timeout", "1",
                   store=store)
        s.wait_healthy()
        with httpx.Client(base_url=s.url, timeout=120) as c:
            keys = [session(c) for _ in range(4)]

        async def cut() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as c:
                tasks = [asyncio.create_task(c.post("/v1/chat/completions", json={"messages": USER}, headers=h))
                         for _, h in keys]
                await asyncio.sleep(3)
                s.proc.send_signal(signal.SIGTERM)
                return list(await asyncio.gather(*tasks))

        rs = asyncio.run(cut())
        out["exit status"] = s.stop()
        s.log.unlink(missing_ok=True)
        out["client statuses"] = sorted({r.status_code for r in rs})
        out["client content types"] = sorted({r.headers.get("content-type", "") for r in rs})
        with serving(ctx, store=store) as s2, httpx.Client(base_url=s2.url, timeout=60) as c:
            finishes = []
            for sid, _ in keys:
                e = c.post("/export_trajectories", json={"session_id": sid}, headers=AH).json()
                finishes += [i["finish_reason"] for i in e["interactions"]] or [f"failed x{e['stats']['failed']}"]
            out["after restart"] = sorted(set(finishes))
    return out


def d7_d8_schema_and_exports(ctx: Ctx) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(150):
        schema = {"type": "object", "properties": {"x": schema}}
    with serving(ctx) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        sid, h = session(c)
        r = c.post("/v1/chat/completions", json={"messages": USER, "tools": [
            {"type": "function", "function": {"name": "deep", "parameters": schema}}]}, headers=h)
        out = {"150-level tool schema": f"{r.status_code} {r.json()['error']['type']}"}
        c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 2}, headers=h)

        async def exports() -> list[int]:
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as ac:
                tasks = [asyncio.create_task(ac.post("/export_trajectories", json={"session_id": sid,
                                                                                    "wait_timeout": 30}, headers=AH))
                         for _ in range(2)]
                await asyncio.sleep(1)
                await ac.post("/rl/end_session", headers=h)
                return sorted(r.status_code for r in await asyncio.gather(*tasks))

        out["two concurrent exports"] = asyncio.run(exports())
    return out


def d10_temperature(ctx: Ctx) -> dict[str, Any]:
    with serving(ctx, engine="local") as s, httpx.Client(base_url=s.url, timeout=300) as c:
        sid, h = session(c)
        body = {"messages": USER, "max_tokens": 16}
        greedy = c.post("/v1/chat/completions", json={**body, "temperature": 0}, headers=h).json()
        same = 0
        for seed in range(5):
            tiny = c.post("/v1/chat/completions", json={**body, "temperature": 1e-300, "seed": seed}, headers=h).json()
            same += tiny["choices"][0]["message"] == greedy["choices"][0]["message"]
        c.post("/rl/end_session", headers=h)
        e = c.post("/export_trajectories", json={"session_id": sid}, headers=AH).json()
        return {"T=1e-300 replies equal to greedy (of 5)": same,
                "recorded temperatures": sorted({i["sampling"]["temperature"] for i in e["interactions"]})}


def d11_cli(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        target = Path(d) / "public.txt"
        target.write_text("public\n")
        link = Path(d) / "admin.key"
        link.symlink_to(target)
        data = Path(d) / "a" / "b" / "c"
        s = Server(ctx, "--access-log", "--admin-key-file", str(link), "--data-dir", str(data), store=str(data / "x"),
                   preexec=lambda: os.umask(0o022))
        # --store inside --data-dir's tree: the parents are created by the store
        try:
            s.wait_healthy()
            with httpx.Client(base_url=s.url) as c:
                _, h = session(c)
                key = h["Authorization"].split()[1]
                c.get(f"/v1/models?api_key={key}", headers=h)
        finally:
            s.stop()
        out["key from a query string in the access log"] = key in s.log_text()
        out["admin key written through the symlink"] = target.read_text() != "public\n"
        out["data dir parent modes"] = sorted({oct(p.stat().st_mode & 0o777) for p in (Path(d) / "a", Path(d) / "a" / "b")})
        s.log.unlink(missing_ok=True)
        garbage = Path(d) / "garbage.sqlite"
        garbage.write_text("not a database")
        r = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", ctx.model, "--engine", "fake",
                            "--port", str(free_port()), "--store", str(garbage)], env=ctx.env, capture_output=True,
                           text=True, timeout=300)
        out["unusable store: stderr lines"] = len(r.stderr.splitlines())
        out["unusable store: traceback"] = "Traceback" in r.stderr
    return out


def d12_fairness(ctx: Ctx) -> dict[str, Any]:
    with serving(ctx, "--max-batch-size", "8", engine="local") as s, httpx.Client(base_url=s.url, timeout=600) as c:
        _, other = session(c, "other")
        _, hog = session(c, "hog")
        body = {"messages": USER, "max_tokens": 8, "temperature": 0}
        c.post("/v1/chat/completions", json=body, headers=other)  # warm up
        t0 = time.perf_counter()
        c.post("/v1/chat/completions", json=body, headers=other)
        alone = time.perf_counter() - t0

        async def contended() -> float:
            async with httpx.AsyncClient(base_url=s.url, timeout=600, limits=httpx.Limits(max_connections=64)) as ac:
                hogs = [asyncio.create_task(ac.post("/v1/chat/completions", json={
                    "messages": USER, "max_tokens": 48, "temperature": 1}, headers=hog))
                        for _ in range(16)]
                await asyncio.sleep(2)
                t1 = time.perf_counter()
                await ac.post("/v1/chat/completions", json=body, headers=other)
                took = time.perf_counter() - t1
                await asyncio.gather(*hogs)
                return took

        behind = asyncio.run(contended())  # max batch 8: the hog alone would fill it twice over
        return {"other session alone s": round(alone, 2), "other session behind a 16-request hog s": round(behind, 2)}


def s1_tool_schema_cost(ctx: Ctx) -> dict[str, Any]:
    """Found after issue 15 (2026-12-02 probe): a tool's JSON schema was checked against the
    meta-schema in Python on the event loop, ~0.6 ms per property; one small tool list held
    every request of the gateway. Posts a 20 KB list (``anyOf`` of 5,000 empty schemas) and a
    3.6 MB one (64 tools x 1,000 properties) on each surface that checks schemas, and measures
    /health meanwhile."""
    wide = {"type": "object", "properties": {"a": {"anyOf": [{}] * 5000}}}
    many = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 20}
                                             for i in range(1000)}}
    cases = {
        "chat 20 KB": ("/v1/chat/completions", {"messages": USER, "max_tokens": 1, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": wide}}]}),
        "chat 3.6 MB": ("/v1/chat/completions", {"messages": USER, "max_tokens": 1, "tools": [
            {"type": "function", "function": {"name": f"f{k}", "parameters": many}} for k in range(64)]}),
        "responses 20 KB": ("/v1/responses", {"input": "hi", "max_output_tokens": 1, "tools": [
            {"type": "function", "name": "f", "parameters": wide}]}),
        "anthropic count_tokens 20 KB": ("/v1/messages/count_tokens", {"messages": USER, "tools": [
            {"name": "f", "input_schema": wide}]}),
    }
    out: dict[str, Any] = {}
    with serving(ctx) as s, httpx.Client(base_url=s.url, timeout=600) as c:
        for name, (path, body) in cases.items():
            _, h = session(c)

            def attack(path: str = path, body: dict[str, Any] = body, h: dict[str, str] = h, name: str = name) -> int:
                t0 = time.perf_counter()
                status = c.post(path, json=body, headers=h).status_code
                out[f"{name}: request s"] = round(time.perf_counter() - t0, 3)
                return status

            worst, _, status = health_latency_during(s.url, attack)
            out[f"{name}: status"] = status
            out[f"{name}: worst /health latency s"] = round(worst, 3)
    return out


DEFECTS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "1": d1_client_template, "2": d2_bodies_and_connections, "3+9": d3_d9_disk_full, "4": d4_big_prompt,
    "5": d5_images, "6": d6_shutdown_timeout, "7+8": d7_d8_schema_and_exports, "10": d10_temperature,
    "11": d11_cli, "12": d12_fairness, "s1": s1_tool_schema_cost,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=None, help="run this source tree's rlgate (PYTHONPATH) instead of the installed one")
    ap.add_argument("--model", default=None, help="tiny model directory (default: built in a temp dir)")
    ap.add_argument("--only", nargs="*", default=None, help="defect numbers, e.g. 2 4 (3 and 9, 7 and 8 run together)")
    args = ap.parse_args()
    model = args.model
    if model is None:
        from rlgate.demo.tiny import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny"))
    ctx = Ctx(model, args.src)
    results = {}
    for name, fn in DEFECTS.items():
        if args.only and not any(o in name.split("+") for o in args.only):
            continue
        t0 = time.time()
        try:
            results[name] = fn(ctx)
        except Exception as exc:  # noqa: BLE001 - a reproduction that breaks the old code is a result too
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"defect {name} ({time.time() - t0:.0f} s): {json.dumps(results[name])}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
