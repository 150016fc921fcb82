"""History matchers: finding the parent turn when a client re-serialises what the model said.

The exact parent lookup (:func:`rlgate.trajectory.tree.find_parent`) needs the request to carry the
parent's reply as a reply (canonical forms). Some clients rewrite it: smolagents sends the model's
tool calls back as assistant *text* (``Calling tools:\\n[{'id': ..., 'function': {...}}]``) and the
results as user messages; Claude Code replaces the whole history by a summary when it compacts. A
matcher recognises one client's form. It answers, for a request's messages:

* a :class:`Match` with a parent: ``messages[:covered]`` is the parent's request messages plus its
  reply in the client's form, and the model's own tokens were identified in it (the calls by their
  ids, names and arguments, the text around them equal), so the turn **extends** the parent's token
  chain; the messages after ``covered`` are rendered as new messages (the bridge);
* a :class:`Match` without a parent: the turn forks, and ``fork_reason`` says precisely why
  (``compacted``, ``smolagents_calls_differ``...);
* None: not this client's form (the exact lookup's answer stands).

Matchers are pluggable (``--history-matcher NAME`` or ``package.module:attribute``; the way AReaL
ships matchers for Claude Code): an object with a ``name`` and a ``match(session, context_key,
messages)`` method. The gateway runs them on every request, after the exact lookup; a matcher's
parent wins when it covers more of the request. Built in: :class:`SmolagentsMatcher` and
:class:`CompactionMatcher` (Claude Code's context compaction: a fork with reason ``compacted``
whose lineage goes on from the turn that wrote the summary, see :func:`compaction_source`).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from rlgate.chat.conversation import DigestChain, Message
from rlgate.object_spec import load_object
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["MATCHERS", "CompactionMatcher", "HistoryMatcher", "Match", "SmolagentsMatcher", "best_match",
           "compaction_source", "load_matchers"]

LOOKBACK = 1024  # completed interactions of the session a matcher looks at (latest first)
MAX_CALL_TEXT = 1_000_000  # characters of one "Calling tools:" list parsed with ast.literal_eval


@dataclass(frozen=True)
class Match:
    parent: Interaction | None  # None: the turn forks (fork_reason says why)
    covered: int = 0  # request messages the parent covers (its messages + its reply in the client's form)
    fork_reason: str | None = None
    matcher: str = ""


class HistoryMatcher(Protocol):
    name: str

    def match(self, session: Session, context_key: str, messages: list[Message]) -> Match | None: ...


def _recent(session: Session) -> Iterator[Interaction]:
    """Completed interactions with a reply, latest first (at most LOOKBACK)."""
    n = 0
    for i in reversed(session.interactions.values()):
        if i.completed and i.output_message is not None:
            yield i
            n += 1
            if n >= LOOKBACK:
                return


def _same_messages(session: Session, context_key: str, a: list[Message], b: list[Message]) -> bool:
    """Canonically equal (the exact lookup's notion), under the same context (tools, template kwargs)."""
    if len(a) != len(b):
        return False
    ca, cb = DigestChain(context_key, session.digest_memo), DigestChain(context_key, session.digest_memo)
    for m in a:
        ca.add(m)
    for m in b:
        cb.add(m)
    return ca.hexdigest() == cb.hexdigest()


def _canonical_args(value: Any) -> Any:
    """Tool-call arguments as a JSON value (a JSON string is parsed; anything else kept)."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value


# --------------------------------------------------------------------------- smolagents

_CALLING = "Calling tools:\n"


class SmolagentsMatcher:
    """smolagents (1.x) ``ToolCallingAgent``: its memory writes each step back as an assistant message
    ``[<text>\\n]Calling tools:\\n<Python repr of [{'id', 'type', 'function': {'name', 'arguments'}}]>``
    and a user message ``Observation:\\n<result>``. The last such assistant message names the model's
    calls by their ids; the interaction that generated exactly those calls (ids, names, arguments) is
    the parent when the messages before it are its request and the text before the calls is its text."""

    name = "smolagents"

    def match(self, session: Session, context_key: str, messages: list[Message]) -> Match | None:
        last = next((k for k in range(len(messages) - 1, -1, -1) if messages[k].role == "assistant"), None)
        if last is None or messages[last].tool_calls:
            return None
        text = messages[last].text
        at = text.rfind(_CALLING)
        if at < 0 or len(text) - at > MAX_CALL_TEXT:
            return None
        try:
            listed = ast.literal_eval(text[at + len(_CALLING):].strip())
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        calls = _listed_calls(listed)
        if not calls:
            return None
        ids = [c[0] for c in calls]
        parent = next((i for i in _recent(session) if [tc.id for tc in i.output_message.tool_calls] == ids), None)  # type: ignore[union-attr]
        if parent is None:
            return None  # not calls rlgate returned in this session: no opinion
        reply = parent.output_message
        assert reply is not None
        before, start = text[:at].strip(), last
        if not before and last > 0 and messages[last - 1].role == "assistant" and not messages[last - 1].tool_calls:
            before, start = messages[last - 1].text.strip(), last - 1  # the text step was not merged into it
        if [(tc.name, _canonical_args(tc.arguments)) for tc in reply.tool_calls] != [(c[1], c[2]) for c in calls]:
            return Match(None, fork_reason="smolagents_calls_differ", matcher=self.name)
        if before != reply.text.strip():
            return Match(None, fork_reason="smolagents_text_differs", matcher=self.name)
        if not _same_messages(session, context_key, messages[:start], parent.messages):
            why = "smolagents_tools_differ" if parent.context_key != context_key else "smolagents_history_differs"
            return Match(None, fork_reason=why, matcher=self.name)
        return Match(parent, last + 1, matcher=self.name)


def _listed_calls(listed: Any) -> list[tuple[str, str, Any]]:
    """``[(id, name, arguments)]`` of smolagents' call list, or [] when it is not one."""
    out = []
    if not isinstance(listed, list):
        return []
    for c in listed:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str):
            return []
        out.append((c["id"], fn["name"], _canonical_args(fn.get("arguments", {}))))
    return out


# --------------------------------------------------------------------------- Claude Code compaction

COMPACTED = "This session is being continued from a previous conversation that ran out of context."


class CompactionMatcher:
    """Claude Code's context compaction: the history is replaced by one user message that starts
    ``This session is being continued from a previous conversation that ran out of context.`` and
    holds the summary the model wrote (then, optionally, recent messages verbatim). The model's
    tokens of the earlier turns are gone from the request, so the turn cannot extend them: it forks
    with reason ``compacted``, and its lineage continues from the turn that wrote the summary
    (:func:`compaction_source`): the episode stays one conversation."""

    name = "claude_code_compaction"

    def match(self, session: Session, context_key: str, messages: list[Message]) -> Match | None:
        users = [m for m in messages[:4] if m.role == "user"][:2]
        if any(COMPACTED in m.text for m in users):
            return Match(None, fork_reason="compacted", matcher=self.name)
        return None


def _claude_code_summary(reply: str) -> str:
    """The summary text Claude Code puts in the compacted history for a reply (its formatting)."""
    t = re.sub(r"<analysis>[\s\S]*?</analysis>", "", reply, count=1)
    m = re.search(r"<summary>([\s\S]*?)</summary>", t)
    if m:
        inner = m.group(1).strip()
        t = re.sub(r"<summary>[\s\S]*?</summary>", lambda _: "Summary:\n" + inner, t, count=1)
    return re.sub(r"\n\n+", "\n", t).strip()


def compaction_source(forked: Interaction, earlier: list[Interaction]) -> Interaction | None:
    """The turn whose summary a ``compacted`` fork carries: the latest earlier interaction whose reply,
    formatted as Claude Code formats a summary, is in the fork's first user messages; else the latest
    earlier interaction (the conversation being compacted)."""
    text = "\n".join(m.text for m in forked.messages[:4] if m.role == "user")
    for i in reversed(earlier):
        reply = i.output_message.text if i.output_message is not None else ""
        summary = _claude_code_summary(reply) if reply.strip() else ""
        if len(summary) >= 16 and summary in text:
            return i
    return earlier[-1] if earlier else None


# --------------------------------------------------------------------------- registry

MATCHERS: dict[str, type] = {SmolagentsMatcher.name: SmolagentsMatcher, CompactionMatcher.name: CompactionMatcher}


def load_matchers(names: list[str]) -> list[HistoryMatcher]:
    """Matchers by built-in name, or ``package.module:attribute`` (a class or factory called without
    arguments, or an object with ``match``); ``none`` drops the ones named before it."""
    if "none" in names:
        names = names[len(names) - names[::-1].index("none"):]
    out: list[HistoryMatcher] = []
    for name in names:
        if name in MATCHERS:
            out.append(MATCHERS[name]())
            continue
        if ":" not in name:
            raise ValueError(f"unknown history matcher {name!r} (built in: {', '.join(MATCHERS)}; "
                             "or package.module:attribute)")
        obj = load_object(name, "--history-matcher")
        out.append(obj if hasattr(obj, "match") else obj())
    return out


def best_match(matchers: list[HistoryMatcher], session: Session, context_key: str, messages: list[Message],
               covered: int) -> Match | None:
    """The first matcher's parent that covers more than ``covered`` (the exact lookup's), else the first
    fork reason a matcher gives, else None."""
    fork: Match | None = None
    for m in matchers:
        found = m.match(session, context_key, messages)
        if found is None:
            continue
        if found.parent is not None and found.covered > covered:
            return found
        if found.parent is None and fork is None:
            fork = found
    return fork
