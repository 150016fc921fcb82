"""TRL's ``GRPOTrainer`` with rlgate as its rollout: agents play through rlgate sessions, TRL trains.

::

    from rlgate.integrations.trl import TRLRollout, agent_reward

    rollout = TRLRollout.start(MathAgent(max_tokens=8), model_dir, data_for=items.__getitem__)
    trainer = GRPOTrainer(model=model, args=GRPOConfig(num_generations=4, ...), train_dataset=prompts,
                          reward_funcs=agent_reward, rollout_func=rollout)
    trainer.train()
    rollout.close()

The contract it implements, read from TRL 1.16's ``GRPOTrainer._generate``: ``rollout_func(prompts,
trainer)`` gets the process's slice of prompts (the ``prompt`` column, each repeated
``num_generations`` times by TRL's sampler) and returns one completion per prompt as a dict of
lists: ``prompt_ids``, ``completion_ids``, ``logprobs`` (one per completion token; TRL's
importance-sampling correction reads them), optionally ``env_mask`` (1 on model tokens, 0 on tool /
environment tokens: TRL multiplies it into the loss mask), and any other key, which TRL forwards to
the reward functions as a keyword argument.

Here each prompt is one agent episode (``data_for(prompt)`` is its ``data``) in its own gateway
session; the completion is the episode's conversation chain (``integrations/episodes.py``): its
first prompt's ids, then every token after them, ``env_mask`` 1 exactly on the generated tokens,
and the engine's logprobs there (0.0 on tool / user tokens, which the mask excludes). A multi-turn
episode is thus one sample with the loss on generated tokens only. The agent's reward is returned
as ``rlgate_reward`` and :func:`agent_reward` hands it to TRL as a reward function. An episode that
fails (the agent raised, made no LLM call, generated nothing) still owes TRL a completion: it gets
one masked-out end-of-sequence token, ``env_mask`` 0 (no loss) and reward ``None`` (TRL sums a
missing reward as 0 in the group); ``rlgate_failed`` marks it.

Weights flow back: TRL's model is the source of truth. Before each rollout whose
``trainer.state.global_step`` differs from the last push (the first included), its weights are
pushed to the serving engine: copied in place into the in-process engine
(:class:`~rlgate.train.sync.ColocatedSync`), or saved and loaded through ``POST /rl/update_weights``
for a gateway elsewhere (``gateway.url``: :class:`~rlgate.train.sync.RemoteSync`). The engine's
version goes up by one per push and every generated token carries it (``rlgate_version``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgate.integrations.episodes import Chain, LoopThread, play
from rlgate.rollout.runner import RolloutRunner
from rlgate.train.config import GatewaySettings, RolloutSettings
from rlgate.train.gateway import GatewayPlan, OpenGateway, open_gateway
from rlgate.train.rollout import rollout_runner

__all__ = ["TRLRollout", "agent_reward", "close_agent", "default_data_for", "open_agent", "trl_batch"]


def default_data_for(prompt: Any) -> dict[str, Any]:
    """The agent's ``data`` for a TRL prompt: a dict as is, a JSON object text parsed, a message list
    as ``{"messages": ...}``, any other text as ``{"prompt": ...}``."""
    if isinstance(prompt, dict):
        return dict(prompt)
    if isinstance(prompt, list):
        return {"messages": prompt}
    text = str(prompt)
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
            if isinstance(data, dict):
                return data
        except json.JSONDecodeError:
            pass
    return {"prompt": text}


def agent_reward(prompts: list[Any], completions: list[Any], rlgate_reward: list[float | None],
                 **kwargs: Any) -> list[float | None]:
    """A TRL reward function: the reward each episode's agent returned (None for a failed episode)."""
    return list(rlgate_reward)


@dataclass
class TRLRollout:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` (see the module docstring). Build it with
    :meth:`start`; :meth:`close` stops its gateway."""

    gateway: OpenGateway
    runner: RolloutRunner
    loop: LoopThread
    data_for: Callable[[Any], dict[str, Any]] = default_data_for
    pushes: list[tuple[int, int]] = field(default_factory=list)  # (TRL global step, engine version) per push
    episodes: int = 0  # played so far
    failed: int = 0  # of them, failed
    dropped_chains: int = 0  # forked conversations not returned (TRL takes one sequence per prompt)
    _synced_step: int | None = None
    _calls: int = 0

    @classmethod
    def start(cls, agent: Any, model: str | Path, *, gateway: GatewaySettings | None = None,
              rollout: RolloutSettings | None = None, data_for: Callable[[Any], dict[str, Any]] = default_data_for,
              out_dir: str | Path = "runs/trl") -> TRLRollout:
        """Open the gateway serving ``model`` (a checkpoint directory: TRL's starting weights) and
        the runner that plays ``agent`` (an rlgate agent: ``run(data, *, base_url, api_key)``).

        ``gateway``: rlgate's ``gateway:`` settings (docs/training.md); default an in-process
        gateway on 127.0.0.1 with the local engine. With ``gateway.url`` the gateway runs
        elsewhere and weights go through ``POST /rl/update_weights`` (``gateway.sync_dir``,
        default ``out_dir/sync``, must be readable there). ``rollout``: rlgate's ``rollout:``
        settings, the same object ``rlgate train`` reads (``concurrency``, ``episode_timeout``,
        ``max_consecutive_failures``, ``reward_range``, ``mode``, ``seed`` for the in-process
        engine's sampling, ...); its ``group_size`` is not read (TRL's ``num_generations`` groups the
        episodes) and samples are always ``concat`` (TRL takes one sequence per episode)."""
        opened, runner, loop = open_agent(agent, model, gateway=gateway, rollout=rollout, out_dir=out_dir)
        return cls(opened, runner, loop, data_for)

    @property
    def url(self) -> str:
        return self.gateway.url

    # ------------------------------------------------------------------ TRL's contract

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self.sync(trainer)
        step = int(trainer.state.global_step)
        self._calls += 1
        items = [(_group_id(step, self._calls, p), k, self.data_for(p)) for k, p in enumerate(prompts)]
        chains = self.loop.run(play(self.runner, items))
        self.episodes += len(chains)
        self.failed += sum(1 for c in chains if not c.ok)
        self.dropped_chains += sum(c.dropped_chains for c in chains)
        return trl_batch(chains, _eos_id(trainer))

    def sync(self, trainer: Any) -> int | None:
        """Push TRL's model to the serving engine unless this step's weights are there already;
        the new engine version (None: nothing pushed)."""
        step = int(trainer.state.global_step)
        if step == self._synced_step:
            return None
        model = trainer.accelerator.unwrap_model(trainer.model)
        version = self.loop.run(self.gateway.sync.push(model))
        self._synced_step = step
        self.pushes.append((step, int(version)))
        return int(version)

    # ------------------------------------------------------------------ life

    def close(self) -> None:
        close_agent(self.gateway, self.runner, self.loop)

    def __enter__(self) -> TRLRollout:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_agent(agent: Any, model: str | Path, *, gateway: GatewaySettings | None = None,
               rollout: RolloutSettings | None = None, out_dir: str | Path = "runs/trl",
               ) -> tuple[OpenGateway, RolloutRunner, LoopThread]:
    """The gateway serving ``model``, the runner that plays ``agent`` through it, and the event loop
    they live on (the arguments are :meth:`TRLRollout.start`'s); :func:`close_agent` ends them.
    Both TRL adapters (this one and ``integrations/trl_async.py``) open theirs here."""
    settings = rollout or RolloutSettings()
    plan = GatewayPlan(model=str(model), out_dir=Path(out_dir), gateway=gateway or GatewaySettings(),
                       seed=settings.seed, connections=settings.concurrency + 8)
    loop = LoopThread()
    try:
        opened = loop.run(open_gateway(plan, Path(model), Path(model)))
    except BaseException:
        loop.close()
        raise
    runner = rollout_runner(settings, opened.client, agent, export_style="concat")
    return opened, runner, loop


def close_agent(gateway: OpenGateway, runner: RolloutRunner, loop: LoopThread) -> None:
    """Close what :func:`open_agent` opened: the runner's client, the gateway, then the loop."""
    async def shut() -> None:
        await runner.aclose()
        await gateway.close()

    try:
        loop.run(shut())
    finally:
        loop.close()


def trl_batch(chains: list[Chain], eos: int) -> dict[str, list[Any]]:
    """``rollout_func``'s return value for ``chains`` (one per prompt, in order)."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask",
                                                 "rlgate_reward", "rlgate_failed", "rlgate_session_id",
                                                 "rlgate_version", "rlgate_turns")}
    for c in chains:
        if c.ok:
            prompt, completion, lps, mask = c.prompt_ids, c.response_ids, c.response_logprobs, c.response_mask
        else:  # TRL needs a completion per prompt: one masked token, no loss, no reward
            prompt, completion, lps, mask = [eos], [eos], [0.0], [0]
        out["prompt_ids"].append(prompt)
        out["completion_ids"].append(completion)
        out["logprobs"].append(lps)
        out["env_mask"].append(mask)
        out["rlgate_reward"].append(c.reward if c.ok else None)
        out["rlgate_failed"].append(not c.ok)
        out["rlgate_session_id"].append(c.session_id)
        out["rlgate_version"].append(c.min_version)
        out["rlgate_turns"].append(c.turns)
    return out


def _group_id(step: int, call: int, prompt: Any) -> str:
    """One GRPO group per distinct prompt of a rollout call (TRL repeats each ``num_generations`` times)."""
    digest = hashlib.blake2b(json.dumps(prompt, sort_keys=True, default=str).encode(), digest_size=6).hexdigest()
    return f"trl-{step}-{call}-{digest}"


def _eos_id(trainer: Any) -> int:
    tok = getattr(trainer.processing_class, "tokenizer", None) or trainer.processing_class
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
    return int(eos if eos is not None else 0)
