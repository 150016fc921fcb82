"""GET /metrics (Prometheus text format) and the silent-failure guards, through the real app."""

from __future__ import annotations

import copy
import logging
import sqlite3

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import ADMIN_KEY, admin_headers, eventually, free_port, key_headers, start_session
from rlgate.config import GatewayConfig
from rlgate.demo.tiny import CHAT_TEMPLATE
from rlgate.engine.base import EngineError
from rlgate.engine.fake import FakeEngine, Scripted
from rlgate.metrics.gateway import guard_specs
from rlgate.server.app import create_app
from rlgate.server.runner import ServerThread
from rlgate.store.base import MemoryStore
from rlgate.store.sqlite import SQLiteStore
from wire import chat

GUARDS = [s.name for s in guard_specs(GatewayConfig(admin_key="x" * 40))] + ["weight_check"]
GUARD_METRICS = [
    "rlgate_tool_parse_attempts", "rlgate_tool_parse_failures", "rlgate_unparsed_tool_markup_replies",
    "rlgate_empty_replies", "rlgate_forks", "rlgate_unaligned_turns", "rlgate_exported_samples_without_reward",
    "rlgate_token_version_lag", "rlgate_stale_tokens", "rlgate_interrupted_generations",
    "rlgate_store_write_failures", "rlgate_guard_firing", "rlgate_guard_ratio", "rlgate_guard_alarms",
]
TRAFFIC_METRICS = [
    "rlgate_requests", "rlgate_generations", "rlgate_queue_seconds", "rlgate_time_to_first_token_seconds",
    "rlgate_generation_seconds", "rlgate_prompt_tokens", "rlgate_generated_tokens", "rlgate_sessions",
    "rlgate_sessions_started", "rlgate_sessions_ended", "rlgate_sessions_exported", "rlgate_engine_weight_version",
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}]
# Every guard fires on its first failure (the defaults wait for guard_min_events events).
EAGER = {"guard_min_events": 1, "guard_tool_parse_failure_ratio": 0.0, "guard_unparsed_tool_markup_ratio": 0.0,
         "guard_empty_reply_ratio": 0.0, "guard_fork_ratio": 0.0, "guard_unaligned_turn_ratio": 0.0,
         "guard_missing_reward_ratio": 0.0, "guard_stale_token_ratio": 0.0, "guard_abort_ratio": 0.0,
         "guard_default_cap_cut_ratio": 0.0, "guard_stale_lag": 2}


def parse(text: str) -> dict[str, dict[tuple, float]]:
    """family name -> {(sample name, sorted labels): value}"""
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        samples = out.setdefault(fam.name, {})
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(fams, family: str, sample: str | None = None, **labels) -> float:
    want = tuple(sorted(labels.items()))
    return sum(v for (name, lab), v in fams.get(family, {}).items()
               if (sample is None or name == sample) and set(want) <= set(lab))


async def scrape(c) -> dict:
    r = await c.get("/metrics", headers=admin_headers())
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


async def end_and_export(c, key, sid, **kw):
    assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
    r = await c.post("/export_trajectories", json={"session_id": sid, **kw}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


async def test_metrics_needs_the_admin_key_and_lists_every_guard(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        assert (await c.get("/metrics")).status_code == 401
        _, key = await start_session(c)
        assert (await c.get("/metrics", headers=key_headers(key))).status_code == 403
        await chat(c, key, [{"role": "user", "content": "hi"}])
        fams = await scrape(c)
    missing = [m for m in GUARD_METRICS + TRAFFIC_METRICS if m not in fams]
    assert not missing, missing
    assert {dict(lab)["guard"] for (_, lab) in fams["rlgate_guard_firing"]} == set(GUARDS)
    assert value(fams, "rlgate_guard_firing") == 0
    assert value(fams, "rlgate_requests", surface="chat", status="200", streamed="false") == 1
    assert value(fams, "rlgate_requests", surface="metrics", status="401") == 1
    assert value(fams, "rlgate_requests", surface="metrics", status="403") == 1
    assert value(fams, "rlgate_generation_seconds", "rlgate_generation_seconds_count", api="chat") == 1
    assert value(fams, "rlgate_time_to_first_token_seconds", "rlgate_time_to_first_token_seconds_count") == 1
    assert value(fams, "rlgate_prompt_tokens", api="chat") > 0
    assert value(fams, "rlgate_generated_tokens", api="chat") == 16  # the fake engine's default reply
    assert value(fams, "rlgate_sessions", status="active") == 1


async def test_streamed_requests_are_labelled(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        async with c.stream("POST", "/v1/chat/completions", headers=key_headers(key),
                            json={"messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
            assert r.status_code == 200
            _ = [line async for line in r.aiter_lines()]
        fams = await scrape(c)
    assert value(fams, "rlgate_requests", surface="chat", status="200", streamed="true") == 1
    assert value(fams, "rlgate_generation_seconds", "rlgate_generation_seconds_count", streamed="true") == 1


def _template_that_rewrites_history(tokenizer):
    """A chat template that shortens earlier replies to 6 characters: the parent's reply is not rendered
    verbatim, so no token-exact bridge exists. (History rewriting that keeps the reply, e.g. a system
    line counting the messages or reasoning stripped, is bridged without a fork: test_families.py.)"""
    tok = copy.deepcopy(tokenizer)
    target = "{{- render_content(message.content) }}"  # the assistant's (first), then the tool's
    tok.chat_template = CHAT_TEMPLATE.replace(target, "{{- render_content(message.content)[:6] }}", 1)
    return tok


async def _unparsed_tool_call(c, app, tokenizer, stop_ids):
    _, key = await start_session(c)
    await chat(c, key, [{"role": "user", "content": "add"}], tools=TOOLS)


async def _empty_reply(c, app, tokenizer, stop_ids):
    _, key = await start_session(c)
    await chat(c, key, [{"role": "user", "content": "say nothing"}])


async def _template_fork(c, app, tokenizer, stop_ids):
    _, key = await start_session(c)
    messages = [{"role": "user", "content": "one"}]
    r = await chat(c, key, messages)
    await chat(c, key, messages + [r["choices"][0]["message"], {"role": "user", "content": "two"}])


async def _missing_reward(c, app, tokenizer, stop_ids):
    sid, key = await start_session(c)
    await chat(c, key, [{"role": "user", "content": "no reward follows"}])
    await end_and_export(c, key, sid)


async def _stale_token(c, app, tokenizer, stop_ids):
    sid, key = await start_session(c)
    await chat(c, key, [{"role": "user", "content": "old weights"}])
    await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
    for _ in range(3):  # the trainer moved on three versions before exporting (guard_stale_lag=2)
        await app.state.gateway.engine.bump_version()
    await end_and_export(c, key, sid)


async def _unaligned_turn(c, app, tokenizer, stop_ids):
    sid, key = await start_session(c, mode="rerender")
    messages = [{"role": "user", "content": "say hello"}]
    r = await chat(c, key, messages)
    await chat(c, key, messages + [r["choices"][0]["message"], {"role": "user", "content": "again"}])
    await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
    await end_and_export(c, key, sid, style="concat")


async def _engine_error(c, app, tokenizer, stop_ids):
    _, key = await start_session(c)
    r = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                     headers=key_headers(key))
    assert r.status_code == 502


async def _default_cap_cut(c, app, tokenizer, stop_ids):
    _, key = await start_session(c)  # the operator set --default-max-tokens 3; the client set no limit
    r = await chat(c, key, [{"role": "user", "content": "talk"}])
    assert r["choices"][0]["finish_reason"] == "length"


async def _store_failure(c, app, tokenizer, stop_ids):
    r = await c.post("/rl/start_session", json={"task_id": "poison"}, headers=admin_headers())
    assert r.status_code == 503


def _engine(case, tokenizer, stop_ids):
    hello = [tokenizer.convert_tokens_to_ids(ch) for ch in ["h", "e", "l", "l", "o"]]
    return {
        "unparsed_tool_call": FakeEngine(tokenizer, script=['<tool_call>\n{"name": add, oops}\n</tool_call>']),
        "empty_reply": FakeEngine(tokenizer, script=[""]),
        "template_fork": FakeEngine(tokenizer, script=["a", "b"]),
        "missing_reward": FakeEngine(tokenizer, script=["x"]),
        "stale_token": FakeEngine(tokenizer, script=["x"]),
        "unaligned_turn": FakeEngine(tokenizer, script=[Scripted(ids=hello + [stop_ids[0]]), "ok"]),
        "engine_error": FakeEngine(tokenizer, fail_with=EngineError("backend down", status=502)),
        "store_failure": FakeEngine(tokenizer),
        "default_cap_cut": FakeEngine(tokenizer, output_tokens=20),
    }[case]


# case -> (provoke, guard, [(family, sample, labels, at least)])
CASES = {
    "unparsed_tool_call": (_unparsed_tool_call, "tool_parse_failures", [
        ("rlgate_tool_parse_failures", None, {"parser": "hermes"}, 1),
        ("rlgate_tool_parse_attempts", None, {"parser": "hermes"}, 1),
        ("rlgate_unparsed_tool_markup_replies", None, {"parser": "hermes"}, 1)]),
    "empty_reply": (_empty_reply, "empty_replies", [("rlgate_empty_replies", None, {"api": "chat"}, 1)]),
    "template_fork": (_template_fork, "forks", [("rlgate_forks", None, {"reason": "template_not_incremental"}, 1)]),
    "missing_reward": (_missing_reward, "missing_rewards", [("rlgate_exported_samples_without_reward", None, {}, 1)]),
    "stale_token": (_stale_token, "stale_tokens", [
        ("rlgate_stale_tokens", None, {}, 2),
        ("rlgate_token_version_lag", "rlgate_token_version_lag_count", {}, 2)]),
    "unaligned_turn": (_unaligned_turn, "unaligned_turns", [("rlgate_unaligned_turns", None, {}, 1)]),
    "engine_error": (_engine_error, "aborted_generations", [
        ("rlgate_interrupted_generations", None, {"reason": "error"}, 1)]),
    "store_failure": (_store_failure, "store_write_failures", [("rlgate_store_write_failures", None, {}, 1)]),
    "default_cap_cut": (_default_cap_cut, "default_cap_cuts", [
        ("rlgate_replies_cut_by_operator_cap", None, {"api": "chat"}, 1)]),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_each_silent_failure_moves_its_counter_and_degrades_health(
        case, make_app, asgi_client, tokenizer, stop_ids, tmp_path, caplog):
    provoke, guard, expected = CASES[case]
    store = None
    if case == "store_failure":
        path = tmp_path / "gw.sqlite"
        store = SQLiteStore(path)
        db = sqlite3.connect(path)  # a real SQLite failure for one kind of row (think: a full disk)
        db.execute("CREATE TRIGGER poison BEFORE INSERT ON sessions WHEN NEW.task_id = 'poison' "
                   "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
        db.commit()
        db.close()
    tok = _template_that_rewrites_history(tokenizer) if case == "template_fork" else tokenizer
    engine = _engine(case, tok, stop_ids)
    extra = {"default_max_tokens": 3} if case == "default_cap_cut" else {}
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY, **EAGER, **extra), engine, store or MemoryStore(), tok,
                     stop_token_ids=stop_ids)
    caplog.set_level(logging.INFO, logger="rlgate.guards")
    async with asgi_client(app) as c:
        health = (await c.get("/health")).json()
        assert health["status"] == "ok", health
        before = await scrape(c)
        await provoke(c, app, tok, stop_ids)
        after = await scrape(c)
        for family, sample, labels, least in expected:
            moved = value(after, family, sample, **labels) - value(before, family, sample, **labels)
            assert moved >= least, (family, labels, moved)
        assert value(after, "rlgate_guard_firing", guard=guard) == 1
        health = (await c.get("/health")).json()
        assert health["status"] == "degraded"
        reasons = {d["guard"]: d["reason"] for d in health["degraded"]}
        assert guard in reasons, health
        if case == "template_fork":
            assert "template_not_incremental" in reasons[guard]
        # the same failure again: still degraded, and the alarm is not logged a second time
        await provoke(c, app, tok, stop_ids)
        assert (await c.get("/health")).json()["status"] == "degraded"
    alarms = [r for r in caplog.records if r.name == "rlgate.guards" and guard in r.getMessage()
              and "ALARM" in r.getMessage()]
    assert len(alarms) == 1, [r.getMessage() for r in alarms]
    if store is not None:
        store.close()


async def test_clean_traffic_keeps_every_guard_quiet(make_app, asgi_client, stop_ids):
    async with asgi_client(make_app(**EAGER)) as c:
        sid, key = await start_session(c)
        messages = [{"role": "user", "content": "hi"}]
        r = await chat(c, key, messages)
        await chat(c, key, messages + [r["choices"][0]["message"], {"role": "user", "content": "more"}])
        await c.post("/rl/set_reward", json={"reward": 1.0}, headers=key_headers(key))
        exp = await end_and_export(c, key, sid, style="concat")
        fams = await scrape(c)
        health = (await c.get("/health")).json()
    assert health["status"] == "ok", health
    assert value(fams, "rlgate_guard_firing") == 0
    assert value(fams, "rlgate_turns", relation="extend") == 1
    assert exp["interactions"][0]["flags"] == []


async def test_only_caps_the_client_never_asked_for_count_as_cuts(make_app, asgi_client, tokenizer):
    """A reply cut at the client's own max_tokens, or at the end of the context, is what it asked for; a
    reply cut at --default-max-tokens or --max-tokens-cap is not (issue 26: the hidden 512 cap)."""
    engine = FakeEngine(tokenizer, output_tokens=50, max_context_length=2048)
    async with asgi_client(make_app(engine, max_tokens_cap=10, **EAGER)) as c:
        _, key = await start_session(c)
        user = [{"role": "user", "content": "talk"}]
        assert (await chat(c, key, user, max_tokens=5))["choices"][0]["finish_reason"] == "length"
        fams = await scrape(c)
        assert value(fams, "rlgate_replies_cut_by_operator_cap") == 0
        assert value(fams, "rlgate_guard_firing", guard="default_cap_cuts") == 0
        for extra in ({}, {"max_tokens": 100}):  # no limit, or more than the cap: cut at the operator's 10
            r = await chat(c, key, user, **extra)
            assert (r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]) == ("length", 10)
        fams = await scrape(c)
    assert value(fams, "rlgate_replies_cut_by_operator_cap", api="chat") == 2
    assert value(fams, "rlgate_guard_firing", guard="default_cap_cuts") == 1


async def test_export_flags_name_the_failures(make_app, asgi_client, tokenizer):
    engine = FakeEngine(tokenizer, script=["", '<tool_call>\n{"name": 1}\n</tool_call>'])
    async with asgi_client(make_app(engine)) as c:
        sid, key = await start_session(c)
        await chat(c, key, [{"role": "user", "content": "a"}])
        await chat(c, key, [{"role": "user", "content": "b"}], tools=TOOLS)
        exp = await end_and_export(c, key, sid)
    flags = [s["flags"] for s in exp["interactions"]]
    assert flags == [["empty_reply", "no_reward"], ["unparsed_tool_call", "fork", "no_reward"]]
    assert exp["interactions"][1]["fork_reason"] == "no_prefix_match"


def test_separate_bind_serves_metrics_without_a_key(make_app):
    port = free_port()
    app = make_app(metrics_port=port)
    with ServerThread(app) as url:
        assert httpx.get(url + "/metrics").status_code == 401  # the main port still wants the key
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert r.status_code == 200
        fams = parse(r.text)
        assert "rlgate_guard_firing" in fams and "rlgate_requests" in fams
    with pytest.raises(httpx.ConnectError):  # stopped with the app
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


@pytest.mark.slow
async def test_local_engine_reports_batch_occupancy_and_queue_time(make_app, asgi_client, tiny_model_dir):
    import asyncio

    from rlgate.engine.local import LocalEngine

    engine = LocalEngine(tiny_model_dir, max_batch_size=2)
    app = make_app(engine)
    try:
        async with asgi_client(app) as c:
            _, key = await start_session(c)
            await asyncio.gather(*(chat(c, key, [{"role": "user", "content": f"q{i}"}], max_tokens=4)
                                   for i in range(4)))
            # the worker thread frees a finished row just after handing over its last token
            await eventually(lambda: engine.stats()["running"] == 0, what="the batch to empty")
            fams = await scrape(c)
    finally:
        await engine.close()
    assert value(fams, "rlgate_engine_batch_capacity") == 2
    assert value(fams, "rlgate_engine_decode_steps") > 0
    rows, steps = value(fams, "rlgate_engine_decode_rows"), value(fams, "rlgate_engine_decode_steps")
    assert 1 <= rows / steps <= 2  # mean batch size within capacity
    assert value(fams, "rlgate_queue_seconds", "rlgate_queue_seconds_count") == 4
    assert value(fams, "rlgate_engine_running_requests") == 0


@pytest.mark.slow
def test_rlgate_serve_metrics_on_both_binds(tiny_tokenizer_dir):
    """``curl /metrics`` on a running ``rlgate serve``: parses, holds every guard; the keyless bind too."""
    import os
    import subprocess
    import sys

    from helpers import wait_healthy

    port, side = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--metrics-port", str(side),
         "--guard-min-events", "1", "--guard-empty-reply-ratio", "0"],
        env={**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout=300)  # importing torch takes long on a busy 2-core machine
        assert httpx.get(url + "/metrics").status_code == 401
        main = httpx.get(url + "/metrics", headers=admin_headers(), timeout=10)
        keyless = httpx.get(f"http://127.0.0.1:{side}/metrics", timeout=10)
        for r in (main, keyless):
            assert r.status_code == 200
            fams = parse(r.text)
            assert not [m for m in GUARD_METRICS + TRAFFIC_METRICS if m not in fams]
            assert {dict(lab)["guard"] for (_, lab) in fams["rlgate_guard_firing"]} == set(GUARDS)
        assert httpx.get(url + "/health").json()["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(30)
