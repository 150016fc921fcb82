"""Adapter policies learning online: each one's stable and candidate weights as two adapters of one engine.

``rlgate serve --online --online-train-adapters`` (docs/policies.md, "Online tenants"): the base model is
served frozen by one local engine, and every adapter policy loaded on it (``POST /rl/policies``) learns
from its own users' feedback with its own trainer, canary and guards (``online/learners.py``).

**Decision: a policy's two versions are two adapters of the same engine.** The default policy's online
training needs two whole engines (``online/versions.py``) because a full weight set is what changes;
an adapter policy changes only its adapter, so its canary candidate is a second adapter on the engine
that already serves everything (the base held once, the candidate a few megabytes, requests of every
policy and version in the same batches). :class:`AdapterSlot` is that view of one adapter, an
:class:`~rlgate.engine.base.Engine` whose requests carry its adapter's name, so the
:class:`~rlgate.online.versions.TwoSlotEngine` that serves a default policy's canary serves an adapter
policy's unchanged: two slots, the canary routing each conversation to the version it is bound to,
promotion swapping the slots' roles.

:class:`PolicyRouter` is the gateway's engine: a request for a learning policy's adapter goes to that
policy's two-slot engine, every other request to the engine itself. It shows each learning policy under
its own name at its stable version (the candidate's adapter, ``NAME#2``, is never listed: ``#`` is not a
policy name's character), and refuses what would move a learning policy's weights behind its learner's
back: a push to it (409 ``policy_learning_online``: its weights come from its users) and any push of the
base weights (409 ``base_frozen``: every adapter was trained on them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from rlgate.engine.base import (
    Engine,
    EngineError,
    GenerateRequest,
    GenerateResult,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
)
from rlgate.engine.capabilities import HasStats, QueueWaitObservable, ServesAdapters
from rlgate.online.versions import TwoSlotEngine

log = logging.getLogger("rlgate.online.adapter_slots")

SPARE_SUFFIX = "#2"  # the engine adapter holding a learning policy's other version


def spare_name(policy: str) -> str:
    return policy + SPARE_SUFFIX


class AdapterSlot(StreamingEngineMixin):
    """One adapter of a shared engine, seen as an engine of its own (a slot of a :class:`TwoSlotEngine`)."""

    def __init__(self, engine: Any, adapter: str) -> None:
        self.engine = engine  # an Engine that ServesAdapters
        self.adapter = adapter

    @property
    def version(self) -> int:
        return int(self.engine.adapter_versions().get(self.adapter, -1))

    @property
    def max_context_length(self) -> int:
        return int(self.engine.max_context_length)

    @property
    def loaded(self) -> bool:
        return self.adapter in self.engine.adapter_versions()

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        named = dataclasses.replace(request, adapter=self.adapter)
        async with contextlib.aclosing(self.engine.stream(named)) as inner:
            async for delta in inner:
                yield delta

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await StreamingEngineMixin.generate(self, request)

    async def load(self, path: str, version: int) -> int:
        """This slot's adapter from the adapter directory ``path``, tagged ``version``."""
        return int(await self.engine.load_adapter(self.adapter, path, version))

    async def unload(self) -> None:
        if self.loaded:
            await self.engine.unload_adapter(self.adapter)

    async def update_weights_from_path(self, path: str) -> int:
        raise EngineError("a learning policy's weights come from its online trainer", status=409,
                          code="policy_learning_online")

    async def start(self) -> None:  # the shared engine is started and closed by its owner
        return None

    async def close(self) -> None:
        return None


# Builds a policy's learner once its adapter is loaded: (name, adapter directory, version) -> its two-slot engine
Learn = Callable[[str, str, int], Awaitable[TwoSlotEngine]]
Forget = Callable[[str], Awaitable[None]]


class PolicyRouter(StreamingEngineMixin):
    """The gateway's engine with adapter policies learning online (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        if not isinstance(engine, ServesAdapters):
            raise ValueError(f"--online-train-adapters needs an engine that serves LoRA adapters, not "
                             f"{type(engine).__name__}")
        self.engine: Any = engine  # an Engine that ServesAdapters
        self.learning: dict[str, TwoSlotEngine] = {}
        self.learn: Learn | None = None  # set by the learners (online/learners.py)
        self.forget: Forget | None = None
        self._on_queue_wait: Callable[[float], None] | None = None

    # ------------------------------------------------------------------ Engine

    @property
    def version(self) -> int:
        return int(self.engine.version)

    @property
    def max_context_length(self) -> int:
        return int(self.engine.max_context_length)

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        slots = self.learning.get(request.adapter) if request.adapter is not None else None
        engine = slots if slots is not None else self.engine
        async with contextlib.aclosing(engine.stream(request)) as inner:
            async for delta in inner:
                yield delta

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await StreamingEngineMixin.generate(self, request)

    async def update_weights_from_path(self, path: str) -> int:
        raise EngineError("the base weights are frozen while adapter policies learn online "
                          "(--online-train-adapters): every adapter was trained on them", status=409,
                          code="base_frozen")

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()

    def stats(self) -> Mapping[str, float]:
        return self.engine.stats() if isinstance(self.engine, HasStats) else {}

    @property
    def on_queue_wait(self) -> Callable[[float], None] | None:
        return self._on_queue_wait

    @on_queue_wait.setter
    def on_queue_wait(self, observe: Callable[[float], None] | None) -> None:
        self._on_queue_wait = observe
        if isinstance(self.engine, QueueWaitObservable):
            self.engine.on_queue_wait = observe

    # ------------------------------------------------------------------ ServesAdapters

    def adapter_versions(self) -> dict[str, int]:
        """The policies' adapters, a learning one at its stable version; candidates' adapters are not listed."""
        out = {k: v for k, v in self.engine.adapter_versions().items() if not k.endswith(SPARE_SUFFIX)}
        for name, slots in self.learning.items():
            out[name] = slots.version
        return out

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        """A new adapter policy, learning from its first turn; a push to a learning one is refused."""
        if name in self.learning:
            raise EngineError(f"policy {name!r} learns online: its weights come from its users' feedback "
                              "(its canary: /rl/canary/... {\"policy\"}); unload it to replace them", status=409,
                              code="policy_learning_online")
        if name.endswith(SPARE_SUFFIX):
            raise EngineError(f"adapter names ending in {SPARE_SUFFIX!r} are kept for candidates", status=400,
                              code="invalid_policy_name")
        loaded = int(await self.engine.load_adapter(name, path, version))
        if self.learn is not None:
            try:
                self.learning[name] = await self.learn(name, path, loaded)
            except BaseException as exc:
                await self.engine.unload_adapter(name)
                if isinstance(exc, Exception) and not isinstance(exc, EngineError):
                    log.exception("policy %s: its online learner could not be built", name)
                    raise WeightUpdateError(f"policy {name!r}: the engine serves {path}, but its online learner "
                                            f"could not load it for training ({type(exc).__name__}: {exc})") from exc
                raise
        return loaded

    async def unload_adapter(self, name: str) -> None:
        slots = self.learning.pop(name, None)
        if slots is None:
            await self.engine.unload_adapter(name)
            return
        if self.forget is not None:
            await self.forget(name)
        for slot in slots.slots:
            if isinstance(slot, AdapterSlot):
                await slot.unload()


if TYPE_CHECKING:  # mypy checks the capabilities (engine/capabilities.py)
    def _capabilities(router: PolicyRouter, slot: AdapterSlot) -> tuple[Engine, HasStats, QueueWaitObservable,
                                                                         ServesAdapters, Engine]:
        return router, router, router, router, slot
