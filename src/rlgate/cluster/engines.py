"""What engine each replica builds: small picklable specs, called inside the replica's process.

A spec is called as ``spec(tokenizer, index) -> Engine`` by replica ``index``; Ray ships the
spec (not an engine) to wherever the replica is placed, so GPUs, threads and connections
are made there. Every spec builds through ``engine/factory.py``'s :class:`EnginePlan` (itself a
spec: ``rlgate serve --replicas`` ships one); the three below are its short forms for code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from rlgate.engine.factory import EnginePlan
from rlgate.engine.options import EngineOptions
from rlgate.engine.remote.options import RemoteOptions

__all__ = ["EnginePlan", "EngineSpec", "FakeEngineSpec", "LocalEngineSpec", "RemoteEngineSpec"]


class EngineSpec(Protocol):
    def __call__(self, tokenizer: Any, index: int) -> Any:
        ...


@dataclass
class FakeEngineSpec:
    """The scripted :class:`~rlgate.engine.fake.FakeEngine` (tests, benchmarks)."""

    output_tokens: int = EngineOptions.fake_output_tokens
    token_delay: float = EngineOptions.fake_token_delay
    max_context_length: int = 4096

    def __call__(self, tokenizer: Any, index: int) -> Any:
        options = EngineOptions(engine="fake", fake_output_tokens=self.output_tokens,
                                fake_token_delay=self.token_delay)
        return EnginePlan(options, context_length=self.max_context_length).build(tokenizer, index=index)


@dataclass
class LocalEngineSpec:
    """A :class:`~rlgate.engine.local.LocalEngine` per replica (one GPU each: ``num_gpus=1``)."""

    model: str
    device: str | None = None
    max_batch_size: int = EngineOptions.max_batch_size
    max_context_length: int | None = None

    def __call__(self, tokenizer: Any, index: int) -> Any:
        options = EngineOptions(engine="local", device=self.device, max_batch_size=self.max_batch_size)
        return EnginePlan(options, self.model, self.max_context_length).build(tokenizer, index=index)


@dataclass
class RemoteEngineSpec:
    """SGLang / vLLM servers: replica ``i`` drives ``backends[i % len(backends)]`` (a list of URLs),
    so the inference servers are shared out between the replicas; ``options`` are ``rlgate serve``'s
    remote-engine options (their ``backend_url`` is replaced by the replica's share)."""

    kind: Literal["sglang", "vllm"]
    backends: list[list[str]]
    options: RemoteOptions = field(default_factory=RemoteOptions)

    def __call__(self, tokenizer: Any, index: int) -> Any:
        urls = self.backends[index % len(self.backends)]
        plan = EnginePlan(EngineOptions(engine=self.kind), remote=replace(self.options, backend_url=list(urls)))
        return plan.build(tokenizer)
