"""``rlgate serve`` options of the remote engines (``factory.remote_engine`` builds one).

The defaults here are the engines' own (``RemoteEngine`` and its subclasses read them from
this class), so they are written once.
"""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from rlgate.config import OPTIONS, option
from rlgate.engine.remote.pool import Failover

__all__ = ["REMOTE_ENGINES", "RemoteOptions", "SGLangPauseMode", "VLLMLogprobsMode", "VLLMPauseMode"]

REMOTE_ENGINES = ("sglang", "vllm")

SGLangPauseMode = Literal["retract", "in_place", "abort"]
VLLMLogprobsMode = Literal["raw_logprobs", "processed_logprobs"]
VLLMPauseMode = Literal["abort", "wait", "keep"]


@dataclass(config=OPTIONS)
class RemoteOptions:
    """Options of ``--engine sglang | vllm``."""

    backend_url: list[str] = option(help="an inference server (repeat for several); sessions stick to one backend",
                                    factory=list, metavar="URL")
    backend_api_key: str | None = option(None, "Bearer key the backends require (their --api-key)", metavar="KEY")
    failover: Failover = option("fail", "requests of sessions pinned to a failed backend: answer 503 (fail) or move "
                                "the session to another backend (move; token-exact, loses the prefix cache)")
    health_interval: float = option(5.0, "seconds between backend health checks (0: no health loop)", ge=0)
    backend_timeout: float = option(300.0, "seconds a backend may stay silent in the middle of a generation", ge=0)
    backend_max_connections: int = option(512, "connections per backend", ge=1)
    strict_logprobs: bool = option(False, "refuse (400) sampling parameters for which the backend's reported "
                                   "logprobs are not log_softmax(logits / T) (see docs/remote-engines.md)")
    sglang_pause_mode: SGLangPauseMode = option("retract", "how SGLang pauses in-flight requests during a weight "
                                                "update (abort: they are resumed from their prefix, transparently)")
    sglang_return_original_logprob: bool = option(False, "the SGLang servers run with "
                                                  "SGLANG_RETURN_ORIGINAL_LOGPROB=1")
    vllm_logprobs_mode: VLLMLogprobsMode = option("raw_logprobs", "the vLLM servers' --logprobs-mode (read from "
                                                  "/server_info in dev mode)")
    vllm_pause_mode: VLLMPauseMode = option("abort", "how vLLM pauses in-flight requests during a weight update "
                                            "(abort: they are resumed from their prefix, transparently)")
