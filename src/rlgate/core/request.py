"""A generation request in rlgate's internal form, whatever surface it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.chat.conversation import Message, ToolSpec


@dataclass(frozen=True)
class NamedTool:
    """A ``tool_choice`` that names one tool (the surfaces' function / tool forms)."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedTool


@dataclass
class ChatRequest:
    """A generation request in rlgate's internal form (any surface).

    The defaults are the ones a request gets for what it leaves out (``api/normalize.py``
    builds every surface's request through them).
    """

    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"  # only "none" changes anything (no tool-call parsing)
    max_tokens: int | None = None  # generated tokens; None -> the rest of the context (or config.default_max_tokens)
    max_total_tokens: int | None = None  # prompt + generated
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # The client's ``store`` flag (Responses API). Every call is recorded for training whatever
    # it says; False only means previous_response_id cannot name this call later.
    store: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # The SDK's retry count (x-stainless-retry-count): > 0 when the client resends a request it gave
    # up on (a timeout); the earlier attempt of the same turn is then superseded, not a second branch.
    retry_attempt: int = 0
    # The request's ``model`` field: the policy that serves it, when it names one (core/policies.py).
    model: str | None = None
