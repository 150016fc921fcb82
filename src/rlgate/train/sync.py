"""Pushing the trainer's weights to the policy that serves the agents.

* :class:`ColocatedSync` — trainer and :class:`~rlgate.engine.local.LocalEngine` in one
  process: the trainer's parameters are copied into the engine's model in place, between
  two decoding steps (generation pauses for the copy), and the engine's version goes up
  by one. The trainer keeps its own copy of the model, so training never races with
  generation.
* :class:`RemoteSync` — the gateway runs elsewhere (another process or machine sharing
  a filesystem): the trainer saves a safetensors checkpoint and calls the admin route
  ``POST /rl/update_weights {"path": ...}``; the gateway loads it into its engine and
  bumps the version. Old checkpoints are deleted, keeping the last ``keep``.

Both return the new weight version; every token generated afterwards carries it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Protocol

from rlgate.client.gateway import GatewayClient


class WeightSync(Protocol):
    async def push(self, model: Any) -> int:
        """Make the serving policy use ``model``'s current weights; return the new version."""
        ...


class ColocatedSync:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def push(self, model: Any) -> int:
        from rlgate.train.policy import serving_state_dict

        return await self.engine.update_weights_from_state_dict(serving_state_dict(model))


class RemoteSync:
    def __init__(self, client: GatewayClient, directory: str | Path, *, keep: int = 2) -> None:
        self.client = client
        self.directory = Path(directory)
        self.keep = keep
        self._saved: list[Path] = []
        self._n = 0

    async def push(self, model: Any) -> int:
        import asyncio

        self._n += 1
        path = self.directory / f"sync-{self._n:06d}"
        from rlgate.train.policy import save_for_serving

        await asyncio.to_thread(save_for_serving, model, path)
        version = await self.client.update_weights(str(path.resolve()))
        self._saved.append(path)
        while len(self._saved) > self.keep:
            shutil.rmtree(self._saved.pop(0), ignore_errors=True)
        return version
