"""What an engine can do beyond the :class:`~rlgate.engine.base.Engine` contract, one small protocol each.

The gateway needs only ``Engine``. Some callers use more when the engine has it: the cluster's
weight-update barrier pauses generation, a restarted replica declares its weight version, the
metrics read batch occupancy. Each such extra is a ``runtime_checkable`` protocol, asked with
``isinstance`` where it is used, so mypy checks the call that follows and a renamed method fails
the type check (and ``tests/test_engine_capabilities.py``), not a run in production.

capability (what it gives)                                              fake  local  remote
:class:`Pausable` (``pause_generation`` / ``continue_generation``)        yes   yes    yes
:class:`VersionRestorable` (``restore_version(v)``: the loaded weights     yes   yes    yes
  are version ``v``; a replica after a restart)
:class:`HasStats` (``stats()``: batch occupancy for the metrics)           -     yes    -
:class:`QueueWaitObservable` (``on_queue_wait``: seconds a request         -     yes    -
  waited for a batch row)
:class:`DescribesBackends` (``describe()``: backends and their state)      -     -      yes
:class:`HasModel` (``model``: the torch module; the fake vLLM server's     -     yes    -
  teacher-forced logprobs)
:class:`ChecksWeights` (``last_weight_check``: the last update's check      -     yes    yes
  against the checkpoint's probe, engine/weight_check.py)
:class:`ServesAdapters` (LoRA adapters on the base weights, loaded and     yes   yes    yes
  replaced at run time; a request names one: ``GenerateRequest.adapter``)
:class:`LoadsStateDict` (``update_weights_from_state_dict``: weights from   -     yes    -
  memory, no checkpoint on disk; the online trainer's candidates)

The online mode's :class:`~rlgate.online.versions.TwoSlotEngine` (two engines behind one, stable and
canary) has ``HasStats`` and ``QueueWaitObservable`` over its two slots.

``isinstance`` on a runtime-checkable protocol checks that the names exist, not their signatures:
each engine module ends with a ``TYPE_CHECKING`` block that hands the engine to its capabilities,
so mypy checks the signatures too (and ``tests/test_engine_capabilities.py`` the table above).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlgate.engine.weight_check import WeightCheck

__all__ = ["ChecksWeights", "DescribesBackends", "HasModel", "HasStats", "LoadsStateDict", "Pausable",
           "QueueWaitObservable", "ServesAdapters", "VersionRestorable"]


@runtime_checkable
class Pausable(Protocol):
    """Generation can be held between two tokens (the cluster's weight-update barrier)."""

    async def pause_generation(self) -> None:
        """Return once no token is being produced; requests in flight wait (new ones too)."""
        ...

    async def continue_generation(self) -> None:
        """Requests held by :meth:`pause_generation` go on."""
        ...


@runtime_checkable
class VersionRestorable(Protocol):
    """The engine can be told which weight version it holds (a replica catching up after a restart)."""

    def restore_version(self, version: int) -> None:
        ...


@runtime_checkable
class HasStats(Protocol):
    """Numbers for the metrics scrape (the local engine: running and waiting requests, decode steps)."""

    def stats(self) -> Mapping[str, float]:
        ...


@runtime_checkable
class QueueWaitObservable(Protocol):
    """The engine reports how long each request waited for a batch row (the queue-time histogram).

    Called on the engine's worker thread: it must be cheap and thread-safe."""

    on_queue_wait: Callable[[float], None] | None


@runtime_checkable
class LoadsStateDict(Protocol):
    """The engine takes weights from memory (the local engine): the online trainer's candidates need no
    checkpoint on disk each."""

    async def update_weights_from_state_dict(self, state_dict: Mapping[str, Any]) -> int:
        """Copy ``state_dict`` in between two decoding steps; return the new version."""
        ...


@runtime_checkable
class DescribesBackends(Protocol):
    """An engine in front of servers: ``describe()["backends"]`` lists them, each with a ``state``."""

    def describe(self) -> dict[str, Any]:
        ...


@runtime_checkable
class HasModel(Protocol):
    """An in-process engine that exposes its torch model."""

    @property
    def model(self) -> Any:
        ...


@runtime_checkable
class ChecksWeights(Protocol):
    """The engine checks each weight update against the checkpoint's probe (engine/weight_check.py)."""

    @property
    def last_weight_check(self) -> WeightCheck | None:
        ...


@runtime_checkable
class ServesAdapters(Protocol):
    """LoRA adapters served on the engine's base weights, side by side (docs/policies.md).

    A request names one in ``GenerateRequest.adapter`` (an adapter not loaded: :class:`EngineError`
    404 ``adapter_not_found``); its tokens carry that adapter's version. Loading or replacing one
    adapter never pauses or changes the rows of another (or of the base)."""

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        """Load the PEFT adapter directory ``path`` as ``name``, or replace ``name``'s weights; return its
        version (a new adapter: ``version``, default 0; a replacement: the old one + 1). Requests of
        ``name`` in flight go on with the new weights (their tokens say which version made them).
        :class:`WeightUpdateError` (400) and nothing changed if ``path`` is not a servable adapter."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Free ``name``; requests of it still in flight end with an error (the gateway unloads idle ones)."""
        ...

    def adapter_versions(self) -> dict[str, int]:
        """The adapters loaded now, by name, with their versions."""
        ...
