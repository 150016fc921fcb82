"""Gateway replicas on a local Ray cluster behind the router, driven with the real SDKs.

One cluster of 3 replicas (fake engine, durable SQLite stores) serves every test here:

* hundreds of sessions x several turns through the router, every trajectory checked token for
  token, with a weight update in the middle of the run that no client may notice;
* a replica SIGKILLed in the middle of a run: only its live sessions fail (503 / 410 naming the
  reason), new sessions avoid it, Ray restarts it, and everything acknowledged is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx
import pytest
from openai import APIStatusError, AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, key_headers
from rlgate.cluster.engines import FakeEngineSpec
from rlgate.cluster.keys import session_id_replica
from rlgate.cluster.launch import Cluster
from rlgate.cluster.replica import ReplicaSpec
from rlgate.config import ClusterConfig, GatewayConfig
from rlgate.engine.fake import fake_logprob

pytestmark = pytest.mark.slow

REPLICAS = 3
OUTPUT_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(ray_local, tiny_model_dir, tmp_path_factory):
    spec = ReplicaSpec(model=str(tiny_model_dir), config=GatewayConfig(admin_key=ADMIN_KEY),
                       engine=FakeEngineSpec(output_tokens=OUTPUT_TOKENS, token_delay=0.002),
                       data_dir=str(tmp_path_factory.mktemp("cluster-data")), store_sync="normal")
    c = Cluster(spec, ClusterConfig(replicas=REPLICAS, replica_num_cpus=1, refresh_interval=0.2,
                                    namespace="rlgate-tests"))
    c.start()
    c.url = c.start_router()
    try:
        yield c
    finally:
        c.stop()


@dataclass
class Conversation:
    session_id: str
    key: str
    replies: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def converse(oai: AsyncOpenAI, conv: Conversation, turns: int, *, stream: bool) -> None:
    messages = [{"role": "system", "content": "be brief"}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"turn {t} of {conv.session_id}"})
        try:
            if stream:
                s = await oai.chat.completions.create(model="m", messages=messages, stream=True,
                                                      extra_headers=key_headers(conv.key))
                parts, finish = [], None
                async for ch in s:
                    if ch.choices:
                        parts.append(ch.choices[0].delta.content or "")
                        finish = ch.choices[0].finish_reason or finish
                text = "".join(parts)
            else:
                r = await oai.chat.completions.create(model="m", messages=messages,
                                                      extra_headers=key_headers(conv.key))
                text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        except APIStatusError as exc:
            conv.errors.append(f"{exc.status_code}: {exc.body}")
            return
        if finish != "stop":
            conv.errors.append(f"finish_reason {finish}")
            return
        conv.replies.append(text)
        messages.append({"role": "assistant", "content": text})


def check_trajectory(export: dict, conv: Conversation, tokenizer, stop_ids, versions_seen: set[int]) -> int:
    """Token for token: each turn extends the previous one exactly, the generated tokens are what the
    client was sent (+ the stop token), logprobs are the engine's; returns turns with two versions."""
    samples = export["interactions"]
    assert len(samples) == len(conv.replies)
    mixed = 0
    previous: list[int] = []
    for s, reply in zip(samples, conv.replies, strict=True):
        ids, mask = s["input_ids"], s["loss_mask"]
        assert ids[: len(previous)] == previous, "a turn does not extend the previous turn token for token"
        out = [t for t, m in zip(ids, mask, strict=True) if m]
        assert out[-1] in stop_ids and s["output_message"]["content"] == reply
        assert tokenizer.decode(out[:-1]).strip() == reply  # the reply, less the leading space the gateway trims
        lps = [lp for lp, m in zip(s["logprobs"], mask, strict=True) if m]
        assert lps == pytest.approx([fake_logprob(t, i) for i, t in enumerate(out)])
        vers = [v for v, m in zip(s["versions"], mask, strict=True) if m]
        assert vers == sorted(vers), "versions go back in time inside one reply"
        versions_seen.update(vers)
        mixed += len(set(vers)) > 1
        assert s["finish_reason"] == "stop"
        previous = ids
    return mixed


async def test_hundreds_of_sessions_and_a_weight_update_no_client_notices(cluster, tokenizer, stop_ids,
                                                                          tiny_model_dir):
    sessions, turns, concurrency = 240, 3, 24
    start_version = cluster.info_of(0)["version"]
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    import httpx2  # what the OpenAI SDK is built on

    async with httpx.AsyncClient(base_url=cluster.url, timeout=60, limits=limits) as admin, \
            httpx2.AsyncClient(timeout=60) as sdk_http:
        oai = AsyncOpenAI(base_url=cluster.url + "/v1", api_key="per-request", max_retries=0, http_client=sdk_http)
        convs: list[Conversation] = []
        gate = asyncio.Semaphore(concurrency)
        update_at = sessions // 3
        updated = asyncio.Event()

        async def episode(i: int) -> None:
            async with gate:
                r = await admin.post("/rl/start_session", json={"task_id": f"q{i % 40}"}, headers=admin_headers())
                assert r.status_code == 200, r.text
                conv = Conversation(r.json()["session_id"], r.json()["api_key"])
                convs.append(conv)
                await converse(oai, conv, turns, stream=i % 2 == 0)
                r = await admin.post("/rl/set_reward", json={"reward": float(i % 2)}, headers=key_headers(conv.key))
                assert r.status_code == 200, r.text
                r = await admin.post("/rl/end_session", headers=key_headers(conv.key))
                assert r.status_code == 200, r.text

        async def update_in_the_middle() -> int:
            while len(convs) < update_at:
                await asyncio.sleep(0.01)
            version = await asyncio.to_thread(cluster.update_weights, str(tiny_model_dir))
            updated.set()
            return version

        t0 = time.perf_counter()
        results = await asyncio.gather(update_in_the_middle(), *(episode(i) for i in range(sessions)))
        elapsed = time.perf_counter() - t0
        new_version = results[0]
        assert new_version == start_version + 1
        errors = [e for c in convs for e in c.errors]
        assert errors == [], f"{len(errors)} client-visible errors, e.g. {errors[:3]}"
        assert len(convs) == sessions and all(len(c.replies) == turns for c in convs)
        assert {session_id_replica(c.session_id) for c in convs} == set(range(REPLICAS))
        assert [i["version"] for i in cluster.info()] == [new_version] * REPLICAS

        versions_seen: set[int] = set()
        mixed = 0
        for conv in convs:
            r = await admin.post("/export_trajectories", json={"session_id": conv.session_id},
                                 headers=admin_headers())
            assert r.status_code == 200, r.text
            mixed += check_trajectory(r.json(), conv, tokenizer, stop_ids, versions_seen)
        assert versions_seen == {start_version, new_version}
        health = (await admin.get("/health", headers=admin_headers())).json()
        assert health["status"] == "ok" and health["version"] == new_version
        print(f"\n{sessions} sessions x {turns} turns in {elapsed:.1f} s; {mixed} turns straddled the update")


async def test_a_killed_replica_fails_only_its_live_sessions_and_comes_back(cluster, tokenizer, stop_ids):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as c:
        async def start(task: str) -> tuple[str, str]:
            r = await c.post("/rl/start_session", json={"task_id": task}, headers=admin_headers())
            assert r.status_code == 200, r.text
            return r.json()["session_id"], r.json()["api_key"]

        async def turn(key: str, text: str) -> httpx.Response:
            return await c.post("/v1/chat/completions", headers=key_headers(key), json={
                "model": "m", "messages": [{"role": "user", "content": text}]})

        sessions = [await start(f"k{i}") for i in range(36)]
        for sid, key in sessions:
            assert (await turn(key, sid)).status_code == 200
        victim = 1
        on_victim = [s for s in sessions if session_id_replica(s[0]) == victim]
        assert len(on_victim) >= 3
        # acknowledged before the kill: half the victim's sessions rewarded and ended
        finished, live = on_victim[: len(on_victim) // 2], on_victim[len(on_victim) // 2:]
        for _, key in finished:
            assert (await c.post("/rl/set_reward", json={"reward": 0.5}, headers=key_headers(key))).status_code == 200
            assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        old_pid = cluster.info_of(victim)["pid"]
        cluster.kill_replica(victim)

        # its live sessions fail with the reason (503 while it is down, 410 once it is back)
        for _, key in live:
            r = await turn(key, "after the kill")
            assert r.status_code in (503, 410), r.text
            assert r.json()["error"]["code"] in ("replica_unavailable", "session_interrupted")
        # every other session goes on
        for sid, key in sessions:
            if session_id_replica(sid) != victim:
                assert (await turn(key, "still here")).status_code == 200
        # new sessions avoid it while it is down
        down_seen = cluster.router.table.replicas[victim].state == "down"
        if down_seen:
            fresh = [await start(f"n{i}") for i in range(8)]
            assert victim not in {session_id_replica(s) for s, _ in fresh}

        # Ray restarts it (a fresh worker process: minutes on a busy 2-core machine); it serves its
        # stored sessions again
        deadline = time.monotonic() + 600
        while True:
            with contextlib.suppress(Exception):  # still restarting
                info = cluster.info_of(victim)
                if info["state"] == "healthy" and info["pid"] != old_pid:
                    break
            assert time.monotonic() < deadline, "the replica did not come back"
            await asyncio.sleep(0.2)
        await cluster.router.table.refresh()
        assert cluster.router.table.replicas[victim].state == "healthy"
        assert info["version"] == cluster.info_of(0)["version"]  # came back at the cluster's weights
        for sid, _ in finished:  # nothing acknowledged is lost
            r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "ended" and r.json()["interactions"][-1]["reward"] == 0.5
        for sid, key in live:
            r = await turn(key, "after the restart")
            assert r.status_code == 410 and r.json()["error"]["code"] == "session_interrupted"
            r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
            assert r.status_code == 200 and r.json()["status"] == "interrupted"
        # and it takes new sessions again
        fresh = [await start(f"m{i}") for i in range(24)]
        assert victim in {session_id_replica(s) for s, _ in fresh}


# --------------------------------------------------------------------------- rollout on Ray, collection


class ChattyAgent:
    """Two turns with the OpenAI SDK; reward 1. Runs inside a Ray worker."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        import os

        from openai import AsyncOpenAI

        oai = AsyncOpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY come from the environment
        assert oai.base_url.host == "127.0.0.1" and api_key == os.environ["OPENAI_API_KEY"]
        messages = [{"role": "user", "content": data["question"]}]
        r = await oai.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "and?"}]
        await oai.chat.completions.create(model="m", messages=messages)
        await oai.close()
        return 1.0


class HangingAgent:
    def __init__(self, pid_dir: str) -> None:
        self.pid_dir = pid_dir

    def run(self, data, *, base_url, api_key, http_client=None):
        import os
        import pathlib

        pathlib.Path(self.pid_dir, str(os.getpid())).touch()
        time.sleep(3600)


@pytest.fixture
def picklable_here(ray_local):
    import sys

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the agents above travel by value
    yield
    ray_local.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


async def test_rollout_on_ray_with_the_collector(cluster, picklable_here, tmp_path):
    import os

    from rlgate.client import GatewayClient
    from rlgate.cluster.collector import Collector
    from rlgate.cluster.directory import ReplicaTable
    from rlgate.cluster.launch import RayDirectory
    from rlgate.rollout.runner import RolloutRunner

    table = ReplicaTable(RayDirectory(cluster.actors), interval=0.2)
    await table.start()
    client = GatewayClient(cluster.url, ADMIN_KEY)
    try:
        async with Collector(table, ADMIN_KEY, maxsize=8) as collector:
            runner = RolloutRunner(client, ChattyAgent(), group_size=3, mode="ray", episode_timeout=600,
                                   ray_options={"num_cpus": 1}, collector=collector)
            groups = [g async for g in runner.groups((f"g{i}", {"question": f"q{i}"}) for i in range(3))]
            episodes = [e for g in groups for e in g.episodes]
            assert [e.error for e in episodes] == [None] * 9 and all(e.ok for e in episodes)
            assert all(len(e.samples) == 2 and e.samples[-1].reward == 1.0 for e in episodes)
            assert collector.queue.qsize() == 0  # every export went to the episode that waited for it

            # a hung agent: its Ray worker is killed at the timeout
            hung = RolloutRunner(client, HangingAgent(str(tmp_path)), group_size=1, mode="ray", episode_timeout=5,
                                 collector=collector)
            t0 = time.perf_counter()
            ep = await hung.episode("hung", 0, {"question": "q"})
            assert not ep.ok and "Ray worker killed" in (ep.error or "") and hung.counters.timed_out == 1
            assert time.perf_counter() - t0 < 60
            pids = [int(p.name) for p in tmp_path.iterdir()]
            assert len(pids) == 1
            deadline = time.monotonic() + 60
            while _alive(pids[0]):
                assert time.monotonic() < deadline, "the hung worker was not killed"
                await asyncio.sleep(0.1)

            # agents that end their own sessions: the trainer drains them all, with backpressure
            sessions = [await client.start_session(f"ext{i}") for i in range(14)]
            for s in sessions:
                oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key, max_retries=0)
                await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                await s.set_reward(0.25)
                await s.end()
            deadline = time.monotonic() + 60
            while collector.queue.qsize() < collector.queue.maxsize:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert collector.queue.qsize() == 8  # bounded: the rest wait on the replicas
            got = []
            async for export in collector:
                got.append(export)
                if len(got) == 14:
                    break
            assert sorted(e["session_id"] for e in got) == sorted(s.session_id for s in sessions), [e["session_id"] for e in got]
            assert all(e["interactions"][0]["reward"] == 0.25 and e["status"] == "ended" for e in got)
            assert os.getpid()  # (the driver stays alive throughout)
    finally:
        await table.stop()
        await client.aclose()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
