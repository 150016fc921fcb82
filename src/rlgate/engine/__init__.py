"""rlgate.engine: the engine contract, the optional capabilities and the engines that implement them.

``import rlgate.engine`` stays light (no torch); :class:`LocalEngine` and the remote engines
(:class:`SGLangEngine`, :class:`VLLMEngine`) are imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlgate.engine.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    StreamingEngineMixin,
    TokenDelta,
    WeightUpdateError,
    collect,
)
from rlgate.engine.capabilities import (
    DescribesBackends,
    HasModel,
    HasStats,
    Pausable,
    QueueWaitObservable,
    VersionRestorable,
)

if TYPE_CHECKING:
    from rlgate.engine.local import LocalEngine
    from rlgate.engine.remote.sglang import SGLangEngine
    from rlgate.engine.remote.vllm import VLLMEngine


def __getattr__(name: str) -> Any:
    if name == "LocalEngine":
        try:
            from rlgate.engine.local import LocalEngine
        except ImportError as exc:
            raise ImportError(f"LocalEngine needs torch ({exc}); install it with: pip install 'rlgate[local]'") from exc
        return LocalEngine
    if name == "SGLangEngine":
        from rlgate.engine.remote import SGLangEngine

        return SGLangEngine
    if name == "VLLMEngine":
        from rlgate.engine.remote import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DescribesBackends",
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "HasModel",
    "HasStats",
    "LocalEngine",
    "Pausable",
    "QueueWaitObservable",
    "SGLangEngine",
    "SamplingParams",
    "StreamingEngineMixin",
    "TokenDelta",
    "VLLMEngine",
    "VersionRestorable",
    "WeightUpdateError",
    "collect",
]
