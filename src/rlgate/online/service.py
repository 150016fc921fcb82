"""One gateway's online state (``app.state.online``): tenants, conversations, feedback, data rights.

Built by ``server/app.py`` when ``OnlineConfig.online`` is on, after the session manager restored
its sessions; :meth:`OnlineGateway.run` is the background loop (implicit signals, retention).
Routes call the methods here (``api/online/router.py``); nothing in it knows about HTTP.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from rlgate.config import OnlineConfig
from rlgate.core.request_scope import on_write_failure
from rlgate.core.sessions import SessionManager
from rlgate.errors import InvalidRequest, NotFound, PermissionDenied, RateLimited
from rlgate.metrics.feedback import FeedbackMetrics
from rlgate.online.conversations import Conversations, conversation_id_from_headers
from rlgate.online.counters import replay_feedback
from rlgate.online.implicit import ImplicitSignals, version_of
from rlgate.online.quotas import TenantQuotas
from rlgate.online.redaction import Redactor, load_redactor
from rlgate.online.retention import purge_expired
from rlgate.online.reward_map import RewardMap
from rlgate.online.rights import DataRights
from rlgate.online.scoped import ScopedOnlineRecords
from rlgate.records.feedback import (
    FeedbackEvent,
    FeedbackPage,
    FeedbackSource,
    check_value,
    new_feedback_id,
)
from rlgate.records.tenants import Tenant, TenantKeys, check_name, hash_tenant_key, new_tenant_id, new_tenant_key
from rlgate.store.online import OnlineRecords
from rlgate.supervised import forever
from rlgate.trajectory.interaction import Interaction, Session

__all__ = ["FeedbackTarget", "OnlineGateway"]

log = logging.getLogger("rlgate.online")


@dataclass(frozen=True)
class FeedbackTarget:
    """What a feedback request is about, once found and checked against the caller."""

    tenant: str
    conversation_id: str
    interaction: Interaction | None  # None: the conversation as a whole
    version: int | None


@dataclass
class OnlineGateway:
    config: OnlineConfig
    sessions: SessionManager
    records: ScopedOnlineRecords
    metrics: FeedbackMetrics
    tenants: TenantKeys = field(init=False)
    conversations: Conversations = field(init=False)
    reward_map: RewardMap = field(init=False)
    implicit: ImplicitSignals = field(init=False)
    rights: DataRights = field(init=False)
    redact: Redactor | None = field(init=False, default=None)
    quotas: TenantQuotas = field(init=False)
    _replayed_implicit: set[str] = field(init=False, default_factory=set)  # replay_feedback's, until the first scan

    @classmethod
    def build(cls, config: OnlineConfig, sessions: SessionManager, store: OnlineRecords,
              metrics: FeedbackMetrics) -> OnlineGateway:
        """``ValueError`` for a configuration that cannot work (a bad weight, hook or pattern)."""
        return cls(config, sessions, ScopedOnlineRecords(store), metrics)

    def __post_init__(self) -> None:
        self.reward_map = RewardMap.from_config(self.config)
        self.tenants = TenantKeys(self.records.load_tenants())
        self.conversations = Conversations(self.sessions)
        self.conversations.restore()
        try:
            self.implicit = ImplicitSignals(self.conversations, tool_error_pattern=self.config.tool_error_pattern,
                                            abandon_after=self.config.abandon_after, emit=self._emit_implicit,
                                            on_turn=lambda t: self.metrics.record_turn(version_of(t)))
        except Exception as exc:  # re.error
            raise ValueError(f"--tool-error-pattern: {exc}") from exc
        self.rights = DataRights(self.sessions, self.conversations, self.records, self.implicit)
        self.quotas = TenantQuotas(self.config, self.sessions, self.conversations,
                                   lambda tenant: self.records.count_feedback(tenant=tenant))
        self.conversations.admit = self.quotas.admit
        self.rights.on_feedback_deleted = self.quotas.feedback_deleted
        # the stored feedback counted again (the turns are, by the scan): the metrics survive a restart
        self._replayed_implicit = replay_feedback(self.records, self.conversations, self.metrics, self.reward_map)
        if self.config.redaction_hook:
            self.redact = load_redactor(self.config.redaction_hook)
            self.sessions.redact = self.redact

    # ------------------------------------------------------------------ tenants

    def create_tenant(self, name: str) -> tuple[Tenant, str]:
        try:
            check_name(name)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="name") from None
        if len(self.tenants.tenants) >= self.config.max_tenants:
            raise RateLimited(f"too many tenants (max_tenants={self.config.max_tenants})", code="too_many_tenants")
        key = new_tenant_key()
        tenant = Tenant(id=new_tenant_id(), name=name, key_hash=hash_tenant_key(key))
        while tenant.id in self.tenants.tenants:  # 48 random bits: practically never
            tenant.id = new_tenant_id()
        self.records.save_tenant(tenant)
        self.tenants.put(tenant)
        on_write_failure(lambda: self.tenants.remove(tenant.id))
        log.info("tenant %s (%s) created", tenant.id, name)
        return tenant, key

    def tenant(self, tenant_id: str) -> Tenant:
        tenant = self.tenants.tenants.get(tenant_id)
        if tenant is None:
            raise NotFound(f"tenant {tenant_id!r} not found", param="tenant_id")
        return tenant

    def revoke_tenant(self, tenant_id: str) -> Tenant:
        tenant = self.tenant(tenant_id)
        if tenant.revoked_at is None:
            tenant.revoked_at = time.time()
            self.records.save_tenant(tenant)
            self.tenants.put(tenant)

            def undo() -> None:
                tenant.revoked_at = None
                self.tenants.put(tenant)

            on_write_failure(undo)
            log.info("tenant %s revoked", tenant.id)
        return tenant

    def forget_tenant(self, tenant_id: str) -> None:
        """After its data was deleted: the tenant's own row too (its key was revoked first)."""
        tenant = self.revoke_tenant(tenant_id)
        self.records.delete_tenant(tenant.id)
        self.tenants.remove(tenant.id)
        on_write_failure(lambda: self.tenants.put(tenant))

    # ------------------------------------------------------------------ conversations

    def session_for(self, tenant: Tenant, headers: Any) -> Session:
        """The session a tenant's generation request goes to (``api/auth.py: session_from_request``)."""
        return self.conversations.session_for(
            tenant, conversation_id_from_headers(headers, self.config.conversation_header))

    # ------------------------------------------------------------------ feedback

    def target(self, tenant: str | None, interaction_id: str | None, conversation_id: str | None) -> FeedbackTarget:
        """The turn or conversation a request names, if the caller may reach it (tenant None: the admin)."""
        if interaction_id is not None:
            found = self.conversations.find_turn(tenant, interaction_id)
            if found is None:
                raise NotFound(f"turn {interaction_id!r} not found (not one of this tenant's held turns: "
                               "never served, deleted, or past retention)", param="interaction_id")
            session, turn = found
            owner = session.metadata.get("tenant")
            assert isinstance(owner, str)
            conversation = self.conversations.conversation_of(session, turn)
            if conversation_id is not None and self.conversations.canonical(owner, conversation_id) != conversation:
                raise InvalidRequest(f"turn {interaction_id!r} is not in conversation {conversation_id!r}",
                                     param="conversation_id")
            if not turn.completed:
                raise InvalidRequest(f"turn {interaction_id!r} did not complete ({turn.status})",
                                     param="interaction_id")
            return FeedbackTarget(owner, conversation, turn, version_of(turn))
        if conversation_id is None:
            raise InvalidRequest("name the turn (interaction_id: the response id) or the conversation "
                                 "(conversation_id)", param="interaction_id")
        if tenant is None:
            raise InvalidRequest("with the admin key, conversation-level feedback needs tenant_id", param="tenant_id")
        conversation_id = self.conversations.canonical(tenant, conversation_id)
        held = self.conversations.turns_of(tenant, conversation_id)
        turns = [t for _, ts in held for t in ts if t.completed]
        if not held:
            raise NotFound(f"conversation {conversation_id!r} not found", param="conversation_id")
        return FeedbackTarget(tenant, conversation_id, None, version_of(turns[-1]) if turns else None)

    def record(self, target: FeedbackTarget, kind: str, value: Any, source: FeedbackSource, *,
               metadata: dict[str, Any] | None = None,
               other: tuple[Session, Interaction] | None = None) -> tuple[list[FeedbackEvent], float | None]:
        """Store explicit or delayed feedback on ``target`` (a preference: on it and on ``other``, each under
        its own conversation); the events and the target's reward now."""
        c = self.config
        try:
            stored = check_value(kind, value, max_comment_chars=c.max_comment_chars,
                                 outcome_range=(c.outcome_low, c.outcome_high))
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="value") from None
        if kind == "implicit":
            raise InvalidRequest("implicit signals are the gateway's own: send thumbs, rating, preference, "
                                 "comment or outcome", param="kind")
        meta = dict(metadata or {})
        if meta and len(json.dumps(meta, separators=(",", ":"))) > c.max_feedback_metadata_bytes:
            raise InvalidRequest(f"metadata holds at most {c.max_feedback_metadata_bytes} bytes of JSON "
                                 "(--max-feedback-metadata-bytes)", param="metadata")
        turn_id = target.interaction.id if target.interaction is not None else None
        if kind == "preference" and (other is None or turn_id is None):
            raise InvalidRequest("a preference names two replies: interaction_id and other_interaction_id",
                                 param="other_interaction_id")
        # (turn, value, version, conversation, metadata) of each event
        pairs: list[tuple[str | None, float | str, int | None, str, dict[str, Any]]] = []
        if kind == "preference" and other is not None:
            other_session, other_turn = other
            if other_turn.id == turn_id:
                raise InvalidRequest("a preference compares two different replies: other_interaction_id names "
                                     "the same reply", param="other_interaction_id")
            pair = "pair-" + secrets.token_hex(8)
            pairs.append((turn_id, stored, target.version, target.conversation_id,
                          {**meta, "pair": pair, "other": other_turn.id}))
            pairs.append((other_turn.id, -float(stored), version_of(other_turn),
                          self.conversations.conversation_of(other_session, other_turn),
                          {**meta, "pair": pair, "other": turn_id}))
        else:
            pairs.append((turn_id, stored, target.version, target.conversation_id, meta))
        for tid, _, _, conversation, _ in pairs:
            if self.records.count_feedback(tenant=target.tenant, conversation_id=conversation,
                                           interaction_id=tid) >= c.max_feedback_per_target:
                raise RateLimited(f"{tid or conversation!r} has max_feedback_per_target="
                                  f"{c.max_feedback_per_target} feedback events", code="too_much_feedback")
        self.quotas.check_feedback(target.tenant, len(pairs))
        events = [FeedbackEvent(id=new_feedback_id(), tenant=target.tenant, conversation_id=conversation,
                                interaction_id=tid, kind=kind, value=v, source=source,  # type: ignore[arg-type]
                                policy_version=version, metadata=m) for tid, v, version, conversation, m in pairs]
        rewards = [self._store(e) for e in events]
        return events, rewards[0]

    def _emit_implicit(self, event: FeedbackEvent) -> None:
        if event.id in self._replayed_implicit:  # found again in a restored turn: stored and counted already
            return
        self._store(event)

    def _store(self, event: FeedbackEvent) -> float | None:
        """Store an event; the reward of its turn (or conversation) with it."""
        self.records.add_feedback(event)
        self.metrics.record_event(event.kind, event.source, event.interaction_id, event.policy_version)
        target = event.interaction_id or f"{event.tenant}/{event.conversation_id}"
        reward = self.reward(event.tenant, event.conversation_id, event.interaction_id, also=event)
        self.metrics.record_reward(target, event.policy_version, reward)
        return reward

    def feedback(self, tenant: str, conversation_id: str, interaction_id: str | None) -> list[FeedbackEvent]:
        """Every stored event on one turn (or on the conversation as a whole, when ``interaction_id`` is None)."""
        page = self.records.list_feedback(tenant=tenant, conversation_id=conversation_id,
                                          limit=self.config.max_feedback_per_target * 2)
        return [e for e in page.events if e.interaction_id == interaction_id]

    def reward(self, tenant: str, conversation_id: str, interaction_id: str | None, *,
               also: FeedbackEvent | None = None) -> float | None:
        """The reward map's reward of a turn (or a conversation) from its stored events."""
        events = self.feedback(tenant, conversation_id, interaction_id)
        if also is not None and all(e.id != also.id for e in events):
            events.append(also)  # written in this loop iteration, not yet visible to a read
        return self.reward_map.reward(events)

    def list_feedback(self, tenant: str | None, *, conversation_id: str | None, interaction_id: str | None,
                      after: int, limit: int) -> FeedbackPage:
        if tenant is None and conversation_id is not None:
            raise PermissionDenied("with the admin key, filter a conversation with tenant_id too")
        return self.records.list_feedback(tenant=tenant, conversation_id=conversation_id,
                                          interaction_id=interaction_id, after=after, limit=limit)

    # ------------------------------------------------------------------ background

    async def run(self) -> None:
        """Scan for implicit signals, release idle conversations and purge by age, forever (cancelled at
        shutdown); the first scan at once: the restored turns are counted from the start."""
        next_purge = 0.0
        first = True

        async def one_pass() -> None:
            nonlocal next_purge, first
            self.implicit.scan()
            self.quotas.release_idle()
            if first:
                self._replayed_implicit.clear()  # every restored turn was looked at
                first = False
            if self.config.data_retention_hours > 0 and time.monotonic() >= next_purge:
                next_purge = time.monotonic() + self.config.retention_interval
                purge_expired(self.conversations, self.rights, self.records, self.config.data_retention_hours)
                self.quotas.feedback_deleted()
                await self.records.forget_deleted()  # the purged data leaves the store's files too

        await forever(one_pass, wait=self.config.implicit_scan_interval, what="online background pass", log=log,
                      at_once=True)
