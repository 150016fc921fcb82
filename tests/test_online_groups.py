"""Live GRPO groups: k-1 extra replies off the user's path, scored together, bounded in cost."""

from __future__ import annotations

import asyncio
import random

from rlgate.config import OnlineConfig
from rlgate.engine.base import SamplingParams
from rlgate.engine.fake import FakeEngine
from rlgate.online.groups import LiveGroup, LiveGroups, TokenBudget, scorer_of
from rlgate.trajectory.interaction import Interaction
from rlgate.trajectory.reward import FinishedEpisode


def _interaction(tokenizer) -> Interaction:
    i = Interaction(id="chatcmpl-1", session_id="conv-1", api="chat", messages=[], tools=[],
                    prompt_ids=tokenizer.encode("hello there"))
    i.output_ids, i.output_logprobs, i.output_versions = [5, 6], [-0.5, -0.25], [0, 0]
    i.finish_reason, i.status = "stop", "completed"
    i.sampling = {"temperature": 1.0}
    return i


def test_token_budget_refills_per_minute() -> None:
    now = [0.0]
    b = TokenBudget(60, clock=lambda: now[0])
    assert b.take(60) and not b.take(1)
    now[0] = 10.0  # 10 s: 10 tokens back
    assert b.take(10) and not b.take(1)
    b.give_back(5)
    assert b.take(5)
    now[0] = 1e6
    assert b.take(60) and not b.take(1)  # at most one minute is banked


def test_a_live_group_is_k_scored_replies_to_the_same_prompt(tokenizer) -> None:
    async def main() -> list[LiveGroup]:
        engine = FakeEngine(tokenizer, output_tokens=4)
        got: list[LiveGroup] = []

        def shorter(episode: FinishedEpisode) -> float:  # the episode form: applied to each reply
            assert len(episode.samples) == 1 and episode.data == {"messages": episode.samples[0].messages}
            assert episode.final_text == episode.samples[0].output_text
            return -float(episode.samples[0].generated_tokens)

        groups = LiveGroups(OnlineConfig(group_fraction=1.0, group_size=4, reward_low=-10.0), engine,
                            scorer_of(shorter), got.append, decode=tokenizer.decode)
        inter = _interaction(tokenizer)
        assert groups.offer(inter, SamplingParams(max_new_tokens=4), "conv-1", "tn-1")
        while groups.in_flight:
            await asyncio.sleep(0.01)
        assert len(engine.requests) == 3  # k - 1 extras, nothing else
        assert all(r.input_ids == inter.prompt_ids and r.session_id == "conv-1" for r in engine.requests)
        assert len({r.sampling.seed for r in engine.requests}) == 3  # each its own seed
        assert groups.counts["completed"] == 1 and groups.extra_tokens == 12
        return got

    (group,) = asyncio.run(main())
    assert group.conversation == "conv-1" and group.tenant == "tn-1" and len(group.samples) == 4
    user, *extras = group.samples
    assert user.id == "chatcmpl-1" and user.reward == -2.0  # the user's own reply is in the group
    assert all(s.reward == -4.0 and s.generated_tokens == 4 for s in extras)
    assert {s.group_id for s in group.samples} == {group.group_id} and [s.episode for s in group.samples] == [0, 1, 2, 3]
    assert all(s.output_message and s.output_message["content"] for s in extras)


def test_groups_are_shed_under_load_and_over_budget(tokenizer) -> None:
    async def main() -> LiveGroups:
        waiting = [3]
        groups = LiveGroups(OnlineConfig(group_fraction=1.0, group_size=3, group_tokens_per_minute=20,
                                          group_shed_waiting=0), FakeEngine(tokenizer, output_tokens=2),
                            scorer_of(lambda s: 1.0), lambda g: None, decode=tokenizer.decode,
                            waiting=lambda: waiting[0], rng=random.Random(0))
        inter = _interaction(tokenizer)
        assert not groups.offer(inter, SamplingParams(max_new_tokens=8), "c")  # engine queue not empty
        waiting[0] = 0
        assert groups.offer(inter, SamplingParams(max_new_tokens=8), "c")  # 2 x 8 = 16 of 20 tokens
        assert not groups.offer(inter, SamplingParams(max_new_tokens=8), "c")  # 16 more do not fit
        while groups.in_flight:
            await asyncio.sleep(0.01)
        # the group used 2 x 2 tokens of the 16 it reserved: the rest came back
        assert groups.budget.tokens >= 15
        return groups

    groups = asyncio.run(main())
    assert groups.counts["shed_load"] == 1 and groups.counts["skipped_budget"] == 1
    assert groups.counts["started"] == groups.counts["completed"] == 1


def test_a_failing_scorer_costs_the_user_nothing(tokenizer) -> None:
    async def main() -> LiveGroups:
        def broken(episode: FinishedEpisode) -> float:
            raise RuntimeError("judge down")

        got: list[LiveGroup] = []
        groups = LiveGroups(OnlineConfig(group_fraction=1.0), FakeEngine(tokenizer, output_tokens=2),
                            scorer_of(broken), got.append, decode=tokenizer.decode)
        assert groups.offer(_interaction(tokenizer), SamplingParams(max_new_tokens=2), "c")
        while groups.in_flight:
            await asyncio.sleep(0.01)
        assert not got
        return groups

    assert asyncio.run(main()).counts["failed"] == 1


def test_fraction_zero_or_an_aborted_reply_never_starts_a_group(tokenizer) -> None:
    async def main() -> None:
        engine = FakeEngine(tokenizer)
        off = LiveGroups(OnlineConfig(group_fraction=0.0), engine, scorer_of(lambda s: 0.0), lambda g: None,
                         decode=tokenizer.decode)
        assert not off.offer(_interaction(tokenizer), SamplingParams(), "c")
        on = LiveGroups(OnlineConfig(group_fraction=1.0), engine, scorer_of(lambda s: 0.0), lambda g: None,
                        decode=tokenizer.decode)
        aborted = _interaction(tokenizer)
        aborted.finish_reason = "abort"
        assert not on.offer(aborted, SamplingParams(), "c")
        assert not engine.requests

    asyncio.run(main())


def test_a_judge_scores_the_group_side_by_side(tokenizer) -> None:
    """The real Judge (rewards/judge.py) behind a mock endpoint: one request for the whole group."""
    import json

    import httpx

    from rlgate.rewards.judge import Judge

    seen: list[dict] = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"choices": [{"message": {"content": '{"scores": [0.1, 0.9, 0.5]}'}}]})

    async def main() -> list[LiveGroup]:
        judge = Judge("http://judge.invalid/v1", rubric="shorter is better")
        judge._http = httpx.AsyncClient(transport=httpx.MockTransport(endpoint))
        got: list[LiveGroup] = []
        groups = LiveGroups(OnlineConfig(group_fraction=1.0, group_size=3), FakeEngine(tokenizer, output_tokens=2),
                            scorer_of(judge), got.append, decode=tokenizer.decode)
        inter = _interaction(tokenizer)
        inter.messages = []
        assert groups.offer(inter, SamplingParams(max_new_tokens=2), "c")
        while groups.in_flight:
            await asyncio.sleep(0.01)
        await judge.aclose()
        return got

    (group,) = asyncio.run(main())
    assert [s.reward for s in group.samples] == [0.1, 0.9, 0.5]
    assert len(seen) == 1 and "3 attempts" in seen[0]["messages"][0]["content"]
    assert "Trajectory 3" in seen[0]["messages"][1]["content"]
