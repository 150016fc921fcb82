"""LoRA adapters on remote backends, through the servers' own runtime LoRA APIs (``ServesAdapters``).

* **vLLM** (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): ``POST /v1/load_lora_adapter
  {"lora_name", "lora_path"}`` (a replacement adds ``"load_inplace": true``), ``POST
  /v1/unload_lora_adapter {"lora_name"}``; a completion names the adapter in its ``model`` field.
* **SGLang** (``--enable-lora``): ``POST /load_lora_adapter {"lora_name", "lora_path"}``, ``POST
  /unload_lora_adapter {"lora_name"}``; a replacement is an unload then a load; ``/generate`` names
  the adapter in ``lora_path``.

An adapter is loaded on every backend serving now, and counts as loaded (its version bumped) only if
every one of them loaded it; a replacement that some backend refused is rolled back on the others (the
previous directory loaded again). A backend that rejoins later gets every adapter before it serves
again. Each backend loads the directory itself: it must be visible at the same path to the gateway
and to the backends, as for full weights.

Versions are the gateway's (one per adapter): a token of an adapter request is tagged with that
adapter's version current when its event arrived. The servers swap an adapter under requests in flight
without telling which tokens came from which weights, so a token produced just before a replacement
and read after it is tagged with the new version (as for full weights in vLLM's ``keep`` pause mode).
Tested against a real vLLM server (its CPU build: tests/test_vllm_real.py; vLLM's base requests then name a
zero identity adapter, engine/remote/vllm.py ``IDENTITY``) and against the fake servers' contract
(testing/fake_lora.py); SGLang against the fake only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import httpx

from rlgate.engine.base import EngineError, GenerateRequest, WeightUpdateError
from rlgate.engine.remote.backend import Backend
from rlgate.engine.remote.errors import BackendRejected, describe_exc, error_text
from rlgate.engine.weights_path import adapter_dir

if TYPE_CHECKING:
    from rlgate.engine.remote.pool import BackendPool

__all__ = ["RemoteAdapters"]

log = logging.getLogger("rlgate.engine.remote")


@dataclass
class _Adapter:
    path: str
    version: int


class RemoteAdapters:
    """``load_adapter`` / ``unload_adapter`` / ``adapter_versions`` of the remote engines (mixed into
    ``RemoteEngine``; each server kind implements :meth:`load_lora` and :meth:`unload_lora`)."""

    kind: ClassVar[str]
    pool: BackendPool
    update_timeout: float
    _lora: dict[str, _Adapter]

    async def ensure_ready(self) -> None:
        raise NotImplementedError

    async def load_lora(self, b: Backend, name: str, path: str, replace: bool) -> None:
        """Load (``replace``: reload in place) adapter ``name`` from ``path`` on ``b``; raise on a refusal."""
        raise NotImplementedError

    async def unload_lora(self, b: Backend, name: str) -> None:
        raise NotImplementedError

    def adapter_versions(self) -> dict[str, int]:
        return {name: a.version for name, a in self._lora.items()}

    def check_adapter(self, request: GenerateRequest) -> None:
        if request.adapter is not None and request.adapter not in self._lora:
            raise EngineError(f"no adapter {request.adapter!r} is loaded", status=404, code="adapter_not_found")

    def adapter_version(self, name: str) -> int:
        adapter = self._lora.get(name)
        if adapter is None:
            raise EngineError(f"adapter {name!r} was unloaded", status=410, code="adapter_unloaded")
        return adapter.version

    async def load_adapter(self, name: str, path: str, version: int | None = None) -> int:
        await asyncio.to_thread(adapter_dir, path)
        await self.ensure_ready()
        targets = [b for b in self.pool.backends if self.pool.eligible(b)]
        if not targets:
            raise WeightUpdateError(f"no {self.kind} backend is available to load adapter {name!r}", status=503)
        old = self._lora.get(name)
        errors = await asyncio.gather(*(self._try(self.load_lora(b, name, path, old is not None)) for b in targets))
        failed = [(b, e) for b, e in zip(targets, errors, strict=True) if e is not None]
        if failed:
            done = [b for b, e in zip(targets, errors, strict=True) if e is None]
            undo = (self._try(self.load_lora(b, name, old.path, True)) if old is not None else
                    self._try(self.unload_lora(b, name)) for b in done)
            for b, e in zip(done, await asyncio.gather(*undo), strict=True):
                if e is not None:  # it serves weights the gateway does not know: out of rotation until resynced
                    b.dirty = True
                    b.set_state("stale", f"adapter {name!r}: undoing a failed load failed: {describe_exc(e)}")
            notes = "; ".join(f"{b.url}: {describe_exc(e)}" for b, e in failed)
            raise WeightUpdateError(f"adapter {name!r} from {path} failed on {len(failed)} of {len(targets)} "
                                    f"{self.kind} backend(s): {notes}", status=400 if len(failed) == len(targets)
                                    else 502)
        new = version if version is not None else (old.version + 1 if old is not None else 0)
        self._lora[name] = _Adapter(path, new)
        log.info("%s: adapter %s loaded from %s on %d backend(s): version %d", self.kind, name, path, len(targets), new)
        return new

    async def unload_adapter(self, name: str) -> None:
        if self._lora.pop(name, None) is None:
            return
        backends = [b for b in self.pool.backends if b.state == "healthy"]
        for b, e in zip(backends, await asyncio.gather(*(self._try(self.unload_lora(b, name)) for b in backends)),
                        strict=True):
            if e is not None:
                log.warning("%s backend %s: unloading adapter %s failed (%s)", self.kind, b.url, name, describe_exc(e))

    async def restore_adapters(self, b: Backend) -> None:
        """Load every adapter on ``b`` before it serves again (a backend that rejoins); raise on a failure."""
        for name, adapter in list(self._lora.items()):
            try:
                await self.load_lora(b, name, adapter.path, False)
            except BackendRejected:  # held already (it never lost it): load it in place to be sure of the weights
                await self.load_lora(b, name, adapter.path, True)

    async def _try(self, call: Awaitable[None]) -> BaseException | None:
        try:
            await call
            return None
        except (httpx.HTTPError, BackendRejected, WeightUpdateError) as exc:
            return exc

    async def lora_call(self, b: Backend, path: str, body: dict[str, object], *, missing_ok: bool = False) -> None:
        """POST a LoRA route of ``b``; BackendRejected unless it answers 200 (``missing_ok``: a 404 is fine too:
        an unload of an adapter the server does not hold)."""
        r = await self.pool.call(b, "POST", path, json_body=body, timeout=self.update_timeout)
        if r.status_code == 200 or (missing_ok and r.status_code in (400, 404)):
            return
        if r.status_code in (404, 405) and not missing_ok:
            raise BackendRejected(f"{path} -> HTTP {r.status_code}: {error_text(r)} (the runtime LoRA API needs vLLM's "
                                  "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or SGLang's --enable-lora)",
                                  r.status_code)
        raise BackendRejected(f"{path} -> HTTP {r.status_code}: {error_text(r)}", r.status_code)
