"""rlgate.integrations.trl_async: TRL's AsyncGRPOTrainer trained on rlgate rollouts, weights back to rlgate.

The slow test runs TRL 1.16's own ``AsyncGRPOTrainer`` for two optimizer steps on the tiny model,
with :class:`AsyncAgentRollout` as its rollout worker and weight transfer and a real OpenAI SDK
agent playing through an in-process gateway. TRL's trainer does not run on a CPU as shipped, and
the test swaps exactly two things of TRL's for CPU equivalents (docs/integrations.md):

* ``get_peak_flops_per_device`` (an MFU metric) calls ``torch.cuda.get_device_name``, which raises
  on a CPU-only torch: here it returns None (TRL's "peak unknown": MFU not logged);
* the tree attention TRL registers as ``tree_fa3`` runs FlashAttention-3 fetched from the Hub
  (``kernels.get_kernel``, Hopper GPUs): here :func:`_cpu_tree_attention` computes the same
  attention (each packed segment attends causally to its root-to-segment path) with PyTorch's SDPA.

Everything else (the queue consumption, staleness check, tree packing, GRPO loss, optimizer,
weight-sync callbacks) is TRL's code as installed.
"""

from __future__ import annotations

import math
import os
import queue
from typing import Any

import pytest

from rlgate.integrations.episodes import Chain
from rlgate.integrations.trl_async import group_advantages, rollout_sample
from rlgate.train.config import GatewaySettings, RolloutSettings

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_group_advantages_follow_trls_worker():
    """TRL's AsyncRolloutWorker: over the scored rewards, (r - mean) / (std + 1e-8), population std; 0 if unscored."""
    rewards = [1.0, 0.0, None, 0.5]
    mean, std = 0.5, math.sqrt((0.25 + 0.25 + 0.0) / 3)
    assert group_advantages(rewards) == pytest.approx([0.5 / (std + 1e-8), -0.5 / (std + 1e-8), 0.0, 0.0])
    assert group_advantages([0.3, 0.3]) == [0.0, 0.0] and group_advantages([None, None]) == [0.0, 0.0]
    assert mean == 0.5


@pytest.mark.torch  # TRL's RolloutSample module imports torch
@pytest.mark.slow  # importing TRL's trainer module: ~5 s here
def test_a_chain_becomes_one_sample_with_the_loss_on_generated_tokens():
    chain = Chain(True, [5, 6], [7, 8, 9], [1, 0, 1], [-0.5, 0.0, -0.25], [3, -1, 3], 1.0, "s", 2, 0)
    s = rollout_sample(chain, advantage=0.7, model_version=3, group_id=4, prompt="p", metrics={"reward": 1.0})
    assert s.input_ids.tolist() == [5, 6, 7, 8, 9] and s.completion_mask.tolist() == [0, 0, 1, 0, 1]
    assert s.old_log_probs.tolist() == [0.0, 0.0, -0.5, 0.0, -0.25]
    assert (s.advantage, s.model_version, s.group_id) == (0.7, 3, 4)
    assert s.prompt == [{"role": "user", "content": "p"}]


class ReplyAgent:
    """A one-call OpenAI SDK agent rewarded by its reply's length; it keeps every reply it got."""

    def __init__(self) -> None:
        self.replies: list[str] = []

    async def run(self, data: dict[str, Any], *, base_url: str, api_key: str, http_client: Any = None) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url + "/v1", api_key=api_key, http_client=http_client)
        reply = await client.chat.completions.create(model="policy", max_tokens=6, temperature=1.0,
                                                     messages=[{"role": "user", "content": data["prompt"]}])
        text = reply.choices[0].message.content or ""
        self.replies.append(text)
        return len(text) / 10.0


class SeenQueue(queue.Queue):
    """The rollout buffer, keeping what the trainer took from it."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.taken: list[Any] = []

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        item = super().get(block, timeout)
        self.taken.append(item)
        return item


def _cpu_tree_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, *, tree_kv_index: Any,
                        tree_cu_seqlens_q: Any, tree_cu_seqlens_k: Any, scaling: float | None = None,
                        **kwargs: Any) -> tuple[Any, None]:
    """TRL's ``tree_fa3`` attention on a CPU: the packed segment ``s`` (queries ``cu_q[s]:cu_q[s+1]``)
    attends to the keys at ``tree_kv_index[cu_k[s]:cu_k[s+1]]`` (its root-to-segment path, the
    segment last), causally aligned to the path's end, as FlashAttention's varlen ``causal=True`` does."""
    import torch
    import torch.nn.functional as F

    n = query.shape[2]
    allowed = torch.zeros(n, n, dtype=torch.bool)
    cq, ck = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(cq) - 1):
        path = tree_kv_index[ck[s]:ck[s + 1]]
        width, length = cq[s + 1] - cq[s], ck[s + 1] - ck[s]
        allowed[cq[s]:cq[s + 1], path] = torch.arange(length)[None, :] <= (length - width + torch.arange(width))[:, None]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _logprob_gap(model: Any, samples: list[Any]) -> float:
    """Largest |sample's old logprob - model's logprob| over the samples' trained tokens."""
    import torch

    worst = 0.0
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor(s.input_ids)[None]
            lps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            mine = lps.gather(1, ids[0, 1:, None])[:, 0]
            for a, b, m in zip(mine.tolist(), s.old_log_probs[1:].tolist(), s.completion_mask[1:].tolist(), strict=True):
                if m:
                    worst = max(worst, abs(a - b))
    return worst


def _served(model_dir: Any, state: dict[str, Any]) -> Any:
    """The tiny model (default attention) with ``state``'s weights, in eval mode as the engine runs it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(state)
    return model.eval()


def _take(buffer: Any, n: int, timeout: float = 120.0) -> list[Any]:
    return [buffer.get(timeout=timeout) for _ in range(n)]


@pytest.mark.torch
@pytest.mark.slow
def test_async_grpo_trains_on_rlgate_rollouts_and_serves_its_weights(tiny_model_dir, tokenizer, tmp_path,
                                                                      monkeypatch):
    import torch
    from datasets import Dataset
    from transformers import AttentionInterface, AutoModelForCausalLM
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer, async_grpo_trainer

    from rlgate.integrations.trl_async import AsyncAgentRollout

    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda accelerator, dtype: None)
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [f"Say {k}" for k in range(4)]
    agent = ReplyAgent()
    with AsyncAgentRollout.open(agent, tiny_model_dir, prompts=prompts, num_generations=4,
                                rollout=RolloutSettings(seed=0), out_dir=tmp_path, queue_maxsize=8) as rollout:
        rollout.rollout_buffer = SeenQueue(8)
        config = AsyncGRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=2, learning_rate=1e-2, seed=0,
                                 num_generations=4, per_device_train_batch_size=8, token_budget=0,
                                 save_strategy="no", report_to=[], use_cpu=True, logging_steps=1, bf16=False)
        trainer = AsyncGRPOTrainer(model=str(tiny_model_dir), args=config, train_dataset=Dataset.from_dict(
            {"prompt": prompts}), rollout_worker=rollout, weight_transfer=rollout)
        monkeypatch.setitem(AttentionInterface._global_mapping, "tree_fa3", _cpu_tree_attention)
        trainer.train()

        # TRL synced before the worker started and after each of its 2 steps; each push is one engine version
        assert rollout.pushes == [(1, 1), (2, 2), (3, 3)] and rollout.failed == 0
        taken = rollout.rollout_buffer.taken
        first, second = taken[:8], taken[8:16]
        assert len(second) == 8 and {s.model_version for s in first} == {1}
        assert {s.model_version for s in second} <= {1, 2}
        for s in taken:  # one sample per episode: the chat prompt, then the reply the agent got, loss on it only
            ids, mask = s.input_ids.tolist(), s.completion_mask.tolist()
            n = mask.index(1)
            assert all(mask[n:]) and not any(mask[:n]) and all(lp == 0.0 for lp in s.old_log_probs[:n].tolist())
            assert tokenizer.decode(ids[:n]).endswith("<|im_end|>\n<|im_start|>assistant\n")
            assert tokenizer.decode(ids[n:], skip_special_tokens=True).strip() in {r.strip() for r in agent.replies}
            assert all(lp < 0.0 for lp in s.old_log_probs[n:].tolist())
        # the logprobs the engine recorded are the served weights' (the initial model's for TRL version 1) ...
        assert _logprob_gap(initial, first) < 1e-4
        logs = [h for h in trainer.state.log_history if "kl" in h]
        assert logs[0]["kl"] < 1e-5  # ... and TRL's own forward (tree packing, its loss) agrees on step 1
        # the step changed TRL's weights, and the engine serves them now: new tokens carry version 3
        assert trainer.model is not None
        final = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        assert any(not torch.equal(final[k], v) for k, v in initial.state_dict().items())
        while not rollout.rollout_buffer.empty():
            rollout.rollout_buffer.get_nowait()
        rollout.start()
        later = _take(rollout.rollout_buffer, 8)
        rollout.stop()
        assert {s.model_version for s in later} == {3}
        assert _logprob_gap(_served(tiny_model_dir, final), later) < 1e-4
        assert _logprob_gap(initial, later) > 10 * max(_logprob_gap(_served(tiny_model_dir, final), later), 1e-4)


class HalfFailingAgent(ReplyAgent):
    """Every second episode raises before its LLM call; the others are ReplyAgent's."""

    def __init__(self, fail_all: bool = False) -> None:
        super().__init__()
        self.calls = 0
        self.fail_all = fail_all

    async def run(self, data: dict[str, Any], **kw: Any) -> float:
        self.calls += 1
        if self.fail_all or self.calls % 2 == 0:
            raise RuntimeError("the agent broke")
        return await super().run(data, **kw)


def _push_initial(rollout: Any, model_dir: Any) -> None:
    """What TRL does before it starts the worker: send its weights, then announce version 1."""
    from transformers import AutoModelForCausalLM

    rollout.send_weights(iter(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()))
    rollout.update_model_version(1)


@pytest.mark.torch
@pytest.mark.slow
def test_a_failed_episode_queues_nothing_and_stays_out_of_its_group(tiny_model_dir, tmp_path):
    from rlgate.integrations.trl_async import AsyncAgentRollout

    agent = HalfFailingAgent()
    with AsyncAgentRollout.open(agent, tiny_model_dir, prompts=["Say 1"], num_generations=4, groups_in_flight=1,
                                out_dir=tmp_path, rollout=RolloutSettings(max_consecutive_failures=0)) as rollout:
        _push_initial(rollout, tiny_model_dir)
        rollout.start()
        samples = _take(rollout.rollout_buffer, 4)  # two groups of 4 episodes, 2 of each failed
        rollout.stop()
        assert rollout.failed >= 4 and rollout.pushes == [(1, 1)]
        rollout.check_health(60.0)  # stopped by stop(): not an error
        groups: dict[int, list[Any]] = {}
        for s in samples:
            groups.setdefault(s.group_id, []).append(s)
        assert [len(g) for g in groups.values()] == [2, 2] and {s.model_version for s in samples} == {1}
        for g in groups.values():  # two scored episodes: advantages +-1 (or 0, 0 on a tie)
            rewards = [s.metrics["reward"] for s in g]
            assert [s.advantage for s in g] == pytest.approx(group_advantages(rewards), abs=1e-6)
            assert sorted(round(s.advantage) for s in g) in ([-1, 1], [0, 0])
        logged: dict[str, float] = {}
        while not rollout.metrics_queue.empty():
            for k, v in rollout.metrics_queue.get_nowait().items():
                logged[k] = logged.get(k, 0.0) + v
        assert logged["rlgate/failed_total"] == rollout.failed and logged["rlgate/episodes_total"] == rollout.episodes


@pytest.mark.torch
@pytest.mark.slow
def test_a_worker_stopped_by_failures_fails_the_trainers_health_check(tiny_model_dir, tmp_path):
    from rlgate.integrations.trl_async import AsyncAgentRollout

    with AsyncAgentRollout.open(HalfFailingAgent(fail_all=True), tiny_model_dir, prompts=["Say 1"], num_generations=2,
                                out_dir=tmp_path, rollout=RolloutSettings(max_consecutive_failures=3)) as rollout:
        _push_initial(rollout, tiny_model_dir)
        rollout.start()
        assert rollout._producer is not None
        rollout._producer.exception(timeout=60)  # the producer ends (TooManyFailures) ...
        with pytest.raises(RuntimeError, match="rollout worker stopped.*the agent broke"):
            rollout.check_health(300.0)  # ... and TRL's next health check says why
        assert rollout.rollout_buffer.empty()


@pytest.mark.torch
@pytest.mark.slow
def test_weights_reach_a_gateway_elsewhere_through_update_weights(tiny_model_dir, tmp_path, monkeypatch):
    """gateway.url: `rlgate serve` in another process; TRL's (name, tensor) stream becomes a checkpoint
    loaded through POST /rl/update_weights, and the next samples carry its version and its logprobs."""
    import torch
    from transformers import AutoModelForCausalLM

    from helpers import ADMIN_KEY, serve_gateway
    from rlgate.integrations.trl_async import AsyncAgentRollout
    from rlgate.train.config import GatewaySettings

    with serve_gateway(tiny_model_dir) as url:
        monkeypatch.setenv("RLGATE_ADMIN_KEY", ADMIN_KEY)
        initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        pushed = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        torch.manual_seed(0)
        with torch.no_grad():  # what an optimizer step does, only bigger
            for p in pushed.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        settings = GatewaySettings(url=url, sync_dir=str(tmp_path / "sync"))
        with AsyncAgentRollout.open(ReplyAgent(), tiny_model_dir, prompts=["Say 1"], num_generations=4,
                                    gateway=settings, out_dir=tmp_path) as rollout:
            rollout.send_weights(iter(pushed.named_parameters()))
            rollout.update_model_version(1)
            rollout.start()
            samples = _take(rollout.rollout_buffer, 4)
            rollout.stop()
            assert rollout.pushes == [(1, 1)] and {s.model_version for s in samples} == {1}
        (checkpoint,) = (tmp_path / "sync").iterdir()
        assert {p.name for p in checkpoint.iterdir()} >= {"model.safetensors", "config.json"}
        assert _logprob_gap(pushed, samples) < 1e-4 and _logprob_gap(initial, samples) > 1e-2


@pytest.mark.torch
@pytest.mark.slow
def test_a_blocked_worker_loop_fails_the_health_check(tiny_model_dir, tmp_path):
    """The worker's heartbeat ticks on its event loop: blocked, it goes stale and check_health says so."""
    import threading
    import time

    from rlgate.integrations.trl_async import AsyncAgentRollout

    with AsyncAgentRollout.open(ReplyAgent(), tiny_model_dir, prompts=["Say 1"], num_generations=2,
                                out_dir=tmp_path) as rollout:
        _push_initial(rollout, tiny_model_dir)
        rollout.start()
        _take(rollout.rollout_buffer, 2)
        rollout.check_health(30.0)  # running: ticks every second
        release = threading.Event()
        rollout.loop.loop.call_soon_threadsafe(release.wait, 120)  # something blocks the worker's loop
        try:
            deadline = time.monotonic() + 60
            with pytest.raises(RuntimeError, match="loop has not run"):
                while time.monotonic() < deadline:
                    rollout.check_health(1.0)
                    release.wait(0.1)
        finally:
            release.set()
        rollout.stop()


@pytest.mark.torch  # the in-process gateway imports the local engine, scripted or not
@pytest.mark.slow
def test_a_multi_turn_episode_is_one_sample_with_context_between_its_turns(tiny_tokenizer_dir, tokenizer, tmp_path):
    """Calculator agent, scripted engine: the tool call and the answer are trained, the tool result is context."""
    from rlgate.demo.calculator_agent import CalculatorAgent
    from rlgate.integrations.trl_async import AsyncAgentRollout

    items = {"What is 2 + 3?": {"question": "What is 2 + 3?", "answer": "5"}}
    with AsyncAgentRollout.open(CalculatorAgent(), tiny_tokenizer_dir, prompts=list(items), num_generations=2,
                                data_for=items.__getitem__, gateway=GatewaySettings(engine="scripted"),
                                out_dir=tmp_path) as rollout:
        rollout.start()
        samples = _take(rollout.rollout_buffer, 2)
        rollout.stop()
    for s in samples:
        ids, mask = s.input_ids.tolist(), s.completion_mask.tolist()
        n = mask.index(1)
        generated = tokenizer.decode([t for t, m in zip(ids[n:], mask[n:], strict=True) if m])
        between = tokenizer.decode([t for t, m in zip(ids[n:], mask[n:], strict=True) if not m])
        assert "<tool_call>" in generated and "Done." in generated and "<tool_response>" not in generated
        assert "<tool_response>" in between and 0 in mask[n:]
        assert all(lp == 0.0 for lp, m in zip(s.old_log_probs.tolist(), mask, strict=True) if not m)
    # the scripted engine plays both episodes alike: equal rewards, no preference in the group
    assert samples[0].metrics["reward"] == samples[1].metrics["reward"]
    assert [s.advantage for s in samples] == [0.0, 0.0] and samples[0].group_id == samples[1].group_id
