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

``isinstance`` on a runtime-checkable protocol checks that the names exist, not their signatures:
each engine module ends with a ``TYPE_CHECKING`` block that hands the engine to its capabilities,
so mypy checks the signatures too (and ``tests/test_engine_capabilities.py`` the table above).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["DescribesBackends", "HasModel", "HasStats", "Pausable", "QueueWaitObservable", "VersionRestorable"]


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
