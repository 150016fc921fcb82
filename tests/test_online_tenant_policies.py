"""Online tenants and policies (online/tenant_policies.py): a tenant bound to its own adapter policy is served
by it whatever model name its client sends; tenants without one share the default policy; one tenant's
traffic is never served by another's policy; the binding is durable and keeps its policy loaded."""

from __future__ import annotations

from pathlib import Path

from openai import AsyncOpenAI

from helpers import admin_headers
from online_helpers import chat, new_tenant, online_app
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread
from rlgate.store.sqlite import SQLiteStore
from test_policies import adapter_dir

MSG = [{"role": "user", "content": "hi"}]


async def bind(c, tenant: str, policy: str | None):
    return await c.post("/v1/tenants/policy", json={"tenant_id": tenant, "policy": policy}, headers=admin_headers())


async def test_each_tenant_is_served_by_its_own_policy(tokenizer, stop_ids, asgi_client, tmp_path: Path) -> None:
    engine = FakeEngine(tokenizer, output_tokens=3)
    app = online_app(tokenizer, stop_ids, engine=engine, gateway={"model_name": "base"})
    async with asgi_client(app) as c:
        for name in ("shop", "bank"):
            r = await c.post("/rl/policies", json={"name": name, "path": adapter_dir(tmp_path / name)},
                             headers=admin_headers())
            assert r.status_code == 200, r.text
        shop, shop_h = await new_tenant(c, "shop")
        bank, bank_h = await new_tenant(c, "bank")
        other, other_h = await new_tenant(c, "other")  # no policy of its own: the default's
        assert (await bind(c, shop, "shop")).json() == {"tenant_id": shop, "policy": "shop"}
        assert (await bind(c, bank, "bank")).status_code == 200
        assert (await bind(c, bank, "nope")).status_code == 404
        assert (await bind(c, "tn-missing", "bank")).status_code == 404
        assert (await c.post("/v1/tenants/policy", json={"tenant_id": shop, "policy": None},
                             headers=shop_h)).status_code == 403  # a tenant key: not its business
        served = {}
        for tenant, headers in ((shop, shop_h), (bank, bank_h), (other, other_h)):
            await chat(c, headers, MSG, conversation="c1")  # the client's own model name ("m")
            served[tenant] = engine.requests[-1].adapter
        assert served == {shop: "shop", bank: "bank", other: None}
        # a tenant's request naming another tenant's policy is served by its own (the name only echoed: a tenant
        # cannot even learn which other policies exist), and it lists its own policy alone
        for headers, name, own in ((shop_h, "bank", "shop"), (other_h, "shop", None), (bank_h, "base", "bank")):
            r = await c.post("/v1/chat/completions", json={"model": name, "messages": MSG, "max_tokens": 4},
                             headers={**headers, "X-Conversation-Id": "c1"})
            assert r.status_code == 200 and r.json()["model"] == name and engine.requests[-1].adapter == own
        listed = {t: [m["id"] for m in (await c.get("/v1/models", headers=h)).json()["data"]]
                  for t, h in ((shop, shop_h), (other, other_h))}
        assert listed == {shop: ["shop"], other: ["base"]}
        # a policy serving a tenant stays loaded
        r = await c.post("/rl/policies/unload", json={"name": "bank"}, headers=admin_headers())
        assert r.status_code == 409 and "serves tenants" in r.json()["error"]["message"]
        listed = (await c.get("/v1/tenants/policies", headers=admin_headers())).json()
        assert listed == {"default": "base", "tenants": {shop: "shop", bank: "bank"}}
        # exports say which policy served each tenant's turns
        sessions = app.state.online.conversations
        assert {t: {i.policy for s in sessions.sessions_of(t) for i in s.interactions.values()}
                for t in (shop, bank, other)} == {shop: {"shop"}, bank: {"bank"}, other: {"base"}}
        # deleting a tenant and its data frees its policy
        r = await c.post("/v1/tenants/revoke", json={"tenant_id": bank, "delete_data": True}, headers=admin_headers())
        assert r.status_code == 200, r.text
        assert (await c.get("/v1/tenants/policies", headers=admin_headers())).json()["tenants"] == {shop: "shop"}


async def test_a_tenants_policy_survives_a_restart_and_serves_its_sdk_clients(tokenizer, stop_ids, asgi_client,
                                                                                tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    first = online_app(tokenizer, stop_ids, store=SQLiteStore(db), gateway={"model_name": "base"})
    async with first.router.lifespan_context(first), asgi_client(first) as c:
        await c.post("/rl/policies", json={"name": "shop", "path": adapter_dir(tmp_path / "shop")},
                     headers=admin_headers())
        shop, shop_h = await new_tenant(c, "shop")
        assert (await bind(c, shop, "shop")).status_code == 200
    engine = FakeEngine(tokenizer, output_tokens=3)
    app = online_app(tokenizer, stop_ids, store=SQLiteStore(db), engine=engine, gateway={"model_name": "base"})
    with ServerThread(app) as url:
        oai = AsyncOpenAI(base_url=url + "/v1", api_key=shop_h["Authorization"].split()[1], max_retries=0)
        for name in ("gpt-4o", "base"):
            r = await oai.chat.completions.create(model=name, messages=MSG, max_tokens=4)
            assert r.model == name and engine.requests[-1].adapter == "shop"
        assert [m.id async for m in oai.models.list()] == ["shop"]
