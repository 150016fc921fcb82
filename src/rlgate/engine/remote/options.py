"""Command-line options of the remote engines and the factory ``rlgate serve`` uses.

Kept apart from ``cli.py`` so that the gateway process imports neither torch-based
engines nor model code when it drives SGLang / vLLM servers.
"""

from __future__ import annotations

import argparse
from typing import Any

REMOTE_ENGINES = ("sglang", "vllm")


def add_remote_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("remote engines (--engine sglang | vllm)")
    g.add_argument("--backend-url", action="append", default=[], metavar="URL",
                   help="an inference server (repeat for several); sessions stick to one backend")
    g.add_argument("--backend-api-key", default=None, help="Bearer key the backends require (their --api-key)")
    g.add_argument("--failover", choices=["fail", "move"], default="fail",
                   help="requests of sessions pinned to a failed backend: answer 503 (fail) or move the session "
                        "to another backend (move; token-exact, loses the prefix cache)")
    g.add_argument("--health-interval", type=float, default=5.0, help="seconds between backend health checks")
    g.add_argument("--backend-timeout", type=float, default=300.0,
                   help="seconds a backend may stay silent in the middle of a generation")
    g.add_argument("--backend-max-connections", type=int, default=512, help="connections per backend")
    g.add_argument("--strict-logprobs", action="store_true",
                   help="refuse (400) sampling parameters for which the backend's reported logprobs are not "
                        "log_softmax(logits / T) (see docs/remote-engines.md)")
    g.add_argument("--sglang-pause-mode", choices=["retract", "in_place", "abort"], default="retract",
                   help="how SGLang pauses in-flight requests during a weight update (abort: they are resumed "
                        "from their prefix, transparently)")
    g.add_argument("--sglang-return-original-logprob", action="store_true",
                   help="the SGLang servers run with SGLANG_RETURN_ORIGINAL_LOGPROB=1")
    g.add_argument("--vllm-logprobs-mode", choices=["raw_logprobs", "processed_logprobs"], default="raw_logprobs",
                   help="the vLLM servers' --logprobs-mode (read from /server_info in dev mode)")
    g.add_argument("--vllm-pause-mode", choices=["abort", "wait", "keep"], default="abort",
                   help="how vLLM pauses in-flight requests during a weight update (abort: they are resumed "
                        "from their prefix, transparently)")


def remote_engine_options(args: argparse.Namespace, *, fallback_context: int | None) -> dict[str, Any]:
    """Keyword arguments of the SGLang or vLLM engine described by ``rlgate serve``'s arguments
    (without the backend URLs)."""
    common: dict[str, Any] = {
        "max_context_length": fallback_context,
        "failover": args.failover,
        "health_interval": args.health_interval,
        "read_timeout": args.backend_timeout,
        "max_connections": args.backend_max_connections,
        "api_key": args.backend_api_key,
        "strict_logprobs": args.strict_logprobs,
    }
    if args.engine == "sglang":
        return {**common, "pause_mode": args.sglang_pause_mode,
                "return_original_logprob": args.sglang_return_original_logprob}
    if args.engine == "vllm":
        return {**common, "logprobs_mode": args.vllm_logprobs_mode, "pause_mode": args.vllm_pause_mode}
    raise ValueError(f"not a remote engine: {args.engine}")


def remote_engine_from_args(args: argparse.Namespace, *, fallback_context: int | None) -> Any:
    """The SGLang or vLLM engine described by ``rlgate serve``'s arguments."""
    if not args.backend_url:
        raise SystemExit(f"rlgate: --engine {args.engine} needs at least one --backend-url")
    options = remote_engine_options(args, fallback_context=fallback_context)
    if args.engine == "sglang":
        from rlgate.engine.remote.sglang import SGLangEngine

        return SGLangEngine(args.backend_url, **options)
    from rlgate.engine.remote.vllm import VLLMEngine

    return VLLMEngine(args.backend_url, **options)
