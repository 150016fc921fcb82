"""What the viewer shows: episodes (sessions) made of turns (exported samples).

The viewer reads exported samples (docs/trajectory-format.md), whether they come from a file
(``rlgate view``: Parquet / JSONL written by ``write_parquet`` / ``write_jsonl``, the demo's
``trajectories.parquet``, a training run's per-step dumps, or saved ``/export_trajectories``
responses) or from the live gateway (``/ui``). Besides the sample fields it uses, when
present, these columns (first name found wins):

=================  ==============================  ========================================
what               columns                         when absent
=================  ==============================  ========================================
session            ``session_id``, ``session``     samples linked by ``parent_id`` / ``chain``
                   (a later ``root`` sample under the same id starts a new episode ``ID~2``:
                   the gateway reuses the id of an exported session)
task               ``task_id``, ``task``           none
GRPO group         ``group_id``, ``group``         the task (the rollout runner names a
                                                   session's task after its group)
training step      ``step``                        none
advantage          ``advantage``                   computed: reward - group mean
policy version     ``train_version``, ``version``  the newest token version of the same
                   at training time                                   ``step``, else of the policy in the file
policy             ``policy``                      one policy (docs/policies.md: versions are
                                                   compared within a policy only)
=================  ==============================  ========================================
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from rlgate.config import STALE_LAG

FLAG_WORDS = {
    "empty_reply": "empty reply",
    "unparsed_tool_call": "unparsed tool call",
    "aborted": "aborted",
    "fork": "fork",
    "no_reward": "no reward",
    "unaligned": "unaligned turn",
    "stale": "stale tokens",
    "failed": "failed turns",
    "dropped_tools": "tools not in the prompt",
    "dropped_tool_calls": "tool calls not in the prompt",
    "dropped_tool_results": "tool results not in the prompt",
    "dropped_reasoning": "reasoning not in the prompt",
    "dropped_images": "images not seen",
}


@dataclass
class Turn:
    """One exported sample: an interaction (individual style) or a root-to-leaf chain (concat)."""

    id: str
    session_id: str
    parent_id: str | None
    relation: str
    fork_reason: str | None
    api: str
    finish_reason: str | None
    reward: float | None
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    versions: list[int]
    messages: list[dict[str, Any]]
    output_message: dict[str, Any] | None
    sampling: dict[str, Any]
    flags: list[str]
    chain: list[str] | None = None  # concat samples: interaction ids root -> leaf
    advantage: float | None = None  # from the file (the trainer's), if it has one
    tools: list[Any] | None = None
    train_version: int | None = None
    policy: str | None = None  # the policy that generated it (its versions count in that policy)

    @property
    def prompt_len(self) -> int:
        """Tokens before the first generated one."""
        try:
            return self.loss_mask.index(1)
        except ValueError:
            return len(self.loss_mask)

    @property
    def n_generated(self) -> int:
        return self.loss_mask.count(1)

    def generated_versions(self) -> list[int]:
        return list(compress(self.versions, self.loss_mask))


@dataclass
class Episode:
    """One session: its turns in creation order."""

    id: str
    task_id: str | None
    group: str | None
    step: int | None
    status: str | None
    turns: list[Turn]
    failed_turns: int = 0  # interactions that failed (not exported)
    advantage: float | None = None  # the trainer's, or computed within the group
    advantage_computed: bool = False

    @property
    def policy(self) -> str | None:
        return next((t.policy for t in self.turns if t.policy is not None), None)

    @property
    def reward(self) -> float | None:
        """The reward of the last rewarded turn (what GRPO scores the episode by)."""
        for t in reversed(self.turns):
            if t.reward is not None:
                return t.reward
        return None

    @property
    def n_tokens(self) -> int:
        return sum(len(t.input_ids) for t in self.turns)

    @property
    def relations(self) -> list[str]:
        return sorted({t.relation for t in self.turns})

    @property
    def flags(self) -> list[str]:
        out: list[str] = []
        for t in self.turns:
            out += [f for f in t.flags if f not in out]
        if self.failed_turns and "failed" not in out:
            out.append("failed")
        return out


@dataclass
class SessionRow:
    """One line of the sessions list (built without touching token lists)."""

    id: str
    task_id: str | None
    group: str | None
    step: int | None
    status: str | None
    turns: int
    tokens: int
    reward: float | None
    relations: list[str]
    flags: list[str]
    advantage: float | None = None
    advantage_computed: bool = False
    policy: str | None = None


def row_of(ep: Episode) -> SessionRow:
    return SessionRow(ep.id, ep.task_id, ep.group, ep.step, ep.status, len(ep.turns), ep.n_tokens, ep.reward,
                      ep.relations, ep.flags, ep.advantage, ep.advantage_computed, ep.policy)


@dataclass
class Run:
    """Everything one viewer page shows."""

    title: str
    episodes: list[Episode]
    stale_lag: int = STALE_LAG  # a token is stale when its version is this far behind the reference
    omitted: int = 0  # sessions left out (--max-sessions)
    by_id: dict[str, Episode] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.by_id = {e.id: e for e in self.episodes}

    @property
    def newest_version(self) -> int:
        return max((v for e in self.episodes for t in e.turns for v in t.generated_versions()), default=-1)

    @property
    def newest_versions(self) -> dict[str | None, int]:
        """The newest token version of each policy (versions of different policies are not comparable)."""
        return newest_by_policy(self.episodes)

    def groups(self) -> dict[str, list[Episode]]:
        out: dict[str, list[Episode]] = {}
        for e in self.episodes:
            if e.group is not None:
                out.setdefault(e.group, []).append(e)
        return out


# --------------------------------------------------------------------------- from samples


def _first(row: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        v = row.get(n)
        if v is not None:
            return v
    return None


def _json_field(v: Any, default: Any) -> Any:
    if v is None:
        return default
    if isinstance(v, str):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return default
    return v


def _float(v: Any) -> float | None:
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def expand_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows of samples; saved ``/export_trajectories`` responses are expanded into their samples."""
    out: list[dict[str, Any]] = []
    for r in rows:
        if isinstance(r.get("interactions"), list):  # an export response
            outer = {k: r[k] for k in ("session_id", "task_id", "status") if r.get(k) is not None}
            out += [{**s, **outer} for s in r["interactions"]]
        else:
            out.append(dict(r))
    return out


def turn_from_row(row: Mapping[str, Any], session_id: str) -> Turn:
    ids = list(map(int, row["input_ids"]))  # map: a 1M-token turn is converted in C
    mask = list(map(int, row.get("loss_mask") or [0] * len(ids)))  # 0 / 1 (Turn.prompt_len looks for 1)
    lps = list(map(float, row.get("logprobs") or [0.0] * len(ids)))
    vers = list(map(int, row.get("versions") or [-1] * len(ids)))
    flags = list(row.get("flags") or [])
    if row.get("relation") == "fork" and "fork" not in flags:
        flags.append("fork")
    if row.get("reward") is None and "no_reward" not in flags:
        flags.append("no_reward")
    tv = _first(row, "train_version", "version")
    return Turn(
        id=str(row.get("id") or ""), session_id=session_id, parent_id=row.get("parent_id"),
        relation=str(row.get("relation") or "root"), fork_reason=row.get("fork_reason"),
        api=str(row.get("api") or ""), finish_reason=row.get("finish_reason"), reward=_float(row.get("reward")),
        input_ids=ids, loss_mask=mask, logprobs=lps, versions=vers,
        messages=_json_field(row.get("messages"), []), output_message=_json_field(row.get("output_message"), None),
        sampling=_json_field(row.get("sampling"), {}), flags=flags,
        chain=list(row["chain"]) if row.get("chain") is not None else None,
        advantage=_float(row.get("advantage")), tools=_json_field(row.get("tools"), None),
        train_version=int(tv) if tv is not None else None, policy=row.get("policy"),
    )


def _components(rows: list[dict[str, Any]]) -> list[str]:
    """Session key per row when the rows carry no session id: samples linked by parent / chain."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            parent[x] = parent.get(parent[x], parent[x])
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[rb] = ra

    for r in rows:
        rid = str(r.get("id"))
        parent.setdefault(rid, rid)
        for other in [r.get("parent_id"), *(r.get("chain") or [])]:
            if other is not None:
                parent.setdefault(str(other), str(other))
                union(str(other), rid)
    return [find(str(r.get("id"))) for r in rows]


def episodes_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Episode]:
    """Group sample rows into episodes (order of first appearance)."""
    flat = expand_rows(rows)
    if any(_first(r, "session_id", "session") is None for r in flat):
        keys = _components(flat)
        for r, k in zip(flat, keys, strict=True):
            if _first(r, "session_id", "session") is None:
                r["session_id"] = f"session-of-{k}"
    episodes: dict[str, Episode] = {}
    current: dict[str, str] = {}  # session id -> key of its latest episode
    count: dict[str, int] = {}  # session id -> episodes seen under it
    for r in flat:
        sid = str(_first(r, "session_id", "session"))
        key = current.get(sid, sid)
        ep = episodes.get(key)
        if ep is not None and r.get("chain") is None and r.get("relation") == "root":
            # The gateway reuses an exported session's id ({task}-{k}, smallest free k): a second
            # root under the same id is a later episode.
            count[sid] = count.get(sid, 1) + 1
            key = current[sid] = f"{sid}~{count[sid]}"
            ep = None
        if ep is None:
            task = _first(r, "task_id", "task")
            group = _first(r, "group_id", "group")
            step = r.get("step")
            ep = episodes[key] = Episode(
                id=key, task_id=str(task) if task is not None else None,
                group=str(group) if group is not None else (str(task) if task is not None else None),
                step=int(step) if step is not None else None, status=r.get("status"), turns=[])
        ep.turns.append(turn_from_row(r, key))
    out = list(episodes.values())
    assign_advantages(out)
    return out


def assign_advantages(episodes: list[Any]) -> None:
    """The trainer's advantage when the file has one; else reward minus the group's mean reward.

    Works on :class:`Episode` s and :class:`SessionRow` s (anything with group, reward, advantage)."""
    groups: dict[str, list[Any]] = {}
    for e in episodes:
        turns = getattr(e, "turns", None)
        given = next((t.advantage for t in reversed(turns) if t.advantage is not None), None) \
            if isinstance(turns, list) else None
        if given is not None:
            e.advantage, e.advantage_computed = given, False
        elif e.group is not None:
            groups.setdefault(e.group, []).append(e)
    for members in groups.values():
        rewards = [e.reward for e in members if e.reward is not None]
        if not rewards:
            continue
        mean = sum(rewards) / len(rewards)
        for e in members:
            if e.reward is not None:
                e.advantage, e.advantage_computed = e.reward - mean, True


def newest_by_policy(episodes: list[Episode]) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for e in episodes:
        for t in e.turns:
            out[t.policy] = max([out.get(t.policy, -1), *t.generated_versions()])
    return out


def mark_stale(episodes: list[Episode], lag: int, current: dict[str | None, int] | None = None) -> None:
    """Flag turns with generated tokens more than ``lag`` versions behind their reference: the
    version they were trained at (``train_version``), else the newest version of their training
    step (a run's per-step dumps), else ``current`` (the live gateway's versions by policy), else the
    newest version of their policy in the data."""
    newest = {**newest_by_policy(episodes), **(current or {})}
    per_step: dict[tuple[int, str | None], int] = {}
    for e in episodes:
        if e.step is not None:
            for t in e.turns:
                key = (e.step, t.policy)
                per_step[key] = max([per_step.get(key, -1), *t.generated_versions()])
    for e in episodes:
        for t in e.turns:
            own = newest.get(t.policy, -1)
            step_ref = per_step.get((e.step, t.policy), own) if e.step is not None else own
            ref = t.train_version if t.train_version is not None else step_ref
            gen = t.generated_versions()
            if gen and ref - min(gen) > lag and "stale" not in t.flags:
                t.flags.append("stale")
