"""The LoRA adapters a fake vLLM / SGLang server holds (testing/fake_vllm.py, fake_sglang.py).

Both fakes load an adapter into the rlgate engine they serve (``capabilities.ServesAdapters``: the local
engine's real adapters, or the fake engine's bookkeeping) under the name the client gave, as the real
servers do (vLLM ``POST /v1/load_lora_adapter`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and
``--enable-lora``; SGLang ``POST /load_lora_adapter`` with ``--enable-lora``), and a generation request
names one: vLLM in its ``model`` field, SGLang in ``lora_path``. Only the parts of the real contract
rlgate uses are emulated: names and paths, in-place reloads (vLLM's ``load_inplace``), unloading, the
list in ``/v1/models``; the real servers' own limits (``--max-loras``, ``--max-lora-rank``) are not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlgate.engine.base import EngineError
from rlgate.engine.capabilities import ServesAdapters

__all__ = ["FakeLoras"]


@dataclass
class FakeLoras:
    """Adapter name -> the path it was loaded from."""

    engine: Any
    paths: dict[str, str] = field(default_factory=dict)
    loads: list[dict[str, Any]] = field(default_factory=list)  # every load asked for (tests read it)

    async def load(self, name: Any, path: Any, *, replace: bool) -> str | None:
        """Load ``path`` as ``name``; None, or why not (the caller answers it in its server's shape)."""
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            return "Both 'lora_name' and 'lora_path' must be provided."
        if name in self.paths and not replace:
            return (f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                    "set 'load_inplace' to True.")
        if not isinstance(self.engine, ServesAdapters):
            return "this fake's engine serves no LoRA adapters"
        self.loads.append({"name": name, "path": path, "replace": replace})
        try:
            await self.engine.load_adapter(name, path)
        except EngineError as exc:
            return f"Loading lora {name} failed: {exc.message}"
        self.paths[name] = path
        return None

    async def unload(self, name: Any) -> str | None:
        if not isinstance(name, str) or name not in self.paths:
            return f"The lora adapter '{name}' cannot be found."
        assert isinstance(self.engine, ServesAdapters)
        await self.engine.unload_adapter(name)
        del self.paths[name]
        return None

    def cards(self, base: str, owner: str) -> list[dict[str, Any]]:
        """``/v1/models`` entries of the adapters, as vLLM lists them (after the base model)."""
        return [{"id": name, "object": "model", "owned_by": owner, "root": path, "parent": base}
                for name, path in self.paths.items()]
