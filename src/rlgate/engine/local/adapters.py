"""The local engine's LoRA adapter commands (``capabilities.ServesAdapters``), run between two steps.

Mixed into :class:`~rlgate.engine.local.engine.LocalEngine`, whose worker owns the
:class:`~rlgate.engine.local.lora.AdapterBank` (``_adapters``). The directory is checked and read
off both the event loop and the worker; only the swap of the stacked weights runs on the worker,
between two decoding steps. Loading or replacing an adapter retracts that adapter's rows alone (their
KV cache came from its old weights): the base's rows and other adapters' rows go on untouched.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rlgate.engine.base import EngineError
from rlgate.engine.local.lora import AdapterBank, read_adapter
from rlgate.engine.weights_path import adapter_dir

if TYPE_CHECKING:
    from rlgate.engine.local.batch import Batch, RequestState

__all__ = ["AdapterCommands"]


class AdapterCommands:
    """``load_adapter`` / ``unload_adapter`` / ``adapter_versions`` of the local engine."""

    _adapters: AdapterBank
    _model: Any
    _batch: Batch | None
    _pending: deque[RequestState]
    _cv: threading.Condition

    def _run_command(self, fn: Callable[[], int]) -> Awaitable[int]:
        raise NotImplementedError

    def _retract(self, adapter: str | None = None, *, only: bool = False) -> None:
        raise NotImplementedError

    def _drop_done(self) -> None:
        raise NotImplementedError

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        """Load the LoRA adapter directory ``path`` as ``name`` (or replace its weights) between two steps;
        return its version. Only ``name``'s rows in flight are retracted (prefilled again with the new
        weights before their next token)."""
        directory = (await asyncio.to_thread(adapter_dir, path)).directory
        adapter = await asyncio.to_thread(read_adapter, directory, self._model)

        def put() -> int:
            new = self._adapters.put(name, adapter, version)
            self._retract(name, only=True)
            return new

        return await self._run_command(put)

    async def unload_adapter(self, name: str) -> None:
        """Free ``name``'s weights between two steps; its requests still waiting or running end with
        :class:`EngineError` 410 ``adapter_unloaded``."""
        def remove() -> int:
            gone = EngineError(f"adapter {name!r} was unloaded", status=410, code="adapter_unloaded")
            with self._cv:
                doomed = [r for r in self._pending if r.adapter == name]
                for req in doomed:
                    self._pending.remove(req)
            running = self._batch.rows if self._batch is not None else []
            for req in doomed + [r for r in running if r.adapter == name]:
                req.finish_with(gone)
            self._drop_done()
            self._adapters.remove(name)
            return 0

        await self._run_command(remove)

    def adapter_versions(self) -> dict[str, int]:
        return self._adapters.versions()
