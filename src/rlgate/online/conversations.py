"""Conversations of real traffic, recognised without an RL harness.

A tenant's request names its conversation in a header (``--conversation-header``, default
``X-Conversation-Id``) or not:

* **with the header**, the conversation is its own session (task ``tenant-{tenant id}``, metadata
  ``{"tenant": ..., "conversation": ...}``); the conversation id is the header's value (a tenant's
  own namespace: two tenants may both say "chat-1");
* **without it**, all of the tenant's requests go to one shared session, where token-exact parent
  matching (``core/sessions.py``, ``trajectory/tree.py``) files each turn under the turn it
  continues, exactly as for a harness's session; a conversation is one tree of it, and its id is
  the id of the tree's first turn (the response id the client got for its first message).

A session that ended (idle sweeper), was exported or holds ``max_interactions_per_session`` turns
is not reused: the next request of that conversation (or tenant) starts a new one, so a
conversation may span sessions. Session keys of these sessions are never shown: the tenant's key
is what authenticates. After a restart the mapping is rebuilt from the sessions' metadata.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from rlgate.core.request_scope import on_write_failure
from rlgate.core.sessions import SessionManager
from rlgate.errors import InvalidRequest
from rlgate.records.tenants import Tenant
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["CONVERSATION_KEY", "TENANT_KEY", "Conversations", "conversation_id_from_headers"]

TENANT_KEY = "tenant"  # session metadata: the tenant it belongs to
CONVERSATION_KEY = "conversation"  # session metadata: the header's conversation id (None: the shared session)
MAX_CONVERSATION_ID = 256
_CONVERSATION_ID = re.compile(r"[\x21-\x7e]{1,256}")  # MAX_CONVERSATION_ID


def conversation_id_from_headers(headers: Mapping[str, str], name: str) -> str | None:
    """The conversation a request names (None: none); 400 for a value that is not 1-256 visible ASCII."""
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not _CONVERSATION_ID.fullmatch(value):
        raise InvalidRequest(f"the {name} header must be 1-{MAX_CONVERSATION_ID} visible ASCII characters",
                             param=name, code="invalid_conversation_id")
    return value


def tenant_of(session: Session) -> str | None:
    tenant = session.metadata.get(TENANT_KEY)
    return tenant if isinstance(tenant, str) else None


class Conversations:
    """Which session serves a tenant's conversation; which conversation a turn belongs to."""

    def __init__(self, sessions: SessionManager) -> None:
        self.sessions = sessions
        # called with the tenant id before a new session starts (online/quotas.py: make room or refuse)
        self.admit: Callable[[str], None] | None = None
        self._current: dict[tuple[str, str | None], str] = {}  # (tenant, conversation) -> session receiving it
        self._by_tenant: dict[str, dict[str, None]] = {}  # tenant -> its held sessions (ordered set)
        # the policy a tenant's new session is bound to (online/tenant_policies.py; None: unbound)
        self.policy_of: Callable[[str], str | None] = lambda tenant_id: None

    def restore(self) -> None:
        """Rebuild the maps from the sessions the session manager restored."""
        for s in self.sessions.sessions.values():
            tenant = tenant_of(s)
            if tenant is not None:
                self._by_tenant.setdefault(tenant, {})[s.id] = None
                self._current[(tenant, s.metadata.get(CONVERSATION_KEY))] = s.id

    def _usable(self, session: Session | None) -> bool:
        return (session is not None and session.status == "active" and session.exported_at is None
                and len(session.interactions) < self.sessions.config.max_interactions_per_session)

    def session_for(self, tenant: Tenant, conversation_id: str | None) -> Session:
        """The session the tenant's next turn in this conversation goes to (started if needed)."""
        key = (tenant.id, conversation_id)
        sid = self._current.get(key)
        session = self.sessions.sessions.get(sid) if sid is not None else None
        if session is not None and self._usable(session):
            return session
        if self.admit is not None:
            self.admit(tenant.id)
        new, _ = self.sessions.start_session(f"tenant-{tenant.id}", mode="token_exact",
                                             metadata={TENANT_KEY: tenant.id, CONVERSATION_KEY: conversation_id},
                                             policy=self.policy_of(tenant.id))
        previous = self._current.get(key)
        self._current[key] = new.id
        self._by_tenant.setdefault(tenant.id, {})[new.id] = None

        def undo() -> None:  # the session's row was not written: the start_session undo removed it
            if self._current.get(key) == new.id:
                if previous is None:
                    del self._current[key]
                else:
                    self._current[key] = previous
            self._by_tenant.get(tenant.id, {}).pop(new.id, None)

        on_write_failure(undo)
        return new

    # ------------------------------------------------------------------ lookups

    def sessions_of(self, tenant: str) -> list[Session]:
        """The tenant's sessions the gateway holds (ids of sessions it dropped meanwhile - exported
        without audit retention - are forgotten here)."""
        held = self.sessions.sessions
        ids = self._by_tenant.get(tenant, {})
        for sid in [sid for sid in ids if sid not in held]:
            del ids[sid]
        return [held[sid] for sid in ids]

    def tenants(self) -> list[str]:
        return list(self._by_tenant)

    def online_sessions(self) -> Iterator[Session]:
        for tenant in list(self._by_tenant):
            yield from self.sessions_of(tenant)

    @staticmethod
    def root_of(session: Session, interaction: Interaction) -> Interaction:
        node, seen = interaction, set()
        while node.parent_id is not None and node.parent_id in session.interactions and node.id not in seen:
            seen.add(node.id)
            node = session.interactions[node.parent_id]
        return node

    def conversation_of(self, session: Session, interaction: Interaction) -> str:
        named = session.metadata.get(CONVERSATION_KEY)
        return named if isinstance(named, str) else self.root_of(session, interaction).id

    def find_turn(self, tenant: str | None, interaction_id: str) -> tuple[Session, Interaction] | None:
        """The turn with this id among the tenant's sessions (every tenant's when ``tenant`` is None)."""
        for t in ([tenant] if tenant is not None else list(self._by_tenant)):
            for s in self.sessions_of(t):
                found = s.interactions.get(interaction_id)
                if found is not None:
                    return s, found
        return None

    def canonical(self, tenant: str, conversation_id: str) -> str:
        """The id a conversation is known by: in the tenant's shared (header-less) sessions a conversation is a
        tree named by its first turn, so a later turn's id names the tree it belongs to (its root's id)."""
        for s in self.sessions_of(tenant):
            if s.metadata.get(CONVERSATION_KEY) is None:
                turn = s.interactions.get(conversation_id)
                if turn is not None:
                    return self.root_of(s, turn).id
        return conversation_id

    def last_turn(self, tenant: str, conversation_id: str) -> Interaction | None:
        """The conversation's latest completed turn (what conversation-level feedback is credited to)."""
        turns = [t for _, ts in self.turns_of(tenant, conversation_id) for t in ts if t.completed]
        return max(turns, key=lambda t: (t.completed_at or t.created_at)) if turns else None

    def turns_of(self, tenant: str, conversation_id: str) -> list[tuple[Session, list[Interaction]]]:
        """Every held turn of a conversation, by session (whole sessions for a named conversation); a
        header-less conversation may be named by any of its turns (see :meth:`canonical`)."""
        conversation_id = self.canonical(tenant, conversation_id)
        out = []
        for s in self.sessions_of(tenant):
            named = s.metadata.get(CONVERSATION_KEY)
            if named == conversation_id:
                out.append((s, list(s.interactions.values())))
            elif named is None and conversation_id in s.interactions:
                tree = [i for i in s.interactions.values() if self.root_of(s, i).id == conversation_id]
                out.append((s, tree))
        return out

    def remember(self, session: Session) -> None:
        """Map a session again (its deletion's writes failed: it stays, reachable)."""
        tenant = tenant_of(session)
        if tenant is not None:
            self._by_tenant.setdefault(tenant, {})[session.id] = None
            self._current.setdefault((tenant, session.metadata.get(CONVERSATION_KEY)), session.id)

    def forget(self, session: Session) -> None:
        tenant = tenant_of(session)
        if tenant is None:
            return
        self._by_tenant.get(tenant, {}).pop(session.id, None)
        if not self._by_tenant.get(tenant):
            self._by_tenant.pop(tenant, None)
        key = (tenant, session.metadata.get(CONVERSATION_KEY))
        if self._current.get(key) == session.id:
            del self._current[key]
