"""The remote engine ``rlgate serve --engine sglang | vllm`` runs, built from its options.

Kept apart from ``cli.py`` so that the gateway process imports neither torch-based
engines nor model code when it drives SGLang / vLLM servers.
"""

from __future__ import annotations

from rlgate.engine.remote.engine import RemoteEngine
from rlgate.engine.remote.options import RemoteOptions
from rlgate.engine.remote.sglang import SGLangEngine
from rlgate.engine.remote.vllm import VLLMEngine

__all__ = ["remote_engine"]


def remote_engine(kind: str, options: RemoteOptions, *, fallback_context: int | None) -> RemoteEngine:
    """The SGLang or vLLM engine ``options`` describe."""
    if not options.backend_url:
        raise ValueError(f"--engine {kind} needs at least one --backend-url")
    common = {
        "max_context_length": fallback_context,
        "failover": options.failover,
        "health_interval": options.health_interval,
        "read_timeout": options.backend_timeout,
        "max_connections": options.backend_max_connections,
        "api_key": options.backend_api_key,
        "strict_logprobs": options.strict_logprobs,
    }
    if kind == "sglang":
        return SGLangEngine(options.backend_url, pause_mode=options.sglang_pause_mode,
                            return_original_logprob=options.sglang_return_original_logprob, **common)
    if kind == "vllm":
        return VLLMEngine(options.backend_url, logprobs_mode=options.vllm_logprobs_mode,
                          pause_mode=options.vllm_pause_mode, **common)
    raise ValueError(f"not a remote engine: {kind}")
