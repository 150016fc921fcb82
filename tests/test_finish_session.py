"""``POST /rl/finish_session`` (issue 28): end, rewards and export in one control call.

Against a real gateway on 127.0.0.1 with the OpenAI SDK: the export is the one the three calls
(end_session, set_reward, export_trajectories) give; its refusals (404 / 401 / 403 / 422 / 409 /
410 / 400) change nothing; its 200 waits until the end and the rewards are durable, and a failed
write undoes all of it. The rollout runner uses it, with the same samples as the three calls.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, eventually, key_headers, start_session
from rlgate.client import GatewayClient, GatewayClientError
from rlgate.engine.fake import FakeEngine
from rlgate.rollout.runner import NO_LLM_CALL, RolloutRunner
from rlgate.server.runner import ServerThread
from test_durable_writes import GatedStore


async def two_turns(base_url: str, key: str) -> list[str]:
    """A two-turn conversation with the OpenAI SDK; the two interaction ids."""
    async with AsyncOpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0) as oai:
        msgs: list[Any] = [{"role": "user", "content": "one"}]
        r1 = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=8)
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "two"}]
        r2 = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=8)
    return [r1.id, r2.id]


def normalised(export: dict[str, Any], ids: list[str]) -> str:
    """The export as JSON with its session's and interactions' ids replaced by placeholders."""
    text = json.dumps(export, sort_keys=True)
    for n, name in enumerate([export["session_id"], *ids]):
        text = text.replace(json.dumps(name), f'"<id{n}>"')
    return text


@pytest.fixture
def gateway(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer, script=lambda r: "7"))) as url:
        yield url


@pytest.mark.parametrize("style", ["individual", "concat"])
async def test_one_call_exports_what_the_three_calls_export(gateway, style):
    async with GatewayClient(gateway, ADMIN_KEY) as client:
        exports = []
        for fused in (False, True):
            s = await client.start_session("task")
            ids = await two_turns(gateway, s.api_key)
            rewards = {ids[0]: 0.25, ids[1]: 1.5}
            if fused:
                export = await s.finish(rewards, style=style, discount=0.5)
            else:
                assert await s.end() == 2
                for iid, r in rewards.items():
                    await s.set_reward(r, interaction_id=iid)
                export = await s.export(style=style, discount=0.5)
            exports.append(normalised(export, ids))
            with pytest.raises(GatewayClientError) as gone:  # exported: the session is gone, its key retired
                await client.export(s.session_id)
            assert gone.value.status == 404
            r = await client._http.post(gateway + "/v1/chat/completions", headers=key_headers(s.api_key),
                                        json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 401
        assert exports[0] == exports[1]
        assert '"status": "ended"' in exports[1] and '"reward": 1.5' in exports[1]
        assert (await client.metrics())["sessions"] == 0  # nothing left behind


async def test_a_float_rewards_the_last_interaction(gateway):
    async with GatewayClient(gateway, ADMIN_KEY) as client:
        s = await client.start_session("task")
        ids = await two_turns(gateway, s.api_key)
        export = await s.finish(2.0)
    assert [(x["id"], x["reward"]) for x in export["interactions"]] == [(ids[0], 2.0), (ids[1], 2.0)]
    assert export["stats"]["completed"] == 2 and export["status"] == "ended"


async def test_refusals_change_nothing(gateway):
    async with httpx.AsyncClient(base_url=gateway, timeout=60) as c:
        sid, key = await start_session(c)
        ids = await two_turns(gateway, key)

        async def finish(body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
            return await c.post("/rl/finish_session", json={"session_id": sid, **body},
                                headers=admin_headers() if headers is None else headers)

        r = await finish({"session_id": "nope", "reward": 1.0})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        assert (await finish({"reward": 1.0}, {})).status_code == 401  # no key
        assert (await finish({"reward": 1.0}, key_headers("x" * 40))).status_code == 403  # an unknown key
        assert (await finish({"reward": 1.0}, key_headers(key))).status_code == 403  # its own session key
        for bad in ({"reward": float("nan")}, {"reward": float("inf")}, {"rewards": {ids[0]: float("-inf")}},
                    {"reward": "high"}, {"discount": 2.0}, {"style": "flat"}):
            r = await c.post("/rl/finish_session", content=json.dumps({"session_id": sid, **bad}),
                             headers={**admin_headers(), "content-type": "application/json"})
            assert r.status_code == 422, (bad, r.text)
        r = await finish({"rewards": {ids[0]: 1.0, "chatcmpl-unknown": 2.0}})  # one bad target: nothing set
        assert r.status_code == 400 and r.json()["error"]["param"] == "interaction_id"
        # after every refusal the session is still active, unrewarded, with its key working
        r = await c.post("/rl/set_reward", json={"reward": 0.5}, headers=key_headers(key))
        assert r.status_code == 200 and r.json()["interaction_id"] == ids[1]
        r = await c.post("/export_trajectories", json={"session_id": sid, "keep": True, "wait_timeout": 0},
                         headers=admin_headers())
        assert r.status_code == 409  # still active
        # ended by end_session: finish answers 409 (and exporting it the old way still works)
        assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        r = await finish({"reward": 1.0})
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_ended"
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert r.status_code == 200 and [x["reward"] for x in r.json()["interactions"]] == [0.5, 0.5]
        # finished once: a second finish finds nothing
        sid, key = await start_session(c)
        await two_turns(gateway, key)
        assert (await finish({"reward": 1.0})).status_code == 200
        assert (await finish({"reward": 1.0})).status_code == 404


async def test_no_llm_call_is_refused_and_the_session_stays(gateway):
    async with httpx.AsyncClient(base_url=gateway, timeout=60) as c:
        sid, key = await start_session(c)
        r = await c.post("/rl/finish_session", json={"session_id": sid, "reward": 1.0}, headers=admin_headers())
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_completed_interaction"
        r = await c.post("/rl/finish_session", json={"session_id": sid}, headers=admin_headers())  # no reward
        assert r.status_code == 200 and r.json()["interactions"] == [] and r.json()["status"] == "ended"


async def test_requests_in_flight_are_refused_or_waited_for(make_app, tokenizer, asgi_client):
    engine = FakeEngine(tokenizer, script=lambda r: "7")
    app = make_app(engine)
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        session = app.state.gateway.sessions.sessions[sid]
        await engine.pause_generation()  # the turn below stays in flight until generation continues
        turn = asyncio.ensure_future(c.post("/v1/chat/completions", headers=key_headers(key), json={
            "model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}))
        await eventually(lambda: session.in_flight == 1, timeout=60)
        r = await c.post("/rl/finish_session", json={"session_id": sid, "reward": 1.0}, headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
        assert session.status == "active" and session.in_flight == 1
        waiting = asyncio.ensure_future(c.post("/rl/finish_session", headers=admin_headers(), json={
            "session_id": sid, "reward": 1.0, "wait_timeout": 60}))
        await engine.continue_generation()
        assert (await turn).status_code == 200
        r = await waiting
        assert r.status_code == 200
        assert [(x["id"], x["reward"]) for x in r.json()["interactions"]] == [(turn.result().json()["id"], 1.0)]


def exported_samples(app) -> float:
    registry = app.state.gateway.sessions.gateway_metrics.registry
    return sum(s.value for m in registry.collect() if m.name == "rlgate_exported_samples"
               for s in m.samples if s.name == "rlgate_exported_samples_total")


async def test_the_answer_waits_until_durable_and_a_failed_write_undoes_it(make_app, asgi_client):
    store = GatedStore()
    store.gate.set()
    app = make_app(store=store)
    sessions = app.state.gateway.sessions
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        r = await c.post("/v1/chat/completions", headers=key_headers(key),
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200
        iid = r.json()["id"]
        # a failed write: 503, and the end, the reward and the export are undone (and not counted)
        store.fail = True
        r = await c.post("/rl/finish_session", json={"session_id": sid, "reward": 3.0}, headers=admin_headers())
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert sessions.metrics["sessions_exported"] == 0 and exported_samples(app) == 0
        session = sessions.sessions[sid]
        assert session.status == "active" and session.exported_at is None
        assert session.interactions[iid].reward is None
        store.fail = False
        r = await c.post("/v1/chat/completions", headers=key_headers(key),  # the key works again
                         json={"messages": [{"role": "user", "content": "again"}], "max_tokens": 4})
        assert r.status_code == 200
        # the 200 is held until the session's end and its reward are durable
        store.gate.clear()
        answer = asyncio.ensure_future(c.post("/rl/finish_session", json={"session_id": sid, "reward": 3.0},
                                              headers=admin_headers()))
        await eventually(lambda: store.waiting or answer.done(), timeout=60)
        assert sorted(store.saved[s] for s in store.waiting) == [f"interaction {r.json()['id']}", f"session {sid}"]
        assert not answer.done()
        store.gate.set()
        r = await asyncio.wait_for(answer, 30)
        assert r.status_code == 200 and r.json()["interactions"][-1]["reward"] == 3.0
        assert sessions.metrics["sessions_exported"] == 1 and exported_samples(app) == 2
        assert sid not in sessions.sessions  # dropped once the answer was sent


async def test_the_runner_finishes_in_one_call_with_the_same_samples(gateway):
    class Agent:
        async def run(self, data, *, base_url, api_key, http_client=None):
            ids = await two_turns(base_url, api_key)
            return {ids[0]: 0.5, ids[1]: 2.0}

    class Silent:
        async def run(self, data, *, base_url, api_key, http_client=None):
            return 1.0  # no LLM call

    async with GatewayClient(gateway, ADMIN_KEY) as client:
        got = []
        for fused in (True, False):
            runner = RolloutRunner(client, Agent(), group_size=2, export_style="concat", fused_finish=fused)
            before = (await client.metrics())["sessions_exported"]
            group = await runner.group("g", {})
            assert all(e.ok for e in group.episodes)
            assert (await client.metrics())["sessions_exported"] == before + 2
            got.append([(s.input_ids, s.loss_mask, s.logprobs, s.reward, s.turn_rewards, s.episode)
                        for e in group.episodes for s in e.samples])
            await runner.aclose()
        assert got[0] == got[1] and got[0][0][4] == [2.5, 2.0]
        runner = RolloutRunner(client, Silent(), group_size=2, max_consecutive_failures=0)
        group = await runner.group("g", {})
        assert [e.error for e in group.episodes] == [NO_LLM_CALL] * 2
        assert (await client.metrics())["sessions"] == 0  # the failed episodes' sessions were discarded


# --------------------------------------------------------------------------- batched starts


async def test_start_sessions_answers_each_item_as_the_single_call_would(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer), capacity_mode="granted")) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            await client.grant_capacity(3)
            got = await client.start_sessions(["a", "b", "a", "c"])
            assert [s.session_id for s in got[:3]] == ["a-0", "b-0", "a-1"]  # type: ignore[union-attr]
            assert isinstance(got[3], GatewayClientError) and got[3].status == 429
            assert got[3].body["error"]["code"] == "no_capacity"
            await two_turns(url, got[0].api_key)  # type: ignore[union-attr]  # a working session key
            await client.grant_capacity(1)
            r = await client._http.post(url + "/rl/start_sessions", headers=admin_headers(),
                                        json={"sessions": [{"task_id": "bad\n"}, {"task_id": "d"}]})
            assert r.status_code == 200
            bad, good = r.json()["sessions"]
            assert bad["status"] == 400 and bad["error"]["param"] == "task_id" and good["session_id"] == "d-0"
            for body, status in (({"sessions": []}, 422), ({"sessions": [{"task_id": ""}]}, 422)):
                assert (await client._http.post(url + "/rl/start_sessions", json=body,
                                                headers=admin_headers())).status_code == status
            r = await client._http.post(url + "/rl/start_sessions", json={"sessions": [{"task_id": "e"}]},
                                        headers=key_headers(got[1].api_key))  # type: ignore[union-attr]
            assert r.status_code == 403


async def test_the_runner_starts_a_step_in_one_call(make_app, tokenizer):
    class Agent:
        async def run(self, data, *, base_url, api_key, http_client=None):
            await two_turns(base_url, api_key)
            return 1.0

    with ServerThread(make_app(FakeEngine(tokenizer, script=lambda r: "7"), capacity_mode="granted")) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, Agent(), group_size=4)
            await client.grant_capacity(6)  # two short: those are retried (429) until granted
            play = asyncio.ensure_future(_all(runner.groups([("g0", {}), ("g1", {})])))
            await eventually(lambda: runner.counters.started == 8 and runner._starts.calls >= 2, timeout=60)
            assert not play.done()
            await client.grant_capacity(2)
            groups = await play
            await runner.aclose()
            assert [len(g.ok) for g in groups] == [4, 4]
            metrics = await client.metrics()
            assert metrics["sessions_started"] == 8 and metrics["sessions"] == 0
            assert runner._starts.calls <= 8  # the first call started 6 of them


async def _all(it):
    return [g async for g in it]


async def test_through_a_cluster_router_finish_is_routed_and_starts_are_not_batched(tokenizer, stop_ids):
    from rlgate.cluster.keys import session_id_replica
    from test_cluster_router import Deployment

    class Agent:
        async def run(self, data, *, base_url, api_key, http_client=None):
            ids = await two_turns(base_url, api_key)
            return {ids[1]: 1.0}

    d = Deployment(tokenizer, stop_ids)
    try:
        async with GatewayClient(d.url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, Agent(), group_size=6)
            group = await runner.group("g", {})
            await runner.aclose()
        assert [e.error for e in group.episodes] == [None] * 6
        assert runner._starts.direct is False and runner._starts.calls == 0
        assert len({session_id_replica(e.session_id) for e in group.episodes}) > 1  # spread by the router
        assert all(e.samples[-1].reward == 1.0 for e in group.episodes)
    finally:
        d.stop()


async def test_start_sessions_is_durable_or_starts_nothing(make_app, asgi_client):
    store = GatedStore()
    app = make_app(store=store, capacity_mode="granted")
    sessions = app.state.gateway.sessions
    async with asgi_client(app) as c:
        store.gate.set()
        assert (await c.post("/grant_capacity", json={"count": 2}, headers=admin_headers())).status_code == 200
        store.gate.clear()
        body = {"sessions": [{"task_id": "a"}, {"task_id": "b"}]}
        answer = asyncio.ensure_future(c.post("/rl/start_sessions", json=body, headers=admin_headers()))
        await eventually(lambda: store.waiting or answer.done(), timeout=60)
        assert [store.saved[s] for s in store.waiting] == ["session a-0", "meta capacity", "session b-0",
                                                          "meta capacity"]
        assert not answer.done()  # held until both are durable
        store.fail = True
        store.gate.set()
        r = await asyncio.wait_for(answer, 30)
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert not sessions.sessions and sessions.capacity == 2  # neither was started
        store.fail = False
        r = await c.post("/rl/start_sessions", json=body, headers=admin_headers())
        assert r.status_code == 200 and [x["session_id"] for x in r.json()["sessions"]] == ["a-0", "b-0"]


async def test_a_lone_start_is_a_plain_start_session(gateway):
    class Agent:
        async def run(self, data, *, base_url, api_key, http_client=None):
            await two_turns(base_url, api_key)
            return 1.0

    async with GatewayClient(gateway, ADMIN_KEY) as client:
        runner = RolloutRunner(client, Agent(), group_size=2)
        (ep,) = (await runner.group("g", {}, admit=False)).episodes[:1]
        assert ep.ok
        # two episodes started together: one batch (and the one /health asking whether it is a router)
        assert runner._starts.calls == 1 and runner._starts.direct is True
        single = RolloutRunner(client, Agent(), group_size=1)  # e.g. verl's agent loop: a runner per episode
        assert (await single.group("g", {})).episodes[0].ok
        assert single._starts.calls == 0 and single._starts.direct is None  # no batch, no /health
        await runner.aclose()
        await single.aclose()


async def test_a_start_cancelled_on_the_wire_leaves_no_session(make_app, tokenizer):
    """An episode cancelled while its batch start is answered: its session is finished at once."""
    from rlgate.rollout.starts import BatchedStarts

    store = GatedStore()
    store.gate.set()
    app = make_app(store=store)
    sessions = app.state.gateway.sessions
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        client = GatewayClient("http://gateway", ADMIN_KEY, http_client=http)
        starts = BatchedStarts(client)
        store.gate.clear()  # the batch's answer waits until its sessions are durable
        kept = asyncio.ensure_future(starts.start("kept"))
        dropped = asyncio.ensure_future(starts.start("dropped"))
        await eventually(lambda: len(store.waiting) == 2, timeout=60)  # both sessions written, unanswered
        assert starts.calls == 1 and starts.direct is True
        dropped.cancel()
        store.gate.set()
        assert (await kept).session_id == "kept-0"
        with pytest.raises(asyncio.CancelledError):
            await dropped
        await eventually(lambda: list(sessions.sessions) == ["kept-0"], timeout=60)  # finished and dropped
        await starts.aclose()
