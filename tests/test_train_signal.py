"""A loop that can go dead does not do so silently: steps without signal are seen, skipped, resampled."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers import ADMIN_KEY
from rlgate.client import GatewayClient
from rlgate.rollout.runner import RolloutRunner
from rlgate.server.runner import ServerThread
from rlgate.train.grpo import GRPOConfig, GRPOTrainer, LoopState, grpo_loop
from rlgate.train.sync import ColocatedSync
from rlgate.train.tracking import StdoutTracker
from rlgate.trajectory.sample import Sample

pytestmark = pytest.mark.torch


class PromptAgent:
    """Reward by the prompt: ``flat`` prompts always earn 1.0 (a group with no signal), the others the
    parity of the reply's length (varies within a group)."""

    async def run(self, data, *, base_url, api_key, http_client=None):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as oai:
            r = await oai.chat.completions.create(model="m", messages=[{"role": "user", "content": data["q"]}],
                                                  max_tokens=6, temperature=1.0)
        return 1.0 if data["flat"] else float(len(r.choices[0].message.content or "") % 2)


def prompts(flat_every: int):
    for i in itertools.count():
        yield f"p{i}", {"q": f"question number {i}", "flat": i % flat_every != flat_every - 1}


def _samples(rewards: list[float]) -> list[Sample]:
    return [Sample(id=f"s{i}", input_ids=[5, 6, 7, 8 + i, 9], loss_mask=[0, 0, 1, 1, 1],
                   logprobs=[0.0, 0.0, -2.0, -2.0, -2.0], versions=[-1, -1, 0, 0, 0], reward=r)
            for i, r in enumerate(rewards)]


def test_a_step_without_signal_applies_no_update(tiny_model_dir):
    """Every group's rewards equal: no AdamW step (its momentum would move every weight with no signal),
    ``updates`` 0, the entropy still measured; ``skip_no_signal_updates: false`` updates as before."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = GRPOTrainer(model, GRPOConfig(lr=1e-2, device="cpu"))
    trainer.step(_samples([1.0, 0.0, 1.0, 0.0]), ["a", "a", "b", "b"], 0)  # a real update: AdamW has momentum
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m = trainer.step(_samples([1.0, 1.0, 0.0, 0.0]), ["a", "a", "b", "b"], 1)
    assert m["updates"] == 0 and m["zero_variance_groups"] == m["groups"] == 2 and m["grad_norm"] == 0
    assert m["entropy"] > 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    plain = GRPOTrainer(model, GRPOConfig(lr=1e-2, device="cpu", skip_no_signal_updates=False))
    plain.step(_samples([1.0, 0.0, 1.0, 0.0]), ["a", "a", "b", "b"], 1)
    m = plain.step(_samples([1.0, 1.0, 0.0, 0.0]), ["a", "a", "b", "b"], 2)
    assert m["updates"] == 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())  # momentum moved them


async def _loop(tiny_model_dir, make_app, cfg: GRPOConfig, flat_every: int, steps: int):
    from transformers import AutoModelForCausalLM

    from rlgate.engine.local import LocalEngine

    engine = LocalEngine(tiny_model_dir)
    trainer = GRPOTrainer(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg)
    trained: list[list[float]] = []
    original = trainer.step

    def recording(samples, group_ids, version):
        by_group: dict[str, list[float]] = {}
        for s, g in zip(samples, group_ids, strict=True):
            by_group.setdefault(g, []).append(s.reward)
        trained.extend(by_group.values())
        return original(samples, group_ids, version)

    trainer.step = recording
    with ServerThread(make_app(engine, capacity_mode="granted")) as url:
        async with GatewayClient(url, ADMIN_KEY) as client:
            runner = RolloutRunner(client, PromptAgent(), group_size=4, concurrency=16)
            state = await grpo_loop(trainer=trainer, runner=runner, sync=ColocatedSync(engine),
                                    prompts=prompts(flat_every), steps=steps, state=LoopState(version=engine.version))
    return state, trained, engine


@pytest.mark.slow
async def test_dynamic_sampling_replaces_groups_without_signal(tiny_model_dir, make_app):
    """``grpo.dynamic_sampling``: a group whose rewards are all equal is played again with a fresh prompt,
    up to ``max_resampled_groups`` per step, counted; ``reward_all`` is every played episode's mean. Without
    it, the same prompts give steps of flat groups, counted in ``zero_variance_groups``; a step with no
    signal at all pushes no weights (the version stays)."""
    cfg = GRPOConfig(lr=1e-3, groups_per_step=2, micro_batch_size=8, device="cpu", dynamic_sampling=True,
                     max_resampled_groups=6)
    state, trained, _ = await _loop(tiny_model_dir, make_app, cfg, flat_every=3, steps=2)
    assert all(h["resampled_groups"] >= 1 for h in state.history)
    # reward_all is the mean over every played episode, the resampled groups' included: each of those groups
    # earned one reward throughout (that is why it was replaced), 0 or 1 here, so their sum is a whole number of
    # groups; the first step's first two prompts are flat ones (always 1.0), so it counts at least those two
    for i, h in enumerate(state.history):
        kept, replaced = h["episodes"], 4 * h["resampled_groups"]
        replaced_sum = h["reward_all"] * (kept + replaced) - h["reward"] * kept
        groups_at_one = replaced_sum / 4
        assert abs(groups_at_one - round(groups_at_one)) < 1e-6 and 0 <= round(groups_at_one) <= h["resampled_groups"]
        assert i > 0 or round(groups_at_one) >= 2
    # the kept groups are the ones that varied (a varying prompt can still come out flat by chance: then
    # it too is replaced, up to the cap)
    flat_kept = sum(1 for rs in trained if len(set(rs)) == 1)
    assert flat_kept <= sum(1 for h in state.history if h["resampled_groups"] == 6)

    cfg = GRPOConfig(lr=1e-3, groups_per_step=2, micro_batch_size=8, device="cpu")
    state, trained, engine = await _loop(tiny_model_dir, make_app, cfg, flat_every=1000, steps=2)
    for h in state.history:  # every prompt is flat: no signal, no update, no push
        assert h["zero_variance_groups"] == h["groups"] == 2 and h["updates"] == 0 and h["resampled_groups"] == 0
    assert state.version == engine.version == 0


def test_the_step_line_says_when_a_step_teaches_nothing():
    lines: list[str] = []
    tracker = StdoutTracker(10, print_fn=lambda s, **_: lines.append(s))
    base = {"reward": 0.5, "loss": 0.0, "approx_kl": 0.0, "tokens_per_s": 10.0, "step_s": 1.0}
    tracker.log(1, {**base, "groups": 4.0, "zero_variance_groups": 1.0, "entropy": 1.234, "updates": 1.0})
    tracker.log(2, {**base, "groups": 4.0, "zero_variance_groups": 4.0, "entropy": 0.01, "updates": 0.0,
                    "resampled_groups": 2.0})
    assert "signal 3/4" in lines[0] and "ent 1.23" in lines[0] and "[" not in lines[0]
    assert "signal 0/4 (+2 resampled)" in lines[1]
    assert "cut" not in lines[0]
    tracker.log(3, {**base, "groups": 4.0, "truncated_episodes": 5.0})
    assert "cut 5 " in lines[2]  # episodes with a reply cut by max_tokens
    assert "NO SIGNAL" in lines[1] and "ENTROPY COLLAPSE" in lines[1]
