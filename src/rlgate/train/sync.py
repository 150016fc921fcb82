"""Pushing the trainer's weights to the policy that serves the agents.

* :class:`ColocatedSync` — trainer and :class:`~rlgate.engine.local.LocalEngine` in one
  process: the trainer's parameters are copied into the engine's model in place, between
  two decoding steps (generation pauses for the copy), and the engine's version goes up
  by one. The trainer keeps its own copy of the model, so training never races with
  generation.
* :class:`RemoteSync` — the gateway runs elsewhere (another process or machine sharing
  a filesystem): the trainer saves a safetensors checkpoint (with the weight probe the
  gateway checks the engine against, engine/weight_check.py) and calls the admin route
  ``POST /rl/update_weights {"path": ...}``; the gateway loads it into its engine and
  bumps the version. Old checkpoints are deleted, keeping the last ``keep``. With
  ``adapters`` (``gateway.push: adapter``) a LoRA run pushes its adapter alone, which a
  vLLM gateway loads through vLLM's runtime LoRA API.
* :class:`AdapterSync` — ``gateway.policy``: the run trains one adapter policy of a gateway other runs
  share (docs/policies.md). Only the LoRA adapter is saved (PEFT's ``save_pretrained``: megabytes, not
  the model) and pushed to that policy (``{"path", "policy"}``); the other policies, and their
  sessions, go on untouched.

All return the new weight version (the policy's own, for an adapter policy); every token generated
afterwards carries it.
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
    def __init__(self, client: GatewayClient, directory: str | Path, *, keep: int = 2, adapters: bool = False) -> None:
        self.client = client
        self.directory = Path(directory)
        self.keep = keep
        self.adapters = adapters  # push a LoRA run's adapter alone (vLLM's runtime LoRA API), not merged weights
        self._saved: list[Path] = []
        self._n = 0

    async def push(self, model: Any) -> int:
        import asyncio

        self._n += 1
        path = self.directory / f"sync-{self._n:06d}"
        from rlgate.train.policy import save_adapter_for_serving, save_for_serving

        await asyncio.to_thread(save_adapter_for_serving if self.adapters else save_for_serving, model, path)
        version = await self.client.update_weights(str(path.resolve()))
        self._rotate(path)
        return version

    def _rotate(self, path: Path) -> None:
        self._saved.append(path)
        while len(self._saved) > self.keep:
            shutil.rmtree(self._saved.pop(0), ignore_errors=True)


class AdapterSync(RemoteSync):
    """Push the LoRA adapter alone to the client's policy (``client.policy``); see the module docstring."""

    async def _save(self, model: Any) -> Path:
        import asyncio

        self._n += 1
        path = self.directory / f"adapter-{self._n:06d}"
        await asyncio.to_thread(model.save_pretrained, path)  # a PeftModel saves its adapter only
        return path.resolve()

    async def push(self, model: Any) -> int:
        path = await self._save(model)
        version = await self.client.update_weights(str(path))
        self._rotate(path)
        return version

    async def start(self, model: Any, resumed_version: int | None) -> int:
        """Create the policy with the run's starting adapter (a fresh run: version 0; a resumed one: its
        checkpoint's version), or, resuming a run whose policy the gateway still serves, push to it.
        RunError if a fresh run's policy exists already (another run may be training it)."""
        from rlgate.rollout.errors import RunError

        name = self.client.policy
        assert name is not None
        served = {p["name"] for p in (await self.client.policies())["policies"]}
        if name in served and resumed_version is None:
            raise RunError(f"gateway.policy: {self.client.base_url} serves a policy {name!r} already (another run "
                           "training it?); choose another name, or unload it: POST /rl/policies/unload")
        if name in served:
            return await self.push(model)
        path = await self._save(model)
        version = await self.client.load_policy(name, str(path), version=resumed_version)
        self._rotate(path)
        return version
