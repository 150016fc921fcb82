"""Every engine rlgate serves from is built here, from one plan.

``rlgate serve`` (one process, ``--replicas N`` on Ray, ``--online-train``'s two slots) and
``rlgate train``'s gateway (in process, or replicas on Ray) describe the engine they want as an
:class:`EnginePlan` (``engine/options.py``'s :class:`EngineOptions`, the remote engines'
:class:`RemoteOptions`, the model and the context length) and call :meth:`EnginePlan.build`, so a
flag means the same in each of them (``--weight-check-tolerance`` and ``--max-rows-per-session``
reach a replica's engine as they reach a single gateway's).

A plan is plain data: Ray ships it (not an engine) to each replica, which calls it as
``plan(tokenizer, index)``; GPUs, threads and connections are made there. ``import`` stays
light: torch and the engines are imported by :meth:`EnginePlan.build`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlgate.engine.options import EngineOptions
from rlgate.engine.remote.options import RemoteOptions

__all__ = ["EnginePlan"]

FALLBACK_CONTEXT = 32768  # a fake engine's context when neither the flags nor the model's config name one


@dataclass
class EnginePlan:
    """What engine to build: ``options.engine`` picks the kind (local, fake, sglang, vllm)."""

    options: EngineOptions = field(default_factory=EngineOptions)
    model: str = ""  # the checkpoint directory (local) or the tokenizer's directory (the others)
    context_length: int | None = None  # the gateway's --context-length (None: the model's own)
    model_context: int | None = None  # the model's own context (its config.json): for engines that cannot read it
    remote: RemoteOptions = field(default_factory=RemoteOptions)  # --engine sglang | vllm
    seed: int | None = None  # local: seed of the sampling (rlgate train's rollout.seed)
    threads: int | None = None  # local: torch threads (None: torch's default)
    replicas: int = 1  # remote: the backends are shared out between this many replicas

    def __call__(self, tokenizer: Any, index: int) -> Any:
        """The cluster's engine-spec contract (``cluster/engines.py``): replica ``index``'s engine."""
        return self.build(tokenizer, index=index)

    def build(self, tokenizer: Any, *, index: int = 0, model: Any = None) -> Any:
        """The engine (``ValueError``: options it cannot be built with; ``ImportError``: the local engine
        without torch). ``model``: a loaded model the local engine serves instead of reading ``self.model``
        (the online trainer's two slots); ``index``: which replica's share of the remote backends."""
        o = self.options
        if o.engine == "fake":
            from rlgate.engine.fake import FakeEngine

            return FakeEngine(tokenizer, output_tokens=o.fake_output_tokens, token_delay=o.fake_token_delay,
                              max_context_length=self.fallback_context() or FALLBACK_CONTEXT)
        if o.engine in ("sglang", "vllm"):
            from rlgate.engine.remote.factory import remote_engine

            urls = self.backends(index)
            return remote_engine(o.engine, replace(self.remote, backend_url=urls),
                                 fallback_context=self.fallback_context(),
                                 weight_check_tolerance=o.weight_check_tolerance)
        if o.engine != "local":
            raise ValueError(f"unknown engine {o.engine!r}")
        import rlgate.engine as engines

        local_engine = engines.LocalEngine  # ImportError without torch, naming the extra to install
        if model is not None:
            return local_engine(model=model, **self.local_kwargs())
        return local_engine(self.model, **self.local_kwargs())

    def local_kwargs(self) -> dict[str, Any]:
        """The local engine's keyword arguments (without the model)."""
        o = self.options
        return {"device": o.device, "max_batch_size": o.max_batch_size, "max_context_length": self.context_length,
                "max_rows_per_session": o.max_rows_per_session, "weight_check_tolerance": o.weight_check_tolerance,
                "seed": self.seed, "threads": self.threads}

    def backends(self, index: int) -> list[str]:
        """Replica ``index``'s backend URLs: the backends ``index``, ``index + replicas``, ...; with fewer
        backends than replicas they are shared."""
        urls = list(self.remote.backend_url)
        if not urls:
            raise ValueError(f"--engine {self.options.engine} needs at least one --backend-url")
        if self.replicas <= 1:
            return urls
        return urls[index::self.replicas] or [urls[index % len(urls)]]

    def fallback_context(self) -> int | None:
        """The context length an engine that cannot read the model is given: the configured one, else
        the model's own."""
        return self.context_length or self.model_context
