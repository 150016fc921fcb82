"""Advantages and losses against hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rlgate.train.loss import group_advantages, kl_penalty, policy_loss, token_logprobs


def test_group_advantages_mean_centred():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0, 5.0, 5.0], ["a", "a", "a", "a", "b", "b"])
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0, 0.0])


def test_group_advantages_std_scaling():
    adv = group_advantages([1.0, 0.0, 3.0, 3.0], [0, 0, 1, 1], scale_by_std=True)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-4)


def test_policy_loss_on_policy_equals_minus_mean_advantage_at_ratio_one():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.tensor([[0, 1, 1]])
    loss, stats = policy_loss(logp, old, torch.tensor([2.0]), mask)
    # ratio 1 everywhere: per token -A, two loss tokens, token mean -> -2
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    # d/dlogp of -A*exp(logp-old)/n = -A/n on masked tokens, 0 elsewhere
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0, -1.0])
    assert stats["clip_fraction"] == 0.0


def test_policy_loss_clipping_hand_computed():
    # ratios e^{0.5}=1.6487 (positive A -> clipped at 1.2) and e^{-0.5}=0.6065 (negative A -> clipped at 0.8)
    logp = torch.tensor([[0.5, -0.5]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2)
    # token 1: -min(1.6487*1, 1.2*1) = -1.2 ; token 2: -min(0.6065*-1, 0.8*-1) = 0.8
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-4)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0])  # both clipped: no gradient
    assert stats["clip_fraction"] == 1.0


def test_policy_loss_unclipped_side_keeps_gradient():
    # positive advantage with ratio below 1 is not clipped by min(): gradient flows
    logp = torch.tensor([[-0.5]], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    loss.backward()
    assert logp.grad.item() == pytest.approx(-math.exp(-0.5))


def test_policy_loss_decoupled_importance_weight():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    old = torch.tensor([[-2.0]])  # behaviour policy (stale)
    prox = torch.tensor([[-1.0]])  # proximal = current weights before the step
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 1), logp_prox=prox)
    # ratio vs prox = 1; weight = exp(-1 - -2) = e
    assert loss.item() == pytest.approx(-math.e)
    loss2, _ = policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 1), logp_prox=prox, importance_cap=2.0)
    assert loss2.item() == pytest.approx(-2.0)


def test_gradient_reaches_only_the_policy_logprobs():
    logp = torch.tensor([[-1.0, -1.5]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.4]], requires_grad=True)
    prox = torch.tensor([[-1.1, -1.3]], requires_grad=True)
    ref = torch.tensor([[-0.9, -1.6]], requires_grad=True)
    adv = torch.tensor([0.7], requires_grad=True)
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 2), logp_prox=prox)
    loss = loss + 0.1 * kl_penalty(logp, ref, torch.ones(1, 2))
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all() and logp.grad.abs().sum() > 0
    for t in (old, prox, ref, adv):
        assert t.grad is None


def test_masked_tokens_and_global_normalisation():
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[1, 0, 1]])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask, num_tokens=4)
    assert loss.item() == pytest.approx(-2 / 4)  # two tokens, normalised by the step's 4 tokens
    loss.backward()
    assert logp.grad[0, 1].item() == 0.0


def test_kl_penalty_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    # token 1: d=0 -> 0; token 2: d=1 -> e - 2
    assert kl_penalty(logp, ref, torch.ones(1, 2)).item() == pytest.approx((math.e - 2) / 2)


def test_token_logprobs_alignment_and_temperature():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)
    ids = torch.randint(0, 7, (2, 4))
    out = token_logprobs(logits, ids, temperature=torch.tensor([1.0, 0.5]))
    assert out.shape == (2, 4) and out[:, 0].tolist() == [0.0, 0.0]
    expected = torch.log_softmax(logits[1, 2] / 0.5, dim=-1)[ids[1, 3]]
    assert out[1, 3].item() == pytest.approx(expected.item(), abs=1e-6)
    greedy = token_logprobs(logits, ids, temperature=0.0)  # greedy: unscaled
    assert greedy[0, 1].item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[ids[0, 1]].item(), abs=1e-6)
