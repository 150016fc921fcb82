"""The gateway with remote engines over real sockets: fake SGLang / vLLM servers (``rlgate.testing``)
on 127.0.0.1, several at once. Session affinity, a backend killed and restarted mid-run, weight
updates across backends, malformed backend answers, logprob semantics, and a gateway process that
never loads the model's weights."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import subprocess
import sys

import httpx
import pytest

from helpers import ADMIN_KEY, admin_headers, dummy_checkpoint, eventually, key_headers
from remote_helpers import (
    REMOTE_KINDS,
    fake_app,
    remote_engine,
    start_fake_backend,
    start_gateway,
    stop,
)
from rlgate.client import GatewayClient
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread

USER = [{"role": "user", "content": "Hello there"}]


@contextlib.contextmanager
def fleet(kind, tokenizer, model_dir, n=2, *, engine_kw=None, **fake_kw):
    """``n`` fake ``kind`` servers (each a FakeEngine) in threads: yields (urls, backend engines)."""
    with contextlib.ExitStack() as stack:
        engines = [FakeEngine(tokenizer, output_tokens=6) for _ in range(n)]
        urls = [stack.enter_context(ServerThread(fake_app(kind, e, tokenizer, model_dir, **fake_kw))) for e in engines]
        yield urls, engines


async def chat(http, url, key, messages=USER, **kw):
    return await http.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **kw},
                           headers=key_headers(key))


async def fake_stats(http, url):
    return (await http.get(url + "/_fake/stats")).json()


def served_by(stats_list, session_id):
    """Indexes of the backends that served ``session_id``."""
    return [i for i, st in enumerate(stats_list) if session_id in st["sessions"]]


# --------------------------------------------------------------------------- affinity


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_sessions_spread_and_every_turn_hits_the_same_backend(kind, make_app, tokenizer, tiny_model_dir):
    with fleet(kind, tokenizer, tiny_model_dir) as (urls, _):
        engine = remote_engine(kind, urls, max_context_length=2048)
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                sessions = [await client.start_session(f"t{i}") for i in range(8)]

                async def episode(s):
                    messages = list(USER)
                    for turn in range(3):
                        r = await chat(http, gw, s.api_key, messages)
                        assert r.status_code == 200, r.text
                        messages += [r.json()["choices"][0]["message"], {"role": "user", "content": f"more {turn}"}]

                await asyncio.gather(*(episode(s) for s in sessions))
                stats = [await fake_stats(http, u) for u in urls]
                health = (await http.get(gw + "/health")).json()
    for s in sessions:
        (i,) = served_by(stats, s.session_id)  # one backend per session ...
        assert stats[i]["sessions"][s.session_id] == 3  # ... for all three turns
    assert sorted(len(st["sessions"]) for st in stats) == [4, 4]  # spread over both backends
    assert health["backends"] == {"total": 2, "healthy": 2} and health["status"] == "ok"


# --------------------------------------------------------------------------- failover


@pytest.mark.slow
@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_killed_backend_fails_its_sessions_with_503_and_rejoins_after_restart(kind, make_app, tiny_model_dir):
    procs = {}
    try:
        for name in ("a", "b"):
            procs[name] = start_fake_backend(kind, tiny_model_dir, "--zero-latency", "--output-tokens", "40")
        urls = [procs["a"][0], procs["b"][0]]
        engine = remote_engine(kind, urls, max_context_length=2048, health_interval=0.2)
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                sessions = [await client.start_session(f"t{i}") for i in range(6)]
                first = await asyncio.gather(*(chat(http, gw, s.api_key) for s in sessions))
                assert all(r.status_code == 200 for r in first)
                stats = [await fake_stats(http, u) for u in urls]
                on_a = [s for s in sessions if served_by(stats, s.session_id) == [0]]
                on_b = [s for s in sessions if served_by(stats, s.session_id) == [1]]
                assert len(on_a) == 3 and len(on_b) == 3

                # a request streaming from A when A is killed ends with a clear error event
                await http.post(urls[0] + "/_fake/config", json={"chunk_delay": 0.05})
                async with http.stream("POST", gw + "/v1/chat/completions", headers=key_headers(on_a[0].api_key),
                                       json={"messages": USER, "max_tokens": 40, "stream": True}) as r:
                    assert r.status_code == 200
                    events = []
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            if len(events) == 4:
                                stop(procs["a"][1], kill=True)  # SIGKILL mid-stream
                errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
                assert len(errors) == 1 and errors[0]["code"] == "backend_unavailable", events[-3:]
                assert urls[0] in errors[0]["message"] and "went away" in errors[0]["message"]

                # the other sessions of A fail cleanly with 503; B's complete
                second = await asyncio.gather(*(chat(http, gw, s.api_key) for s in on_a + on_b))
                for s, r in zip(on_a + on_b, second, strict=True):
                    if s in on_a:
                        assert r.status_code == 503, r.text
                        assert urls[0] in r.json()["error"]["message"]
                    else:
                        assert r.status_code == 200, r.text
                # new sessions go to B only
                new = [await client.start_session("new") for _ in range(2)]
                assert [(await chat(http, gw, s.api_key)).status_code for s in new] == [200, 200]
                stats_b = await fake_stats(http, urls[1])
                assert all(served_by([stats_b], s.session_id) == [0] for s in new)
                health = (await http.get(gw + "/health")).json()
                assert health["backends"] == {"total": 2, "healthy": 1}

                # restart A on the same port: it rejoins, takes new sessions, and its old sessions work again
                port = int(urls[0].rsplit(":", 1)[1])
                procs["a"] = start_fake_backend(kind, tiny_model_dir, "--zero-latency", "--output-tokens", "8",
                                                port=port)
                async def both_healthy() -> bool:
                    return (await http.get(gw + "/health")).json()["backends"]["healthy"] == 2

                await eventually(both_healthy, interval=0.1, what="backend A rejoined")
                later = [await client.start_session("later") for _ in range(3)]
                assert [(await chat(http, gw, s.api_key)).status_code for s in later] == [200] * 3
                stats_a = await fake_stats(http, urls[0])
                assert any(s.session_id in stats_a["sessions"] for s in later)
                again = await asyncio.gather(*(chat(http, gw, s.api_key) for s in on_a[1:]))
                assert all(r.status_code == 200 for r in again), [r.text for r in again]
                for s in on_a[1:]:
                    await s.end()
                    exp = await s.export()
                    assert exp["stats"]["completed"] == 2 and exp["stats"]["failed"] == 1
    finally:
        for _, proc in procs.values():
            stop(proc)


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_failover_move_continues_the_session_token_exactly(kind, make_app, tokenizer, tiny_model_dir):
    with contextlib.ExitStack() as stack:
        engines = [FakeEngine(tokenizer, script=["First answer."] * 2 + ["Second answer."] * 2) for _ in range(2)]
        threads = [ServerThread(fake_app(kind, e, tokenizer, tiny_model_dir)) for e in engines]
        urls = [stack.enter_context(t) for t in threads]
        engine = remote_engine(kind, urls, max_context_length=2048, failover="move")
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                async with client.session("move") as s:
                    r = await chat(http, gw, s.api_key)
                    assert r.status_code == 200
                    first = 0 if engines[0].requests else 1
                    threads[first].stop()  # its backend goes away
                    messages = USER + [r.json()["choices"][0]["message"], {"role": "user", "content": "And?"}]
                    r2 = await chat(http, gw, s.api_key, messages)
                    assert r2.status_code == 200, r2.text
                exp = await s.export(style="concat")
    other = engines[1 - first]
    assert len(engines[first].requests) == 1 and len(other.requests) == 1
    turn1, turn2 = engines[first].requests[0], other.requests[0]
    (sample,) = exp["interactions"]
    assert exp["stats"]["extend"] == 1 and len(sample["chain"]) == 2  # one token sequence across two backends
    assert turn2.input_ids[: len(turn1.input_ids)] == turn1.input_ids


# --------------------------------------------------------------------------- weights


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_weight_update_reaches_all_backends_and_failure_does_not_bump(kind, make_app, tokenizer,
                                                                           tiny_model_dir, tmp_path):
    ckpt = dummy_checkpoint(tmp_path / "step-1")  # the fake engines behind the backends check it, do not read it
    with fleet(kind, tokenizer, tiny_model_dir) as (urls, engines):
        engine = remote_engine(kind, urls, max_context_length=2048)
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                async def one_turn(task):
                    async with client.session(task) as s:
                        assert (await chat(http, gw, s.api_key)).status_code == 200
                    (item,) = (await s.export())["interactions"]
                    n_prompt = item["loss_mask"].index(1)
                    return item["versions"][n_prompt:]

                assert set(await one_turn("before")) == {0}
                r = await http.post(gw + "/rl/update_weights", json={"path": str(ckpt)}, headers=admin_headers())
                assert r.status_code == 200 and r.json()["version"] == 1, r.text
                for u in urls:
                    (update,) = (await fake_stats(http, u))["weight_updates"]
                    assert update["path"] == str(ckpt) and update["ok"]
                assert all(e.version == 1 for e in engines)
                for _ in range(2):  # whichever backend serves it, tokens come from version 1
                    assert set(await one_turn("after")) == {1}

                await http.post(urls[1] + "/_fake/config", json={"fail_weight_updates": True})
                r = await http.post(gw + "/rl/update_weights", json={"path": str(tiny_model_dir)},
                                    headers=admin_headers())
                assert r.status_code == 502, r.text
                msg = r.json()["error"]["message"]
                assert urls[1] in msg and "keeps weight version 1" in msg and "rolled back" in msg
                assert (await http.get(gw + "/health")).json()["version"] == 1
                loads = (await fake_stats(http, urls[0]))["weight_updates"]
                assert [u["path"] for u in loads] == [str(ckpt), str(tiny_model_dir), str(ckpt)]  # and back
                states = [b.state for b in engine.backends]
                # SGLang refuses a checkpoint and keeps its weights; a failed vLLM reload leaves them unknown:
                # the rollback fails too while the fault lasts, so that backend is out of rotation
                assert states == (["healthy", "healthy"] if kind == "sglang" else ["healthy", "stale"])
                for _ in range(2):
                    assert set(await one_turn("after-failure")) == {1}
                await http.post(urls[1] + "/_fake/config", json={"fail_weight_updates": False})
                await engine.check_backends()  # the health loop resyncs it to version 1
                for _ in range(2):
                    assert set(await one_turn("after-resync")) == {1}
                metrics = (await http.get(gw + "/rl/metrics", headers=admin_headers())).json()
    assert metrics["engine"]["weight_version"] == 1
    assert [b["state"] for b in metrics["engine"]["backends"]] == ["healthy", "healthy"]
    assert [b["weight_version"] for b in metrics["engine"]["backends"]] == [1, 1]


async def test_vllm_without_dev_mode_refuses_weight_updates_clearly(make_app, tokenizer, tiny_model_dir):
    with fleet("vllm", tokenizer, tiny_model_dir, n=1, dev_mode=False) as (urls, _):
        engine = remote_engine("vllm", urls, max_context_length=2048)
        with ServerThread(make_app(engine)) as gw:
            async with httpx.AsyncClient(timeout=60) as http:
                r = await http.post(gw + "/rl/update_weights", json={"path": str(tiny_model_dir)},
                                    headers=admin_headers())
    assert r.status_code == 502 and "VLLM_SERVER_DEV_MODE=1" in r.json()["error"]["message"]


async def test_sglang_weights_changed_behind_the_gateway_are_refused_then_resynced(make_app, tokenizer,
                                                                                   tiny_model_dir):
    with fleet("sglang", tokenizer, tiny_model_dir, n=1) as (urls, _):
        engine = remote_engine("sglang", urls, max_context_length=2048)
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                s = await client.start_session("rogue")
                assert (await chat(http, gw, s.api_key)).status_code == 200
                r = await http.post(urls[0] + "/update_weights_from_disk",  # someone else loads other weights
                                    json={"model_path": str(tiny_model_dir), "weight_version": "rogue"})
                assert r.json()["success"]
                r = await chat(http, gw, s.api_key)
                assert r.status_code == 503 and "rlgate did not load" in r.json()["error"]["message"]
                await engine.check_backends()  # what the health loop does: reload the gateway's weights
                assert engine.backends[0].state == "healthy"
                assert (await chat(http, gw, s.api_key)).status_code == 200
                assert (await fake_stats(http, urls[0]))["weight_version"] == "0"


# --------------------------------------------------------------------------- malformed answers

FAULT_STATUS = {"non_json": 502, "missing_logprobs": 502, "wrong_lengths": 502, "wrong_token_ids": 502,
                "truncate": 502, "reset": 502, "stream_error": 502, "finish_abort": 503, "http_500": 502,
                "http_503": 503, "stall": 504}


@pytest.mark.parametrize("fault", sorted(FAULT_STATUS))
@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_malformed_backend_answers_fail_the_interaction_cleanly(kind, fault, make_app, tokenizer,
                                                                     tiny_model_dir):
    with fleet(kind, tokenizer, tiny_model_dir, n=1) as (urls, _):
        engine = remote_engine(kind, urls, max_context_length=2048, read_timeout=5.0)  # "stall" waits this long
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                async with client.session("faults") as s:
                    await http.post(urls[0] + "/_fake/faults", json={"fault": fault, "after": 2})
                    bad = await chat(http, gw, s.api_key)
                    assert bad.status_code == FAULT_STATUS[fault], bad.text  # an abort no pause caused: 503
                    err = bad.json()["error"]
                    assert urls[0] in err["message"] and kind in err["message"]
                    await http.post(urls[0] + "/_fake/faults", json={"fault": fault, "after": 2})
                    async with http.stream("POST", gw + "/v1/chat/completions", headers=key_headers(s.api_key),
                                           json={"messages": USER, "max_tokens": 8, "stream": True}) as r:
                        body = (await r.aread()).decode()
                    assert r.status_code == 200 and '"error"' in body and urls[0] in body  # an error event
                    good = await chat(http, gw, s.api_key)
                    assert good.status_code == 200
                exp = await s.export()
    assert exp["stats"]["failed"] == 2 and exp["stats"]["completed"] == 1
    (item,) = exp["interactions"]  # only the good one is exported
    n_prompt = item["loss_mask"].index(1)
    assert len(item["logprobs"]) == len(item["input_ids"])
    assert all(math.isfinite(x) and x <= 0 for x in item["logprobs"][n_prompt:])


# --------------------------------------------------------------------------- context length


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_context_length_comes_from_the_backends(kind, make_app, tokenizer, tiny_model_dir):
    with contextlib.ExitStack() as stack:
        small = FakeEngine(tokenizer, max_context_length=64)
        url = stack.enter_context(ServerThread(fake_app(kind, small, tokenizer, tiny_model_dir)))
        engine = remote_engine(kind, [url], max_context_length=4096)  # the config's value is only a fallback
        with ServerThread(make_app(engine)) as gw:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                s = await client.start_session("ctx")
                r = await chat(http, gw, s.api_key, [{"role": "user", "content": "word " * 200}])
                assert r.status_code == 400 and "64 tokens" in r.json()["error"]["message"]
                assert engine.max_context_length == 64
                r = await chat(http, gw, s.api_key, max_tokens=500)
                assert r.status_code == 200
                assert len(small.requests) == 1 and small.requests[0].sampling.max_new_tokens < 64


# --------------------------------------------------------------------------- logprob semantics


@pytest.mark.slow
async def test_reported_logprob_distributions(make_app, tokenizer, tiny_model_dir):
    """SGLang reports log_softmax(logits / T); vLLM (raw_logprobs) reports log_softmax(logits)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgate.engine.local import LocalEngine

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    t = 0.5
    recorded = {}
    for kind in REMOTE_KINDS:
        with contextlib.ExitStack() as stack:
            url = stack.enter_context(ServerThread(fake_app(kind, LocalEngine(tiny_model_dir, device="cpu"),
                                                            tokenizer, tiny_model_dir)))
            engine = remote_engine(kind, [url], max_context_length=2048)
            with ServerThread(make_app(engine)) as gw:
                async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=120) as http:
                    async with client.session(kind) as s:
                        r = await chat(http, gw, s.api_key, max_tokens=12, temperature=t, seed=7)
                        assert r.status_code == 200
                    (recorded[kind],) = (await s.export())["interactions"]
            strict = remote_engine(kind, [url], max_context_length=2048, strict_logprobs=True)
            with ServerThread(make_app(strict)) as gw:
                async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=120) as http:
                    s = await client.start_session("strict")
                    r = await chat(http, gw, s.api_key, max_tokens=4, temperature=t)
                    assert r.status_code == (400 if kind == "vllm" else 200), r.text
    for kind, item in recorded.items():
        ids = torch.tensor([item["input_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        scale = t if kind == "sglang" else 1.0
        logp = torch.log_softmax(logits / scale, dim=-1)
        n_prompt = item["loss_mask"].index(1)
        for pos in range(n_prompt, len(item["input_ids"])):
            assert abs(logp[pos - 1, item["input_ids"][pos]].item() - item["logprobs"][pos]) < 1e-4, kind


# --------------------------------------------------------------------------- no model in the gateway


def test_gateway_with_a_remote_engine_imports_no_local_engine(tiny_model_dir, tmp_path):
    code = f"""
import json, sys
from rlgate.cli import add_serve_args, build_app
import argparse
p = argparse.ArgumentParser(); add_serve_args(p)
args = p.parse_args(["--model", {str(tiny_model_dir)!r}, "--engine", "vllm", "--backend-url", "http://127.0.0.1:9"])
app = build_app(args, "k" * 40)
print(json.dumps({{"engine": type(app.state.gateway.engine).__name__,
                  "local": "rlgate.engine.local" in sys.modules,
                  "modeling": sorted(m for m in sys.modules if m.startswith("transformers.models.")
                                     and ".modeling_" in m and ".auto." not in m)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {"engine": "VLLMEngine", "local": False, "modeling": []}


@pytest.mark.slow
@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_gateway_serves_from_a_tokenizer_only_directory(kind, tokenizer, tiny_model_dir, tmp_path):
    """The gateway's --model needs no weights with a remote engine (they live on the backends)."""
    tok_only = tmp_path / "tokenizer-only"
    shutil.copytree(tiny_model_dir, tok_only, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    assert not list(tok_only.glob("*.safetensors"))
    with ServerThread(fake_app(kind, FakeEngine(tokenizer, script=["Hi!"]), tokenizer, tiny_model_dir)) as backend:
        gw, proc = start_gateway(tok_only, kind, ADMIN_KEY, "--backend-url", backend)
        try:
            async with GatewayClient(gw, ADMIN_KEY) as client, httpx.AsyncClient(timeout=60) as http:
                async with client.session("tok") as s:
                    r = await chat(http, gw, s.api_key)
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hi!"
                assert (await http.get(gw + "/health")).json()["backends"] == {"total": 1, "healthy": 1}
        finally:
            stop(proc)


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_closing_the_engine_aborts_streams_in_flight(kind, tokenizer, tiny_model_dir):
    """Gateway shutdown: like the local engine, generations still running end with "abort"."""
    from rlgate.engine.base import GenerateRequest, SamplingParams

    backend = FakeEngine(tokenizer, output_tokens=200, token_delay=0.1)  # 20 s unless aborted
    with ServerThread(fake_app(kind, backend, tokenizer, tiny_model_dir)) as url:
        engine = remote_engine(kind, [url], max_context_length=2048)
        await engine.start()
        stream = engine.stream(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=200), session_id="s"))
        first = await stream.__anext__()
        closing = asyncio.create_task(engine.close())
        rest = [d async for d in stream]
        await closing
    assert first.token_ids and rest and rest[-1].finish_reason == "abort"
    assert sum(len(d.token_ids) for d in [first, *rest]) < 200
    await eventually(lambda: backend.aborted, what="the backend aborted too")  # it saw the disconnect
    assert backend.aborted == 1
