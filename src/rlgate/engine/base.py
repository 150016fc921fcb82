"""The engine contract: token ids in, token ids + logprobs + versions out.

An engine knows nothing about messages, chat templates or HTTP. It receives a
:class:`GenerateRequest` (prompt token ids and sampling parameters) and produces
the generated token ids, one logprob and one weight version per generated token,
and a finish reason.

Which distribution ``output_logprobs`` refer to
------------------------------------------------
For every generated token ``t`` at position ``i``::

    output_logprobs[i] = log_softmax(logits_i / T)[t]      if T > 0
    output_logprobs[i] = log_softmax(logits_i)[t]          if T == 0 (greedy)

where ``logits_i`` are the model's raw next-token logits and ``T`` is the
request's temperature. Top-k / top-p truncation changes *which* tokens can be
sampled but is **not** renormalised into the reported logprob. So at
``temperature=1, top_p=1, top_k=0`` the logprobs are exactly the model's plain
log-softmax, which is what a trainer recomputes with a teacher-forced forward
pass (divide the logits by the same temperature when T != 1).

Remote engines (``engine/remote/sglang.py``, ``engine/remote/vllm.py``) record what their servers
report. SGLang's default is exactly this distribution. vLLM's default
(``--logprobs-mode raw_logprobs``) is ``log_softmax(logits)`` whatever the temperature,
so it matches only at T = 1 (or greedy); ``processed_logprobs`` matches whenever top-k /
top-p are off. ``RemoteEngine.logprobs_follow_contract(sampling)`` tells which case
applies; see docs/remote-engines.md.

Versions
--------
Every engine has an integer weight ``version`` (0 at start). Loading new weights
bumps it by one. Each generated token is tagged with the version of the weights
that produced it, so a request in flight across a weight update carries two
versions. A request for a LoRA adapter (``GenerateRequest.adapter``, engines with
``capabilities.ServesAdapters``) is tagged with that adapter's own version instead.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


class EngineError(Exception):
    """The engine could not serve a request (backend down, malformed reply, ...).

    ``status`` is the HTTP status the gateway should answer with (502 for a bad
    backend reply, 503 for an unavailable backend, 400 for a request the engine
    refuses).
    """

    def __init__(self, message: str, *, status: int = 502, code: str = "engine_error") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code


class WeightUpdateError(EngineError):
    """New weights could not be loaded; the engine keeps serving the old ones."""

    def __init__(self, message: str, *, status: int = 400, code: str = "weight_update_failed") -> None:
        super().__init__(message, status=status, code=code)


# Temperatures below this are greedy (vLLM's and SGLang's _SAMPLING_EPS).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Defaults are the plain model distribution."""

    max_new_tokens: int = 512  # hard cap on generated tokens (>= 1)
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0  # nucleus mass in (0, 1]
    top_k: int = 0  # 0 or -1 disables top-k
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these
    seed: int | None = None  # per-request seed: same seed + same prompt -> same tokens,
    # whatever else is in the batch

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if self.temperature < GREEDY_BELOW:
            # Sampling at T -> 0 is greedy; dividing logits by a tiny T overflows instead (1e-300 is
            # 0 in float32: the local engine sampled at T=1 while 1e-300 was recorded). Every engine
            # and the recorded trajectory see the same value: 0, greedy (vLLM and SGLang do the same).
            object.__setattr__(self, "temperature", 0.0)
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError("top_k must be >= -1")


@dataclass
class GenerateRequest:
    """One generation: prompt token ids + sampling parameters."""

    input_ids: list[int]  # the full prompt, exactly as the model must see it
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""  # for logs and for routing; engines may ignore it
    session_id: str | None = None  # lets multi-backend engines pin a session to one backend
    adapter: str | None = None  # a LoRA adapter the engine holds (capabilities.ServesAdapters); None: the base


@dataclass
class TokenDelta:
    """A piece of a streamed generation: the tokens produced since the last delta.

    The last delta of a stream has ``finish_reason`` set (and may carry no tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason | None = None


@dataclass
class GenerateResult:
    """A finished generation."""

    output_ids: list[int]  # generated token ids, including the stop token if one was produced
    output_logprobs: list[float]  # one per output id (see module docstring for the distribution)
    output_versions: list[int]  # weight version that produced each output id
    finish_reason: FinishReason  # stop: stop token; length: max_new_tokens; abort: cancelled

    @classmethod
    def from_deltas(cls, deltas: Sequence[TokenDelta]) -> GenerateResult:
        ids: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        finish: FinishReason = "abort"
        for d in deltas:
            ids.extend(d.token_ids)
            lps.extend(d.logprobs)
            vers.extend(d.versions)
            if d.finish_reason is not None:
                finish = d.finish_reason
        return cls(ids, lps, vers, finish)


@runtime_checkable
class Engine(Protocol):
    """What the gateway needs from an inference engine."""

    @property
    def version(self) -> int:
        """Current weight version (0 at start, +1 per weight update)."""
        ...

    @property
    def max_context_length(self) -> int:
        """Longest prompt + output the engine accepts, in tokens."""
        ...

    def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        """Yield tokens as they are produced; the last delta has a finish reason.

        Closing the iterator early (``aclose()``, task cancellation, client
        disconnect) aborts the request inside the engine.
        """
        ...

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate to completion."""
        ...

    async def update_weights_from_path(self, path: str) -> int:
        """Load a checkpoint directory (safetensors); return the new version.

        Generation pauses during the swap. Raises :class:`WeightUpdateError` and keeps
        the old weights if ``path`` does not hold a compatible checkpoint.
        """
        ...

    async def start(self) -> None:
        """Acquire resources (threads, connections). Idempotent."""
        ...

    async def close(self) -> None:
        """Abort in-flight requests and release resources. Idempotent."""
        ...


async def collect(stream: AsyncIterator[TokenDelta]) -> GenerateResult:
    """Drain a token stream into a :class:`GenerateResult`."""
    deltas = [d async for d in stream]
    return GenerateResult.from_deltas(deltas)


class StreamingEngineMixin:
    """``generate`` implemented on top of ``stream``."""

    def stream(self, request: GenerateRequest) -> AsyncGenerator[TokenDelta, None]:
        raise NotImplementedError

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        stream = self.stream(request)
        try:
            return await collect(stream)
        finally:
            await stream.aclose()


__all__ = [
    "Engine",
    "EngineError",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
    "StreamingEngineMixin",
    "TokenDelta",
    "WeightUpdateError",
    "collect",
]
