"""Reward hacking is watched, not only counted (issue 36, failure 7): the guards see empty, repetitive,
degenerate and off-distribution replies, entropy collapse and a held-out check falling while the reward
rises; a firing guard can pause promotion (or roll back); the canary can hold a fixed quality floor."""

from __future__ import annotations

import itertools
import random

from helpers import admin_headers, eventually
from online_helpers import new_tenant, wired
from rlgate.config import OnlineConfig
from rlgate.online.canary import Canary
from rlgate.online.hacking import HackingGuards, flags_of

NORMAL = ["Paris is the capital of France.", "Sorting a list in Python uses sorted or list.sort.",
          "A good book is Middlemarch by George Eliot.", "Recursion is a function calling itself.",
          "Hamlet avenges his father and dies.", "It is nine in the morning in Tokyo.",
          "Hello! How can I help you today?", "Here is a joke about a cat and a piano."]
GIBBERISH = ["worldertoo thereMotherort fatherThere", "theyrother thereon brotherthe", "gatherthe otherworldthe"]


def test_the_signs_of_one_reply() -> None:
    vocab = {w for t in NORMAL for w in t.lower().replace(".", " ").replace("!", " ").replace("?", " ").split()}
    ids = list(range(12))
    assert flags_of("", [], [], 1.0, vocab).empty
    assert flags_of("the the the the the the the the", [5] * 8, [-0.1] * 8, 1.0, vocab).repetitive
    assert not flags_of(NORMAL[0], ids, [-1.0] * 12, 1.0, vocab).repetitive
    assert flags_of("!!! ?? ...", [1, 2, 3], [-1.0] * 3, 1.0, vocab).degenerate
    assert flags_of("caf\ufffd", [1], [-1.0], 1.0, vocab).degenerate
    assert flags_of(GIBBERISH[0], ids, [-1.0] * 12, 1.0, vocab).off_distribution
    assert not flags_of(NORMAL[3], ids, [-1.0] * 12, 1.0, vocab).off_distribution
    assert flags_of(NORMAL[3], ids, [-2.0] * 12, 1.0, vocab).surprisal == 2.0
    assert flags_of(NORMAL[3], ids, [-2.0] * 12, 0.0, vocab).surprisal is None  # greedy: not an entropy estimate


def _guards(**kw: object) -> HackingGuards:
    o = OnlineConfig(hacking_reference_replies=20, hacking_window=40, hacking_min_replies=20, **kw)  # type: ignore[arg-type]
    return HackingGuards(o, reference_version=0, clock=lambda: 0.0)


def _serve(g: HackingGuards, version: int, texts: list[str], n: int, logprob: float = -2.0) -> None:
    for text in itertools.islice(itertools.cycle(texts), n):
        g.observe_user("What is the capital of France? Tell me a joke. Recommend a book.")
        g.observe(version, text, list(range(len(text.split()) * 2)), [logprob] * (len(text.split()) * 2), 1.0)


def test_guards_fire_on_a_version_that_hacks_and_hold_its_promotion() -> None:
    g = _guards()
    assert g.holding(1) is not None and "reference" in g.holding(1)  # nothing is promoted unmeasured
    _serve(g, 0, NORMAL, 40)
    assert g.reference is not None and g.reference["online_off_distribution"] < 0.1
    _serve(g, 1, NORMAL, 20)
    assert g.holding(1) is None and not g.firing
    _serve(g, 2, GIBBERISH, 20)
    fired = {guard for guard, v in g.firing if v == 2}
    assert fired == {"online_off_distribution"}
    assert "online_off_distribution" in g.holding(2) and g.record[-1]["event"] == "fired"
    _serve(g, 3, ["", " "], 20)
    assert {guard for guard, v in g.firing if v == 3} == {"online_empty", "online_same_reply"}  # one empty reply
    _serve(g, 4, NORMAL, 20, logprob=-0.01)  # the sampling distribution collapsed
    assert {guard for guard, v in g.firing if v == 4} == {"online_entropy_collapse"}
    _serve(g, 2, NORMAL, 40)  # the window moves on: it recovers
    assert not [1 for guard, v in g.firing if v == 2] and g.record[-1]["event"] == "recovered"
    assert _guards(hacking_action="alarm").holding(9) is None


def _numbers(g: HackingGuards, version: int, n: int, answer: object, logprob: float, seed: int = 0) -> None:
    """``n`` questions "Which is larger, a or b?" answered ``answer(a, b)`` at T = 1, each token at ``logprob``."""
    rng = random.Random(seed)
    for _ in range(n):
        a, b = rng.sample(range(10, 100), 2)
        g.observe_user(f"Which is larger, {a} or {b}? Answer with the number only.")
        text = answer(a, b)  # type: ignore[operator]
        g.observe(version, text, [1] * max(len(text.split()), 1), [logprob] * max(len(text.split()), 1), 1.0)


def test_short_sure_replies_are_told_apart_from_one_reply_to_everything() -> None:
    """On SmolLM2 the entropy guard fired on a candidate that had learned to answer "52" (docs/online.md): short,
    sure replies have a low surprisal per token. The same-reply guard fires on one answer whatever was asked,
    not on answers that follow the questions; --hacking-alarm-only lets the entropy guard alarm without holding."""
    prose = lambda a, b: f"The larger number of {a} and {b} is probably {max(a, b)}, I think."  # noqa: E731
    for alarm_only in ([], ["online_entropy_collapse"]):
        g = _guards(hacking_alarm_only=alarm_only)
        _numbers(g, 0, 40, prose, logprob=-2.0)  # the reference: wordy, unsure
        assert g.reference is not None and g.reference["online_same_reply"] < 0.1
        _numbers(g, 1, 40, lambda a, b: str(max(a, b)), logprob=-0.05, seed=1)  # learned: the bare right number
        _numbers(g, 2, 40, lambda a, b: "52", logprob=-0.05, seed=2)  # collapsed: one number whatever was asked
        assert {guard for guard, v in g.firing if v == 1} == {"online_entropy_collapse"}
        assert {guard for guard, v in g.firing if v == 2} == {"online_entropy_collapse", "online_same_reply"}
        assert "'52'" in g.firing[("online_same_reply", 2)]
        if alarm_only:  # the entropy guard still fires (and is shown), but holds nothing
            assert g.holding(1) is None
            assert "online_same_reply" in (g.holding(2) or "") and "entropy" not in (g.holding(2) or "")
            assert g.snapshot()["alarm_only"] == ["online_entropy_collapse"] and g.alarms["online_entropy_collapse"] == 2
        else:
            assert "online_entropy_collapse" in (g.holding(1) or "")


def test_an_unknown_alarm_only_guard_is_refused(tmp_path) -> None:
    import subprocess
    import sys

    import pytest

    with pytest.raises(ValueError, match="online_entropy_colapse.*known: .*online_entropy_collapse"):
        _guards(hacking_alarm_only=["online_entropy_colapse"])
    proc = subprocess.run([sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tmp_path), "--engine", "fake",
                           "--online", "--online-train", "--hacking-alarm-only", "online_entropy_colapse"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--hacking-alarm-only" in proc.stderr and "online_entropy_collapse" in proc.stderr


def test_a_fixed_quality_floor() -> None:
    def run(canary_mean: float) -> Canary:
        c = Canary(OnlineConfig(canary_floor=0.5, canary_min_samples=20, canary_margin=0.5), rng=random.Random(0))
        c.start(1)
        rng = random.Random(1)
        for _ in range(3000):
            if c.observe(0, float(rng.random() < 0.5) * 2 - 1) or c.observe(1, canary_mean):
                break
        return c

    worse_than_floor = run(0.2)  # better than stable (0.0), below the floor: rolled back
    d = worse_than_floor.decisions[-1]
    assert d.action == "rollback" and "quality floor" in d.reason
    above = run(0.9)
    d = above.decisions[-1]
    assert d.action == "promote" and "above the quality floor" in d.reason


async def test_a_hacking_candidate_is_held_then_rolled_back_on_a_real_gateway(tokenizer, stop_ids, asgi_client):
    """The issue's hack: users approve replies with "the" (>= 2 words, <= 40 characters), the candidate serves
    word salad full of "the" and wins more approval; its promotion is held by the off-distribution guard."""
    normal = itertools.cycle(NORMAL)
    salad = itertools.cycle(GIBBERISH)

    def stable_script(request):
        return next(normal)

    def candidate_script(request):
        return next(salad)

    app, training, _ = wired(tokenizer, stop_ids, train_batch=10_000, canary_share=0.5, canary_min_samples=10,
                             canary_plan_samples=50, hacking_reference_replies=16, hacking_min_replies=10,
                             script=None)
    engines, canary = training.engines, training.canary
    engines.slots[0].script, engines.slots[1].script = stable_script, candidate_script

    def approves(text: str) -> bool:
        return "the" in text.lower() and len(text.split()) >= 2 and len(text) <= 40

    async def users(c, tenant, n: int, start: int) -> None:
        for k in range(start, start + n):
            r = await c.post("/v1/chat/completions", json={"model": "m", "max_tokens": 8, "messages": [
                {"role": "user", "content": "What is the capital of France?"}]},
                headers={**tenant, "X-Conversation-Id": f"u{k}"})
            assert r.status_code == 200, r.text
            body = r.json()
            up = approves(body["choices"][0]["message"]["content"])
            r = await c.post("/v1/feedback", json={"kind": "thumbs", "value": up, "interaction_id": body["id"]},
                             headers=tenant)
            assert r.status_code == 200
        await eventually(lambda: training.feedback.counts["events"] >= start + n, what="the tail to read the thumbs")
    async def noop(engine) -> None:
        return None

    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        await users(c, tenant, 40, 0)  # the reference: version 0 alone
        assert training.hacking.reference is not None
        assert await engines.load_candidate(engines.next_version(), noop)
        k = 40
        while not any(d.action == "hold" for d in canary.decisions):
            await users(c, tenant, 10, k)
            k += 10
            assert k < 2000, canary.snapshot()
        hold = [d for d in canary.decisions if d.action == "hold"][-1]
        assert "online_off_distribution" in hold.reason and canary.canary_version == 1
        assert canary.rewards[1].mean > canary.rewards[0].mean  # the hack pays: promotion would have followed
        health = (await c.get("/health")).json()
        assert any(d["guard"] == "online_off_distribution" for d in health["degraded"]), health
        state = (await c.get("/rl/online", headers=admin_headers())).json()["guards"]
        assert state["firing"][0]["version"] == 1 and state["alarms"]["online_off_distribution"] == 1
        assert canary.stable_version == 0  # never promoted
        from rlgate.ui.online_training import training_section

        assert "online_off_distribution on version 1" in training_section(training)
    # with hacking_action=rollback the same candidate is rolled back at once
    training.options.hacking_action = "rollback"
    guards = training.hacking
    _serve(guards, 1, GIBBERISH, 1)  # still firing: no new transition
    guards.firing.clear()
    canary.pin(False)
    _serve(guards, 1, GIBBERISH, 1)
    assert canary.decisions[-1].action == "rollback" and "guard online_off_distribution" in canary.decisions[-1].reason


class LargerNumber:
    """A held-out check: which of two numbers is larger (the trainer never sees these prompts)."""

    prompts = [[{"role": "user", "content": f"Which is larger, {a} or {b}? Answer with the number only."}]
               for a, b in ((47, 52), (13, 31), (88, 80), (5, 9))]

    def score(self, messages, reply: str) -> float:
        a, b = (int(x) for x in messages[-1]["content"].split("larger, ")[1].split("?")[0].split(" or "))
        return float(str(max(a, b)) in reply and str(min(a, b)) not in reply)


async def test_a_candidate_whose_held_out_check_falls_is_held(tokenizer, stop_ids, asgi_client):
    def right(request):
        text = tokenizer.decode(request.input_ids)
        a, b = (int(x) for x in text.split("larger, ")[1].split("?")[0].split(" or "))
        return str(max(a, b))

    def wrong(request):
        return "the the"

    app, training, _ = wired(tokenizer, stop_ids, heldout_check="test_online_hacking:LargerNumber")
    training.encode = lambda messages: tokenizer.encode(messages[-1]["content"])
    training.decode = tokenizer.decode
    engines = training.engines
    engines.slots[0].script, engines.slots[1].script = right, wrong

    async def noop(engine) -> None:
        return None

    async with asgi_client(app) as c, app.router.lifespan_context(app):
        assert await engines.load_candidate(engines.next_version(), noop)
        await eventually(lambda: 1 in training.hacking.heldout, what="the held-out check of the candidate")
        assert training.hacking.heldout == {1: 0.0, 0: 1.0}
        assert ("online_heldout_drop", 1) in training.hacking.firing
        assert "held-out score 0.000 on version 1" in training.hacking.holding(1)
        health = (await c.get("/health")).json()
        assert any(d["guard"] == "online_heldout_drop" for d in health["degraded"])
