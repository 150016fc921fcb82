"""Policies (core/policies.py): adapter policies loaded at run time, sessions bound to them, requests naming
them in ``model``, per-policy versions, exports and metrics; an unknown policy a 404 in each API's shape
(the real OpenAI and Anthropic SDKs against a server on 127.0.0.1). The fake engine serves here (its
adapters are bookkeeping), in the gateway or behind a fake vLLM / SGLang server (their runtime LoRA routes:
testing/fake_lora.py); tests/test_policies_local.py runs the local engine's real adapters."""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
import pytest
from anthropic import AsyncAnthropic
from anthropic import NotFoundError as AnthropicNotFound
from openai import AsyncOpenAI, BadRequestError
from openai import NotFoundError as OpenAINotFound
from prometheus_client.parser import text_string_to_metric_families

from helpers import admin_headers, dummy_checkpoint, key_headers, start_session
from remote_helpers import KINDS
from rlgate.engine.fake import FakeEngine
from rlgate.engine.remote.vllm import IDENTITY
from rlgate.server.runner import ServerThread
from rlgate.store.sqlite import SQLiteStore

MSG = [{"role": "user", "content": "hi"}]


def adapter_dir(directory: Path) -> str:
    """A directory that passes every engine's adapter check (adapter_config.json + a safetensors file),
    for the fake engine, which does not read it."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": 8}')
    (directory / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    return str(directory)


async def load(c: httpx.AsyncClient, name: str, path: str, **body) -> httpx.Response:
    return await c.post("/rl/policies", json={"name": name, "path": path, **body}, headers=admin_headers())


async def chat(c: httpx.AsyncClient, key: str, model: str = "anything") -> httpx.Response:
    return await c.post("/v1/chat/completions", json={"model": model, "messages": MSG}, headers=key_headers(key))


async def export(c: httpx.AsyncClient, sid: str) -> dict:
    r = await c.post("/rl/finish_session", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def engine(tokenizer) -> FakeEngine:
    return FakeEngine(tokenizer, output_tokens=3)


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_models_lists_the_policies_and_sessions_bind_to_them(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base")) as c:
        sid0, key0 = await start_session(c, "t")
        models = (await c.get("/v1/models", headers=key_headers(key0))).json()["data"]
        assert [m["id"] for m in models] == ["base"]
        # a gateway serving one policy takes any model name, as before
        assert (await chat(c, key0, "gpt-4o")).status_code == 200
        for name in ("a", "b"):
            r = await load(c, name, adapter_dir(tmp_path / name))
            assert r.status_code == 200 and r.json()["version"] == 0, r.text
        models = (await c.get("/v1/models", headers=key_headers(key0))).json()["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("base", None), ("a", "base"), ("b", "base")]
        sid, key = await start_session(c, "t", policy="b")
        r = await chat(c, key, "whatever-the-agent-says")  # a bound session: its policy, the name only echoed
        assert r.status_code == 200 and r.json()["model"] == "whatever-the-agent-says"
        assert engine.requests[-1].adapter == "b"
        out = await export(c, sid)
        assert [s["policy"] for s in out["interactions"]] == ["b"]
        assert out["interactions"][0]["versions"][-3:] == [0, 0, 0]
        # the default policy's earlier turn names it
        assert [s["policy"] for s in (await export(c, sid0))["interactions"]] == ["base"]


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_a_request_naming_a_policy_binds_an_unbound_session(make_app, asgi_client, engine, engine_kind,
                                                                   tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base")) as c:
        await load(c, "a", adapter_dir(tmp_path / "a"))
        await load(c, "b", adapter_dir(tmp_path / "b"))
        sid, key = await start_session(c, "t")
        assert (await chat(c, key, "a")).status_code == 200
        assert engine.requests[-1].adapter == "a"
        r = await chat(c, key, "b")  # one session, one policy
        assert r.status_code == 400 and r.json()["error"]["code"] == "policy_mismatch"
        r = await chat(c, key, "not-a-policy")  # bound now: any other name is only echoed
        assert r.status_code == 200 and engine.requests[-1].adapter == "a"
        _, key2 = await start_session(c, "t")
        r = await chat(c, key2, "base")  # the default policy by its name: no binding needed
        # (vLLM: its zero identity adapter while adapters are loaded: engine/remote/vllm.py, IDENTITY)
        assert r.status_code == 200 and engine.requests[-1].adapter == (IDENTITY if engine_kind == "vllm" else None)
        r = await c.post("/rl/start_session", json={"task_id": "t", "policy": "nope"}, headers=admin_headers())
        assert r.status_code == 404 and r.json()["error"]["code"] == "policy_not_found"


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_pushes_version_one_policy_alone(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base")) as c:
        await load(c, "a", adapter_dir(tmp_path / "a"))
        await load(c, "b", adapter_dir(tmp_path / "b"), version=7)  # a resumed run's version
        r = await c.post("/rl/update_weights", json={"path": adapter_dir(tmp_path / "a2"), "policy": "a"},
                         headers=admin_headers())
        assert r.status_code == 200 and r.json() == {"message": "success", "version": 1, "policy": "a"}
        versions = (await c.get("/rl/metrics", headers=admin_headers())).json()["policies"]
        assert versions == {"base": 0, "a": 1, "b": 7}
        sa, ka = await start_session(c, "t", policy="a")
        sb, kb = await start_session(c, "t", policy="b")
        s0, k0 = await start_session(c, "t", policy="base")
        for key in (ka, kb, k0):
            assert (await chat(c, key)).status_code == 200
        got = {sid: (await export(c, sid))["interactions"][0] for sid in (sa, sb, s0)}
        assert [set(got[s]["versions"]) - {-1} for s in (sa, sb, s0)] == [{1}, {7}, {0}]
        # a full weight push would change what every adapter computes: refused while any is served
        r = await c.post("/rl/update_weights", json={"path": dummy_checkpoint(tmp_path / "full")},
                         headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "adapters_resident"
        assert engine.version == 0
        # an adapter push needs an adapter directory
        r = await c.post("/rl/update_weights", json={"path": dummy_checkpoint(tmp_path / "full"), "policy": "a"},
                         headers=admin_headers())
        assert r.status_code == 400 and "adapter_config.json" in r.json()["error"]["message"]


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_loading_and_unloading_refuse_what_they_must(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base", max_policies=2)) as c:
        _, key = await start_session(c, "t")
        assert (await c.get("/rl/policies", headers=key_headers(key))).status_code == 403
        assert (await load(c, "a", adapter_dir(tmp_path / "a"))).status_code == 200
        cases = [
            (("a", adapter_dir(tmp_path / "x")), 409, "policy_exists"),
            (("base", adapter_dir(tmp_path / "x")), 409, "policy_exists"),
            (("bad name", adapter_dir(tmp_path / "x")), 400, "invalid_policy_name"),
            (("c", str(tmp_path / "missing")), 400, "weight_update_failed"),
            (("c", "relative/dir"), 400, "weight_update_failed"),
            (("c", dummy_checkpoint(tmp_path / "full")), 400, "weight_update_failed"),
        ]
        for (name, path), status, code in cases:
            r = await load(c, name, path)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (name, path, r.text)
        assert (await load(c, "b", adapter_dir(tmp_path / "b"))).status_code == 200
        r = await load(c, "c", adapter_dir(tmp_path / "c"))
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_limit_reached"
        assert "--max-policies 2" in r.json()["error"]["message"]
        assert {k: v for k, v in engine.adapter_versions().items() if k != IDENTITY} == {"a": 0, "b": 0}
        # unloading: not while a session bound to it is active; the default never
        sid, key = await start_session(c, "t", policy="a")
        assert (await chat(c, key)).status_code == 200
        r = await c.post("/rl/policies/unload", json={"name": "a"}, headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_in_use"
        assert (await c.post("/rl/policies/unload", json={"name": "base"}, headers=admin_headers())).status_code == 400
        assert (await c.post("/rl/policies/unload", json={"name": "zzz"}, headers=admin_headers())).status_code == 404
        await c.post("/rl/end_session", headers=key_headers(key))
        assert (await c.post("/rl/policies/unload", json={"name": "a"}, headers=admin_headers())).status_code == 200
        assert {k: v for k, v in engine.adapter_versions().items() if k != IDENTITY} == {"b": 0}
        listed = (await c.get("/rl/policies", headers=admin_headers())).json()
        assert [p["name"] for p in listed["policies"]] == ["base", "b"]
        # the ended session of the unloaded policy is still exported, its turns naming it
        assert [s["policy"] for s in (await export_ended(c, sid))["interactions"]] == ["a"]
        assert (await load(c, "c", adapter_dir(tmp_path / "c"))).status_code == 200  # room again
        for name in ("b", "c"):  # the last policy gone, vLLM's identity adapter goes too (engine/remote/vllm.py)
            assert (await c.post("/rl/policies/unload", json={"name": name}, headers=admin_headers())).status_code == 200
        assert engine.adapter_versions() == {} and not list(tmp_path.glob(".rlgate-identity-lora-*"))


async def export_ended(c: httpx.AsyncClient, sid: str) -> dict:
    r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


async def test_collect_takes_one_policys_sessions(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base")) as c:
        await load(c, "a", adapter_dir(tmp_path / "a"))
        keys = {}
        for policy in ("a", "base", "a", None):
            sid, key = await start_session(c, "t", **({"policy": policy} if policy else {}))
            assert (await chat(c, key, "base" if policy is None else "x")).status_code == 200
            await c.post("/rl/end_session", headers=key_headers(key))
            keys[sid] = policy
        r = await c.post("/rl/collect", json={"policy": "a"}, headers=admin_headers())
        assert sorted(s["session_id"] for s in r.json()["sessions"]) == sorted(s for s, p in keys.items() if p == "a")
        r = await c.post("/rl/collect", json={"policy": "base"}, headers=admin_headers())  # unbound: the default's
        assert len(r.json()["sessions"]) == 2
        r = await c.post("/rl/collect", json={"policy": "nope"}, headers=admin_headers())
        assert r.status_code == 404


@pytest.mark.parametrize("engine_kind", KINDS)
async def test_policies_and_bindings_survive_a_restart(make_app, asgi_client, tokenizer, tmp_path) -> None:
    db = tmp_path / "store.db"
    engine = FakeEngine(tokenizer, output_tokens=3)
    first = make_app(engine=engine, store=SQLiteStore(db), model_name="base")
    async with first.router.lifespan_context(first), asgi_client(first) as c:  # closes the store at the end
        await load(c, "a", adapter_dir(tmp_path / "a"))
        await c.post("/rl/update_weights", json={"path": adapter_dir(tmp_path / "a1"), "policy": "a"},
                     headers=admin_headers())
        sid, key = await start_session(c, "t", policy="a")
        assert (await chat(c, key)).status_code == 200
    engine2 = FakeEngine(tokenizer, output_tokens=3)
    app = make_app(engine=engine2, store=SQLiteStore(db), model_name="base")
    async with app.router.lifespan_context(app), asgi_client(app) as c:
        assert set(engine2.adapter_versions()) - {IDENTITY} == {"a"}  # loaded again from its directory, at its version:
        listed = (await c.get("/rl/policies", headers=admin_headers())).json()["policies"]
        assert [(p["name"], p["version"], p["path"]) for p in listed] == [
            ("base", 0, None), ("a", 1, str((tmp_path / "a1").resolve()))]
        s = app.state.gateway.sessions.sessions[sid]
        assert s.policy == "a" and [i.policy for i in s.interactions.values()] == ["a"]


async def test_per_policy_metrics(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base")) as c:
        await load(c, "a", adapter_dir(tmp_path / "a"))
        _, ka = await start_session(c, "t", policy="a")
        _, k0 = await start_session(c, "t", policy="base")
        for key in (ka, ka, k0):
            assert (await chat(c, key)).status_code == 200
        text = (await c.get("/metrics", headers=admin_headers())).text
        values = {(s.name, s.labels.get("policy")): s.value for f in text_string_to_metric_families(text)
                  for s in f.samples if s.name.startswith("rlgate_policy_")}
        assert values[("rlgate_policy_turns_total", "a")] == 2 and values[("rlgate_policy_turns_total", "base")] == 1
        assert values[("rlgate_policy_generated_tokens_total", "a")] == 6
        assert values[("rlgate_policy_active_sessions", "a")] == 1
        assert values[("rlgate_policy_version", "a")] == 0
        # an exported token's version lag is measured within its policy: a at version 2 while the base is at 0
        for _ in range(2):
            await c.post("/rl/update_weights", json={"path": adapter_dir(tmp_path / "a"), "policy": "a"},
                         headers=admin_headers())
        sid, key = await start_session(c, "t", policy="a")
        assert (await chat(c, key)).status_code == 200
        await export(c, sid)
        text = (await c.get("/metrics", headers=admin_headers())).text
        lag = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name.startswith("rlgate_token_version_lag")}
        assert lag["rlgate_token_version_lag_count"] == 3 and lag["rlgate_token_version_lag_sum"] == 0


async def test_an_engine_without_adapters_says_so(make_app, asgi_client, engine, tmp_path) -> None:
    class NoAdapters:  # the Engine contract, nothing more
        def __init__(self, inner: FakeEngine) -> None:
            self.inner = inner
            self.version, self.max_context_length = inner.version, inner.max_context_length
            self.stream, self.generate = inner.stream, inner.generate
            self.update_weights_from_path, self.start, self.close = (inner.update_weights_from_path, inner.start,
                                                                    inner.close)

    async with asgi_client(make_app(engine=NoAdapters(engine))) as c:
        r = await load(c, "a", adapter_dir(tmp_path / "a"))
        assert r.status_code == 400 and r.json()["error"]["code"] == "adapters_unsupported"


async def test_an_unknown_policy_is_a_404_in_each_apis_shape(make_app, engine, tmp_path) -> None:
    """With several policies served, an unbound session's request naming none of them: the SDKs' own
    NotFoundError, in OpenAI's shape (chat, Responses) and Anthropic's."""
    app = make_app(engine=engine, model_name="base")
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            await load(c, "a", adapter_dir(tmp_path / "a"))
            _, key = await start_session(c, "t")
        oai = AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(OpenAINotFound) as err:
            await oai.chat.completions.create(model="gpt-4o", messages=MSG)
        assert err.value.code == "model_not_found" and "base, a" in err.value.message
        with pytest.raises(OpenAINotFound) as err:
            await oai.responses.create(model="gpt-4o", input="hi")
        assert err.value.code == "model_not_found"
        ant = AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
        with pytest.raises(AnthropicNotFound) as aerr:
            await ant.messages.create(model="claude-x", max_tokens=8, messages=MSG)
        assert aerr.value.body["type"] == "error" and aerr.value.body["error"]["type"] == "not_found_error"
        # the policy by name, through each SDK; the session is bound to it by its first request
        r = await oai.chat.completions.create(model="a", messages=MSG)
        assert r.model == "a" and engine.requests[-1].adapter == "a"
        m = await ant.messages.create(model="a", max_tokens=8, messages=MSG)
        assert m.model == "a" and engine.requests[-1].adapter == "a"
        with pytest.raises(BadRequestError) as bad:
            await oai.chat.completions.create(model="base", messages=MSG)
        assert bad.value.code == "policy_mismatch"
        models = await oai.models.list()
        assert [m.id async for m in models] == ["base", "a"]


async def test_the_viewer_shows_and_filters_by_policy(make_app, asgi_client, engine, tmp_path) -> None:
    async with asgi_client(make_app(engine=engine, model_name="base", ui=True)) as c:
        await load(c, "a", adapter_dir(tmp_path / "a"))
        sid, key = await start_session(c, "t", policy="a")
        _, key0 = await start_session(c, "t", policy="base")
        for k in (key, key0):
            assert (await chat(c, k)).status_code == 200
        page = (await c.get("/ui", headers=admin_headers())).text
        assert 'data-policy="a"' in page and 'data-policy="base"' in page
        assert '<select name="policy"><option value="">any</option><option value="a">a</option>' in page
        page = (await c.get(f"/ui/session?id={sid}", headers=admin_headers())).text
        assert "<dt>policy</dt><dd>a</dd>" in page
        turn = next(iter(app_sessions(c)[sid].interactions))
        page = (await c.get(f"/ui/turn?session={sid}&id={turn}", headers=admin_headers())).text
        assert "<dt>policy</dt><dd>a</dd>" in page and "reference 0;" in page


def app_sessions(c: httpx.AsyncClient) -> dict:
    return c._transport.app.state.gateway.sessions.sessions  # type: ignore[attr-defined]
