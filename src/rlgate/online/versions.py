"""Two weight sets behind one gateway: the stable version and the canary, one engine each.

**Decision: two engine instances behind the gateway, each holding one version.** An engine holds
one weight set and tags every token with its version (``engine/base.py``); the cluster serves one
version at a time on every replica (its weight-update barrier moves them all together). Serving a
canary therefore needs a second engine, and the simplest sound way is two whole engines: for the
tiny model (3.2M parameters) and small models on one machine, two ``LocalEngine`` s; for remote
engines, two backend pools. No engine learns anything new: a slot's engine loads a checkpoint as it
always does and is told the checkpoint's version (``VersionRestorable``), so a token's recorded
version names the weights that produced it whichever slot served it.

:class:`TwoSlotEngine` is an :class:`~rlgate.engine.base.Engine`: ``stream`` asks the
:class:`~rlgate.online.canary.Canary` which version serves the request's conversation and runs it
on the slot holding that version. Promotion swaps the slots' roles (no copy); a rollback retires
the canary slot. The next candidate loads into the slot that is not stable, once no active
conversation is bound to the version it holds (``Canary.active_on``).

Its capabilities (``engine/capabilities.py``): ``HasStats`` (the slots' batch numbers summed, so
``/metrics`` shows the engine under ``--online-train`` too) and ``QueueWaitObservable`` (the gateway's
queue-time histogram reaches both slots).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING

from rlgate.engine.base import Engine, EngineError, GenerateRequest, GenerateResult, StreamingEngineMixin, TokenDelta
from rlgate.engine.capabilities import HasStats, QueueWaitObservable, VersionRestorable
from rlgate.online.canary import Canary, Decision

log = logging.getLogger("rlgate.online.versions")


def conversation_of(request: GenerateRequest) -> str:
    """The routing key of a request: its conversation (the gateway session, else the request)."""
    return request.session_id or request.request_id


class TwoSlotEngine(StreamingEngineMixin):
    """Serves the stable and the canary version from two engines (see the module docstring)."""

    def __init__(self, stable: Engine, spare: Engine, canary: Canary,
                 key: Callable[[GenerateRequest], str] = conversation_of) -> None:
        self.slots: list[Engine] = [stable, spare]
        self.versions: list[int | None] = [canary.stable_version, None]  # the version each slot holds
        self.canary = canary
        self.key = key
        self._loading = asyncio.Lock()
        self._issued = canary.stable_version  # the newest version number handed out
        self._on_queue_wait: Callable[[float], None] | None = None
        canary.listeners.append(self._on_decision)

    # ------------------------------------------------------------------ Engine

    @property
    def version(self) -> int:
        return self.canary.stable_version

    @property
    def max_context_length(self) -> int:
        return min(e.max_context_length for e in self.slots)

    def slot_of(self, version: int) -> Engine:
        for engine, held in zip(self.slots, self.versions, strict=True):
            if held == version:
                return engine
        raise LookupError(f"no slot holds version {version}")

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        engine = self.slot_of(self.canary.route(self.key(request)))
        async with contextlib.aclosing(engine.stream(request)) as inner:
            async for delta in inner:
                yield delta

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await StreamingEngineMixin.generate(self, request)

    def next_version(self) -> int:
        """A version number never used before: the one allocator of the trainer's candidates and of checkpoints
        pushed through ``/rl/update_weights`` (so the two never name different weights alike)."""
        seen = [v for v in (*self.versions, self.canary.stable_version, *self.canary.rewards, self._issued,
                            *(d.version for d in self.canary.decisions)) if v is not None]
        self._issued = max(seen) + 1
        return self._issued

    async def update_weights_from_path(self, path: str) -> int:
        """A checkpoint pushed by ``/rl/update_weights`` becomes the next canary candidate."""
        if not self.can_load():  # no version number is spent on a refused push
            raise EngineError("a canary is still running, or the spare weights slot still serves active "
                              "conversations: promote or roll back first (/rl/canary)", status=409, code="canary_busy")
        version = self.next_version()
        started = await self.load_candidate(version, lambda e: e.update_weights_from_path(path))
        if not started:
            raise EngineError("a canary is still running, or the spare weights slot still serves active "
                              "conversations: promote or roll back first (/rl/canary)", status=409, code="canary_busy")
        return version

    def stats(self) -> dict[str, float]:
        """The numbers of the slots that report them, summed (batch rows, waiting requests, capacity, decode
        counters); empty when neither does (fake engines)."""
        out: dict[str, float] = {}
        for e in self.slots:
            if isinstance(e, HasStats):
                for k, v in e.stats().items():
                    out[k] = out.get(k, 0) + v
        return out

    @property
    def on_queue_wait(self) -> Callable[[float], None] | None:
        return self._on_queue_wait

    @on_queue_wait.setter
    def on_queue_wait(self, observe: Callable[[float], None] | None) -> None:
        self._on_queue_wait = observe
        for e in self.slots:
            if isinstance(e, QueueWaitObservable):
                e.on_queue_wait = observe

    async def start(self) -> None:
        for e in self.slots:
            await e.start()

    async def close(self) -> None:
        for e in self.slots:
            await e.close()

    # ------------------------------------------------------------------ candidates

    def spare_index(self) -> int:
        return 1 - self.versions.index(self.canary.stable_version)

    def can_load(self) -> bool:
        """A candidate may load now: no canary runs, and the spare slot's version has no active conversation
        (a rolled-back version serves none: its conversations move to stable at their next turn)."""
        if self.canary.canary_version is not None:
            return False
        held = self.versions[self.spare_index()]
        return held is None or held not in self.canary.served() or self.canary.active_on(held) == 0

    async def load_candidate(self, version: int, load: Callable[[Engine], Awaitable[object]]) -> bool:
        """Load a candidate's weights into the spare slot (``load(engine)``) and start it as the canary.
        False (nothing loaded) while another canary runs or the spare slot still serves active
        conversations."""
        async with self._loading:
            if not self.can_load():
                return False
            i = self.spare_index()
            engine = self.slots[i]
            if self.canary.retired == self.versions[i]:
                self.canary.retired = None  # its conversations move to stable at their next turn
            self.versions[i] = None  # not routable while its weights change
            await load(engine)
            if isinstance(engine, VersionRestorable):
                engine.restore_version(version)
            self.versions[i] = version
            self.canary.start(version)
            return True

    def _on_decision(self, d: Decision) -> None:
        if d.action == "rollback":
            log.info("version %d rolled back: its slot takes no new conversations", d.version)


if TYPE_CHECKING:  # mypy checks that TwoSlotEngine has these capabilities (engine/capabilities.py)
    def _capabilities(engine: TwoSlotEngine) -> tuple[Engine, HasStats, QueueWaitObservable]:
        return engine, engine, engine
