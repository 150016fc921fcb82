"""The live gateway's sessions as the viewer's model (read straight from the session manager)."""

from __future__ import annotations

from collections.abc import Iterable

from rlgate.core.sessions import SessionManager
from rlgate.trajectory.export import export_samples, individual_sample
from rlgate.trajectory.flags import reply_flags
from rlgate.trajectory.interaction import Session
from rlgate.trajectory.tree import discounted_rewards
from rlgate.ui.model import Episode, SessionRow, assign_advantages, turn_from_row


def group_of(s: Session) -> str:
    """GRPO group: ``metadata["group"]`` / ``["group_id"]``, else the task (the rollout runner
    starts every episode of a group with the group id as its task)."""
    g = s.metadata.get("group", s.metadata.get("group_id"))
    return str(g) if g is not None else s.task_id


def _status(s: Session) -> str:
    return "exported" if s.exported_at is not None else s.status


def session_rows(sessions: Iterable[Session]) -> list[SessionRow]:
    """Sessions-list rows, without copying any token list."""
    rows = []
    for s in sessions:
        done = s.completed_interactions()
        rewards = discounted_rewards(done, 1.0)
        flags: list[str] = []
        for i in done:
            flags += [f for f in reply_flags(i) + (["no_reward"] if rewards[i.id] is None else []) if f not in flags]
        if len(done) < len(s.interactions) and any(i.status == "failed" for i in s.interactions.values()):
            flags.append("failed")
        reward = next((rewards[i.id] for i in reversed(done) if rewards[i.id] is not None), None)
        step = s.metadata.get("step")
        rows.append(SessionRow(
            id=s.id, task_id=s.task_id, group=group_of(s), step=int(step) if isinstance(step, int) else None,
            status=_status(s), turns=len(done), tokens=sum(i.num_tokens for i in done), reward=reward,
            relations=sorted({i.relation for i in done}), flags=flags,
            policy=s.policy or next((i.policy for i in done if i.policy), None)))
    assign_advantages(rows)
    return rows


def episode(s: Session, only: set[str] | None = None) -> Episode:
    """One session with its turns (individual samples, discount 1), as ``/export_trajectories`` gives them;
    ``only``: just these interactions (rewards still see the whole tree)."""
    interactions = list(s.interactions.values())
    if only is None:
        samples, stats = export_samples(interactions, style="individual")
    else:
        done = [i for i in interactions if i.completed]
        rewards = discounted_rewards(done, 1.0)
        samples = [individual_sample(i, rewards[i.id]) for i in done if i.id in only]
        stats = {"failed": sum(1 for i in interactions if i.status == "failed")}
    step = s.metadata.get("step")
    turns = [turn_from_row(r.to_dict(), s.id) for r in samples]
    for t in turns:  # the raw request shows the tools the model was offered (samples do not carry them)
        i = s.interactions.get(t.id)
        if i is not None and i.tools:
            t.tools = [spec.to_openai() for spec in i.tools]
    ep = Episode(id=s.id, task_id=s.task_id, group=group_of(s), step=int(step) if isinstance(step, int) else None,
                 status=_status(s), turns=turns, failed_turns=stats["failed"])
    return ep


def group_episodes(mgr: SessionManager, gid: str, limit: int = 64) -> list[Episode]:
    members = [episode(s) for s in list(mgr.sessions.values()) if group_of(s) == gid][:limit]
    assign_advantages(members)
    return members
