"""The torch side of online training: the GRPO trainer, candidates for the canary, reverts.

:class:`OnlinePolicy` is the :class:`~rlgate.online.trainer.Stepper` the continuous trainer
(``online/trainer.py``) steps: it holds the existing :class:`~rlgate.train.grpo.GRPOTrainer` on its
own copy of the model (nothing forked: the same advantages, decoupled-PPO loss and importance
correction as ``rlgate train``), publishes the trainer's weights into the spare engine slot as the
next canary candidate (``online/versions.py``), and when the canary rolls a candidate back it sets
the trainer's weights back to the stable version's and clears the optimiser's moments, on the
training thread before the next step (never under a step in flight).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rlgate.config import OnlineConfig
from rlgate.engine.base import Engine
from rlgate.engine.capabilities import LoadsStateDict
from rlgate.engine.factory import EnginePlan
from rlgate.online.adapter_slots import AdapterSlot, PolicyRouter, spare_name
from rlgate.online.canary import Canary, Decision
from rlgate.online.groups import GroupScorer, LiveGroups, load_scorer
from rlgate.online.learners import PolicyLearners
from rlgate.online.trainer import NonFiniteStep, OnlineTrainer
from rlgate.online.training import OnlineTraining
from rlgate.online.versions import TwoSlotEngine
from rlgate.train.config import GRPOConfig, LoraSettings, OnlineTrainConfig
from rlgate.train.grpo import GRPOTrainer
from rlgate.train.policy import serving_state_dict, shape_policy
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.train.online")


def _clone(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


class OnlinePolicy:
    """GRPO steps for the continuous trainer + candidates for the two-slot engine (module docstring)."""

    def __init__(self, model: Any, config: GRPOConfig, engines: TwoSlotEngine, *, ref_model: Any = None,
                 autocast: str | None = None) -> None:
        self.trainer = GRPOTrainer(model, config, ref_model=ref_model, autocast=autocast)
        self.engines = engines
        self.canary = engines.canary
        self._states: dict[int, dict[str, torch.Tensor]] = {self.canary.stable_version: self._snapshot()}
        self._revert_to: int | None = None
        self.online: OnlineTrainer | None = None  # set by attach(); reset on a rollback
        self.canary.listeners.append(self._on_decision)

    def attach(self, online: OnlineTrainer) -> None:
        self.online = online

    # ------------------------------------------------------------------ Stepper

    def step(self, samples: list[Sample], group_ids: list[str], current_version: int) -> dict[str, float]:
        """One GRPO step (training thread); a pending revert is applied first. Raises :class:`NonFiniteStep`
        when the loss or a gradient was not finite (``GRPOTrainer.step`` then applied no update) or when the
        weights came out non-finite (then set back to the last published version's, moments cleared)."""
        target = self._revert_to
        if target is not None:
            self._revert_to = None
            self._revert(target)
        metrics = self.trainer.step(samples, group_ids, current_version)
        if metrics.get("nonfinite_updates", 0.0) > 0:
            raise NonFiniteStep(f"non-finite loss or gradient (loss {metrics.get('loss')}, gradient norm "
                                f"{metrics.get('grad_norm')}): the update was not applied")
        if not all(bool(torch.isfinite(p).all()) for p in self.trainer.model.parameters()):
            last = max(self._states)
            self._revert(last)
            raise NonFiniteStep(f"non-finite weights after the update: set back to version {last}'s", reverted=True)
        return metrics

    def _snapshot(self) -> dict[str, torch.Tensor]:
        """The trainer's weights as a revert needs them: every weight, or a LoRA model's trained ones alone."""
        model = self.trainer.model
        if hasattr(model, "peft_config"):
            return {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" in k}
        return _clone(model.state_dict())

    def _revert(self, version: int) -> None:
        state = self._states.get(version)
        if state is None:
            log.error("no weights kept for version %d: the trainer goes on from its own", version)
            return
        self.trainer.model.load_state_dict(state, strict=not hasattr(self.trainer.model, "peft_config"))
        self.trainer.optimizer.state.clear()
        log.warning("online trainer: weights set back to version %d's", version)

    # ------------------------------------------------------------------ candidates

    async def publish(self) -> int | None:
        """The trainer's weights as the next canary candidate (None: the spare slot is busy)."""
        if not self.engines.can_load():
            return None
        version = self.engines.next_version()
        load = await self._candidate(version)
        if not await self.engines.load_candidate(version, load):
            return None
        self._states[version] = self._snapshot()
        return version

    async def _candidate(self, version: int) -> Callable[[Engine], Awaitable[object]]:
        """What loads the trainer's weights into the spare slot as ``version``: the served weights (a LoRA
        model's merged), from memory."""
        state = _clone(serving_state_dict(self.trainer.model))

        async def load(engine: Engine) -> None:
            if not isinstance(engine, LoadsStateDict):
                raise TypeError(f"{type(engine).__name__} cannot load weights from memory: online training "
                                "with it needs a checkpoint directory per candidate (not built yet)")
            await engine.update_weights_from_state_dict(state)

        return load

    def _on_decision(self, d: Decision) -> None:
        if d.action == "promote":
            for v in list(self._states):
                if v != d.version:
                    del self._states[v]  # only the stable weights are kept for a revert
        elif d.action == "rollback":
            self._states.pop(d.version, None)
            self._revert_to = self.canary.stable_version
            if self.online is not None:
                self.online.reset(self.canary.stable_version)
        if self.online is not None:
            self.online.poke()


def build_online_training(model: Any, options: OnlineConfig, tokenizer: Any, *, engine: EnginePlan | None = None,
                          scorer: GroupScorer | None = None, stop_token_ids: Sequence[int] | None = None,
                          train_config: OnlineTrainConfig | None = None) -> OnlineTraining:
    """Online training on the local engine: two engines holding copies of ``model`` (stable + canary slot),
    built by ``engine`` (its options, seed and threads; default: ``rlgate serve``'s defaults), the trainer on
    ``model`` itself, live groups scored by ``scorer`` (default: ``options.group_reward``; none: no live groups).
    ``stop_token_ids``: where held-out replies end (default: the tokenizer's end of sequence).
    ``train_config``: the trainer's ``grpo:`` and ``train:`` sections (``--online-train-config``; default:
    ``rlgate train``'s defaults with ``options.lr``). ``training.engines`` is the engine to give
    ``create_app``, and ``training`` itself its ``online_training``."""
    cfg = train_config or OnlineTrainConfig(grpo=GRPOConfig(lr=options.lr))
    plan = engine or EnginePlan()
    slots = [plan.build(tokenizer, model=copy.deepcopy(model)) for _ in range(2)]  # served as loaded
    canary = Canary(options)
    engines = TwoSlotEngine(slots[0], slots[1], canary)
    # the KL reference is the starting model (a LoRA model's copy would carry the adapters it trains)
    ref = copy.deepcopy(model) if cfg.grpo.kl_coef > 0 and cfg.train.lora is not None else None
    policy = OnlinePolicy(shape_policy(model, cfg.train), cfg.grpo, engines, ref_model=ref,
                          autocast="bfloat16" if cfg.train.dtype == "mixed" else None)
    trainer = OnlineTrainer(options, policy, policy.publish)
    policy.attach(trainer)
    if scorer is None and options.group_reward:
        scorer = load_scorer(options.group_reward)
    encode, decode, stops = _text_io(tokenizer, stop_token_ids)
    training = OnlineTraining(options, canary, engines, trainer, encode=encode, decode=decode, stop_token_ids=stops,
                              trainer_settings=cfg.model_dump(mode="json"))
    if scorer is not None and options.group_fraction > 0:
        training.groups = LiveGroups(options, engines, scorer, training.add_group,
                                     decode=decode,
                                     waiting=lambda: sum(e.stats()["waiting"] for e in slots))
    return training


def _text_io(tokenizer: Any, stop_token_ids: Sequence[int] | None) -> tuple[
        Callable[[list[dict[str, Any]]], list[int]], Callable[[list[int]], str], tuple[int, ...]]:
    """Chat messages -> prompt ids, reply ids -> text, and where held-out replies end."""
    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    def encode(messages: list[dict[str, Any]]) -> list[int]:
        out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    stops = tuple(stop_token_ids) if stop_token_ids is not None else tuple(
        t for t in (getattr(tokenizer, "eos_token_id", None),) if isinstance(t, int))
    return encode, decode, stops


class AdapterPolicy(OnlinePolicy):
    """An adapter policy's learner stepper: GRPO on its own LoRA adapter; a candidate is the adapter alone,
    saved under ``directory`` (``v{version}``) and loaded as the spare adapter of its two slots
    (``online/adapter_slots.py``). Directories no version needs any more (not stable, not the canary) are
    removed; the user's own directory (the policy's first weights) is never touched."""

    def __init__(self, model: Any, config: GRPOConfig, engines: TwoSlotEngine, directory: Path, **kw: Any) -> None:
        super().__init__(model, config, engines, **kw)
        self.directory = directory
        self.paths: dict[int, str] = {}  # version -> its saved adapter (candidates this learner made)

    async def _candidate(self, version: int) -> Callable[[Engine], Awaitable[object]]:
        path = self.directory / f"v{version}"
        await asyncio.to_thread(self.trainer.model.save_pretrained, path)  # a PeftModel saves its adapter only
        self.paths[version] = str(path.resolve())

        async def load(engine: Engine) -> None:
            assert isinstance(engine, AdapterSlot)
            await engine.load(self.paths[version], version)

        return load

    def _on_decision(self, d: Decision) -> None:
        super()._on_decision(d)
        # the previous stable's directory stays until the next promotion: the store names it until the new one is
        # recorded (a listener after this one), so a crash in between still restarts on weights that exist
        keep = {v for v in (self.canary.stable_version, self.canary.canary_version, self.canary.retired)
                if v is not None}
        if d.action in ("promote", "rollback"):
            for v in [v for v in self.paths if v not in keep]:
                shutil.rmtree(self.paths.pop(v), ignore_errors=True)


class AdapterLearners:
    """Builds each adapter policy's learner for ``rlgate serve --online --online-train-adapters``
    (``online/learners.py``): the trainer's model is a copy of ``base`` that **shares its weights** (held once
    for every learner, frozen) with the policy's own adapter on it, loaded from the directory the policy was
    loaded from; the canary's two slots are two adapters of ``engine``. ``learners`` is the gateway's
    engine's companion: give ``create_app`` ``learners.router`` as its engine and ``learners`` as its
    ``online_training``."""

    def __init__(self, base: Any, engine: Engine, options: OnlineConfig, tokenizer: Any, *,
                 directory: Path | None = None, scorer: GroupScorer | None = None,
                 stop_token_ids: Sequence[int] | None = None, train_config: OnlineTrainConfig | None = None) -> None:
        cfg = train_config or OnlineTrainConfig(grpo=GRPOConfig(lr=options.lr))
        if cfg.train.dtype == "bfloat16":
            raise ValueError("--online-train-adapters: train.dtype bfloat16 would cast the base weights every "
                             "learner shares; use float32 or mixed")
        if cfg.train.lora is None:  # the policies' adapters bring their own rank and targets
            cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"lora": LoraSettings()})})
        self.config = cfg
        self.base = base.eval().requires_grad_(False)
        self.engine = engine
        self.options = options
        self.tokenizer = tokenizer
        self.directory = directory or Path(tempfile.mkdtemp(prefix="rlgate-online-adapters-"))
        self.scorer = scorer if scorer is not None else (load_scorer(options.group_reward)
                                                         if options.group_reward else None)
        self.text = _text_io(tokenizer, stop_token_ids)
        self.router = PolicyRouter(engine)
        self.learners = PolicyLearners(self.router, self.build)

    def _shared_copy(self) -> Any:
        """A copy of the base whose weights are the base's own tensors (nothing copied but the modules)."""
        memo = {id(t): t for t in itertools.chain(self.base.parameters(), self.base.buffers())}
        return copy.deepcopy(self.base, memo)

    def _models(self, path: str) -> tuple[Any, Any]:
        model = shape_policy(self._shared_copy(), self.config.train, adapter=Path(path))
        ref = self._shared_copy() if self.config.grpo.kl_coef > 0 else None  # the base: what the adapter moves from
        return model, ref

    async def build(self, name: str, path: str, version: int) -> OnlineTraining:
        """Policy ``name``'s learner, its adapter loaded from ``path`` at ``version`` (online/learners.py)."""
        cfg, options = self.config, self.options
        model, ref = await asyncio.to_thread(self._models, path)
        canary = Canary(options, stable_version=version)
        engines = TwoSlotEngine(AdapterSlot(self.engine, name), AdapterSlot(self.engine, spare_name(name)), canary)
        directory = self.directory / name
        directory.mkdir(parents=True, exist_ok=True)
        policy = AdapterPolicy(model, cfg.grpo, engines, directory, ref_model=ref,
                               autocast="bfloat16" if cfg.train.dtype == "mixed" else None)
        if Path(path).resolve().is_relative_to(directory.resolve()):  # a version this learner promoted before a restart
            policy.paths[version] = str(Path(path).resolve())
        trainer = OnlineTrainer(options, policy, policy.publish, version=version)
        policy.attach(trainer)
        encode, decode, stops = self.text
        training = OnlineTraining(options, canary, engines, trainer, encode=encode, decode=decode,
                                  stop_token_ids=stops, trainer_settings=cfg.model_dump(mode="json"), policy=name,
                                  weights_path=policy.paths.get)
        if self.scorer is not None and options.group_fraction > 0:
            stats = self.router.stats
            training.groups = LiveGroups(options, engines, self.scorer, training.add_group, decode=decode,
                                         waiting=lambda: int(stats().get("waiting", 0)))
        return training
