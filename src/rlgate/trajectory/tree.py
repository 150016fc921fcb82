"""The conversation tree of a session: parent detection and tree-aware reward discount.

Parent detection
----------------
A new request extends an earlier interaction P when ``P.messages + [P's reply]`` is a
prefix of the new request's messages (canonical forms, see
:mod:`rlgate.chat.conversation`) and P was rendered with the same tools and template
arguments. Among all such P the longest wins; ties go to the most recently completed.
Lookups use a rolling digest of the message list, so finding the parent costs
O(number of messages) hash operations and one dict lookup per prefix length.

Lineage (conversations across forks)
------------------------------------
The token tree above breaks where a request forks (edited history, other tools, a template
that could not be bridged). Lineage joins the pieces by *messages*: a parentless interaction's
lineage parent is the completed interaction whose messages + reply are the longest prefix of
its messages, whatever the tools or template arguments (ties: the latest). An interaction with
a token parent has it as its lineage parent. A fork with reason ``compacted`` (the client replaced
its history by a summary: :mod:`rlgate.trajectory.matchers`) has no such prefix: its lineage parent
is the turn that wrote the summary (:func:`~rlgate.trajectory.matchers.compaction_source`).
The roots of the lineage forest are the session's conversations; rewards are discounted along
lineage, so a later turn's reward reaches earlier turns across a fork. Lineage is computed only
when a session has more than one token root.

Discount
--------
Each rewarded interaction passes its reward up to every ancestor (lineage), multiplied by γ per
step; an interaction's discounted reward is its own reward plus everything its
descendants passed up (``None`` if neither it nor any descendant has a reward). On a
single chain this is the original's backward recursion ``c = c·γ + r``:
rewards [None, None, 10] with γ = 0.9 give [8.1, 9, 10]. Stored rewards are never
modified; every export computes the discount afresh.
"""

from __future__ import annotations

from typing import Any

from rlgate.chat.conversation import DigestChain, Message
from rlgate.trajectory.interaction import Interaction, Session
from rlgate.trajectory.matchers import compaction_source


def find_parent(
    session: Session, context_key: str, messages: list[Message]
) -> tuple[Interaction | None, int, DigestChain]:
    """Return ``(parent, n_covered, chain)``.

    ``n_covered`` is how many leading request messages the parent covers (its request
    messages plus its reply); ``chain`` is the digest chain over all request messages,
    which the caller extends with the reply to key the new interaction. Digests are only
    finalised at prefix lengths some completed interaction of the session covers.
    """
    chain = DigestChain(context_key, session.digest_memo)
    lengths = session.covered_lengths
    candidates: list[tuple[int, str]] = []
    for k, m in enumerate(messages, start=1):
        chain.add(m)
        if k in lengths:
            candidates.append((k, chain.hexdigest()))
    for k, key in reversed(candidates):
        # ids are appended in completion order: the last live one is the most recent.
        for iid in reversed(session.prefix_index.get(key, ())):
            cand = session.interactions.get(iid)
            if cand is not None and cand.completed:
                return cand, k, chain
    return None, 0, chain


def interaction_key(interaction: Interaction) -> str:
    """Key under which children find this interaction: its context, messages and reply."""
    chain = DigestChain(interaction.context_key)
    for m in interaction.messages:
        chain.add(m)
    if interaction.output_message is not None:
        chain.add(interaction.output_message)
    return chain.hexdigest()


def register_completed(session: Session, interaction: Interaction) -> None:
    """Make a completed interaction findable as a parent."""
    if interaction.prefix_key:
        session.prefix_index.setdefault(interaction.prefix_key, []).append(interaction.id)
        session.covered_lengths.add(len(interaction.messages) + 1)


def children_map(interactions: list[Interaction]) -> dict[str, list[Interaction]]:
    ids = {i.id for i in interactions}
    out: dict[str, list[Interaction]] = {i.id: [] for i in interactions}
    for i in interactions:
        if i.parent_id is not None and i.parent_id in ids:
            out[i.parent_id].append(i)
    return out


def lineage_parents(interactions: list[Interaction]) -> dict[str, str | None]:
    """Each completed interaction's lineage parent (see module docstring); creation order in."""
    ids = {i.id for i in interactions}
    out: dict[str, str | None] = {
        i.id: i.parent_id if i.parent_id is not None and i.parent_id in ids else None for i in interactions
    }
    if sum(1 for v in out.values() if v is None) < 2:
        return out
    memo: dict[Any, bytes] = {}
    covers: dict[str, str] = {}  # digest of messages + reply (no context) -> latest earlier interaction
    for n, i in enumerate(interactions):
        if out[i.id] is None and i.fork_reason == "compacted":
            source = compaction_source(i, interactions[:n])
            out[i.id] = source.id if source is not None else None
        chain = DigestChain("", memo)
        prefixes: list[str] = []
        for m in i.messages:
            chain.add(m)
            prefixes.append(chain.hexdigest())
        if out[i.id] is None:
            out[i.id] = next((covers[d] for d in reversed(prefixes) if d in covers), None)
        if i.output_message is not None:
            covers[chain.add(i.output_message).hexdigest()] = i.id
    return out


def conversation_ids(parents: dict[str, str | None]) -> dict[str, str]:
    """Each interaction's conversation: the id of its lineage root."""
    out: dict[str, str] = {}
    for iid in parents:  # creation order: a parent is resolved before its children
        p = parents[iid]
        out[iid] = out.get(p, p) if p is not None else iid
    return out


def discounted_rewards(
    interactions: list[Interaction], gamma: float, parents: dict[str, str | None] | None = None
) -> dict[str, float | None]:
    """Discount over completed interactions along ``parents`` (default: lineage; see module docstring)."""
    parents = lineage_parents(interactions) if parents is None else parents
    kids: dict[str, list[Interaction]] = {i.id: [] for i in interactions}
    for i in interactions:
        p = parents.get(i.id)
        if p is not None and p in kids:
            kids[p].append(i)
    memo: dict[str, float | None] = {}

    def value(i: Interaction) -> float | None:
        if i.id in memo:
            return memo[i.id]
        total = i.reward
        for c in kids[i.id]:
            v = value(c)
            if v is not None:
                total = (total or 0.0) + gamma * v
        memo[i.id] = total
        return total

    # Iterative-safe order: leaves first (creation order reversed is children-first,
    # because a child is always created after its parent).
    for i in reversed(interactions):
        value(i)
    return memo


def chain_of(leaf: Interaction, by_id: dict[str, Interaction]) -> list[Interaction]:
    """Root-to-leaf path ending at ``leaf``."""
    chain = [leaf]
    seen = {leaf.id}
    while chain[-1].parent_id is not None and chain[-1].parent_id in by_id:
        p = by_id[chain[-1].parent_id]
        if p.id in seen:  # defensive: a cycle would be a bug
            break
        seen.add(p.id)
        chain.append(p)
    chain.reverse()
    return chain
