"""What engine each replica builds: small picklable specs, called inside the replica's process.

A spec is called as ``spec(tokenizer, index) -> Engine`` by replica ``index``; Ray ships the
spec (not an engine) to wherever the replica is placed, so GPUs, threads and connections
are made there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rlgate.engine.options import EngineOptions


class EngineSpec(Protocol):
    def __call__(self, tokenizer: Any, index: int) -> Any:
        ...


@dataclass
class FakeEngineSpec:
    """The scripted :class:`~rlgate.engine.fake.FakeEngine` (tests, benchmarks)."""

    output_tokens: int = 16
    token_delay: float = 0.0
    max_context_length: int = 4096

    def __call__(self, tokenizer: Any, index: int) -> Any:
        from rlgate.engine.fake import FakeEngine

        return FakeEngine(tokenizer, output_tokens=self.output_tokens, token_delay=self.token_delay,
                          max_context_length=self.max_context_length)


@dataclass
class LocalEngineSpec:
    """A :class:`~rlgate.engine.local.LocalEngine` per replica (one GPU each: ``num_gpus=1``)."""

    model: str
    device: str | None = None
    max_batch_size: int = EngineOptions.max_batch_size
    max_context_length: int | None = None

    def __call__(self, tokenizer: Any, index: int) -> Any:
        from rlgate.engine.local import LocalEngine

        return LocalEngine(self.model, device=self.device, max_batch_size=self.max_batch_size,
                           max_context_length=self.max_context_length)


@dataclass
class RemoteEngineSpec:
    """SGLang / vLLM servers: replica ``i`` drives ``backends[i % len(backends)]`` (a list of URLs),
    so the inference servers are shared out between the replicas."""

    kind: Literal["sglang", "vllm"]
    backends: list[list[str]]
    options: dict[str, Any] = field(default_factory=dict)  # SGLangEngine / VLLMEngine keyword arguments

    def __call__(self, tokenizer: Any, index: int) -> Any:
        urls = self.backends[index % len(self.backends)]
        if self.kind == "sglang":
            from rlgate.engine.remote.sglang import SGLangEngine

            return SGLangEngine(urls, **self.options)
        from rlgate.engine.remote.vllm import VLLMEngine

        return VLLMEngine(urls, **self.options)
