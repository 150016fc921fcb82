"""Sessions and interactions as rows, with delta encoding along each conversation.

A turn that extends its parent stores only what it adds. ``base_id`` names the parent;
``prompt_base_len`` leading prompt ids are the parent's ``prompt_ids + output_ids`` (or its
prompt only), ``messages_skip`` leading messages equal the parent's, and ``tools`` is NULL
when they equal the parent's. A 50-turn conversation thus stores O(turns) tokens and
messages, not O(turns^2).

:class:`RowCodec` remembers the live interactions (references, no copies) so that it can
encode a new turn against its parent, and which rows already exist (an update then writes
only the columns that change).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec, message_from_openai, message_to_openai
from rlgate.store.sqlite.codec import (
    decode_floats,
    decode_ints,
    encode_floats,
    encode_ints,
    key_text,
    messages_json,
    text,
    to_json,
    tools_json,
)
from rlgate.store.sqlite.schema import (
    DYNAMIC_COLS,
    INSERT_INTERACTION,
    SESSION_COLS,
    STATIC_COLS,
    UPDATE_INTERACTION,
    UPSERT_SESSION,
)
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["RowCodec", "Statement"]

log = logging.getLogger("rlgate.store")

Statement = tuple[str, tuple[Any, ...]]  # SQL and its parameters
_N_STATIC = len(STATIC_COLS)


def _common_prefix_len(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RowCodec:
    """Encodes changes as SQL statements and decodes the rows back (see the module docstring)."""

    def __init__(self) -> None:
        self._live: dict[str, Interaction] = {}
        self._by_session: dict[str, set[str]] = {}
        self._inserted: set[str] = set()
        self._seq = 0  # last interaction seq handed out

    # ------------------------------------------------------------------ encode

    def session(self, session: Session) -> Statement:
        row = (key_text(session.id, "session id"), key_text(session.task_id, "task_id"), session.key_hash,
               session.mode, session.status, session.created_at, session.last_active, session.ended_at,
               session.exported_at, to_json(session.metadata), session.policy)
        return UPSERT_SESSION, row

    def interaction(self, i: Interaction) -> Statement:
        """An insert the first time ``i`` is saved, an update of its changing columns after."""
        if i.id in self._inserted:
            return UPDATE_INTERACTION, (*self._dynamic(i), i.id)
        row = (*self._static(i), *self._dynamic(i))
        self._track(i)
        self._inserted.add(i.id)
        return INSERT_INTERACTION, row

    def is_inserted(self, interaction_id: str) -> bool:
        """Was an insert of this interaction submitted (its next save is an update)?"""
        return interaction_id in self._inserted

    def refresh_insert(self, insert: Statement, i: Interaction) -> Statement:
        """``insert`` (this interaction's insert, not yet written) with ``i``'s current values."""
        sql, params = insert
        assert sql == INSERT_INTERACTION and params[0] == i.id
        return sql, (*params[:_N_STATIC], *self._dynamic(i))

    def forget_failed(self, ops: list[Statement]) -> None:
        """A change was not written: an interaction whose insert failed is no base for delta
        encoding, and its next save (if any) inserts it again instead of updating nothing."""
        for sql, params in ops:
            if sql == INSERT_INTERACTION:
                iid = params[0]
                self._inserted.discard(iid)
                self._live.pop(iid, None)

    def delete_session(self, session_id: str) -> list[Statement]:
        for iid in self._by_session.pop(session_id, ()):
            self._live.pop(iid, None)
            self._inserted.discard(iid)
        return [("DELETE FROM interactions WHERE session_id=?", (session_id,)),
                ("DELETE FROM sessions WHERE id=?", (session_id,))]

    def forget(self, session_id: str, interaction_ids: list[str]) -> None:
        """These turns are being deleted (a whole conversation tree: none is another's base)."""
        ids = self._by_session.get(session_id, set())
        for iid in interaction_ids:
            self._live.pop(iid, None)
            self._inserted.discard(iid)
            ids.discard(iid)

    def _track(self, i: Interaction) -> None:
        self._live[i.id] = i
        self._by_session.setdefault(i.session_id, set()).add(i.id)

    def _dynamic(self, i: Interaction) -> tuple[Any, ...]:
        return (i.prefix_key, i.status, encode_ints(i.output_ids), encode_floats(i.output_logprobs),
                encode_ints(i.output_versions), i.finish_reason, i.stop_kind,
                to_json(message_to_openai(i.output_message)) if i.output_message is not None else None,
                i.reward, text(i.error), i.completed_at)

    def _static(self, i: Interaction) -> tuple[Any, ...]:
        base = self._live.get(i.parent_id) if i.parent_id else None
        prompt_base_len = 0
        messages_skip = 0
        same_tools = False
        if base is not None:
            bp, bo = base.prompt_ids, base.output_ids
            lp, lo = len(bp), len(bo)
            if len(i.prompt_ids) >= lp + lo and i.prompt_ids[:lp] == bp and i.prompt_ids[lp:lp + lo] == bo:
                prompt_base_len = lp + lo
            elif len(i.prompt_ids) >= lp and i.prompt_ids[:lp] == bp:
                prompt_base_len = lp
            messages_skip = _common_prefix_len(base.messages, i.messages)
            same_tools = i.tools == base.tools
        tools = None if same_tools else tools_json(i.tools)
        self._seq += 1
        return (i.id, self._seq, key_text(i.session_id, "session id"), i.api, i.parent_id, i.relation,
                i.fork_reason, i.context_key, base.id if base is not None else None, prompt_base_len,
                encode_ints(i.prompt_ids[prompt_base_len:]), messages_skip, messages_json(i.messages[messages_skip:]),
                tools, to_json(i.sampling), int(i.client_store), i.created_at, i.policy,
                to_json(i.template_dropped) if i.template_dropped else None)

    # ------------------------------------------------------------------ decode

    def load(self, session_rows: list[tuple[Any, ...]], interaction_rows: list[tuple[Any, ...]]) -> list[Session]:
        """Sessions with their interactions from rows in ``SESSION_COLS`` / ``STATIC_COLS + DYNAMIC_COLS``
        order; the decoded interactions become the live ones later turns are encoded against."""
        sessions: dict[str, Session] = {}
        for row in session_rows:
            r = dict(zip(SESSION_COLS, row, strict=True))
            s = Session(id=r["id"], task_id=r["task_id"], key_hash=r["key_hash"], mode=r["mode"],
                        status=r["status"], created_at=r["created_at"], last_active=r["last_active"],
                        ended_at=r["ended_at"], exported_at=r["exported_at"], metadata=json.loads(r["metadata"]),
                        policy=r["policy"])
            sessions[s.id] = s
        decoded: dict[str, Interaction] = {}
        all_rows = [dict(zip(STATIC_COLS + DYNAMIC_COLS, row, strict=True)) for row in interaction_rows]
        known = {r["id"] for r in all_rows}
        rows = all_rows
        while rows:  # seq order puts a base before its extensions; loop in case it does not
            deferred = [r for r in rows if r["base_id"] in known and r["base_id"] not in decoded]
            for r in rows:
                if not (r["base_id"] in known and r["base_id"] not in decoded):
                    i = self._decode(r, sessions, decoded)
                    if i is not None:
                        decoded[i.id] = i
            if len(deferred) == len(rows):  # cannot happen (bases are older); never spin
                for r in deferred:
                    log.error("store: interaction %s extends undecodable %s; skipped", r["id"], r["base_id"])
                break
            rows = [r for r in deferred if r["id"] not in decoded]
        for r in all_rows:  # seq order: the order the live session had them in
            self._seq = max(self._seq, r["seq"])
            i = decoded.get(r["id"])
            if i is not None:
                sessions[i.session_id].interactions[i.id] = i
                self._track(i)
                self._inserted.add(i.id)
        return list(sessions.values())

    def _decode(self, r: dict[str, Any], sessions: dict[str, Session],
                decoded: dict[str, Interaction]) -> Interaction | None:
        if r["session_id"] not in sessions:
            log.error("store: interaction %s belongs to no session; skipped", r["id"])
            return None
        base = decoded.get(r["base_id"]) if r["base_id"] else None
        if r["base_id"] and base is None:
            log.error("store: interaction %s extends missing %s; skipped", r["id"], r["base_id"])
            return None
        prompt = decode_ints(r["prompt_ids"])
        messages = [message_from_openai(m) for m in json.loads(r["messages"])]
        if base is not None:
            prompt = (base.prompt_ids + base.output_ids)[: r["prompt_base_len"]] + prompt
            messages = base.messages[: r["messages_skip"]] + messages
        tools = base.tools if (r["tools"] is None and base is not None) else [
            ToolSpec(name=t["name"], description=t.get("description"), parameters=t["parameters"])
            for t in json.loads(r["tools"] or "[]")
        ]
        out_msg = message_from_openai(json.loads(r["output_message"])) if r["output_message"] else None
        return Interaction(
            id=r["id"], session_id=r["session_id"], api=r["api"], messages=messages, tools=tools,
            prompt_ids=prompt, parent_id=r["parent_id"], relation=r["relation"], fork_reason=r["fork_reason"],
            context_key=r["context_key"], prefix_key=r["prefix_key"],
            output_ids=decode_ints(r["output_ids"]), output_logprobs=decode_floats(r["output_logprobs"]),
            output_versions=decode_ints(r["output_versions"]), finish_reason=r["finish_reason"],
            stop_kind=r["stop_kind"], output_message=out_msg, reward=r["reward"], status=r["status"],
            error=r["error"], created_at=r["created_at"], completed_at=r["completed_at"],
            sampling=json.loads(r["sampling"]), client_store=bool(r["client_store"]), policy=r["policy"],
            template_dropped=json.loads(r["template_dropped"]) if r["template_dropped"] else [],
        )
