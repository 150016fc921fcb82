"""GRPO on trajectories recorded by the gateway, top to bottom.

Launch it with ``rlgate train --config FILE.yaml`` (any Hugging Face checkpoint) or see
it run in ``rlgate demo``. One optimisation step:

1. collect ``groups_per_step`` GRPO groups from the rollout runner (agents talking to the
   gateway), dropping samples whose oldest generated token is more than
   ``max_staleness`` policy versions behind;
2. advantages: each sample's reward minus its group's mean (optionally / std);
3. forward + backward over micro-batches (gradient accumulation), PPO-clip loss with the
   ratio against the proximal policy (the trainer's own logprobs at the start of the step)
   and each token weighted by the capped ratio of those to the *recorded* behaviour logprobs
   — decoupled PPO — plus an optional KL to a frozen reference;
4. gradient clipping, AdamW step;
5. push the weights to the serving policy (colocated copy or remote checkpoint), which
   bumps the weight version, and admit one more step's worth of episodes.

Departures from textbook GRPO:

* loss normalisation is per token over the whole step (sum of token losses / number of
  generated tokens in the step, DAPO-style), not per sequence then per group;
* advantages are only mean-centred by default (no std scaling, as in Dr. GRPO);
* one optimiser update per batch by default, whose ratio is then exactly 1 (``grpo.proximal:
  trainer``, the default): trainer and engine need not agree, and with bfloat16 compute against a
  float32 engine they differed by 0.07-0.11 nats per token on SmolLM2 (``behav_logprob_abs_err``);
  the capped pi_trainer / pi_engine weight corrects that instead. ``proximal: recorded`` takes an
  on-policy token's ratio against the engine's logprob, as before 2026-12-06: the clip then bound
  5-17% of on-policy tokens (``clip_fraction``) and the sums task fell back (docs/training.md §3);
* samples without a reward (e.g. a side request off the rewarded branch) are left out of
  the step and counted, not trained on as reward 0;
* the policy runs with dropout off (``eval()`` mode, gradients still flow), so for
  on-policy samples the recomputed logprobs match the recorded ones;
* samples are whatever the gateway exported: ``individual`` (one per LLM call) or
  ``concat`` (one per conversation branch with loss on every generated segment).

The loop never spins without progress: ``group_size < 2`` is refused up front (a group
of one has no advantage), and ``max_dropped_groups_in_a_row`` dropped groups in a row
(failed, stale or unrewarded episodes) raise :class:`TrainingStalled` with the reasons.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rlgate.rollout.errors import RunError
from rlgate.rollout.runner import Allowance, Group, RolloutRunner
from rlgate.train.config import GRPOConfig
from rlgate.train.forward import PolicyForward, can_share, plan_chunks
from rlgate.train.loss import group_advantages, kl_penalty, policy_loss
from rlgate.train.sync import WeightSync
from rlgate.trajectory.batch import StepBatch, lag
from rlgate.trajectory.export import to_padded_tensors
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.train")


class TrainingStalled(RunError):
    """Groups keep being dropped: the loop would never complete a step."""


@dataclass
class StepStats:
    kept_groups: int = 0
    dropped_stale: int = 0  # samples dropped for being too stale
    dropped_groups: int = 0  # groups left with < 2 episodes
    unrewarded: int = 0  # samples without a reward (left out)
    failed_episodes: int = 0
    episode_rewards: list[float] = field(default_factory=list)
    generated_tokens: int = 0
    drop_reasons: list[str] = field(default_factory=list)  # one line per dropped group
    resampled_groups: int = 0  # groups without reward variance replaced (grpo.dynamic_sampling)
    all_rewards: list[float] = field(default_factory=list)  # every played episode's, resampled groups' included
    truncated_episodes: int = 0  # played episodes with a reply cut by max_tokens (grpo.truncated_reward)


class GRPOTrainer:
    """Owns the policy being trained, its optimiser and an optional frozen reference."""

    def __init__(self, model: Any, config: GRPOConfig, ref_model: Any = None, *, total_steps: int | None = None,
                 steps_done: int = 0, autocast: str | None = None) -> None:
        """``ref_model``: the frozen KL reference (default: a copy of ``model`` as given). ``total_steps``:
        the run's length, for ``lr_schedule`` (None: the schedule never decays); ``steps_done``: steps a
        resumed run has already taken (where the schedule continues); ``autocast``: ``"bfloat16"`` runs
        the forward and backward passes under ``torch.autocast`` (weights and AdamW stay as they are:
        ``train.dtype: mixed``)."""
        self.config = config
        self.total_steps = total_steps
        self.steps_done = steps_done
        self.device = torch.device(config.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device)
        # Dropout off: the trainer's logprobs must be those of the policy that sampled
        # (eval() changes no gradient flow; it only disables stochastic layers).
        self.model.eval()
        if getattr(self.model, "is_activation_checkpointing", None) or (
                not hasattr(self.model, "is_activation_checkpointing")
                and getattr(self.model, "is_gradient_checkpointing", False)):
            _train_mode_without_dropout(self.model)  # transformers checkpoints only in training mode
        self.ref_model = None
        if config.kl_coef > 0:
            self.ref_model = (ref_model if ref_model is not None else copy.deepcopy(model)).to(self.device).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
        )
        share = config.share_prompt
        if share:
            share, why = can_share(self.model)
            if not share:
                log.info("grpo.share_prompt: off for this model (%s): every sample runs its whole prompt", why)
        self.forward = PolicyForward(trim_logits=config.trim_logits, share=share,
                                     autocast=torch.bfloat16 if autocast == "bfloat16" else None)

    def lr_factor(self, k: int) -> float:
        """The learning rate of training step ``k`` (0-based), as a fraction of ``lr``: linear warmup over
        ``warmup_steps`` steps, then ``lr_schedule`` (constant, or linear / cosine decay to 0 at the last step)."""
        cfg = self.config
        if k < cfg.warmup_steps:
            return (k + 1) / (cfg.warmup_steps + 1)
        if cfg.lr_schedule == "constant" or not self.total_steps:
            return 1.0
        span = max(self.total_steps - cfg.warmup_steps, 1)
        progress = min((k - cfg.warmup_steps) / span, 1.0)
        if cfg.lr_schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self, samples: list[Sample], group_ids: list[str], current_version: int) -> dict[str, float]:
        """One optimisation step on exported samples; returns metrics."""
        cfg = self.config
        lr = cfg.lr * self.lr_factor(self.steps_done)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # ------------------------------------------------------------------ advantages
        rewards = [0.0 if s.reward is None else float(s.reward) for s in samples]
        advantages = group_advantages(rewards, group_ids, scale_by_std=cfg.scale_adv_by_std)
        temps = torch.tensor([s.temperature for s in samples])
        oldest = [s.min_version for s in samples]
        stale = torch.tensor([v is not None and v < current_version for v in oldest])
        batch = to_padded_tensors(samples, pad_token_id=cfg.pad_token_id)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        total_tokens = int(batch["loss_mask"].sum())
        # ------------------------------------------------------------------ proximal logprobs
        # The proximal policy is the trainer's at the start of the step: what a stale sample's ratio is taken
        # against (decoupled PPO), and every sample's with grpo.proximal "trainer". With one update per batch
        # that is the current policy, so each chunk's own forward (detached) is it and no extra forward runs;
        # several updates per batch move the weights between chunks, so it is computed once up front.
        prox_current = cfg.minibatches == 1
        prox_all = None
        if (stale.any() or cfg.proximal == "trainer") and not prox_current:
            prox_all = self._no_grad_logprobs(self.model, batch, temps)
        ref_all = self._no_grad_logprobs(self.ref_model, batch, temps) if self.ref_model is not None else None
        # no advantage anywhere and nothing else to optimise (no KL): no update, only the entropy is measured
        no_signal = bool(cfg.skip_no_signal_updates and ref_all is None and not advantages.any())
        # ------------------------------------------------------------------ updates
        n = len(samples)
        order = torch.arange(n)
        per_update = math.ceil(n / cfg.minibatches)
        metrics: dict[str, float] = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "kl_ref": 0.0,
                                     "grad_norm": 0.0, "behav_logprob_abs_err": 0.0, "nonfinite_updates": 0.0}
        err_sum, err_n, updates = 0.0, 0, 0
        ent_sum = 0.0
        lengths = batch["attention_mask"].sum(1).cpu()
        computed = real = 0  # token positions the forward passes ran (with padding / without; a shared prompt once)
        for start in range(0, n, per_update):
            idx = order[start:start + per_update]
            update_tokens = int(batch["loss_mask"][idx].sum())
            # forward chunks: a group's shared prompt once (grpo.share_prompt), micro-batches of similar
            # lengths each cut to its longest sample; no update's gradient changes (it sums over its chunks)
            for chunk in plan_chunks(batch, idx, cfg.micro_batch_size, self.forward.share):
                mb, width = chunk.rows, chunk.width
                computed += (width - chunk.prefix) * len(mb) + (chunk.prefix if chunk.first else 0)
                sub = {k: v[mb.to(v.device), :width] for k, v in batch.items() if k != "rewards"}
                real += int(sub["attention_mask"][:, chunk.prefix:].sum()) + (chunk.prefix if chunk.first else 0)
                mask = sub["loss_mask"]
                ent: list[torch.Tensor] = []  # each sample is in exactly one update
                with torch.set_grad_enabled(not no_signal):
                    logp = self.forward.logprobs(self.model, batch, chunk, temps[mb].to(self.device), ent)
                if ent:
                    ent_sum += float((ent[0] * mask).sum())
                old = sub["logprobs"]
                with torch.no_grad():  # do recorded behaviour logprobs match the trainer's?
                    on_mask = mask & ~stale[mb].to(self.device).unsqueeze(-1)
                    err_sum += float(((logp - old).abs() * on_mask).sum())
                    err_n += int(on_mask.sum())
                if no_signal:
                    continue
                prox = None
                start_logp = logp.detach() if prox_current else None if prox_all is None else prox_all[mb, :width]
                if start_logp is not None:
                    if cfg.proximal == "trainer":
                        prox = start_logp
                    elif stale[mb].any():
                        # on-policy samples use the recorded logprobs as proximal policy too
                        on = ~stale[mb].to(self.device)
                        prox = torch.where(on.unsqueeze(-1), old, start_logp)
                loss, st = policy_loss(
                    logp, old, advantages[mb].to(self.device), mask, logp_prox=prox,
                    clip_low=cfg.clip_low, clip_high=cfg.clip_high, importance_cap=cfg.importance_cap,
                    num_tokens=max(update_tokens, 1),
                )
                if ref_all is not None:
                    kl = kl_penalty(logp, ref_all[mb, :width], mask, num_tokens=max(update_tokens, 1))
                    loss = loss + cfg.kl_coef * kl
                    # kl is already this micro-batch's share of the update's token mean
                    metrics["kl_ref"] += float(kl.detach()) * max(update_tokens, 1) / max(total_tokens, 1)
                # the chunks of one shared prompt backpropagate into its graph in turn: the last frees it
                loss.backward(retain_graph=bool(chunk.prefix) and not chunk.last)
                w = float(mask.sum()) / max(total_tokens, 1)
                metrics["loss"] += float(loss.detach())  # micro-batch losses sum to the update's loss
                metrics["clip_fraction"] += st["clip_fraction"] * w
                metrics["approx_kl"] += st["approx_kl"] * w
            if no_signal:
                continue
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            if math.isfinite(float(grad_norm)) and math.isfinite(metrics["loss"]):
                self.optimizer.step()
            else:  # a NaN / inf loss or gradient: this update is not applied (weights and AdamW moments kept)
                metrics["nonfinite_updates"] += 1
                log.error("training step: non-finite loss or gradient norm (%s): update skipped", float(grad_norm))
            self.optimizer.zero_grad(set_to_none=True)
            metrics["grad_norm"] += float(grad_norm)
            updates += 1
        metrics["grad_norm"] /= max(updates, 1)
        metrics["loss"] /= max(updates, 1)
        metrics["behav_logprob_abs_err"] = err_sum / max(err_n, 1)
        metrics["tokens"] = float(total_tokens)
        metrics["pad_fraction"] = 1.0 - real / max(computed, 1)  # of the positions trained on
        # positions the forward passes ran, as a fraction of the batch's tokens (< 1: shared prompts ran once)
        metrics["forward_fraction"] = computed / max(float(lengths.sum()), 1.0)
        metrics["samples"] = float(n)
        metrics["stale_samples"] = float(stale.sum())
        metrics["adv_abs_mean"] = float(advantages.abs().mean())
        # groups whose rewards are all equal carry no learning signal (every advantage 0)
        by_group: dict[str, set[float]] = {}
        for gid, r in zip(group_ids, rewards, strict=True):
            by_group.setdefault(gid, set()).add(r)
        metrics["groups"] = float(len(by_group))
        metrics["zero_variance_groups"] = float(sum(1 for rs in by_group.values() if len(rs) == 1))
        metrics["entropy"] = ent_sum / max(total_tokens, 1)  # mean over generated tokens, nats
        metrics["lr"] = lr
        # 0: a step without signal applied no update (skip_no_signal_updates); non-finite ones are not applied either
        metrics["updates"] = float(updates - metrics["nonfinite_updates"])
        gen = [s.generated_tokens for s in samples]
        metrics["completion_len_mean"] = sum(gen) / max(len(gen), 1)
        metrics["completion_len_max"] = float(max(gen, default=0))
        self.steps_done += 1
        return metrics

    @torch.no_grad()
    def _no_grad_logprobs(self, model: Any, batch: dict[str, torch.Tensor], temps: torch.Tensor) -> torch.Tensor:
        """Logprobs of every position of ``batch`` (0.0 on padding), in the step's forward chunks."""
        n, full = batch["input_ids"].shape
        out = torch.zeros((n, full), dtype=torch.float32, device=self.device)
        for chunk in plan_chunks(batch, torch.arange(n), self.config.micro_batch_size, self.forward.share):
            rows = chunk.rows.to(self.device)
            out[rows, :chunk.width] = self.forward.logprobs(model, batch, chunk, temps[chunk.rows].to(self.device)).float()
        return out


def _train_mode_without_dropout(model: Any) -> None:
    """Training mode (gradient checkpointing runs only there) with every dropout off, so the trainer's
    logprobs stay those of the policy that sampled."""
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.eval()
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


# =============================================================================== the loop


@dataclass
class LoopState:
    """What the loop knows between steps (saved in checkpoints)."""

    step: int = 0
    version: int = 0  # weight version the gateway serves
    history: list[dict[str, float]] = field(default_factory=list)
    # a step that finished while the loop was being cancelled (Ctrl-C, SIGTERM): counted in ``step`` and
    # ``history``, but ``on_step`` never saw it; the caller logs it (not saved in checkpoints)
    unreported: StepResult | None = None


def filter_group(group: Group, version: int, max_staleness: int, stats: StepStats, batch: StepBatch, *,
                 resample: bool = False, truncated_reward: float | None = None) -> bool:
    """Add the samples of a group's good, fresh-enough episodes to ``batch`` (under the group's id, each
    episode with its lag); False when the group was left out. ``resample``: a group whose samples all
    earned the same reward (no learning signal) is set aside (``stats.resampled_groups``).
    ``truncated_reward``: the reward of an episode with a reply cut by max_tokens, in place of its own
    (its samples' rewards are rewritten: they are what is trained on)."""
    episodes = []
    lags = []
    for e in group.episodes:
        if not e.ok:
            stats.failed_episodes += 1
            continue
        behind = lag(e.samples, version)
        if behind > max_staleness:
            stats.dropped_stale += len(e.samples)
            continue
        episodes.append(e)
        lags.append(behind)
    rewarded: list[list[Sample]] = []
    rewards: list[float] = []
    unrewarded = tokens = 0
    for e in episodes:
        tokens += e.generated_tokens
        kept = [s for s in e.samples if s.reward is not None]  # off a rewarded branch: no signal to learn from
        reward = e.reward or 0.0
        if any(s.finish_reason == "length" for s in e.samples):
            stats.truncated_episodes += 1
            if truncated_reward is not None:
                reward = truncated_reward
                for s in kept:
                    s.reward = truncated_reward
        rewards.append(reward)
        unrewarded += len(e.samples) - len(kept)
        rewarded.append(kept)
    stats.unrewarded += unrewarded
    stats.all_rewards += rewards
    samples = [s for kept in rewarded for s in kept]
    if resample and len(episodes) >= 2 and len({smp.reward for smp in samples}) == 1:
        stats.resampled_groups += 1
        return False
    if len(episodes) < 2 or not samples:
        stats.dropped_groups += 1
        stats.drop_reasons.append(
            f"{group.group_id}: {len(group.episodes) - len(group.ok)} failed, "
            f"{len(group.ok) - len(episodes)} stale, {unrewarded} unrewarded samples")
        return False
    for kept, behind in zip(rewarded, lags, strict=True):
        if kept:
            batch.add(kept, group.group_id, lag=behind)
    stats.kept_groups += 1
    stats.episode_rewards += rewards
    stats.generated_tokens += tokens
    return True


async def _next_group(queue: asyncio.Queue[Group], producer: asyncio.Task[None]) -> Group:
    """The next finished group; raises if the producer died (or ran out) instead of hanging."""
    if not queue.empty():
        return queue.get_nowait()
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        getter.cancel()
        raise
    if getter.done():
        return getter.result()
    getter.cancel()
    producer.result()  # surfaces the producer's error
    raise RuntimeError("the prompt iterator ran out before the step was complete")


@dataclass
class StepResult:
    """What ``on_step`` sees after each step."""

    metrics: dict[str, float]  # the step's metrics (docs/training.md, "Metrics per step")
    samples: list[Sample]  # the samples trained on, stamped with group_id, episode and step


class _CancelledAfterStep(Exception):
    """The loop was cancelled while a training step ran; the step finished (its ``metrics``)."""

    def __init__(self, metrics: dict[str, float]) -> None:
        super().__init__("cancelled after a finished training step")
        self.metrics = metrics


async def _train_step(loop: asyncio.AbstractEventLoop, pool: concurrent.futures.Executor, trainer: GRPOTrainer,
                      samples: list[Sample], group_ids: list[str], version: int) -> dict[str, float]:
    """``trainer.step`` on the training thread. Cancelled meanwhile (Ctrl-C), it waits for the step
    to finish: the weights then hold an applied update, which ``_CancelledAfterStep`` carries to the
    caller (a step that failed re-raises the cancellation)."""
    future = loop.run_in_executor(pool, trainer.step, samples, group_ids, version)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        if future.cancelled() or future.exception() is not None:
            raise
        raise _CancelledAfterStep(future.result()) from None


async def grpo_loop(
    *,
    trainer: GRPOTrainer,
    runner: RolloutRunner,
    sync: WeightSync,
    prompts: Iterator[tuple[str, dict[str, Any]]],
    steps: int,
    state: LoopState | None = None,
    on_step: Callable[[LoopState, StepResult], Awaitable[None] | None] | None = None,
) -> LoopState:
    """Run ``steps`` GRPO steps; ``on_step`` sees the state and the step's result after each.

    Cancelled (Ctrl-C) while a training step runs, the loop lets the step finish and counts
    it in ``state.step`` before re-raising, so the trainer's weights match ``state``.
    """
    cfg = trainer.config
    if runner.group_size < 2:
        raise RunError(f"rollout.group_size is {runner.group_size}: GRPO compares episodes within a group, "
                       "so a group needs at least 2 episodes")
    state = state or LoopState()
    episodes_per_step = cfg.groups_per_step * runner.group_size
    allowance = runner.allowance or Allowance()
    runner.allowance = allowance
    # ---------------------------------------------------------------- admission
    # Rollout may run ahead of training by max_staleness versions: admit that many steps.
    # Gateway capacity is always granted before the runner's own allowance, so an admitted
    # episode never waits for the server (and evaluations granting their own never starve).
    first = (cfg.max_staleness + 1) * episodes_per_step
    await runner.client.grant_capacity(first)
    await allowance.grant(first)
    queue: asyncio.Queue[Group] = asyncio.Queue()

    async def produce() -> None:
        async for g in runner.groups(prompts, max_groups_in_flight=(cfg.max_staleness + 1) * cfg.groups_per_step):
            await queue.put(g)

    producer = asyncio.create_task(produce())
    # Training runs off the event loop (rollout goes on when max_staleness > 0), always on
    # the same thread: torch's OpenMP pool is per thread, and hopping threads costs.
    loop = asyncio.get_running_loop()
    train_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlgate-train")
    dropped_in_a_row = 0
    resample_cap = cfg.groups_per_step if cfg.max_resampled_groups is None else cfg.max_resampled_groups
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            # ------------------------------------------------------------ 1. collect groups
            stats = StepStats()
            batch = StepBatch()
            while stats.kept_groups < cfg.groups_per_step:
                group = await _next_group(queue, producer)
                resampled = stats.resampled_groups
                kept = filter_group(group, state.version, cfg.max_staleness, stats, batch,
                                    resample=cfg.dynamic_sampling and resampled < resample_cap,
                                    truncated_reward=cfg.truncated_reward)
                if stats.resampled_groups > resampled:  # no signal: played again with a fresh group
                    await runner.client.grant_capacity(runner.group_size)
                    await allowance.grant(runner.group_size)
                    continue
                dropped_in_a_row = 0 if kept else dropped_in_a_row + 1
                if cfg.max_dropped_groups_in_a_row and dropped_in_a_row >= cfg.max_dropped_groups_in_a_row:
                    raise TrainingStalled(
                        f"{dropped_in_a_row} groups in a row were dropped (grpo.max_dropped_groups_in_a_row); "
                        "a group needs 2 successful, fresh episodes with rewarded samples. Last ones: "
                        + "; ".join(stats.drop_reasons[-3:]))
                # a dropped group is replaced whole; otherwise only its failed episodes
                replace = runner.group_size if not kept else sum(1 for e in group.episodes if not e.ok)
                if replace:  # dropped episodes do not count against the allowance
                    await runner.client.grant_capacity(replace)
                    await allowance.grant(replace)
            samples = batch.samples
            for sample in samples:
                sample.step = state.step + 1
                sample.train_version = state.version  # what the viewer judges staleness against
            t_rollout = time.perf_counter() - t0
            # ------------------------------------------------------------ 2-4. optimise
            t1 = time.perf_counter()
            try:
                metrics = await _train_step(loop, train_thread, trainer, samples, batch.group_ids, state.version)
            except _CancelledAfterStep as done:  # the update was applied: the weights are those of this step
                state.step += 1
                _finish_metrics(done.metrics, state, stats, batch, t0, t_rollout, time.perf_counter() - t1, 0.0)
                state.history.append(done.metrics)
                state.unreported = StepResult(done.metrics, samples)
                raise asyncio.CancelledError from None
            t_train = time.perf_counter() - t1
            state.step += 1  # the weights are those of this step from here on
            # ------------------------------------------------------------ 5. weight sync + admission
            t2 = time.perf_counter()
            try:
                if metrics.get("updates", 1.0) > 0:  # a step without signal changed no weight: nothing to push
                    state.version = await sync.push(trainer.model)
                t_sync = time.perf_counter() - t2
                await runner.client.grant_capacity(episodes_per_step)
                await allowance.grant(episodes_per_step)
            except asyncio.CancelledError:  # stopped after the update: the step is kept, as above
                _finish_metrics(metrics, state, stats, batch, t0, t_rollout, t_train, time.perf_counter() - t2)
                state.history.append(metrics)
                state.unreported = StepResult(metrics, samples)
                raise
            _finish_metrics(metrics, state, stats, batch, t0, t_rollout, t_train, t_sync)
            state.history.append(metrics)
            if on_step is not None:
                out = on_step(state, StepResult(metrics, samples))
                if asyncio.iscoroutine(out):
                    await out
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        train_thread.shutdown(wait=True)
    return state


def _finish_metrics(metrics: dict[str, float], state: LoopState, stats: StepStats, batch: StepBatch, t0: float,
                    t_rollout: float, t_train: float, t_sync: float) -> None:
    """Add the loop's own numbers to a finished step's ``metrics`` (the trainer's), and the batch's
    (trajectory/batch.py: staleness, mean sample reward) that the trainer's do not have."""
    metrics.update({k: v for k, v in batch.metrics().items() if k not in metrics})
    rewards = stats.episode_rewards
    metrics.update({
        "step": float(state.step),
        "version": float(state.version),
        "reward": sum(rewards) / max(len(rewards), 1),
        "episodes": float(len(rewards)),
        "failed_episodes": float(stats.failed_episodes),
        "dropped_stale_samples": float(stats.dropped_stale),
        "dropped_groups": float(stats.dropped_groups),
        "resampled_groups": float(stats.resampled_groups),
        # every played episode's mean reward (with dynamic_sampling, ``reward`` is over the kept groups only)
        "reward_all": sum(stats.all_rewards) / max(len(stats.all_rewards), 1),
        "unrewarded_samples": float(stats.unrewarded),
        "truncated_episodes": float(stats.truncated_episodes),  # played ones, resampled groups' included
        "generated_tokens": float(stats.generated_tokens),
        "rollout_s": t_rollout, "train_s": t_train, "sync_s": t_sync,
        "step_s": time.perf_counter() - t0,
    })
    # per wall second of the step, not of ``rollout_s``: with rollouts overlapping training (max_staleness > 0)
    # the wait for a batch generated during the previous step can be ~0 s, and tokens / wait is then absurd
    metrics["tokens_per_s"] = stats.generated_tokens / max(metrics["step_s"], 1e-9)
