"""The remote engine ``rlgate serve --engine sglang | vllm`` runs, built from its options.

Kept apart from ``cli.py`` so that the gateway process imports neither torch-based
engines nor model code when it drives SGLang / vLLM servers.
"""

from __future__ import annotations

from typing import Any

from rlgate.engine.remote.engine import RemoteEngine
from rlgate.engine.remote.options import RemoteOptions
from rlgate.engine.remote.sglang import SGLangEngine
from rlgate.engine.remote.vllm import VLLMEngine
from rlgate.engine.weight_check import DEFAULT_TOLERANCE

__all__ = ["engine_kwargs", "remote_engine"]


def engine_kwargs(kind: str, options: RemoteOptions, *, fallback_context: int | None,
                  weight_check_tolerance: float | None = DEFAULT_TOLERANCE) -> dict[str, Any]:
    """Keyword arguments of the SGLang or vLLM engine ``options`` describe (without the URLs)."""
    common: dict[str, Any] = {
        "weight_check_tolerance": weight_check_tolerance,
        "max_context_length": fallback_context,
        "failover": options.failover,
        "health_interval": options.health_interval,
        "read_timeout": options.backend_timeout,
        "max_connections": options.backend_max_connections,
        "api_key": options.backend_api_key,
        "strict_logprobs": options.strict_logprobs,
    }
    if kind == "sglang":
        return {**common, "pause_mode": options.sglang_pause_mode,
                "return_original_logprob": options.sglang_return_original_logprob}
    if kind == "vllm":
        return {**common, "logprobs_mode": options.vllm_logprobs_mode, "pause_mode": options.vllm_pause_mode}
    raise ValueError(f"not a remote engine: {kind}")


def remote_engine(kind: str, options: RemoteOptions, *, fallback_context: int | None,
                  weight_check_tolerance: float | None = DEFAULT_TOLERANCE) -> RemoteEngine:
    """The SGLang or vLLM engine ``options`` describe."""
    if not options.backend_url:
        raise ValueError(f"--engine {kind} needs at least one --backend-url")
    kwargs = engine_kwargs(kind, options, fallback_context=fallback_context,
                           weight_check_tolerance=weight_check_tolerance)
    engine_class = SGLangEngine if kind == "sglang" else VLLMEngine
    return engine_class(options.backend_url, **kwargs)
