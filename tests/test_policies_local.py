"""Policies on the local engine, end to end: the real OpenAI and Anthropic SDKs against a gateway on 127.0.0.1
serving the tiny model and two PEFT adapters at once; every exported sample's logprobs are those of PEFT's
model of its own policy alone, and a push to one policy changes that policy's turns only."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from peft import PeftModel
from transformers import AutoModelForCausalLM

from helpers import ADMIN_KEY, admin_headers, start_session
from rlgate.config import GatewayConfig
from rlgate.engine.local import LocalEngine
from rlgate.model import load_tokenizer
from rlgate.server.app import create_app
from rlgate.server.runner import ServerThread
from rlgate.store.base import MemoryStore
from test_engine_lora import make_adapter


def policy_model(base: Path, adapter: Path | None):
    model = AutoModelForCausalLM.from_pretrained(base)
    return (PeftModel.from_pretrained(model, adapter) if adapter is not None else model).eval()


def check_logprobs(model, sample: dict) -> None:
    """The sample's recorded logprobs against a teacher-forced pass of ``model`` (greedy: plain log-softmax)."""
    ids = sample["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    got = [(lp, logp[i - 1, t].item()) for i, (t, m, lp) in
           enumerate(zip(ids, sample["loss_mask"], sample["logprobs"], strict=True)) if m]
    assert got
    torch.testing.assert_close(torch.tensor([g for g, _ in got]), torch.tensor([e for _, e in got]), atol=1e-4, rtol=0)


@pytest.mark.slow
async def test_three_policies_served_side_by_side_through_the_sdks(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapters = {"a": make_adapter(tiny_model_dir, tmp_path / "a", seed=1),
                "b": make_adapter(tiny_model_dir, tmp_path / "b", seed=2, r=8, targets=["q_proj", "v_proj"])}
    engine = LocalEngine(tiny_model_dir, device="cpu")
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY, model_name="base"), engine, MemoryStore(),
                     load_tokenizer(tiny_model_dir))
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            for name, path in adapters.items():
                r = await c.post("/rl/policies", json={"name": name, "path": str(path)}, headers=admin_headers())
                assert r.status_code == 200, r.text
            sessions = {p: await start_session(c, "t", policy=p) for p in ("a", "b", "base")}

            async def turn(policy: str) -> None:  # half through each SDK; the model name is the agent's own
                _, key = sessions[policy]
                messages = [{"role": "user", "content": f"hello {policy}"}]
                if policy == "b":
                    await AsyncAnthropic(base_url=url, api_key=key).messages.create(
                        model="claude-x", max_tokens=12, messages=messages, extra_body={"temperature": 0})
                else:
                    await AsyncOpenAI(base_url=url + "/v1", api_key=key).chat.completions.create(
                        model="gpt-x", max_tokens=12, messages=messages, temperature=0)

            await asyncio.gather(*(turn(p) for p in sessions))  # in flight together: one mixed batch
            pushed = make_adapter(tiny_model_dir, tmp_path / "a2", seed=9)
            r = await c.post("/rl/update_weights", json={"path": str(pushed), "policy": "a"}, headers=admin_headers())
            assert r.json()["version"] == 1
            await asyncio.gather(*(turn(p) for p in sessions))
            exports = {}
            for policy, (sid, _) in sessions.items():
                r = await c.post("/rl/finish_session", json={"session_id": sid}, headers=admin_headers())
                exports[policy] = r.json()["interactions"]
    models = {"a": [policy_model(tiny_model_dir, adapters["a"]), policy_model(tiny_model_dir, pushed)],
              "b": [policy_model(tiny_model_dir, adapters["b"])] * 2, "base": [policy_model(tiny_model_dir, None)] * 2}
    for policy, samples in exports.items():
        assert [s["policy"] for s in samples] == [policy, policy]
        for k, sample in enumerate(samples):
            generated = {v for v, m in zip(sample["versions"], sample["loss_mask"], strict=True) if m}
            assert generated == ({k} if policy == "a" else {0})  # the push moved a's version alone
            check_logprobs(models[policy][k], sample)
