"""The record of one LLM call and the session that holds it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from rlgate.chat.conversation import Message, ToolSpec
from rlgate.chat.render_cache import RenderCache

Relation = Literal["root", "extend", "fork"]
InteractionStatus = Literal["pending", "completed", "failed"]
SessionStatus = Literal["active", "ended", "interrupted"]
TrajectoryMode = Literal["token_exact", "rerender"]


@dataclass
class Interaction:
    """One call to the policy, exactly as the model saw and produced it."""

    id: str  # the API response id (chatcmpl-…, msg_…, resp_…); rewards refer to it
    session_id: str
    api: str  # "chat" | "responses" | "messages": the surface that served it
    messages: list[Message]  # request messages (internal form; exported in OpenAI chat form)
    tools: list[ToolSpec]  # tools offered to the model
    prompt_ids: list[int]  # exact token ids the engine received
    parent_id: str | None = None  # interaction this one extends (token-exact prefix), if any
    relation: Relation = "root"  # root: first in session; extend: continues parent; fork: new branch
    fork_reason: str | None = None  # why a non-first request started a new root
    context_key: str = ""  # digest of tools + template kwargs (part of prefix matching)
    prefix_key: str = ""  # digest of (context, messages + reply); children match on it
    output_ids: list[int] = field(default_factory=list)  # generated ids (stop token included)
    output_logprobs: list[float] = field(default_factory=list)  # behaviour logprob per output id
    output_versions: list[int] = field(default_factory=list)  # weight version per output id
    finish_reason: str | None = None  # stop | length | tool_calls | abort (what the client saw)
    stop_kind: str | None = None  # stop_token | stop_string | length | abort
    output_message: Message | None = None  # the reply as the client received it
    reward: float | None = None  # as set over HTTP; never mutated by discounting
    status: InteractionStatus = "pending"
    error: str | None = None  # why it failed (status == "failed")
    created_at: float = field(default_factory=time.time)
    completed_at: float | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature etc. (for trainers)
    # The client's "store" flag. The call is recorded either way; False only means a later
    # request cannot name it with previous_response_id (the Responses API's semantics).
    client_store: bool = True
    # What the chat template left out of this turn's prompt (chat/template_support.py: tools, tool_calls,
    # tool_results, reasoning, images): the model never saw it. Stored with the turn (SQLite schema 5).
    template_dropped: list[str] = field(default_factory=list)
    policy: str | None = None  # the policy that served it (core/policies.py; None: recorded before policies)
    # Set while pending when the client retried this request (x-stainless-retry-count): it is then
    # recorded as failed when it ends (the client never received it), not as a second branch. In memory.
    superseded_by: str | None = field(default=None, repr=False, compare=False)

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class Session:
    """One RL episode."""

    id: str  # "{task_id}-{k}"
    task_id: str
    key_hash: str  # sha256 of the session's API key (the key itself is never stored)
    mode: TrajectoryMode = "token_exact"
    status: SessionStatus = "active"
    created_at: float = field(default_factory=time.time)
    last_active: float = field(default_factory=time.time)
    ended_at: float | None = None
    exported_at: float | None = None  # set when exported with keep=true or retained for audit
    interactions: dict[str, Interaction] = field(default_factory=dict)  # insertion = creation order
    metadata: dict[str, Any] = field(default_factory=dict)
    # prefix_key -> ids of completed interactions with that key (children look them up)
    prefix_index: dict[str, list[str]] = field(default_factory=dict, repr=False)
    covered_lengths: set[int] = field(default_factory=set, repr=False)  # len(messages)+1 of those keys
    digest_memo: dict[Any, bytes] = field(default_factory=dict, repr=False)  # message -> digest cache
    in_flight: int = 0  # requests being generated right now
    render_cache: RenderCache = field(default_factory=RenderCache, repr=False, compare=False)  # freed with it
    image_bytes: int = 0  # image bytes its interactions hold (max_image_bytes_per_session)
    policy: str | None = None  # the policy it is bound to (core/policies.py); None: unbound (the default's)

    def completed_interactions(self) -> list[Interaction]:
        return [i for i in self.interactions.values() if i.completed]

    def last_completed(self) -> Interaction | None:
        done = [i for i in self.interactions.values() if i.completed]
        return max(done, key=lambda i: (i.completed_at or 0.0)) if done else None

    def touch(self) -> None:
        self.last_active = time.time()
