"""Fair limits per tenant: one tenant's traffic cannot refuse another's.

The gateway's own limits are global (``--max-sessions`` open sessions, ``--max-stored-sessions`` held
ones): with one session per named conversation, one busy tenant could fill them and every other
tenant - a new one included - would get ``429 too_many_sessions``. :class:`TenantQuotas` bounds each
tenant instead, and releases idle conversations on a schedule that fits online traffic:

* **Open conversations** (``--max-open-conversations-per-tenant``): at the limit, the tenant's least
  recently active conversation with nothing in flight is *released* (its session ended, counted)
  to make room; only when all of them are busy is the request refused (429, naming the tenant's own
  limit). The same happens when the gateway's global ``--max-sessions`` is reached: the idle
  conversation released is one of the tenant holding the most open sessions, so a quiet tenant is
  never refused while a busy one holds idle sessions.
* **Idle release** (``--conversation-release-s``): a conversation without a turn for this long is
  released by the background pass (the session manager's own sweeper waits an hour). A released
  conversation's next turn starts a new session: it is recorded as a new root (a trainer sees two
  trajectories) and may be routed to another weight version.
* **Held conversations** (``--max-conversations-per-tenant``): sessions held in any state (ended
  ones stay until deleted, purged by retention or exported); beyond it the tenant's new
  conversations are refused (429 ``tenant_conversations_full``), never another tenant's.
* **Stored feedback** (``--max-feedback-per-tenant``): explicit events beyond it are refused (429
  ``tenant_feedback_full``). Counted in memory from one ``COUNT`` per tenant, kept exact by the
  deletions that reset it.

The trainer's share of a step per tenant is ``OnlineConfig.tenant_train_share``
(``online/trainer.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rlgate.config import OnlineConfig
from rlgate.core.request_scope import on_write_failure
from rlgate.core.sessions import SessionManager
from rlgate.errors import RateLimited
from rlgate.online.conversations import Conversations, tenant_of
from rlgate.trajectory.interaction import Session

__all__ = ["TenantQuotas"]

log = logging.getLogger("rlgate.online.quotas")


class TenantQuotas:
    """Per-tenant limits and idle release (see the module docstring)."""

    def __init__(self, config: OnlineConfig, sessions: SessionManager, conversations: Conversations,
                 count_feedback: Callable[[str], int], clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.sessions = sessions
        self.conversations = conversations
        self.count_feedback = count_feedback  # the store's count of a tenant's events
        self.clock = clock
        self._feedback: dict[str, int] = {}  # tenant -> events stored (lazily counted)
        self.counts = {"released_idle": 0, "released_for_room": 0, "refused_sessions": 0,
                       "refused_conversations": 0, "refused_feedback": 0}

    # ------------------------------------------------------------------ sessions

    def admit(self, tenant: str) -> None:
        """Before a new session of ``tenant`` starts: make room, or refuse it (429) for this tenant only."""
        c = self.config
        held = self.conversations.sessions_of(tenant)
        if len(held) >= c.max_conversations_per_tenant:
            self.counts["refused_conversations"] += 1
            raise RateLimited(f"this tenant holds max_conversations_per_tenant={c.max_conversations_per_tenant} "
                              "conversations: delete some (POST /v1/data/delete) or wait for retention",
                              code="tenant_conversations_full")
        open_ = [s for s in held if s.status == "active"]
        if len(open_) >= c.max_open_conversations_per_tenant and not self._release_one(open_):
            self.counts["refused_sessions"] += 1
            raise RateLimited(f"this tenant has max_open_conversations_per_tenant="
                              f"{c.max_open_conversations_per_tenant} conversations with a request in flight",
                              code="too_many_sessions")
        if self.sessions.open_sessions() >= self.sessions.config.max_sessions:
            # the gateway is full: release an idle conversation of the tenant holding the most
            by_tenant: dict[str, list[Session]] = {}
            for s in self.conversations.online_sessions():
                owner = tenant_of(s)
                if owner is not None and s.status == "active":
                    by_tenant.setdefault(owner, []).append(s)
            for owner in sorted(by_tenant, key=lambda t: -len(by_tenant[t])):
                if self._release_one(by_tenant[owner]):
                    break

    def _release_one(self, open_: list[Session]) -> bool:
        idle = [s for s in open_ if not s.in_flight]
        if not idle:
            return False
        oldest = min(idle, key=lambda s: s.last_active)
        self.sessions.end_session(oldest)
        self.counts["released_for_room"] += 1
        log.info("conversation session %s released to make room (idle %.0f s)", oldest.id,
                 self.clock() - oldest.last_active)
        return True

    def release_idle(self, now: float | None = None) -> int:
        """End the online sessions idle for longer than ``conversation_release_s``; how many."""
        limit = self.config.conversation_release_s
        if limit <= 0:
            return 0
        now = self.clock() if now is None else now
        released = 0
        for s in list(self.conversations.online_sessions()):
            if s.status == "active" and not s.in_flight and now - s.last_active > limit:
                self.sessions.end_session(s)
                released += 1
        self.counts["released_idle"] += released
        if released:
            log.info("released %d conversations idle for more than %.0f s", released, limit)
        return released

    # ------------------------------------------------------------------ feedback

    def check_feedback(self, tenant: str, n: int) -> None:
        """Before ``n`` explicit events of ``tenant`` are stored (429 beyond its quota); counts them."""
        have = self._feedback.get(tenant)
        if have is None:
            have = self._feedback[tenant] = self.count_feedback(tenant)
        if have + n > self.config.max_feedback_per_tenant:
            self.counts["refused_feedback"] += 1
            raise RateLimited(f"this tenant stores max_feedback_per_tenant={self.config.max_feedback_per_tenant} "
                              "feedback events: delete conversations or wait for retention",
                              code="tenant_feedback_full")
        self._feedback[tenant] = have + n

        def undo() -> None:  # not stored after all
            if tenant in self._feedback:
                self._feedback[tenant] -= n

        on_write_failure(undo)

    def feedback_deleted(self, tenant: str | None = None) -> None:
        """Events were deleted (of ``tenant``; None: any, by age): count again when next needed."""
        if tenant is None:
            self._feedback.clear()
        else:
            self._feedback.pop(tenant, None)
