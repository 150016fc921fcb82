"""rlgate.engine: the engine contract and the engines that implement it.

``import rlgate.engine`` stays light (no torch); :class:`LocalEngine` is imported on first
access.
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

if TYPE_CHECKING:
    from rlgate.engine.local import LocalEngine


def __getattr__(name: str) -> Any:
    if name == "LocalEngine":
        from rlgate.engine.local import LocalEngine

        return LocalEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "LocalEngine",
    "SamplingParams",
    "StreamingEngineMixin",
    "TokenDelta",
    "WeightUpdateError",
    "collect",
]
