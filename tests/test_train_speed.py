"""The training step's speed levers change no number: logits only where the loss needs them."""

from __future__ import annotations

import copy

import pytest
import torch

from rlgate.train.loss import logits_to_keep, token_logprobs


def test_token_logprobs_of_the_last_positions_equal_those_of_all():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11)
    ids = torch.randint(0, 11, (3, 6))
    temps = torch.tensor([1.0, 0.7, 0.0])
    full = token_logprobs(logits, ids, temps)
    for k in (2, 3, 6):
        part = token_logprobs(logits[:, -k:], ids, temps)
        assert part.shape == (3, 6)
        assert torch.equal(part[:, 6 - k + 1:], full[:, 6 - k + 1:])
        assert part[:, :6 - k + 1].abs().sum() == 0  # positions the logits do not cover are 0.0


def test_logits_to_keep_starts_one_before_the_earliest_loss_token():
    mask = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]], dtype=torch.bool)
    assert logits_to_keep(mask) == 4  # positions 2..5: position 2 predicts the first loss token (3)
    assert logits_to_keep(torch.zeros(2, 5, dtype=torch.bool)) == 5
    assert logits_to_keep(torch.tensor([[0, 1, 1]], dtype=torch.bool)) == 3


def assert_same_adamw_steps(wa: dict, wb: dict, *, lr: float, steps: int) -> None:
    """Weights after the same AdamW steps computed two ways agree to float32 rounding, but for the few
    whose gradient is near AdamW's eps (1e-8): their update, lr * g / (|g| + eps), turns on the gradient's
    last bits (CI saw 1 of 65,536 and 7 of 271,104 elements differ by up to 0.2 lr). So: at most 0.1% of
    each tensor's elements past the float32 tolerance, and none by more than half an update per step."""

    for k in wa:
        diff = (wb[k] - wa[k]).abs()
        off = diff > 1e-5 + 1e-4 * wa[k].abs()
        assert off.float().mean().item() <= 1e-3, (k, int(off.sum()), diff.numel())
        assert diff.max().item() <= 0.5 * lr * steps, (k, diff.max().item())


@pytest.mark.torch
def test_a_step_with_trimmed_logits_is_the_step_with_all_of_them(tiny_model_dir):
    """Same loss, metrics and updated weights (to float32 rounding) with and without ``trim_logits``,
    on- and off-policy (the proximal pass), with a KL reference."""
    from transformers import AutoModelForCausalLM

    from rlgate.train.config import GRPOConfig
    from rlgate.train.forward import _takes_logits_to_keep
    from rlgate.train.grpo import GRPOTrainer
    from rlgate.trajectory.sample import Sample

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert _takes_logits_to_keep(base)  # else both runs would compute every logit
    samples = [Sample(id=f"s{i}", input_ids=[5, 6, 7, 8, 9 + i, 10, 11 + i][: 5 + i % 3],
                      loss_mask=[0, 0, 0, 1, 1, 1, 1][: 5 + i % 3], logprobs=[0.0, 0.0, 0.0, -3.0, -3.0, -3.0, -3.0][: 5 + i % 3],
                      versions=[-1, -1, -1, 0, 0, 0, 0][: 5 + i % 3], reward=float(i % 2))
               for i in range(6)]
    samples[0].loss_mask = [0, 0, 1, 1, 1]  # an earlier first generated token in one row
    results = {}
    for trim in (False, True):
        cfg = GRPOConfig(lr=1e-3, device="cpu", micro_batch_size=4, trim_logits=trim, kl_coef=0.1, share_prompt=False)
        trainer = GRPOTrainer(copy.deepcopy(base), cfg)
        m1 = trainer.step(samples, ["g", "g", "g", "h", "h", "h"], 0)
        m2 = trainer.step(samples, ["g", "g", "g", "h", "h", "h"], 1)  # now stale: proximal logprobs too
        results[trim] = (m1, m2, trainer.model.state_dict())
    (a1, a2, wa), (b1, b2, wb) = results[False], results[True]
    for key in ("loss", "entropy", "approx_kl", "kl_ref", "grad_norm", "behav_logprob_abs_err", "tokens"):
        assert b1[key] == pytest.approx(a1[key], rel=1e-4, abs=1e-6), key
        assert b2[key] == pytest.approx(a2[key], rel=1e-4, abs=1e-6), key
    assert a2["stale_samples"] == b2["stale_samples"] == 6
    assert_same_adamw_steps(wa, wb, lr=1e-3, steps=2)


@pytest.mark.torch
async def test_the_rollout_levers_are_run_settings(tiny_model_dir, tmp_path):
    """``rollout.batch_starts`` / ``rollout.fused_finish`` reach the runner, ``gateway.engine_threads``
    the in-process engine (default on the CPU: all cores but one)."""
    from rlgate.train.config import TrainConfig
    from rlgate.train.gateway import GatewayPlan, open_gateway
    from rlgate.train.run import make_runner

    def cfg(**sections):
        return TrainConfig.model_validate({"model": str(tiny_model_dir), "out_dir": str(tmp_path / "run"),
                                           "dataset": "unused.jsonl", "agent": "m:A", **sections})

    default = make_runner(cfg(), None, object(), None)
    assert default.batch_starts and default.fused_finish
    off = make_runner(cfg(rollout={"batch_starts": False, "fused_finish": False}), None, object(), None)
    assert not off.batch_starts and not off.fused_finish
    for threads, expected in ((None, max(1, torch.get_num_threads() - 1)), (3, 3)):
        c = cfg(gateway={"device": "cpu", "engine_threads": threads})
        gw = await open_gateway(GatewayPlan.of(c), tiny_model_dir, tiny_model_dir)
        try:
            assert gw.sync.engine.threads == expected
        finally:
            await gw.close()


@pytest.mark.torch
def test_micro_batches_are_length_sorted_and_cut_to_their_longest_sample(tiny_model_dir):
    """The step trains micro-batches of similar lengths, each cut to its longest sample (was: every
    micro-batch padded to the batch's longest): ``pad_fraction`` is that layout's, and the loss,
    metrics and updated weights are those of one sample per micro-batch (no padding at all), on- and
    off-policy with a KL reference (the no-grad passes use the same layout)."""
    from transformers import AutoModelForCausalLM

    from rlgate.train.config import GRPOConfig
    from rlgate.train.grpo import GRPOTrainer
    from rlgate.trajectory.sample import Sample

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lengths = [5, 20, 6, 19, 7, 18]
    samples = [Sample(id=f"s{i}", input_ids=[(5 + 3 * i + t) % 90 + 3 for t in range(n)],
                      loss_mask=[0, 0] + [1] * (n - 2), logprobs=[0.0, 0.0] + [-3.0] * (n - 2),
                      versions=[-1, -1] + [0] * (n - 2), reward=float(i % 2))
               for i, n in enumerate(lengths)]
    groups = ["g", "g", "g", "h", "h", "h"]
    results = {}
    for micro in (1, 2):
        trainer = GRPOTrainer(copy.deepcopy(base), GRPOConfig(lr=1e-3, device="cpu", micro_batch_size=micro,
                                                              kl_coef=0.1, share_prompt=False))
        m1 = trainer.step(samples, groups, 0)
        m2 = trainer.step(samples, groups, 1)  # now stale: the proximal pass too
        results[micro] = (m1, m2, trainer.model.state_dict())
    (a1, a2, wa), (b1, b2, wb) = results[1], results[2]
    assert a1["pad_fraction"] == 0.0
    # sorted: (20, 19), (18, 7), (6, 5) -> 40 + 36 + 12 positions for 75 tokens (unsorted, uncut: 120)
    assert b1["pad_fraction"] == b2["pad_fraction"] == pytest.approx(1 - 75 / 88)
    for key in ("loss", "entropy", "approx_kl", "kl_ref", "grad_norm", "behav_logprob_abs_err", "tokens"):
        assert b1[key] == pytest.approx(a1[key], rel=1e-4, abs=1e-6), key
        assert b2[key] == pytest.approx(a2[key], rel=1e-4, abs=1e-6), key
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "mixed"])
def test_a_shared_prompt_runs_once_and_changes_no_number(tiny_model_dir, dtype):
    """``grpo.share_prompt``: the prompt a group's samples share runs once (its cache expanded to the
    group's completions, the backward flowing into it once per chunk). Same loss, metrics and updated
    weights as one forward per sample, with a group split over several chunks, a group whose samples
    differ in length, a lone sample and a sample whose prompt is too short to share; on- and
    off-policy with a KL reference (the no-grad passes share too). ``forward_fraction`` counts the
    positions run. Under ``train.dtype: mixed`` (bfloat16 autocast) the two agree to bfloat16's precision."""
    from transformers import AutoModelForCausalLM

    from rlgate.train.config import GRPOConfig
    from rlgate.train.forward import can_share, plan_chunks
    from rlgate.train.grpo import GRPOTrainer
    from rlgate.trajectory.export import to_padded_tensors
    from rlgate.trajectory.sample import Sample

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert can_share(base) == (True, "")

    def sample(i: int, prompt: list[int], gen: int) -> Sample:
        ids = prompt + [(7 * i + 3 * t) % 80 + 10 for t in range(gen)]
        n = len(prompt)
        return Sample(id=f"s{i}", input_ids=ids, loss_mask=[0] * n + [1] * gen, logprobs=[0.0] * n + [-3.0] * gen,
                      versions=[-1] * n + [0] * gen, reward=float(i % 3 == 0))

    p1 = [(11 * t) % 90 + 5 for t in range(20)]
    p2 = [(13 * t) % 90 + 5 for t in range(14)]
    samples = ([sample(i, p1, 3 + i % 4) for i in range(5)] + [sample(5 + i, p2, 4) for i in range(3)]
               + [sample(8, p1[:12], 5), sample(9, p2[:6], 3)])
    groups = ["a"] * 5 + ["b"] * 3 + ["c", "d"]
    batch = to_padded_tensors(samples)
    chunks = plan_chunks(batch, torch.arange(10), 2, share=True)
    assert sorted(c.prefix for c in chunks) == [0, 13, 13, 19, 19, 19]  # p1: 3 chunks of <= 2, p2: 2, lone: 1
    assert [(c.first, c.last) for c in chunks if c.prefix == 19] == [(True, False), (False, False), (False, True)]
    results = {}
    for share in (False, True):
        trainer = GRPOTrainer(copy.deepcopy(base), GRPOConfig(lr=1e-3, device="cpu", micro_batch_size=2, kl_coef=0.1,
                                                              share_prompt=share),
                              autocast="bfloat16" if dtype == "mixed" else None)
        m1 = trainer.step(samples, groups, 0)
        m2 = trainer.step(samples, groups, 1)  # now stale: the proximal pass too
        results[share] = (m1, m2, trainer.model.state_dict())
    (a1, a2, wa), (b1, b2, wb) = results[False], results[True]
    real = sum(len(s.input_ids) for s in samples)
    assert b1["forward_fraction"] < 0.75 < a1["forward_fraction"]  # the prompts of groups a and b ran once
    assert b1["pad_fraction"] >= 0 and b1["forward_fraction"] * real == pytest.approx(
        sum((c.width - c.prefix) * len(c.rows) + (c.prefix if c.first else 0) for c in chunks))
    tol = dict(rel=1e-4, abs=1e-6) if dtype == "float32" else dict(rel=0.05, abs=0.02)
    for key in ("loss", "entropy", "approx_kl", "kl_ref", "grad_norm", "tokens"):
        assert b1[key] == pytest.approx(a1[key], **tol), key
        assert b2[key] == pytest.approx(a2[key], **tol), key
    if dtype == "float32":
        assert_same_adamw_steps(wa, wb, lr=1e-3, steps=2)
    else:  # bfloat16 compute: the updates agree in direction
        deltas = [(wa[k] - base.state_dict()[k]).flatten() for k in wa], [(wb[k] - base.state_dict()[k]).flatten()
                                                                           for k in wb]
        cos = torch.nn.functional.cosine_similarity(torch.cat(deltas[0]), torch.cat(deltas[1]), dim=0)
        assert cos > 0.95


@pytest.mark.torch
def test_prompt_sharing_is_off_where_the_cache_would_not_hold_the_prompt(tiny_model_dir):
    """Sliding-window layers and gradient checkpointing turn sharing off, saying why."""
    from transformers import AutoModelForCausalLM

    from rlgate.train.forward import can_share

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    getattr(model, "activation_checkpointing_enable", None or model.gradient_checkpointing_enable)()
    ok, why = can_share(model)
    assert not ok and "checkpointing" in why
    sliding = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sliding.config.layer_types = ["sliding_attention"] * sliding.config.num_hidden_layers
    sliding.config.sliding_window = 4
    ok, why = can_share(sliding)
    assert not ok and "sliding_attention" in why
