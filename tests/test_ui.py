"""The viewer over HTTP (no browser): off by default, who may look, CSRF, escaping, file loading."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from helpers import ADMIN_KEY, admin_headers, key_headers, start_session
from rlgate.cli import main as cli
from rlgate.engine.fake import FakeEngine
from rlgate.testing.runs import synthetic_run
from rlgate.trajectory.export import write_jsonl
from rlgate.ui.files import find_tokenizer, read_samples
from rlgate.ui.model import episodes_from_rows
from rlgate.ui.static_export import build_run

HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>"\'&'
TOKEN_RE = re.compile(r'<span class="[pcbg][^"]*" data-token-id="(\d+)" data-logprob="([^"]+)" '
                      r'data-version="(-?\d+)" data-loss="([01])">')


async def login(c) -> str:
    r = await c.post("/ui/login", data={"key": ADMIN_KEY})
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    return r.cookies["rlgate_ui"]


async def test_ui_is_off_by_default(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        for path in ("/ui", "/ui/login", "/ui/session?id=x"):
            assert (await c.get(path, headers=admin_headers())).status_code == 404
        assert (await c.post("/ui/login", data={"key": ADMIN_KEY})).status_code == 404


async def test_who_may_look(make_app, asgi_client):
    async with asgi_client(make_app(ui=True)) as c:
        _, session_key = await start_session(c)
        for headers in ({}, key_headers(session_key), key_headers("wrong-" * 8)):
            r = await c.get("/ui", headers=headers)
            assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        r = await c.get(f"/ui?key={ADMIN_KEY}&api_key={ADMIN_KEY}")  # a key in a URL is never read
        assert r.status_code == 303
        assert (await c.get("/ui", headers=admin_headers())).status_code == 200  # header auth (scripts)
        r = await c.post("/ui/login", data={"key": session_key})
        assert r.status_code == 403 and "rlgate_ui" not in r.cookies
        r = await c.post("/ui/login", data={"key": ADMIN_KEY})
        cookie = r.headers["set-cookie"]
        for attr in ("HttpOnly", "SameSite=strict", "Path=/ui", "Max-Age="):
            assert attr.lower() in cookie.lower(), cookie
        assert ADMIN_KEY not in cookie
        c.cookies.set("rlgate_ui", r.cookies["rlgate_ui"])
        page = await c.get("/ui")
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'sha256-" in csp and "frame-ancestors 'none'" in csp
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        assert ADMIN_KEY not in page.text
        r = await c.post("/ui/logout")
        assert r.status_code == 303
        assert (await c.get("/ui")).status_code == 303  # the cookie's token is forgotten


async def test_cross_site_posts_are_refused(make_app, asgi_client):
    async with asgi_client(make_app(ui=True)) as c:
        r = await c.post("/ui/login", data={"key": ADMIN_KEY}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "rlgate_ui" not in r.cookies
        r = await c.post("/ui/login", data={"key": ADMIN_KEY}, headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        r = await c.post("/ui/login", data={"key": ADMIN_KEY}, headers={"Origin": "http://gateway"})
        assert r.status_code == 303
        token = r.cookies["rlgate_ui"]
        c.cookies.set("rlgate_ui", token)
        r = await c.post("/ui/logout", headers={"Sec-Fetch-Site": "same-site"})
        assert r.status_code == 403
        assert (await c.get("/ui")).status_code == 200  # still logged in
        r = await c.post("/ui/login", content=b"key=" + b"x" * 10_000,
                         headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 413


async def test_hostile_output_is_escaped_everywhere(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=[HOSTILE])
    async with asgi_client(make_app(engine, ui=True)) as c:
        sid, key = await start_session(c, task_id=HOSTILE)
        r = await c.post("/v1/chat/completions", headers=key_headers(key),
                         json={"messages": [{"role": "user", "content": HOSTILE}]})
        tid = r.json()["id"]
        pages = [await c.get(p, params=q, headers=admin_headers()) for p, q in (
            ("/ui", {}), ("/ui/session", {"id": sid}), ("/ui/turn", {"session": sid, "id": tid}),
            ("/ui/group", {"id": HOSTILE}))]
    for page in pages:
        assert page.status_code == 200, page.url
        body = page.text
        assert "<script>alert" not in body and "<img src=x" not in body
        assert body.count("<script>") == 1  # the viewer's own script only
    turn = pages[2].text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in turn
    tokens = TOKEN_RE.findall(turn)
    assert len(tokens) == int(re.search(r'data-count="(\d+)"', turn).group(1)) > 0


def test_static_export_matches_the_samples(tokenizer, stop_ids, tiny_model_dir, tmp_path):
    rows = asyncio.run(synthetic_run(tokenizer, stop_ids, groups=3, group_size=3, seed=1))
    rows[0]["messages"][1]["content"] = HOSTILE
    path = write_jsonl(rows, tmp_path / "samples.jsonl")
    out = tmp_path / "view.html"
    assert cli(["view", str(path), "--out", str(out), "--tokenizer", str(tiny_model_dir), "--title", HOSTILE]) == 0
    html = out.read_text()
    assert "<script>alert" not in html and html.count("<script>") == 1
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # nothing to fetch
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "default-src &#x27;none&#x27;" in csp
    strips = re.findall(r'data-view="t:([^"]+)">(.*?)</script>', html, flags=re.S)
    assert len(strips) == len(rows)
    by_id = {r["id"]: r for r in rows}
    for key, body in strips:
        sid, tid = json.loads(key.replace("&quot;", '"'))
        sample = by_id[tid]
        tokens = TOKEN_RE.findall(body)
        assert [int(t[0]) for t in tokens] == sample["input_ids"]
        assert [int(t[3]) for t in tokens] == sample["loss_mask"]
        assert [int(t[2]) for t in tokens] == sample["versions"]
        assert [float(t[1]) for t in tokens] == pytest.approx(sample["logprobs"], rel=1e-6, abs=1e-6)


def test_loading_files_and_sessions(tokenizer, stop_ids, tmp_path, tiny_model_dir):
    rows = asyncio.run(synthetic_run(tokenizer, stop_ids, groups=2, group_size=2, seed=2))
    # a directory of per-step dumps, one of them without session ids (the demo's file has none)
    (tmp_path / "dump").mkdir()
    write_jsonl(rows[:4], tmp_path / "dump" / "step-000001.jsonl")
    bare = [{k: v for k, v in r.items() if k not in ("session_id", "task_id")} for r in rows[4:]]
    write_jsonl(bare, tmp_path / "dump" / "step-000002.jsonl")
    loaded = read_samples([tmp_path / "dump"])
    assert [r["id"] for r in loaded] == [r["id"] for r in rows]
    episodes = episodes_from_rows(loaded)
    linked = {}
    for r in rows:
        linked.setdefault(r["session_id"], set()).add(r["id"])
    assert sorted(sorted(t.id for t in e.turns) for e in episodes) == sorted(sorted(v) for v in linked.values())
    # saved /export_trajectories responses
    resp = {"session_id": "t-0", "task_id": "t", "status": "ended", "interactions": rows[:2]}
    (tmp_path / "resp.json").write_text(json.dumps(resp))
    [ep] = episodes_from_rows(read_samples([tmp_path / "resp.json"]))
    assert ep.id == "t-0" and len(ep.turns) == 2
    # a session id the gateway reused after an export is a second episode
    again = [{**r, "session_id": "calc-0-0"} for r in rows[:2]] + [{**r, "session_id": "calc-0-0"} for r in rows[2:4]]
    assert [e.id for e in episodes_from_rows(again)] == ["calc-0-0", "calc-0-0~2"]
    run = build_run(rows, title="t", max_sessions=1)
    assert len(run.episodes) == 1 and run.omitted == 3
    (tmp_path / "demo" / "model").mkdir(parents=True)
    (tmp_path / "demo" / "model" / "tokenizer.json").write_text("{}")
    (tmp_path / "demo" / "trajectories.parquet").write_text("")
    assert find_tokenizer([tmp_path / "demo" / "trajectories.parquet"]) == tmp_path / "demo" / "model"
    with pytest.raises(SystemExit):
        cli(["view", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "x.html")])
