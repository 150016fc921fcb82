"""How fast the trajectory viewer opens, in headless Chromium (Debian's chromium + chromium-driver).

1. static export of a 200-session run (synthetic calculator episodes recorded through a real
   gateway: tool call, tool result, answer; ~2 turns of 300-650 tokens each) written by
   ``rlgate view``: file size, time to write it, and in Chromium the time from navigation
   to the sessions list on screen (navigation start -> load event; the list is rendered by
   then), and a click to a turn's token strip;
2. the demo's own samples when given (``--demo-parquet demo-out/trajectories.parquet``,
   first 200 sessions);
3. live ``/ui`` on a session whose turn has 10,000 tokens: server time for the page and
   Chromium's time to load it (its first part: 4,096 tokens, docs/viewer.md#long-turns-are-paged).

    python benchmarks/viewer_open.py [--sessions 200] [--screenshot docs/viewer.png]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import httpx  # noqa: E402

from browser import chromium, wait_for  # noqa: E402
from rlgate.config import GatewayConfig  # noqa: E402
from rlgate.demo.tiny import build_tiny_model  # noqa: E402
from rlgate.engine.fake import FakeEngine  # noqa: E402
from rlgate.model import load_tokenizer, stop_token_ids  # noqa: E402
from rlgate.server.app import create_app  # noqa: E402
from rlgate.server.runner import ServerThread  # noqa: E402
from rlgate.store.base import MemoryStore  # noqa: E402
from rlgate.testing.runs import synthetic_run  # noqa: E402
from rlgate.trajectory.export import write_parquet  # noqa: E402
from rlgate.ui.render import TOKENS_PER_PART, StaticLinks  # noqa: E402
from rlgate.ui.static_export import write_view  # noqa: E402

LOAD_MS = "const n = performance.getEntriesByType('navigation')[0]; return n.loadEventEnd > 0 ? n.loadEventEnd : 0;"
CLICK_MS = """const [href, done] = arguments;
const t0 = performance.now();
location.hash = href.slice(1);
requestAnimationFrame(() => setTimeout(() => done(performance.now() - t0), 0));"""


def open_static(path: Path, repeats: int, turn_href: str, shot: Path | None) -> tuple[list[float], list[float]]:
    loads, clicks = [], []
    for k in range(repeats):
        with chromium() as d:  # a fresh browser each time: nothing cached
            d.get(path.as_uri())
            loads.append(float(wait_for(d, LOAD_MS)))
            wait_for(d, "return document.querySelectorAll('tr.srow').length > 0;")
            clicks.append(float(d.execute_async_script(CLICK_MS, turn_href)))
            wait_for(d, "return document.querySelector('main .strip') !== null;")
            if shot is not None and k == 0:
                d.set_window_size(1400, 860)
                d.execute_script("document.querySelector('main .strip span.b').scrollIntoView({block: 'start'});"
                                 "window.scrollBy(0, -40);"
                                 "const g = document.querySelectorAll('main .strip span.g');"
                                 "g[Math.floor(g.length / 2)].dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));")
                d.save_screenshot(str(shot))
    return loads, clicks


def live_10k(tokenizer, stops, repeats: int) -> tuple[list[float], list[float], int]:
    admin = "bench-admin-key-" + "0" * 24
    engine = FakeEngine(tokenizer, output_tokens=10_000, max_context_length=20_000)
    app = create_app(GatewayConfig(admin_key=admin, ui=True, default_max_tokens=10_000), engine, MemoryStore(),
                     tokenizer, stop_token_ids=stops)
    server_ms, browser_ms = [], []
    with ServerThread(app) as url:
        h = {"Authorization": f"Bearer {admin}"}
        r = httpx.post(url + "/rl/start_session", json={"task_id": "long"}, headers=h).json()
        reply = httpx.post(url + "/v1/chat/completions", timeout=120,
                           json={"messages": [{"role": "user", "content": "write a lot"}]},
                           headers={"Authorization": f"Bearer {r['api_key']}"}).json()
        page = f"{url}/ui/turn?session={r['session_id']}&id={reply['id']}"
        tokens = reply["usage"]["total_tokens"]
        for _ in range(repeats):
            t0 = time.perf_counter()
            assert httpx.get(page, headers=h, timeout=60).status_code == 200
            server_ms.append(1000 * (time.perf_counter() - t0))
        with chromium() as d:
            d.get(url + "/ui/login")
            d.find_element("name", "key").send_keys(admin)
            d.find_element("css selector", "form[action='/ui/login'] button").click()
            wait_for(d, "return location.pathname === '/ui';")
            for _ in range(repeats):
                d.get(page)
                browser_ms.append(float(wait_for(d, LOAD_MS)))
                n = d.execute_script("return document.querySelectorAll('main .strip span').length;")
                assert n == min(tokens, TOKENS_PER_PART), (n, tokens)
    return server_ms, browser_ms, tokens


def fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.0f} ms (min {min(xs):.0f}, max {max(xs):.0f}, n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--demo-parquet", default=None, help="also open the demo's samples (first --sessions)")
    ap.add_argument("--screenshot", default=None, help="save a screenshot of a turn here (docs/viewer.png)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rlgate-viewer-bench-"))
    model = build_tiny_model(work / "model", seed=0)
    tokenizer = load_tokenizer(str(model))
    stops = stop_token_ids(tokenizer, model)

    t0 = time.perf_counter()
    rows = asyncio.run(synthetic_run(tokenizer, stops, groups=args.sessions // 4, group_size=4, seed=0))
    record_s = time.perf_counter() - t0
    parquet = write_parquet(rows, work / "run.parquet")
    t0 = time.perf_counter()
    out, run = write_view([parquet], work / "view.html", tokenizer=tokenizer)
    write_s = time.perf_counter() - t0
    spans = sum(len(t.input_ids) for e in run.episodes for t in e.turns)
    second = next(e for e in run.episodes if len(e.turns) > 1 and e.turns[1].relation == "extend")
    href = StaticLinks().turn(second.id, second.turns[1].id)
    print(f"static export: {len(run.episodes)} sessions, {sum(len(e.turns) for e in run.episodes)} turns, "
          f"{spans:,} token elements, {out.stat().st_size / 1e6:.1f} MB; recorded in {record_s:.1f} s, "
          f"written in {write_s:.2f} s")
    loads, clicks = open_static(out, args.repeats, href, Path(args.screenshot) if args.screenshot else None)
    print(f"  open in Chromium (navigation -> load, list on screen): {fmt(loads)}")
    print(f"  click to a turn's token strip: {fmt(clicks)}")

    if args.demo_parquet:
        t0 = time.perf_counter()
        out2, run2 = write_view([args.demo_parquet], work / "demo.html", tokenizer=tokenizer,
                                max_sessions=args.sessions)
        spans2 = sum(len(t.input_ids) for e in run2.episodes for t in e.turns)
        first = run2.episodes[0]
        loads2, _ = open_static(out2, args.repeats, StaticLinks().turn(first.id, first.turns[0].id), None)
        print(f"demo samples: {len(run2.episodes)} sessions, {spans2:,} token elements, "
              f"{out2.stat().st_size / 1e6:.1f} MB, written in {time.perf_counter() - t0:.2f} s; "
              f"open: {fmt(loads2)}")

    server_ms, browser_ms, tokens = live_10k(tokenizer, stops, args.repeats)
    print(f"live /ui turn of {tokens:,} tokens: server {fmt(server_ms)}; Chromium load {fmt(browser_ms)}")


if __name__ == "__main__":
    main()
