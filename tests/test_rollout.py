"""Rollout runner: groups, rewards, failing / hanging agents, subprocess mode."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from helpers import ADMIN_KEY, eventually
from rlgate.client import GatewayClient
from rlgate.engine.fake import FakeEngine
from rlgate.rollout.agent import check_result
from rlgate.rollout.errors import AgentContractError
from rlgate.rollout.runner import Allowance, RolloutRunner
from rlgate.server.runner import ServerThread


class ChatAgent:
    """Asks one question with the OpenAI SDK; reward = 1 if the reply mentions the answer."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oai:
            r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": data["q"]}],
                                                  max_tokens=8)
        return 1.0 if data["a"] in (r.choices[0].message.content or "") else 0.0


class TwoTurnAgent:
    """Two calls; returns a dict rewarding both interactions."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oai:
            msgs = [{"role": "user", "content": "one"}]
            r1 = await oai.chat.completions.create(model="m", messages=msgs)
            msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "two"}]
            r2 = await oai.chat.completions.create(model="m", messages=msgs)
        return {r1.id: 0.5, r2.id: 2.0}


class FlakyAgent:
    """Raises for index 1, hangs for index 2, otherwise behaves.

    The agents that behave share one SDK client (``with_options`` per session key): building
    an ``AsyncOpenAI`` per episode takes seconds on a loaded machine, which would eat the
    episode timeout this test gives only to the hanging agents.
    """

    def __init__(self, oai):
        self.calls = 0
        self.oai = oai

    async def run(self, data, *, base_url, api_key, http_client=None):
        self.calls += 1
        n = self.calls
        if n % 4 == 2:
            raise RuntimeError("tool crashed")
        if n % 4 == 3:
            await asyncio.Event().wait()  # hangs until the runner cancels it
        r = await self.oai.with_options(api_key=api_key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": data["q"]}], max_tokens=8)
        return 1.0 if data["a"] in (r.choices[0].message.content or "") else 0.0


def test_check_result():
    assert check_result(1) == 1.0 and check_result({"a": 1}) == {"a": 1.0}
    for bad in (None, "1", True, {"a": "x"}, float("nan"), float("inf"), {"a": float("-inf")}, {"a": True}):
        with pytest.raises(AgentContractError):
            check_result(bad)
    assert check_result(0.5, (0.0, 1.0)) == 0.5
    with pytest.raises(AgentContractError, match="outside reward_range"):
        check_result(1.5, (0.0, 1.0))


async def test_groups_rewards_and_exports(make_app, tokenizer):
    engine = FakeEngine(tokenizer, script=lambda req: "the answer is 7" if len(engine.requests) % 2 else "no idea")
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, ChatAgent(), group_size=4, concurrency=8)
            groups = [g async for g in runner.groups([("g0", {"q": "?", "a": "7"}), ("g1", {"q": "?", "a": "7"})])]
    assert sorted(g.group_id for g in groups) == ["g0", "g1"]
    for g in groups:
        assert len(g.ok) == 4
        for e in g.episodes:
            (s,) = e.samples
            assert s.reward == e.reward and e.reward in (0.0, 1.0)
            assert s.generated_tokens > 0
            assert (s.group_id, s.episode, s.task_id) == (g.group_id, e.index, g.group_id)
            assert s.session_id == e.session_id
    rewards = sorted(e.reward for g in groups for e in g.episodes)
    assert rewards == [0.0] * 4 + [1.0] * 4
    assert runner.counters.completed == 8 and runner.counters.failed == 0


async def test_dict_rewards_per_interaction(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, TwoTurnAgent(), group_size=1, export_style="individual")
            (ep,) = (await runner.group("g", {})).episodes
    assert ep.ok and ep.reward == 2.5
    # discount 1.0 along the chain: the first turn gets 0.5 + 2.0
    assert [s.reward for s in ep.samples] == [2.5, 2.0]


@pytest.mark.slow  # the hanging agents are cut by a 15 s episode timeout (generous for a loaded machine)
async def test_failing_and_hanging_agents_lose_only_their_episode(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer, script=lambda r: "7"))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            from openai import AsyncOpenAI

            async with AsyncOpenAI(base_url=client.base_url, api_key="none", max_retries=0) as oai:
                # the timeout is for the hanging agents; the others must never meet it, even on a
                # machine under load (5 s was met once beside a Ray test run)
                runner = RolloutRunner(client, FlakyAgent(oai), group_size=4, concurrency=8, episode_timeout=15.0)
                groups = [g async for g in runner.groups([("a", {"q": "?", "a": "7"}),
                                                          ("b", {"q": "?", "a": "7"})])]
            metrics = await client.metrics()
    assert runner.counters.failed == 4 and runner.counters.timed_out == 2 and runner.counters.completed == 4
    for g in groups:
        assert len(g.ok) == 2
        for e in g.episodes:
            if not e.ok:
                assert e.samples == [] and e.error
    # the failed episodes' sessions were ended and discarded, not left open
    assert metrics["open_sessions"] == 0


async def test_allowance_admits_only_granted_episodes(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer), capacity_mode="granted")) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            allowance = Allowance()
            runner = RolloutRunner(client, ChatAgent(), group_size=2, allowance=allowance)
            task = asyncio.create_task(runner.group("g", {"q": "?", "a": "x"}))
            await eventually(lambda: allowance.waiting == 2, what="both episodes waiting for an admission")
            assert runner.counters.started == 0 and not task.done()
            await client.grant_capacity(2)
            await allowance.grant(2)
            group = await task
    assert len(group.ok) == 2


class EnvAgent:
    """A blocking agent for subprocess mode: builds SDK clients from the environment only."""

    def run(self, data, *, base_url, api_key, http_client=None):
        import os

        from openai import OpenAI

        assert os.environ["OPENAI_BASE_URL"] == base_url.rstrip("/") + "/v1"
        assert os.environ["ANTHROPIC_BASE_URL"] == base_url and os.environ["ANTHROPIC_API_KEY"] == api_key
        client = OpenAI(max_retries=0)  # everything from OPENAI_BASE_URL / OPENAI_API_KEY
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return float(len(r.choices[0].message.content or "") > 0)


@pytest.mark.slow
async def test_subprocess_mode_sets_the_environment(make_app, tokenizer):
    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, EnvAgent(), group_size=2, mode="subprocess", episode_timeout=60)
            group = await runner.group("g", {})
    assert [e.ok for e in group.episodes] == [True, True], [e.error for e in group.episodes]
    assert [e.reward for e in group.episodes] == [1.0, 1.0]


class WaitingAgent:
    """Subprocess agent: one call, then waits until the test creates ``release`` in ``data["dir"]``
    (or hangs for good, or dies without reporting)."""

    def run(self, data, *, base_url, api_key, http_client=None):
        import os
        import pathlib
        import time
        import uuid

        from openai import OpenAI

        if data.get("die"):
            os._exit(3)
        OpenAI(max_retries=0).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        folder = pathlib.Path(data["dir"])
        (folder / f"{data['name']}-{uuid.uuid4().hex}").touch()
        while data.get("hang") or not (folder / "release").exists():
            time.sleep(0.05)
        return 1.0


@pytest.mark.slow
async def test_subprocess_waits_scale_past_the_thread_pool_and_timeouts_kill(make_app, tokenizer, tmp_path):
    """More waiting subprocess episodes than the default thread pool has workers (min(32,
    cpus+4)): none may time out spuriously; a hung one is killed by its timeout while the
    others still wait; a dead one is reported."""
    data = {"dir": str(tmp_path)}
    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            def runner(timeout: float, n: int = 1) -> RolloutRunner:
                return RolloutRunner(client, WaitingAgent(), group_size=n, concurrency=16, mode="subprocess",
                                     episode_timeout=timeout)

            ok = asyncio.create_task(runner(3600, 12).group("ok", {**data, "name": "ok"}))
            hung = await runner(2).group("hung", {**data, "name": "hung", "hang": True})
            dead = await runner(3600).group("dead", {**data, "name": "dead", "die": True})
            assert not ok.done()  # the hung episode was killed while the others still waited
            await eventually(lambda: len(list(tmp_path.glob("ok-*"))) == 12, timeout=600,
                             what="the 12 episodes waiting at once")
            (tmp_path / "release").touch()
            ok = await ok
            metrics = await client.metrics()
    assert [e.ok for e in ok.episodes] == [True] * 12, [e.error for e in ok.episodes]
    assert not hung.episodes[0].ok and "timed out" in hung.episodes[0].error
    assert not dead.episodes[0].ok and "exit code 3" in dead.episodes[0].error
    assert metrics["open_sessions"] == 0


async def test_any_episode_error_loses_only_that_episode(make_app, tokenizer):
    """Not only agent errors: an agent factory that raises is one failed episode too."""
    calls = {"n": 0}

    def factory(group_id, data):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyError("no agent for this prompt")
        return ChatAgent()

    with ServerThread(make_app(FakeEngine(tokenizer, script=lambda r: "7"))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, factory, group_size=3, concurrency=1)
            group = await runner.group("g", {"q": "?", "a": "7"})
            metrics = await client.metrics()
    assert [e.ok for e in group.episodes].count(False) == 1
    failed = next(e for e in group.episodes if not e.ok)
    assert "KeyError" in failed.error and runner.counters.failed == 1
    assert metrics["open_sessions"] == 0


class NoCallAgent:
    """Returns a reward without calling the gateway (a classic mistake: the agent's own client)."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        return 1.0


async def test_episode_order_with_and_without_a_collector(make_app, tokenizer):
    """Without a collector the runner ends the session, then rewards it (admin key) and exports it;
    with one (cluster/collector.py) the export is taken the moment the session ends, so rewards come
    first. Both: the same rewards and typed samples, and an episode without an LLM call fails clearly."""
    from rlgate.cluster.collector import Collector
    from rlgate.cluster.directory import ReplicaTable, StaticDirectory

    def factory(group_id, data):
        return {"chat": ChatAgent(), "two": TwoTurnAgent(), "none": NoCallAgent()}[data["kind"]]

    items = [("chat", {"kind": "chat", "q": "?", "a": "7"}), ("two", {"kind": "two"}), ("none", {"kind": "none"})]
    with ServerThread(make_app(FakeEngine(tokenizer, script=lambda r: "7"))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            directory = StaticDirectory([url], ADMIN_KEY)
            table = ReplicaTable(directory, interval=0.2)
            await table.start()
            try:
                # (first: a collector takes every finished session of the gateways it polls)
                plain = RolloutRunner(client, factory, group_size=2)
                results = {"plain": {g.group_id: g async for g in plain.groups(items)}}
                async with Collector(table, ADMIN_KEY, maxsize=4, poll_wait=0.5) as collector:
                    collected = RolloutRunner(client, factory, group_size=2, collector=collector)
                    results["collector"] = {g.group_id: g async for g in collected.groups(items)}
                    assert collector.queue.qsize() == 0  # every export went to the episode that waited for it
                metrics = await client.metrics()
            finally:
                await table.stop()
                await directory.aclose()
    for name, groups in results.items():
        for e in groups["chat"].episodes:
            assert e.ok and e.reward == 1.0, (name, e.error)
            (s,) = e.samples
            assert s.reward == 1.0 and (s.group_id, s.episode) == ("chat", e.index)
        for e in groups["two"].episodes:
            assert e.ok and [s.reward for s in e.samples] == [2.5, 2.0], name
            assert {(s.group_id, s.episode) for s in e.samples} == {("two", e.index)}
        for e in groups["none"].episodes:
            assert not e.ok and e.samples == [] and "made no LLM call through the gateway" in e.error, (name, e.error)
    assert plain.counters.failed == collected.counters.failed == 2
    assert metrics["open_sessions"] == 0


async def test_a_reward_function_does_not_combine_with_a_collector():
    # The collector takes the export when the session ends; a reward function scores the ended
    # episode, so its rewards would come too late: refused when the runner is built.
    async with GatewayClient("http://127.0.0.1:9", ADMIN_KEY) as client:
        with pytest.raises(ValueError, match="reward function"):
            RolloutRunner(client, NoCallAgent(), reward_fn=lambda episode: 1.0, collector=object())



def test_groups_failing_together_leave_no_exception_unretrieved(make_app, tokenizer, caplog):
    """Groups that fail in the same loop iteration: groups() raises one failure and reads the
    others, so asyncio never logs "Task exception was never retrieved" (a second traceback after
    the run's own error; seen in CI as a flaky count of tracebacks)."""
    import gc

    from rlgate.rollout.errors import TooManyFailures

    async def scenario(url: str) -> bool:
        gate = asyncio.get_running_loop().create_future()

        class FailingTogether(RolloutRunner):
            async def group(self, group_id, data, *, admit=True):
                await gate  # every group finishes in the same iteration
                raise TooManyFailures(f"group {group_id} failed")

        async with GatewayClient(url, ADMIN_KEY) as client:
            it = FailingTogether(client, ChatAgent(), group_size=2).groups([("a", {}), ("b", {}), ("c", {})])
            first = asyncio.ensure_future(it.__anext__())
            await eventually(lambda: sum("FailingTogether" in repr(t) for t in asyncio.all_tasks()) >= 3)
            gate.set_result(None)
            try:
                await first
            except TooManyFailures:
                return True
            finally:
                await it.aclose()
        return False

    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        assert asyncio.run(scenario(url))  # its own loop: every task is gone once it returns
    gc.collect()  # an unread task exception is logged when its task is collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_the_failure_streak_is_reported_as_it_reached_the_limit(make_app, tokenizer):
    """Episodes failing together: the run stops with "N episodes failed in a row" for N the limit,
    decided at the failure that reached it, whatever failed while that one was being discarded
    (CI saw "5 episodes failed in a row (... = 4)")."""
    from rlgate.rollout.errors import TooManyFailures

    started: list[asyncio.Event] = []
    gate = asyncio.Event()

    class FailTogether:
        async def run(self, data, *, base_url, api_key, http_client=None):
            started.append(asyncio.Event())
            await gate.wait()
            raise RuntimeError("the tool server is down")

    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            await client.grant_capacity(16)
            runner = RolloutRunner(client, FailTogether(), group_size=6, concurrency=6, max_consecutive_failures=2)
            task = asyncio.ensure_future(runner.group("g", {}))
            await eventually(lambda: len(started) == 6)
            gate.set()  # all six fail in the same iteration, before any of them is discarded
            with pytest.raises(TooManyFailures) as err:
                await task
    assert str(err.value).startswith("2 episodes failed in a row (rollout.max_consecutive_failures = 2)")
    assert runner.counters.failed >= 2


class ReplyAgent:
    """One call; returns the reply's text (not a reward: a reward function scores the episode)."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oai:
            r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": data["q"]}],
                                                  max_tokens=8)
        return r.choices[0].message.content


class RankingReward:
    """Both forms, as the LLM judge has them: a group is ranked side by side (its longest reply 1, the others
    0); one episode alone gets 0.5."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.single = 0

    async def score_group(self, episodes):
        texts = [e.final_text for e in episodes]
        self.groups.append(texts)
        best = max(range(len(texts)), key=lambda i: len(texts[i]))
        return [1.0 if i == best else 0.0 for i in range(len(texts))]

    def __call__(self, episode):
        self.single += 1
        return 0.5


async def test_a_group_form_reward_scores_each_group_side_by_side(make_app, tokenizer):
    """The one reward protocol (trajectory/reward.py): in GRPO groups the group form ranks the group's episodes
    in one call; evaluation (one episode at a time) takes the episode form."""
    replies = itertools.cycle(["a", "bbbbbbbb", "cc", "ddd", "eeee", "fffff", "ggggggggggg", "hhhhhh"])  # lengths differ
    engine = FakeEngine(tokenizer, script=lambda req: next(replies))
    reward = RankingReward()
    with ServerThread(make_app(engine)) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, ReplyAgent(), group_size=4, concurrency=2, reward_fn=reward)
            groups = [g async for g in runner.groups([("g0", {"q": "?"}), ("g1", {"q": "?"})])]
            evaluated = await runner.evaluate([{"q": "?"}])
            metrics = await client.metrics()
    assert len(reward.groups) == 2 and all(len(texts) == 4 for texts in reward.groups)  # one call per group
    for g in groups:
        assert len(g.ok) == 4
        by_text = {e.samples[0].output_text: e.reward for e in g.episodes}
        longest = max(by_text, key=len)
        assert by_text[longest] == 1.0 and sorted(by_text.values()) == [0.0, 0.0, 0.0, 1.0]
        assert all(e.samples[0].reward == e.reward for e in g.episodes)  # the exported samples carry it
    assert [e.reward for e in evaluated] == [0.5] and reward.single == 1
    assert runner.counters.completed == 9 and runner.counters.failed == 0
    assert metrics["open_sessions"] == 0


async def test_a_group_form_reward_that_fails_loses_its_group_and_a_bad_value_stops_the_run(make_app, tokenizer):
    class Down:
        async def score_group(self, episodes):
            raise RuntimeError("judge down")

    class Wrong:
        def score_group(self, episodes):
            return [float("nan")] * len(episodes)

    with ServerThread(make_app(FakeEngine(tokenizer))) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, ReplyAgent(), group_size=3, reward_fn=Down())
            group = await runner.group("g", {"q": "?"})
            assert not group.ok and all("judge down" in (e.error or "") for e in group.episodes)
            assert runner.counters.failed == 3
            with pytest.raises(AgentContractError, match="reward function"):
                await RolloutRunner(client, ReplyAgent(), group_size=3, reward_fn=Wrong()).group("h", {"q": "?"})
            assert (await client.metrics())["open_sessions"] == 0  # every session ended and dropped
