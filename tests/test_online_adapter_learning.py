"""Adapter policies learning online side by side (``--online-train-adapters``; online/learners.py,
online/adapter_slots.py, train/online.py: AdapterLearners): the tiny model on the local engine, real PEFT
adapters, two tenants each bound to its own policy. Each policy's learner trains on its own tenant's
feedback only, its candidates are adapters of the same engine, its canary decides alone; pushes that
would move a learning policy behind its learner are refused; a promoted version survives a restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from openai import AsyncOpenAI
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from helpers import ADMIN_KEY, admin_headers
from online_helpers import new_tenant

MSG = [{"role": "user", "content": "Which is larger, 3 or 8?"}]


def fresh_adapter(base: Path, out: Path) -> str:
    """An untrained adapter (B = 0: it answers as the base does), as ``save_pretrained`` writes it."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    model.save_pretrained(out)
    return str(out.resolve())


def gateway(tiny_model_dir: Path, tokenizer, stop_ids, store, directory: Path, **online: Any):
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.engine.local.engine import LocalEngine
    from rlgate.server.app import create_app
    from rlgate.train.config import GRPOConfig, OnlineTrainConfig
    from rlgate.train.online import AdapterLearners

    options = OnlineConfig(online=True, train_adapters=True, train_batch=4, train_batch_max=8, canary_share=1.0,
                           conversation_idle_s=0.0, hacking_action="alarm", **online)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapters = AdapterLearners(base, LocalEngine(tiny_model_dir, device="cpu"), options, tokenizer,
                               directory=directory, stop_token_ids=stop_ids,
                               train_config=OnlineTrainConfig(grpo=GRPOConfig(lr=1e-2)))
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY, model_name="base", ui=True), adapters.router, store, tokenizer,
                     stop_token_ids=stop_ids, online=options, online_training=adapters.learners)
    return app, adapters


async def until(check, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def turn(c, headers: dict[str, str], conversation: str) -> dict[str, Any]:
    r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4},
                     headers={**headers, "X-Conversation-Id": conversation})
    assert r.status_code == 200, r.text
    return r.json()


async def test_each_policy_learns_from_its_own_tenant_with_its_own_canary(tiny_model_dir: Path, tokenizer, stop_ids,
                                                                          asgi_client, tmp_path: Path) -> None:
    from rlgate.store.sqlite import SQLiteStore

    db = tmp_path / "store.db"
    app, adapters = gateway(tiny_model_dir, tokenizer, stop_ids, SQLiteStore(db), tmp_path / "candidates")
    learners = adapters.learners
    base_before = {k: v.clone() for k, v in adapters.base.state_dict().items()}
    async with app.router.lifespan_context(app), asgi_client(app) as c:
        tenants = {}
        for name in ("shop", "bank"):
            r = await c.post("/rl/policies", json={"name": name, "path": fresh_adapter(tiny_model_dir, tmp_path / name)},
                             headers=admin_headers())
            assert r.status_code == 200, r.text
            tenants[name] = await new_tenant(c, name)
            r = await c.post("/v1/tenants/policy", json={"tenant_id": tenants[name][0], "policy": name},
                             headers=admin_headers())
            assert r.status_code == 200, r.text
        assert set(learners.learners) == {"shop", "bank"}
        # the candidates' adapters are the engine's, never listed as policies
        assert [m["id"] for m in (await c.get("/v1/models", headers=admin_headers())).json()["data"]] == \
            ["base", "shop", "bank"]

        # only shop's users give feedback, up and down in turn (every step's rewards differ: a gradient)
        shop_h = tenants["shop"][1]
        for k in range(8):
            reply = await turn(c, shop_h, f"c{k}")
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "interaction_id": reply["id"], "value": k % 2 == 0},
                             headers=shop_h)
            assert r.status_code == 200, r.text
        shop, bank = learners.learners["shop"], learners.learners["bank"]
        assert shop.trainer is not None and bank.trainer is not None

        async def shop_candidate() -> bool:
            assert shop.feedback is not None
            return shop.canary.canary_version is not None and shop.feedback.counts["events"] == 8

        await until(shop_candidate, "shop's first candidate and every feedback event read")
        assert shop.trainer.counts["received_feedback_samples"] == 8 and shop.trainer.counts["steps"] >= 1
        assert bank.trainer.counts["received_feedback_samples"] == 0 and bank.trainer.counts["steps"] == 0
        assert bank.canary.canary_version is None and bank.canary.stable_version == 0
        candidate = shop.canary.canary_version
        assert candidate == 1
        # the learners hold the base once (their models' base weights are the shared base's tensors) and never
        # change it; shop's candidate is a trained adapter
        shared = {p.data_ptr() for p in adapters.base.parameters()}
        for learner in (shop, bank):
            model = learner.trainer.stepper.trainer.model
            frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
            assert frozen and all(p.data_ptr() in shared and not p.requires_grad for p in frozen)
        assert all(torch.equal(v, base_before[k]) for k, v in adapters.base.state_dict().items())
        from safetensors.torch import load_file

        saved = load_file(tmp_path / "candidates" / "shop" / f"v{candidate}" / "adapter_model.safetensors")
        assert any(float(v.abs().max()) > 0 for k, v in saved.items() if "lora_B" in k)

        # shop's new conversations are served by its candidate (canary share 1), bank's by its version 0
        shop_turn = await turn(c, shop_h, "new-shop")
        bank_turn = await turn(c, tenants["bank"][1], "new-bank")
        found = {k: app.state.online.conversations.find_turn(None, t["id"])[1]
                 for k, t in (("shop", shop_turn), ("bank", bank_turn))}
        assert (found["shop"].policy, set(found["shop"].output_versions)) == ("shop", {candidate})
        assert (found["bank"].policy, set(found["bank"].output_versions)) == ("bank", {0})

        # each canary is its own: actions name the policy
        r = await c.post("/rl/canary/promote", json={"reason": "test"}, headers=admin_headers())
        assert r.status_code == 400 and r.json()["error"]["code"] == "policy_required"
        r = await c.post("/rl/canary/promote", json={"policy": "nope"}, headers=admin_headers())
        assert r.status_code == 404 and r.json()["error"]["code"] == "policy_not_found"
        r = await c.post("/rl/canary/promote", json={"policy": "bank"}, headers=admin_headers())
        assert r.status_code == 409  # bank has no canary
        r = await c.post("/rl/canary/promote", json={"policy": "shop", "reason": "looks good"}, headers=admin_headers())
        assert r.status_code == 200, r.text
        listed = {p["name"]: p for p in (await c.get("/rl/policies", headers=admin_headers())).json()["policies"]}
        assert (listed["shop"]["version"], listed["bank"]["version"], listed["base"]["version"]) == (candidate, 0, 0)
        assert listed["shop"]["path"] == str((tmp_path / "candidates" / "shop" / f"v{candidate}").resolve())
        state = (await c.get("/rl/online", headers=admin_headers())).json()
        assert state["mode"] == "adapters"
        assert state["policies"]["shop"]["canary"]["stable_version"] == candidate
        assert state["policies"]["bank"]["canary"]["stable_version"] == 0
        one = (await c.get("/rl/online", params={"policy": "bank"}, headers=admin_headers())).json()
        assert one["trainer"]["received_feedback_samples"] == 0
        page = (await c.get("/ui/online", headers=admin_headers())).text  # a section per learning policy
        assert "online training (policy shop): canary" in page and "online training (policy bank): canary" in page
        metrics = (await c.get("/metrics", headers=admin_headers())).text
        assert f'rlgate_online_version{{policy="shop",role="stable"}} {float(candidate)}' in metrics
        assert 'rlgate_online_version{policy="bank",role="stable"} 0.0' in metrics

        # nothing moves a learning policy behind its learner, nor the base they share
        r = await c.post("/rl/update_weights", json={"policy": "shop", "path": str(tmp_path / "shop")},
                         headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_learning_online", r.text
        r = await c.post("/rl/policies/unload", json={"name": "bank"}, headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_in_use"  # bank's tenant
        # a policy freed of its tenant (revoked, its data deleted) unloads with its learner and both its adapters
        r = await c.post("/v1/tenants/revoke", json={"tenant_id": tenants["bank"][0], "delete_data": True},
                         headers=admin_headers())
        assert r.status_code == 200, r.text
        r = await c.post("/rl/policies/unload", json={"name": "bank"}, headers=admin_headers())
        assert r.status_code == 200, r.text
        assert set(learners.learners) == {"shop"}
        assert set(adapters.engine.adapter_versions()) <= {"shop", "shop#2"}

    # a restart on the same store serves shop at its promoted version, from the promoted weights, learning again
    app2, adapters2 = gateway(tiny_model_dir, tokenizer, stop_ids, SQLiteStore(db), tmp_path / "candidates")
    async with app2.router.lifespan_context(app2), asgi_client(app2) as c:
        assert set(adapters2.learners.learners) == {"shop"}
        assert adapters2.learners.learners["shop"].canary.stable_version == candidate
        r = await c.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 4},
                         headers={**shop_h, "X-Conversation-Id": "after-restart"})
        assert r.status_code == 200, r.text
        again = app2.state.online.conversations.find_turn(None, r.json()["id"])[1]
        assert set(again.output_versions) == {candidate}
        # the restored weights are the promoted candidate's: the engine's logprobs are its PEFT model's
        from peft import PeftModel

        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                         listed["shop"]["path"]).eval()
        with torch.no_grad():
            logits = peft(torch.tensor([again.prompt_ids + again.output_ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(again.prompt_ids) - 1:-1], -1)
        want = logp.gather(1, torch.tensor(again.output_ids)[:, None])[:, 0].tolist()
        assert again.output_logprobs == pytest.approx(want, abs=1e-4)


async def test_the_base_is_frozen_and_a_tenant_reaches_its_policy_with_the_openai_sdk(
        tiny_model_dir: Path, tokenizer, stop_ids, tmp_path: Path) -> None:
    from rlgate.server.runner import ServerThread
    from rlgate.store.base import MemoryStore

    app, adapters = gateway(tiny_model_dir, tokenizer, stop_ids, MemoryStore(), tmp_path / "candidates")
    with ServerThread(app) as url:
        import httpx

        async with httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/rl/policies", json={"name": "shop", "path": fresh_adapter(tiny_model_dir, tmp_path / "a")},
                             headers=admin_headers())
            assert r.status_code == 200, r.text
            r = await c.post("/rl/update_weights", json={"path": str(tiny_model_dir)}, headers=admin_headers())
            assert r.status_code == 409 and r.json()["error"]["code"] in ("adapters_resident", "base_frozen"), r.text
            tenant, headers = await new_tenant(c, "shop")
            r = await c.post("/v1/tenants/policy", json={"tenant_id": tenant, "policy": "shop"},
                             headers=admin_headers())
            assert r.status_code == 200, r.text
            r = await c.post("/rl/policies/unload", json={"name": "shop#2"}, headers=admin_headers())
            assert r.status_code in (400, 404)  # a candidate's adapter is no policy
        oai = AsyncOpenAI(base_url=f"{url}/v1", api_key=headers["Authorization"].removeprefix("Bearer "))
        out = await oai.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=4,
                                                extra_headers={"X-Conversation-Id": "sdk"})
        assert out.model == "gpt-4o" and out.choices[0].message.content is not None
        turn_ = app.state.online.conversations.find_turn(None, out.id)[1]
        assert turn_.policy == "shop" and set(turn_.output_versions) == {0}
        assert adapters.learners.learners["shop"].hacking is not None


def test_the_flags_are_checked_before_the_model_loads(tiny_tokenizer_dir: Path) -> None:
    import subprocess
    import sys

    def serve(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_tokenizer_dir),
                               "--store", ":memory:", *flags], capture_output=True, text=True, timeout=300,
                              env={**__import__("os").environ, "RLGATE_ADMIN_KEY": ADMIN_KEY})

    alone = serve("--online-train-adapters")
    assert alone.returncode != 0 and "needs --online and --engine local" in alone.stderr
    both = serve("--online", "--online-train", "--online-train-adapters")
    assert both.returncode != 0 and "choose one" in both.stderr
    remote = serve("--online", "--online-train-adapters", "--engine", "fake")
    assert remote.returncode != 0 and "--engine local" in remote.stderr
