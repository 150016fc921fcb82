"""The canary: the confidence sequence, routing, automatic and operator decisions, two weight slots."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from rlgate.config import OnlineConfig
from rlgate.engine.base import GenerateRequest, SamplingParams
from rlgate.engine.fake import FakeEngine
from rlgate.online.canary import Canary
from rlgate.online.sequential import RunningMean, compare, radius
from rlgate.online.versions import TwoSlotEngine


def _canary(**kw: object) -> Canary:
    return Canary(OnlineConfig(**kw), rng=random.Random(0))  # type: ignore[arg-type]


def test_radius_shrinks_and_covers_the_mean_at_every_size() -> None:
    assert radius(0, low=0, high=1, alpha=0.05, plan=100) == math.inf
    widths = [radius(n, low=0, high=1, alpha=0.05, plan=100) for n in (10, 100, 1000, 10000)]
    assert widths == sorted(widths, reverse=True) and widths[-1] < 0.03
    # time-uniform: over 200 runs of 2000 fair coins, the true mean leaves the sequence at ANY
    # size in at most ~alpha of runs (a fixed-n interval peeked at every step leaves it far more)
    rng = random.Random(1)
    escaped = 0
    for _ in range(200):
        m = RunningMean()
        for _ in range(2000):
            m.add(float(rng.random() < 0.5))
            if abs(m.mean - 0.5) > radius(m.n, low=0, high=1, alpha=0.05, plan=200):
                escaped += 1
                break
    assert escaped <= 0.05 * 200


def test_compare_is_the_difference_of_the_two_intervals() -> None:
    s, c = RunningMean(), RunningMean()
    for _ in range(400):
        s.add(1.0)
        c.add(-1.0)
    cmp = compare(s, c, low=-1, high=1, alpha=0.05, plan=200)
    assert cmp.diff == -2.0 and cmp.upper < 0 and cmp.lower >= -2.0


def test_a_worse_canary_is_rolled_back_and_its_conversations_move() -> None:
    canary = _canary(canary_share=0.5, canary_min_samples=10)
    seen: list[object] = []
    canary.listeners.append(seen.append)
    canary.start(1)
    versions = {f"c{i}": canary.route(f"c{i}") for i in range(200)}
    assert set(versions.values()) == {0, 1}
    assert all(canary.route(c) == v for c, v in versions.items())  # a conversation keeps its version
    decision = None
    for _ in range(500):
        decision = canary.observe(0, 1.0) or canary.observe(1, -1.0)
        if decision:
            break
    assert decision is not None and decision.action == "rollback" and decision.by == "auto"
    assert "worse than stable" in decision.reason and decision.comparison is not None
    assert canary.stable_version == 0 and canary.canary_version is None and seen[-1] is decision
    moved = [c for c, v in versions.items() if v == 1]
    assert all(canary.route(c) == 0 for c in moved) and canary.switched == len(moved)


def test_an_equal_canary_is_promoted_within_the_margin() -> None:
    canary = _canary(canary_min_samples=10, canary_margin=0.3)
    canary.start(1)
    rng = random.Random(2)
    decision = None
    for _ in range(5000):
        decision = canary.observe(0, float(rng.random() < 0.5)) or canary.observe(1, float(rng.random() < 0.5))
        if decision:
            break
    assert decision is not None and decision.action == "promote", decision
    assert canary.stable_version == 1 and canary.route("new") == 1


def test_operator_pin_promote_rollback() -> None:
    canary = _canary(canary_share=1.0)
    canary.start(1)
    canary.pin(True)
    assert canary.route("a") == 0  # pinned: new conversations stay on stable
    for _ in range(200):
        assert canary.observe(1, -1.0) is None and canary.observe(0, 1.0) is None  # no automatic decision
    d = canary.promote(reason="looks good")
    assert d.by == "operator" and canary.stable_version == 1
    with pytest.raises(ValueError, match="no canary"):
        canary.rollback()
    with pytest.raises(ValueError, match="served before"):
        canary.start(1)
    snap = canary.snapshot()
    assert snap["state"] == "pinned" and [x["action"] for x in snap["decisions"]] == ["start", "pin", "promote"]


def test_two_slots_serve_each_conversation_its_version(tokenizer) -> None:
    async def main() -> None:
        stable, spare = FakeEngine(tokenizer, output_tokens=3), FakeEngine(tokenizer, output_tokens=3)
        canary = _canary(canary_share=0.5)
        engine = TwoSlotEngine(stable, spare, canary)

        async def noop(e: object) -> None:
            return None

        assert await engine.load_candidate(1, noop)
        assert not await engine.load_candidate(2, noop)  # one canary at a time
        got = {}
        for i in range(40):
            r = await engine.generate(GenerateRequest([1, 2, 3], SamplingParams(max_new_tokens=3), session_id=f"s{i}"))
            got[f"s{i}"] = set(r.output_versions)
        assert {frozenset(v) for v in got.values()} == {frozenset({0}), frozenset({1})}
        assert len(stable.requests) + len(spare.requests) == 40
        canary.promote()
        assert engine.version == 1 and engine.spare_index() == 0
        # the old stable slot still serves its active conversations: no candidate may take it yet
        assert not engine.can_load()
        canary.clock = lambda: 1e12  # ... until they are idle
        assert await engine.load_candidate(2, noop) and engine.versions == [2, 1]

    asyncio.run(main())


async def test_canary_admin_routes(tokenizer, stop_ids, asgi_client) -> None:
    from helpers import ADMIN_KEY, admin_headers
    from online_helpers import new_tenant
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.online.training import OnlineTraining
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    canary = _canary()
    engines = TwoSlotEngine(FakeEngine(tokenizer), FakeEngine(tokenizer), canary)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engines, MemoryStore(), tokenizer, stop_token_ids=stop_ids,
                     online=OnlineConfig(online=True),
                     online_training=OnlineTraining(canary.options, canary, engines))
    async with asgi_client(app) as c, app.router.lifespan_context(app):
        _, tenant = await new_tenant(c)
        for path in ("/rl/canary/pin", "/rl/canary/promote", "/rl/canary/rollback"):  # admin only
            assert (await c.post(path, headers=tenant)).status_code == 403
        r = await c.post("/rl/canary/rollback", headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_canary"
        tmp = "/nonexistent-checkpoint"
        r = await c.post("/rl/update_weights", json={"path": tmp}, headers=admin_headers())
        assert r.status_code == 400  # the checkpoint cannot load: nothing starts
        assert canary.canary_version is None

        async def noop(e: object) -> None:
            return None

        assert await engines.load_candidate(1, noop)
        r = await c.post("/rl/update_weights", json={"path": tmp}, headers=admin_headers())
        assert r.status_code == 409 and r.json()["error"]["code"] == "canary_busy"
        assert (await c.post("/rl/canary/pin", json={"reason": "holiday"}, headers=admin_headers())).json()["action"] == "pin"
        r = await c.post("/rl/canary/rollback", json={"reason": "saw a bad reply"}, headers=admin_headers())
        assert r.status_code == 200 and r.json()["by"] == "operator" and r.json()["reason"] == "saw a bad reply"
        state = (await c.get("/rl/online", headers=admin_headers())).json()["canary"]
        assert state["state"] == "pinned" and [d["action"] for d in state["decisions"]] == ["start", "pin", "rollback"]
        metrics = (await c.get("/metrics", headers=admin_headers())).text
        assert 'rlgate_online_canary_decisions_total{action="rollback",by="operator"} 1.0' in metrics
        assert 'rlgate_online_canary_state{state="pinned"} 1.0' in metrics


def test_serve_online_train_needs_online_and_the_local_engine(tiny_tokenizer_dir, capsys) -> None:
    from rlgate.cli import main

    for extra in ([], ["--online"]):
        with pytest.raises(SystemExit, match="needs --online and --engine local"):
            main(["serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake", "--online-train", "--port", "0",
                  *extra])
    with pytest.raises(SystemExit, match="--canary-share: Input should be less than or equal to 1"):
        main(["serve", "--model", str(tiny_tokenizer_dir), "--engine", "fake", "--online", "--online-train",
              "--canary-share", "2", "--port", "0"])


def test_the_viewer_section_shows_state_test_and_decisions() -> None:
    from rlgate.online.training import OnlineTraining
    from rlgate.ui.online_training import training_section

    canary = _canary()
    canary.start(1)
    for _ in range(30):
        canary.observe(0, 1.0)
        canary.observe(1, 0.5)
    html = training_section(OnlineTraining(canary.options, canary))
    assert "state <b>canary</b>" in html and "always-valid interval" in html and "30 canary rewards" in html
    canary.rollback(reason="<script>bad</script>")
    html = training_section(OnlineTraining(canary.options, canary))
    assert "no canary running" in html and "&lt;script&gt;" in html and "<script>" not in html
