"""One inference server as the remote engine sees it, and what each server kind implements."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx

__all__ = ["Backend", "BackendHooks", "BackendState"]

log = logging.getLogger("rlgate.engine.remote")

BackendState = Literal["healthy", "down", "stale"]


@dataclass(eq=False)
class Backend:
    """One inference server and what the engine knows about it."""

    url: str
    index: int
    state: BackendState = "healthy"
    reason: str = ""  # why it is not healthy
    version: int = 0  # gateway weight version these weights correspond to
    labels: dict[str, int] = field(default_factory=dict)  # backend weight label -> gateway version
    label: str | None = None  # the backend's current label for its weights, when it reports one
    model_path: str | None = None  # checkpoint the server was launched with (rollback target at v0)
    max_model_len: int | None = None
    in_flight: int = 0  # requests streaming now
    sessions: int = 0  # sessions pinned to it
    served: int = 0  # requests started, ever
    probed: bool = False
    dirty: bool = False  # its weights may not be what ``version`` says: reload before it serves again
    changed_at: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)  # engine-specific facts (served model name, ...)
    clients: list[httpx.AsyncClient] = field(default_factory=list)  # connection pool shards
    turn: int = 0
    loop: asyncio.AbstractEventLoop | None = None

    def set_state(self, state: BackendState, reason: str = "") -> None:
        if state != self.state:
            log.warning("backend %s: %s -> %s%s", self.url, self.state, state, f" ({reason})" if reason else "")
            self.changed_at = time.time()
        self.state = state
        self.reason = reason

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state,
            "reason": self.reason or None,
            "weight_version": self.version,
            "weight_label": self.label,
            "in_flight": self.in_flight,
            "sessions": self.sessions,
            "requests": self.served,
            "max_model_len": self.max_model_len,
        }


class BackendHooks(Protocol):
    """The weight protocol of one server kind (SGLang, vLLM); :class:`RemoteEngine` subclasses
    implement it. Each method raises ``httpx.HTTPError``, ``BackendRejected``,
    ``MalformedResponse`` or ``WeightUpdateError`` (``LoadRefused``: the weights were kept)."""

    @property
    def kind(self) -> str:
        """The server kind, for messages ("sglang", "vllm")."""
        ...

    @property
    def reports_labels(self) -> bool:
        """Does the server label its weights (SGLang's weight_version)?"""
        ...

    async def probe_backend(self, b: Backend) -> None:
        """Read model info (context length, launch checkpoint, weight label) into ``b``."""
        ...

    async def pause_backend(self, b: Backend) -> bool:
        """Pause generation for a weight update; False if the server has no pause."""
        ...

    async def resume_backend(self, b: Backend) -> None:
        """Resume generation after :meth:`pause_backend`."""
        ...

    async def load_weights(self, b: Backend, path: str, label: str) -> None:
        """Load the checkpoint at ``path``, labelled ``label`` where the server keeps labels."""
        ...

    async def restore_adapters(self, b: Backend) -> None:
        """Load the LoRA adapters the engine serves on ``b`` (a backend that rejoins)."""
        ...

    def label_for(self, version: int) -> str:
        """The label the server gets for the gateway's weight ``version``."""
        ...

    async def score_backend(self, b: Backend, input_ids: list[int]) -> list[float]:
        """Teacher-forced ``log_softmax(logits)`` of ``input_ids[1:]`` on ``b`` (the weight check)."""
        ...
