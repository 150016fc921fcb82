"""End-to-end: the official OpenAI SDK against rlgate on 127.0.0.1 with the tiny model."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys

import httpx
import pytest
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, free_port, wait_healthy
from remote_helpers import KINDS, start_fake_backend
from remote_helpers import stop as stop_process
from rlgate.client import GatewayClient

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate arithmetic",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]






@pytest.fixture(scope="module", params=KINDS)
def served(request, tiny_model_dir):
    """``rlgate serve`` as a subprocess on the tiny model: its local engine, or the SGLang / vLLM engine
    driving a fake server of that kind (itself a subprocess running the local engine)."""
    backend, extra = None, []
    if request.param != "local":
        backend_url, backend = start_fake_backend(request.param, tiny_model_dir)
        extra = ["--backend-url", backend_url]
    port = free_port()
    env = {**os.environ, "RLGATE_ADMIN_KEY": ADMIN_KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", request.param,
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(300)
        if backend is not None:
            stop_process(backend)


def _generated(sample):
    return [t for t, m in zip(sample["input_ids"], sample["loss_mask"], strict=False) if m]


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["", "/v1"])
async def test_openai_sdk_session_roundtrip(served, tokenizer, stop_ids, suffix):
    client = GatewayClient(served, ADMIN_KEY)
    async with client.session("e2e", mode="rerender") as s:
        oai = AsyncOpenAI(base_url=served + suffix, api_key=s.api_key, max_retries=0)
        messages = [{"role": "system", "content": "You are a calculator."}]
        replies = []
        for q in ["What is 2 + 2?", "And 3 * 3?", "Thanks."]:
            messages.append({"role": "user", "content": q})
            r = await oai.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="none",
                                                  max_tokens=16, temperature=1.0)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert r.usage.completion_tokens >= 1
            replies.append(r)
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            await s.set_reward(float(len(replies)))
        await oai.close()
    export = await s.export()
    await client.aclose()
    items = export["interactions"]
    assert [i["id"] for i in items] == [r.id for r in replies]
    # rewards 1, 2, 3 on a chain, discount 1.0: each turn gets its return-to-go
    assert [i["reward"] for i in items] == [6.0, 5.0, 3.0]
    assert [i["relation"] for i in items] == ["root", "extend", "extend"]
    for item, reply in zip(items, replies, strict=False):
        n_prompt = item["loss_mask"].index(1)
        expected_prompt = tokenizer.apply_chat_template(item["messages"], tools=TOOLS, tokenize=True,
                                                        add_generation_prompt=True)["input_ids"]
        assert item["input_ids"][:n_prompt] == expected_prompt
        out = _generated(item)
        assert all(m == 1 for m in item["loss_mask"][n_prompt:])
        text_ids = out[:-1] if reply.choices[0].finish_reason == "stop" else out
        if reply.choices[0].finish_reason == "stop":
            assert out[-1] in stop_ids
        message = reply.choices[0].message
        reasoning = (message.model_extra or {}).get("reasoning_content")
        decoded = tokenizer.decode(text_ids)
        if reasoning:  # the model opened a <think> block (the tokenizer has one): the parser took it out of content
            assert decoded.lstrip().startswith("<think>") and reasoning.strip() in decoded
            assert decoded.rstrip().endswith((message.content or "").strip())
        else:
            assert decoded.strip() == (message.content or "")
        lps = item["logprobs"][n_prompt:]
        assert all(math.isfinite(x) and x <= 0 for x in lps)
        assert item["logprobs"][:n_prompt] == [0.0] * n_prompt
        assert item["versions"] == [-1] * n_prompt + [0] * len(out)


@pytest.mark.slow
async def test_token_exact_session_extends_parent_tokens(served):
    client = GatewayClient(served, ADMIN_KEY)
    async with client.session("exact") as s:
        oai = AsyncOpenAI(base_url=served + "/v1", api_key=s.api_key, max_retries=0)
        messages = [{"role": "user", "content": "Hello"}]
        for q in ["Go on", "More"]:
            r = await oai.chat.completions.create(model="t", messages=messages, max_tokens=12)
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": q}]
        await oai.chat.completions.create(model="t", messages=messages, max_tokens=12)
        await oai.close()
    export = await s.export(style="concat")
    await client.aclose()
    (sample,) = export["interactions"]
    assert export["stats"]["extend"] == 2 and len(sample["chain"]) == 3
    # three generated segments, each carried verbatim inside the one sequence
    segments, prev = 0, 0
    for m in sample["loss_mask"]:
        segments += m == 1 and prev == 0
        prev = m
    assert segments == 3


@pytest.mark.slow
async def test_logprobs_match_teacher_forcing(served, tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    client = GatewayClient(served, ADMIN_KEY)
    async with client.session("fidelity") as s:
        oai = AsyncOpenAI(base_url=served + "/v1", api_key=s.api_key, max_retries=0)
        for q in ["one", "two two", "three three three"]:
            await oai.chat.completions.create(model="t", messages=[{"role": "user", "content": q}],
                                              max_tokens=24, temperature=1.0, top_p=1.0)
        await oai.close()
    export = await s.export()
    await client.aclose()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    checked = 0
    for item in export["interactions"]:
        ids = torch.tensor([item["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0]
        for pos, (tok, m, lp) in enumerate(zip(item["input_ids"], item["loss_mask"], item["logprobs"], strict=False)):
            if m:
                assert abs(logp[pos - 1, tok].item() - lp) < 1e-4
                checked += 1
    assert checked >= 3


@pytest.mark.slow
async def test_32_sessions_x_3_turns_concurrently(served):
    client = GatewayClient(served, ADMIN_KEY)

    async def episode(k: int):
        async with client.session(f"conc{k}") as s:
            oai = AsyncOpenAI(base_url=served + "/v1", api_key=s.api_key, max_retries=0)
            messages: list[dict] = []
            ids = []
            for turn in range(3):
                messages.append({"role": "user", "content": f"session {k} turn {turn}"})
                r = await oai.chat.completions.create(model="t", messages=messages, max_tokens=8, seed=k)
                ids.append(r.id)
                messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            await s.set_reward(float(k))
            await oai.close()
        return s, ids

    results = await asyncio.gather(*(episode(k) for k in range(32)))
    for k, (s, ids) in enumerate(results):
        export = await s.export()
        assert [i["id"] for i in export["interactions"]] == ids
        assert all(f"session {k} turn" in i["messages"][0]["content"] for i in export["interactions"])
        assert export["interactions"][-1]["reward"] == float(k)
    await client.aclose()


def test_serve_refuses_public_bind_without_admin_key(tiny_tokenizer_dir):
    env = {k: v for k, v in os.environ.items() if k != "RLGATE_ADMIN_KEY"}
    r = subprocess.run(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake",
         "--host", "0.0.0.0", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode != 0
    assert "refusing to bind 0.0.0.0" in (r.stderr + r.stdout)


@pytest.mark.slow
def test_serve_generates_and_prints_admin_key_once(tiny_tokenizer_dir):
    env = {k: v for k, v in os.environ.items() if k != "RLGATE_ADMIN_KEY"}
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake",
         "--port", str(port), "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        line = proc.stdout.readline()
        while line and "generated admin key" not in line:  # e.g. transformers' "PyTorch was not found"
            line = proc.stdout.readline()
        assert "generated admin key" in line
        key = line.strip().rsplit(" ", 1)[-1]
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc)
        r = httpx.post(url + "/rl/start_session", json={"task_id": "x"}, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
        r = httpx.post(url + "/rl/start_session", json={"task_id": "x"}, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 403
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=300)
    assert key not in out  # printed exactly once, never logged afterwards
