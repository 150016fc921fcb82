"""``rlgate serve`` options of the remote engines, and the factory that builds one from them.

Kept apart from ``cli.py`` so that the gateway process imports neither torch-based
engines nor model code when it drives SGLang / vLLM servers. The defaults here are the
engines' own (``RemoteEngine`` and its subclasses read them from this class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlgate.config import option
from rlgate.engine.remote.pool import Failover

if TYPE_CHECKING:
    from rlgate.engine.remote.engine import RemoteEngine

__all__ = ["REMOTE_ENGINES", "RemoteOptions", "SGLangPauseMode", "VLLMLogprobsMode", "VLLMPauseMode", "remote_engine"]

REMOTE_ENGINES = ("sglang", "vllm")

SGLangPauseMode = Literal["retract", "in_place", "abort"]
VLLMLogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
VLLMPauseMode = Literal["wait", "keep", "abort"]


@dataclass
class RemoteOptions:
    """Options of ``--engine sglang | vllm``."""

    backend_url: list[str] = option(help="an inference server (repeat for several); sessions stick to one backend",
                                    factory=list, metavar="URL")
    backend_api_key: str | None = option(None, "Bearer key the backends require (their --api-key)", metavar="KEY")
    failover: Failover = option("fail", "requests of sessions pinned to a failed backend: answer 503 (fail) or move "
                                "the session to another backend (move; token-exact, loses the prefix cache)")
    health_interval: float = option(5.0, "seconds between backend health checks (0: no health loop)")
    backend_timeout: float = option(300.0, "seconds a backend may stay silent in the middle of a generation")
    backend_max_connections: int = option(512, "connections per backend")
    strict_logprobs: bool = option(False, "refuse (400) sampling parameters for which the backend's reported "
                                   "logprobs are not log_softmax(logits / T) (see docs/remote-engines.md)")
    sglang_pause_mode: SGLangPauseMode = option("retract", "how SGLang pauses in-flight requests during a weight "
                                                "update")
    sglang_return_original_logprob: bool = option(False, "the SGLang servers run with "
                                                  "SGLANG_RETURN_ORIGINAL_LOGPROB=1")
    vllm_logprobs_mode: VLLMLogprobsMode = option("raw_logprobs", "the vLLM servers' --logprobs-mode (read from "
                                                  "/server_info in dev mode)")
    vllm_pause_mode: VLLMPauseMode = option("wait", "how vLLM pauses in-flight requests during a weight update")


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
        from rlgate.engine.remote.sglang import SGLangEngine

        return SGLangEngine(options.backend_url, pause_mode=options.sglang_pause_mode,
                            return_original_logprob=options.sglang_return_original_logprob, **common)
    if kind == "vllm":
        from rlgate.engine.remote.vllm import VLLMEngine

        return VLLMEngine(options.backend_url, logprobs_mode=options.vllm_logprobs_mode,
                          pause_mode=options.vllm_pause_mode, **common)
    raise ValueError(f"not a remote engine: {kind}")
