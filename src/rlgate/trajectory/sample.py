"""The typed training sample: one exported token sequence, from export to trainer.

:func:`rlgate.trajectory.export.export_samples` builds :class:`Sample` objects; the
control route ``POST /export_trajectories`` sends them as JSON objects (:meth:`Sample.to_dict`,
the wire form documented in docs/trajectory-format.md); the rollout runner reads them
back (:meth:`Sample.from_dict`), stamps where they came from (group, episode), and the
GRPO trainer reads their fields by name — no string keys cross a module boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# Optional fields left out of the wire form while unset (concat-only, or set by rollout).
_OMIT_WHEN_NONE = ("chain", "turn_rewards", "group_id", "episode", "step", "train_version", "policy")


@dataclass
class Sample:
    """One training sequence; the four token lists are aligned and have the same length L."""

    id: str  # interaction id (the API response id); concat: the leaf's id
    input_ids: list[int]  # prompt + generated token ids, exactly as the engine saw them
    loss_mask: list[int]  # 1 on tokens the model generated (any turn of a concat chain), else 0
    logprobs: list[float]  # behaviour logprob of each generated token (recorded by the engine), 0.0 elsewhere
    versions: list[int]  # weight version that generated each token, -1 on prompt tokens
    reward: float | None  # discounted reward (trajectory/tree.py); None if neither it nor a descendant was rewarded
    session_id: str = ""  # the gateway session (= one episode) it was recorded in
    task_id: str = ""  # the session's task id (the rollout runner uses the GRPO group id)
    parent_id: str | None = None  # interaction this one extends (token-exact prefix), if any
    relation: str = "root"  # "root" | "extend" | "fork"
    fork_reason: str | None = None  # why a fork started a new branch (None unless relation == "fork"; concat:
    # of the chain's first turn)
    conversation_id: str = ""  # the conversation (lineage root, trajectory/tree.py): samples split by a fork share it
    lineage_parent_id: str | None = None  # interaction this one continues by messages (concat: the chain's first
    # turn's), across a fork; equals parent_id where there is no fork
    api: str = "chat"  # surface that served it: "chat" | "responses" | "messages"
    finish_reason: str | None = None  # of the (leaf) interaction: stop | length | tool_calls | abort
    messages: list[dict[str, Any]] = field(default_factory=list)  # request messages, OpenAI chat form
    output_message: dict[str, Any] | None = None  # the reply as the client received it, OpenAI chat form
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, ... as served
    policy: str | None = None  # the policy that generated it (its versions are that policy's); concat: the leaf's
    chain: list[str] | None = None  # concat only: interaction ids root -> leaf
    turn_rewards: list[float | None] | None = None  # concat only: discounted reward of each chain interaction
    flags: list[str] = field(default_factory=list)  # silent-failure flags (trajectory/flags.py): empty_reply,
    # unparsed_tool_call, aborted, fork, no_reward, unaligned, dropped_<part> (concat: of any turn of the chain)
    # ---- provenance set by the rollout runner and the trainer (None in a plain export)
    group_id: str | None = None  # the GRPO group (rollout runner)
    episode: int | None = None  # the episode's index within its group (rollout runner)
    step: int | None = None  # the training step that used it (grpo_loop)
    train_version: int | None = None  # the policy version that step trained (its staleness reference)
    extra: dict[str, Any] = field(default_factory=dict)  # wire fields this version does not know (kept)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if not (len(self.loss_mask) == len(self.logprobs) == len(self.versions) == n):
            raise ValueError(f"sample {self.id}: token lists differ in length "
                             f"({n}, {len(self.loss_mask)}, {len(self.logprobs)}, {len(self.versions)})")

    # ------------------------------------------------------------------ derived

    @property
    def generated_tokens(self) -> int:
        return sum(1 for m in self.loss_mask if m)

    @property
    def min_version(self) -> int | None:
        """Weight version of the oldest generated token (staleness is judged on it)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m and v >= 0]
        return min(vs) if vs else None

    @property
    def temperature(self) -> float:
        """Sampling temperature the logprobs were recorded at (0 or unset -> 1: greedy logprobs are unscaled)."""
        t = self.sampling.get("temperature")
        return float(t) if t else 1.0

    @property
    def output_text(self) -> str:
        """Text content of the reply (empty when it only called tools)."""
        content = (self.output_message or {}).get("content")
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content or ""

    # ------------------------------------------------------------------ wire form

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.name in _OMIT_WHEN_NONE:
                continue
            out[f.name] = value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs, extra=extra)
