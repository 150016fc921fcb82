"""TRL's ``AsyncGRPOTrainer`` with rlgate as its rollout worker and its weight transfer.

::

    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
    from rlgate.integrations.trl_async import AsyncAgentRollout

    with AsyncAgentRollout.open(MathAgent(max_tokens=8), model_dir, prompts=dataset["prompt"],
                                num_generations=4, data_for=items.__getitem__) as rollout:
        trainer = AsyncGRPOTrainer(model=str(model_dir), args=AsyncGRPOConfig(num_generations=4, ...),
                                   train_dataset=dataset, rollout_worker=rollout, weight_transfer=rollout)
        trainer.train()

The contract, read from TRL 1.16's ``trl/experimental/async_grpo``: the trainer drains
``rollout_buffer``, a queue of scored ``RolloutSample``\\ s (``input_ids``, ``completion_mask`` 1 on
the tokens the loss is taken over, ``old_log_probs`` per token, one ``advantage`` per sample,
``model_version``, ``group_id``, ``metrics``), drops a sample whose ``model_version`` is more than
``max_staleness`` behind its own, and drains ``metrics_queue`` when it logs. It calls ``start()``
once on train begin, after the first weight sync, and ``check_health(s)`` while it waits for
samples. Every ``weight_sync_steps`` it calls ``pause()``, ``send_weights(iterator of (name,
tensor))``, ``resume()``, then ``update_model_version(v)`` with its version ``v`` (0 before the
first sync, +1 per sync).

Here (one object is both the worker and the transfer):

* the worker plays groups of ``num_generations`` agent episodes per prompt (prompts cycled in
  order, ``groups_in_flight`` groups at once), each episode in its own gateway session
  (``integrations/episodes.py``); each completed episode becomes one sample: its conversation chain
  (first prompt's ids then every later token; ``completion_mask`` 1 exactly on the generated
  tokens; ``old_log_probs`` the engine's recorded logprobs there, 0.0 elsewhere);
* its ``advantage`` is computed per group as TRL's own worker does: the rewards of the group's
  scored episodes, ``(r - mean) / (std + 1e-8)`` (population std); an episode whose agent
  returned no reward gets advantage 0;
* ``model_version`` is the TRL version whose weights generated the chain's *oldest* token: each
  token carries the rlgate weight version it was sampled under, and every push here pairs an
  engine version with the TRL version the trainer announces next (in-process they are equal);
* a **failed episode** (the agent raised, timed out, made no LLM call or generated nothing) has no
  tokens to train on: it is left out of its group's advantage statistics and queues no sample
  (TRL's worker likewise drops rows without a trained token), and it is counted
  (``failed``; ``rlgate/failed_total`` in TRL's logs). More than ``max_consecutive_failures`` in a
  row stop the worker; the trainer's next ``check_health`` raises with the cause;
* the transfer collects the ``(name, tensor)`` stream and pushes it through the same path as
  rlgate's own trainer (``train/sync.py``): copied in place into the in-process engine, or saved as
  a checkpoint and loaded through ``POST /rl/update_weights`` for a gateway elsewhere
  (``gateway.url``). ``pause`` and ``resume`` do nothing: rlgate swaps weights between two decoding
  steps and re-prefills the requests in flight, whose later tokens carry the new version.

Set ``AsyncGRPOConfig.temperature`` to the temperature the agent samples at (TRL scores the
samples' tokens at its own temperature). TRL 1.16's trainer needs a CUDA GPU as shipped
(docs/integrations.md says where and what the CPU test swaps).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from multiprocessing.queues import Queue as MPQueue
from pathlib import Path
from typing import Any

from rlgate.integrations.episodes import Chain, LoopThread, play
from rlgate.integrations.trl import close_agent, default_data_for, open_agent
from rlgate.rollout.runner import RolloutRunner
from rlgate.train.config import GatewaySettings, RolloutSettings
from rlgate.train.gateway import OpenGateway

__all__ = ["AsyncAgentRollout", "group_advantages", "rollout_sample"]

logger = logging.getLogger(__name__)


def group_advantages(rewards: Sequence[float | None]) -> list[float]:
    """One advantage per episode of a group, as TRL's ``AsyncRolloutWorker`` computes it: over the
    scored episodes, ``(r - mean) / (std + 1e-8)`` with the population std; 0 for an unscored one."""
    scored = [r for r in rewards if r is not None and not math.isnan(r)]
    if not scored:
        return [0.0] * len(rewards)
    mean = sum(scored) / len(scored)
    std = math.sqrt(sum((r - mean) ** 2 for r in scored) / len(scored))
    return [0.0 if r is None or math.isnan(r) else (r - mean) / (std + 1e-8) for r in rewards]


def rollout_sample(chain: Chain, *, advantage: float, model_version: int, group_id: int, prompt: Any,
                   metrics: dict[str, float]) -> Any:
    """TRL's ``RolloutSample`` for a completed episode's chain (see the module docstring)."""
    import numpy as np
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    n = len(chain.prompt_ids)
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    return RolloutSample(
        prompt=messages, completion=[],  # the text is in the gateway's store (session_id), not re-rendered here
        input_ids=np.asarray(chain.prompt_ids + chain.response_ids, dtype=np.int64),
        completion_mask=np.asarray([0] * n + chain.response_mask, dtype=np.int64),
        old_log_probs=np.asarray([0.0] * n + chain.response_logprobs, dtype=np.float32),
        advantage=float(advantage), model_version=int(model_version), group_id=int(group_id), metrics=metrics)


@dataclass
class _StreamedWeights:
    """TRL's weight stream as the model :class:`~rlgate.train.sync.WeightSync` pushes: its
    ``state_dict`` for the in-process engine, a checkpoint directory for a gateway elsewhere."""

    state: dict[str, Any]
    config_dir: Path  # the starting checkpoint: config.json, generation_config.json

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def save_pretrained(self, path: str | Path, safe_serialization: bool = True) -> None:
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})
        for name in ("config.json", "generation_config.json"):
            if (self.config_dir / name).is_file():
                shutil.copyfile(self.config_dir / name, out / name)


@dataclass
class AsyncAgentRollout:
    """A ``rollout_worker`` and ``weight_transfer`` for TRL's ``AsyncGRPOTrainer`` (see the module
    docstring). Build it with :meth:`open` (``start`` is TRL's: it starts the worker);
    :meth:`close` stops its gateway."""

    gateway: OpenGateway
    runner: RolloutRunner
    loop: LoopThread
    prompts: list[Any]
    num_generations: int
    model_dir: Path
    data_for: Callable[[Any], dict[str, Any]] = default_data_for
    groups_in_flight: int = 2
    # TRL's protocol types both queues as either kind; these are thread queues (the worker is a thread)
    rollout_buffer: queue.Queue[Any] | MPQueue[Any] = field(default_factory=queue.Queue)
    metrics_queue: queue.Queue[Any] | MPQueue[Any] = field(default_factory=lambda: queue.Queue(maxsize=4096))
    pushes: list[tuple[int, int]] = field(default_factory=list)  # (TRL version, engine version) per push
    episodes: int = 0  # played so far
    failed: int = 0  # of them, failed (no sample)
    queued: int = 0  # samples put on rollout_buffer
    dropped_chains: int = 0  # forked conversations not sent (one sample per episode)
    _trl_version: dict[int, int] = field(default_factory=dict)  # engine version -> TRL version
    _pending_engine_version: int | None = None  # pushed, not yet announced by update_model_version
    _producer: Future[None] | None = None
    _progress_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, agent: Any, model: str | Path, *, prompts: Sequence[Any], num_generations: int,
              data_for: Callable[[Any], dict[str, Any]] = default_data_for, gateway: GatewaySettings | None = None,
              rollout: RolloutSettings | None = None, groups_in_flight: int = 2, queue_maxsize: int = 1024,
              out_dir: str | Path = "runs/trl-async") -> AsyncAgentRollout:
        """Open the gateway serving ``model`` (the checkpoint directory TRL starts from) and the runner
        that plays ``agent`` (an rlgate agent: ``run(data, *, base_url, api_key)``) on ``prompts``
        (e.g. ``train_dataset["prompt"]``; ``data_for(prompt)`` is an episode's ``data``),
        ``num_generations`` episodes per prompt (AsyncGRPOConfig's). ``gateway``, ``rollout`` and ``out_dir`` are
        :meth:`~rlgate.integrations.trl.TRLRollout.start`'s; ``queue_maxsize`` bounds the samples
        waiting for the trainer (the worker waits when it is full)."""
        if not prompts:
            raise ValueError("prompts is empty: the worker needs at least one prompt to play")
        if num_generations < 1 or groups_in_flight < 1:
            raise ValueError("num_generations and groups_in_flight must be at least 1")
        opened, runner, loop = open_agent(agent, model, gateway=gateway, rollout=rollout, out_dir=out_dir)
        return cls(opened, runner, loop, list(prompts), num_generations, Path(model), data_for, groups_in_flight,
                   queue.Queue(maxsize=queue_maxsize))

    @property
    def url(self) -> str:
        return self.gateway.url

    # ------------------------------------------------------------------ RolloutWorkerProtocol

    def start(self) -> None:
        """Start producing samples (TRL calls it once, after the first weight sync; idempotent)."""
        if self._producer is None:
            self._progress_at = time.time()
            self._producer = asyncio.run_coroutine_threadsafe(self._produce(), self.loop.loop)

    def stop(self) -> None:
        """Stop producing (episodes in flight are cancelled; samples already queued stay)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        producer.cancel()
        try:
            producer.result(timeout=60)
        except CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - the trainer is done; say why the worker had stopped
            logger.warning("the rlgate rollout worker had stopped: %r", exc)

    def update_model_version(self, model_version: int) -> None:
        with self._lock:
            if self._pending_engine_version is not None:
                self._trl_version[self._pending_engine_version] = int(model_version)
                self.pushes.append((int(model_version), self._pending_engine_version))
                self._pending_engine_version = None

    def check_health(self, stale_after_s: float) -> None:
        producer = self._producer
        if producer is not None and producer.done():
            exc = producer.exception() if not producer.cancelled() else None
            raise RuntimeError(f"the rlgate rollout worker stopped: {exc!r}") from exc
        age = time.time() - self._progress_at
        if producer is not None and age > stale_after_s:
            raise RuntimeError(f"the rlgate rollout worker's loop has not run for {age:.0f} s (> {stale_after_s:.0f} s)")

    # ------------------------------------------------------------------ WeightTransferProtocol

    def init_weight_transfer(self) -> None:
        """Nothing to set up: weights go through the gateway's own sync path."""

    def pause(self) -> None:
        """Nothing to do: the engine swaps weights between two decoding steps."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Push the ``(name, tensor)`` stream to the serving engine; its version goes up by one."""
        weights = _StreamedWeights({name: tensor.detach() for name, tensor in iterator}, self.model_dir)
        version = int(self.loop.run(self.gateway.sync.push(weights)))
        with self._lock:
            self._pending_engine_version = version

    def resume(self) -> None:
        """Nothing to do (see :meth:`pause`)."""

    def destroy(self) -> None:
        """Nothing to release until :meth:`close`."""

    # ------------------------------------------------------------------ producing

    async def _produce(self) -> None:
        work = iter(enumerate(itertools.cycle(self.prompts)))
        async with asyncio.TaskGroup() as lanes:
            for _ in range(self.groups_in_flight):
                lanes.create_task(self._lane(work))
            lanes.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        """Tick while the worker's event loop runs (TRL's worker ticks its heartbeat the same way): a
        slow episode is bounded by ``episode_timeout``, a blocked loop is what ``check_health`` catches."""
        while True:
            self._progress_at = time.time()
            await asyncio.sleep(1.0)

    async def _lane(self, work: Iterator[tuple[int, Any]]) -> None:
        while True:
            group_id, prompt = next(work)
            t0 = time.monotonic()
            data = self.data_for(prompt)
            chains = await play(self.runner, [(f"trl-async-{group_id}", k, data) for k in range(self.num_generations)])
            failed = sum(1 for c in chains if not c.ok)
            dropped = sum(c.dropped_chains for c in chains)
            self.episodes += len(chains)
            self.failed += failed
            self.dropped_chains += dropped
            self._metric({"rlgate/episodes_total": float(len(chains)), "rlgate/failed_total": float(failed),
                          "rlgate/dropped_chains_total": float(dropped), "rlgate/group_s": time.monotonic() - t0})
            for sample in self._samples(group_id, prompt, chains):
                await self._put(sample)

    def _samples(self, group_id: int, prompt: Any, chains: list[Chain]) -> list[Any]:
        ok = [c for c in chains if c.ok]
        rewards = [c.reward for c in ok]
        scored = [r for r in rewards if r is not None]
        std = float(math.sqrt(sum((r - sum(scored) / len(scored)) ** 2 for r in scored) / len(scored))) if scored \
            else math.nan
        out = []
        for chain, advantage in zip(ok, group_advantages(rewards), strict=True):
            reward = math.nan if chain.reward is None else float(chain.reward)
            out.append(rollout_sample(chain, advantage=advantage, model_version=self._version_of(chain),
                                      group_id=group_id, prompt=prompt,
                                      metrics={"reward": reward, "reward_std": std}))
        return out

    def _version_of(self, chain: Chain) -> int:
        """The TRL version of the weights that generated the chain's oldest token (0 if unknown)."""
        engine = chain.min_version
        with self._lock:
            return self._trl_version.get(engine, 0) if engine is not None else 0

    async def _put(self, sample: Any) -> None:
        while True:
            try:
                sample.enqueued_at = time.time()
                self.rollout_buffer.put_nowait(sample)
                self.queued += 1
                return
            except queue.Full:  # the trainer is behind: wait for it
                await asyncio.sleep(0.05)

    def _metric(self, values: dict[str, float]) -> None:
        try:
            self.metrics_queue.put_nowait(values)
        except queue.Full:  # the trainer stopped logging; never block the rollout on it
            pass

    # ------------------------------------------------------------------ life

    def close(self) -> None:
        self.stop()
        close_agent(self.gateway, self.runner, self.loop)

    def __enter__(self) -> AsyncAgentRollout:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

