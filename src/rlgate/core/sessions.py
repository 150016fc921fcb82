"""Sessions, keys, capacity, rewards and export: the gateway's control state.

All state lives in one :class:`SessionManager` instance owned by the app (no module
globals). Every change is written through to the :class:`~rlgate.store.base.Store`, by way of a
:class:`~rlgate.core.request_scope.ScopedStore` that records each write for the durability barrier
of the request making it (a 2xx means the change is on disk, without a call to remember per save).

Keys: a session's API key is kept only as its SHA-256 digest. Looking a key up hashes
it and indexes a dict by the digest, so the lookup's timing depends on the digest,
not on how much of the secret matched. The admin key is compared with
``hmac.compare_digest``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

from rlgate.config import GatewayConfig
from rlgate.core.naming import DefaultNaming, SessionNaming
from rlgate.core.rate_limit import RateLimiter
from rlgate.core.request_scope import ScopedStore, after_response, on_durable, on_write_failure
from rlgate.core.session_restore import load_sessions, log_restored
from rlgate.errors import (
    AuthenticationFailed,
    Conflict,
    Gone,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unavailable,
)
from rlgate.metrics.gateway import GatewayMetrics
from rlgate.store.base import Store
from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE, NO_DISCOUNT, ExportStyle, export_samples
from rlgate.trajectory.interaction import Interaction, Session, TrajectoryMode
from rlgate.trajectory.tree import register_completed

log = logging.getLogger("rlgate.sessions")

MIN_KEY_LENGTH = 32
NOTHING_TO_REWARD = "no_completed_interaction"  # error code: a reward for a session that made no LLM call


_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]+")  # what a caller-chosen key may be made of


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class SessionManager:
    def __init__(self, config: GatewayConfig, store: Store, naming: SessionNaming | None = None,
                 metrics: GatewayMetrics | None = None) -> None:
        self.config = config
        self.store = ScopedStore(store)  # every write joins the current request's durability barrier
        self.naming: SessionNaming = naming or DefaultNaming()
        self.gateway_metrics = metrics if metrics is not None else GatewayMetrics(config)  # Prometheus + guards
        self.sessions: dict[str, Session] = {}
        self._by_key: dict[str, str] = {}  # key digest -> session id
        self.capacity = 0  # admissions left in "granted" capacity mode
        self._admin_hash = hash_key(config.admin_key)
        self.metrics: dict[str, int] = {
            "sessions_started": 0,
            "sessions_ended": 0,
            "sessions_exported": 0,
            "sessions_interrupted": 0,
            "interactions_completed": 0,
            "interactions_failed": 0,
            "interactions_aborted": 0,
            "sessions_swept": 0,
        }
        self.accepting = True  # False while shutting down: no new sessions
        self.rate_limiter = RateLimiter(config.rate_limit_per_key, config.rate_limit_burst)
        # ended / interrupted sessions not exported yet, oldest first (for collect())
        self._finished: dict[str, None] = {}
        self._finished_changed: asyncio.Event | None = None
        # applied to every exported sample (None: withheld); rlgate serve --online --redaction-hook
        self.redact: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None

    # ------------------------------------------------------------------ restart

    def restore(self, conversation: Callable[[Session], bool] | None = None) -> None:
        """Reload persisted sessions (:func:`~rlgate.core.session_restore.load_sessions`): those active at
        the stop become ``interrupted``; ``conversation`` names the online conversations (a calmer log line)."""
        restored = load_sessions(self.store, self.config.retain_exported)
        self.capacity = restored.capacity
        self.metrics["sessions_interrupted"] += restored.interrupted
        self.sessions.update(restored.sessions)
        self._by_key.update(restored.by_key)
        self._finished.update(dict.fromkeys(restored.finished))
        self.gateway_metrics.record_restart(restored.cut)
        log_restored(restored, conversation)

    # ------------------------------------------------------------------ capacity

    def grant_capacity(self, count: int = 1) -> int:
        self.capacity += count
        self.store.save_meta("capacity", self.capacity)

        def undo() -> None:
            self.capacity -= count

        on_write_failure(undo)
        return self.capacity

    # ------------------------------------------------------------------ sessions

    def _free_session_id(self, task_id: str) -> str:
        k = 0
        while self.naming.session_id(f"{task_id}-{k}") in self.sessions:
            k += 1
        return self.naming.session_id(f"{task_id}-{k}")

    def open_sessions(self) -> int:
        return sum(1 for s in self.sessions.values() if s.status == "active")

    def sessions_by_status(self) -> dict[str, int]:
        """Held sessions by status; sessions kept for audit after export count as "exported"."""
        out: dict[str, int] = {}
        for s in self.sessions.values():
            key = "exported" if s.exported_at is not None else s.status
            out[key] = out.get(key, 0) + 1
        return out

    def start_session(
        self,
        task_id: str,
        api_key: str | None = None,
        *,
        mode: TrajectoryMode | None = None,
        metadata: dict[str, Any] | None = None,
        policy: str | None = None,  # bound to this policy (core/policies.py; the caller checked it exists)
    ) -> tuple[Session, str]:
        if not self.accepting:
            raise Unavailable("the gateway is shutting down and admits no new sessions", code="shutting_down")
        if self.open_sessions() >= self.config.max_sessions:
            raise RateLimited(
                f"too many open sessions (max_sessions={self.config.max_sessions}); end or export some first",
                code="too_many_sessions",
            )
        if len(self.sessions) >= self.config.max_stored_sessions:
            raise RateLimited(
                f"too many sessions held (max_stored_sessions={self.config.max_stored_sessions}): "
                "export ended sessions first",
                code="too_many_stored_sessions",
            )
        if not task_id.isprintable():  # it is written to logs, and names the session
            raise InvalidRequest("task_id must not hold control characters (newlines, tabs, NUL...)",
                                 param="task_id")
        if api_key is not None:
            if not _VISIBLE_ASCII.fullmatch(api_key):  # a header value a client can send back
                raise InvalidRequest("api_key must be printable ASCII without spaces: it is sent back in the "
                                     "Authorization or x-api-key header", param="api_key")
            if secrets.compare_digest(hash_key(api_key), self._admin_hash):
                raise InvalidRequest("api_key must not be the admin key", param="api_key")
            if len(api_key) < MIN_KEY_LENGTH:
                raise InvalidRequest(
                    f"api_key must be at least {MIN_KEY_LENGTH} characters", param="api_key"
                )
            owner = self._by_key.get(hash_key(api_key))
            if owner is not None and owner in self.sessions and self.sessions[owner].status == "active":
                raise Conflict("api_key belongs to an active session", param="api_key")
        granted = self.config.capacity_mode == "granted"
        if granted and self.capacity <= 0:
            raise RateLimited("no capacity: the trainer has not granted another session yet", code="no_capacity")
        key = api_key if api_key is not None else self.naming.new_key()
        digest = hash_key(key)
        session = Session(
            id=self._free_session_id(task_id),
            task_id=task_id,
            key_hash=digest,
            mode=mode or self.config.trajectory_mode,
            metadata=dict(metadata or {}), policy=policy,
        )
        # The write first: a store that refuses the row (StoreError) leaves nothing behind.
        self.store.save_session(session)
        if granted:
            self.capacity -= 1
            self.store.save_meta("capacity", self.capacity)
        previous_owner = self._by_key.get(digest)
        self.sessions[session.id] = session
        self._by_key[digest] = session.id  # drops the mapping of an ended session, if any
        self.metrics["sessions_started"] += 1

        def undo() -> None:  # the writes failed: no orphan holding a slot, a key or capacity
            if self.sessions.get(session.id) is session:
                del self.sessions[session.id]
            if self._by_key.get(digest) == session.id:
                if previous_owner is not None and previous_owner in self.sessions:
                    self._by_key[digest] = previous_owner
                else:
                    del self._by_key[digest]
            if granted:
                self.capacity += 1
            self.metrics["sessions_started"] -= 1

        on_write_failure(undo)
        log.info("session %s started (task %s, mode %s)", session.id, task_id, session.mode)
        return session, key

    def is_admin(self, token: str) -> bool:
        return secrets.compare_digest(hash_key(token), self._admin_hash)

    def session_for_key(self, token: str) -> Session:
        return self._session_for_digest(hash_key(token))

    def identify(self, token: str) -> Session | None:
        """The session ``token`` is the key of; None for the admin key. Raises
        :class:`AuthenticationFailed` for any other token. One hash of the token for both
        questions (the gate asks them of every request with a body)."""
        digest = hash_key(token)
        if secrets.compare_digest(digest, self._admin_hash):
            return None
        return self._session_for_digest(digest)

    def _session_for_digest(self, digest: str) -> Session:
        sid = self._by_key.get(digest)
        session = self.sessions.get(sid) if sid is not None else None
        if session is None:
            raise AuthenticationFailed("invalid API key: not a session key of this gateway")
        return session

    def require_active(self, session: Session) -> None:
        """Raise (409 ended / 410 interrupted) unless the session is active."""
        if session.status == "ended":
            raise Conflict(f"session {session.id} has ended; start a new session", code="session_ended")
        if session.status == "interrupted":
            raise Gone(f"session {session.id} was interrupted by a gateway restart; its key is retired",
                       code="session_interrupted")

    def require_generating(self, session: Session) -> None:
        """Raise unless the session may generate (and record) another interaction."""
        self.require_active(session)
        if len(session.interactions) >= self.config.max_interactions_per_session:
            raise RateLimited(
                f"session {session.id} reached max_interactions_per_session="
                f"{self.config.max_interactions_per_session}",
                code="too_many_interactions",
            )
        if session.in_flight >= self.config.max_concurrent_requests_per_session:
            raise RateLimited(
                f"session {session.id} has {session.in_flight} requests in flight "
                f"(max_concurrent_requests_per_session={self.config.max_concurrent_requests_per_session})",
                code="too_many_concurrent_requests",
            )

    def end_session(self, session: Session) -> int:
        if session.status == "active":
            session.status = "ended"
            session.ended_at = time.time()
            self.metrics["sessions_ended"] += 1
            self.store.save_session(session)
            self._mark_finished(session)

            def undo() -> None:
                if session.status == "ended":
                    session.status, session.ended_at = "active", None
                    self.metrics["sessions_ended"] -= 1
                    self._finished.pop(session.id, None)

            on_write_failure(undo)
            log.info("session %s ended with %d interactions", session.id, len(session.interactions))
        return len(session.completed_interactions())

    # ------------------------------------------------------------------ interactions

    def add_interaction(self, session: Session, interaction: Interaction, *, image_bytes: int = 0) -> None:
        session.interactions[interaction.id] = interaction
        session.image_bytes += image_bytes
        session.touch()
        self.store.save_interaction(interaction)

        def undo() -> None:  # the interaction never reached the store: forget it entirely
            if session.interactions.get(interaction.id) is interaction:
                del session.interactions[interaction.id]
                session.image_bytes -= image_bytes
            ids = session.prefix_index.get(interaction.prefix_key)
            if ids and interaction.id in ids:
                ids.remove(interaction.id)
            log.warning("session %s: interaction %s forgotten: the store could not write it", session.id,
                        interaction.id)

        on_write_failure(undo)

    def complete_interaction(self, session: Session, interaction: Interaction) -> None:
        interaction.status = "completed"
        interaction.completed_at = time.time()
        register_completed(session, interaction)
        session.touch()
        self.metrics["interactions_completed"] += 1
        if interaction.finish_reason == "abort":
            self.metrics["interactions_aborted"] += 1
        self.store.save_interaction(interaction)

    def fail_interaction(self, session: Session, interaction: Interaction, error: str) -> None:
        interaction.status = "failed"
        interaction.error = error
        interaction.completed_at = time.time()
        self.metrics["interactions_failed"] += 1
        self.store.save_interaction(interaction)

    # ------------------------------------------------------------------ rewards

    def reward_target(self, session: Session, interaction_id: str | None) -> Interaction:
        """The interaction a reward lands on: ``interaction_id``'s, or the last completed one (400 if none)."""
        if interaction_id is None:
            target = session.last_completed()
            if target is None:
                raise InvalidRequest(f"session {session.id} has no completed interaction to reward",
                                     code=NOTHING_TO_REWARD)
            return target
        target = session.interactions.get(interaction_id)
        if target is None:
            raise InvalidRequest(f"interaction {interaction_id!r} is not in session {session.id}",
                                 param="interaction_id")
        if not target.completed:
            raise InvalidRequest(f"interaction {interaction_id!r} did not complete ({target.status})",
                                 param="interaction_id")
        return target

    def set_reward(self, session: Session, reward: float, interaction_id: str | None) -> Interaction:
        return self._reward(self.reward_target(session, interaction_id), reward)

    def _reward(self, target: Interaction, reward: float) -> Interaction:
        previous = target.reward
        target.reward = float(reward)
        self.store.save_interaction(target)

        def undo() -> None:
            target.reward = previous

        on_write_failure(undo)
        return target

    # ------------------------------------------------------------------ export

    async def export(
        self,
        session_id: str,
        *,
        style: ExportStyle = DEFAULT_EXPORT_STYLE,
        discount: float = NO_DISCOUNT,
        keep: bool = False,
        wait_timeout: float = 0.0,
        current_version: int | None = None,
    ) -> dict[str, Any]:
        """The session's samples (see trajectory/export.py); ``current_version``: the engine's weight
        version now, for the staleness metrics (None: not measured)."""
        session = self.sessions.get(session_id)
        if session is None or session.exported_at is not None:
            raise NotFound(f"session {session_id!r} not found (never started, or already exported)")
        deadline = time.monotonic() + max(0.0, wait_timeout)
        while session.status == "active" or session.in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                what = "is still active" if session.status == "active" else "has requests in flight"
                raise Conflict(
                    f"session {session_id} {what}; end it first or pass wait_timeout",
                    code="session_active",
                )
            await asyncio.sleep(min(left, 0.02))
        if session.exported_at is not None:  # another export took it while this one waited
            raise NotFound(f"session {session_id!r} not found (exported meanwhile by another request)")
        return self._export_now(session, style=style, discount=discount, keep=keep, current_version=current_version)

    def _export_now(self, session: Session, *, style: ExportStyle, discount: float, keep: bool,
                    current_version: int | None) -> dict[str, Any]:
        """The export of a finished session with nothing in flight; without ``keep`` the session goes."""
        samples, stats = export_samples(list(session.interactions.values()), style=style, discount=discount,
                                        task_id=session.task_id)
        interactions = [s.to_dict() for s in samples]
        if self.redact is not None:
            interactions = [r for r in map(self.redact, interactions) if r is not None]
        response = {
            "session_id": session.id,
            "task_id": session.task_id,
            "status": session.status,
            "style": style,
            "discount": discount,
            "mode": session.mode,
            "stats": stats,
            "interactions": interactions,
        }
        # The response is fully built: only now may the session go.
        if not keep:
            self._drop_after_export(session)

        def count() -> None:  # once durable, before the answer: a refused one (503, undone) counts nothing
            # a kept export is a look (e.g. a reward function's, before rewards): its samples count once, at the end
            if not keep:
                self.gateway_metrics.record_export(interactions, stats, style, current_version)
            self.metrics["sessions_exported"] += 1

        on_durable(count)
        return response

    def _drop_after_export(self, session: Session) -> None:
        """Retire the key and mark the session exported now (a second export is a 404); the
        store forgets it only after the export response was sent (at-least-once: if the
        gateway dies in between, the session is exportable again after the restart). Its id
        stays reserved until then, so a new session cannot take the row."""
        if self._by_key.get(session.key_hash) == session.id:  # the key may map to a newer session
            del self._by_key[session.key_hash]
        session.exported_at = time.time()
        finished = self._finished.pop(session.id, 0) is None

        def undo() -> None:  # the request's writes (a finish's end and rewards) failed: exportable again
            session.exported_at = None
            self._by_key.setdefault(session.key_hash, session.id)
            if finished:
                self._finished[session.id] = None

        on_write_failure(undo)

        def drop() -> None:
            if self.config.retain_exported > 0:
                self.store.save_session(session)
            elif self.sessions.get(session.id) is session:
                del self.sessions[session.id]
                self.rate_limiter.forget(session.id)
                self.store.delete_session(session.id)

        after_response(drop)
        log.info("session %s exported", session.id)

    async def finish(
        self,
        session_id: str,
        *,
        reward: float | None = None,
        rewards: dict[str, float] | None = None,
        style: ExportStyle = DEFAULT_EXPORT_STYLE,
        discount: float = NO_DISCOUNT,
        wait_timeout: float = 0.0,
        current_version: int | None = None,
    ) -> dict[str, Any]:
        """End an active session, set its rewards and return its export, as ``end_session``,
        ``set_reward`` (``reward``: the last completed interaction's; ``rewards``: by interaction id)
        and :meth:`export` would one after the other, in one request: the rollout's per-episode
        control calls (issue 28). All or nothing: every reward target is checked before anything
        changes, and a failed store write undoes the end and the rewards (the session is active and
        exportable again). Waits up to ``wait_timeout`` s for the session's requests in flight.

        404: unknown or exported; 409 / 410: no longer active (ended, interrupted); 409
        ``session_busy``: requests still in flight; 400 ``no_completed_interaction``: a reward but
        no completed interaction to put it on (the agent made no LLM call)."""
        session = self.sessions.get(session_id)
        if session is None or session.exported_at is not None:
            raise NotFound(f"session {session_id!r} not found (never started, or already exported)")
        self.require_active(session)
        deadline = time.monotonic() + max(0.0, wait_timeout)
        while session.in_flight:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Conflict(f"session {session_id} has requests in flight; finish it when they are answered "
                               "or pass wait_timeout", code="session_busy")
            await asyncio.sleep(min(left, 0.02))
        if self.sessions.get(session_id) is not session or session.exported_at is not None:
            raise NotFound(f"session {session_id!r} not found (exported meanwhile by another request)")
        self.require_active(session)  # ended by another request (or the sweeper) while this one waited
        # From here on nothing awaits: no request of the session can slip in between the steps.
        targets = [] if reward is None else [(self.reward_target(session, None), reward)]
        targets += [(self.reward_target(session, iid), r) for iid, r in (rewards or {}).items()]
        self.end_session(session)
        for target, r in targets:
            self._reward(target, r)
        return self._export_now(session, style=style, discount=discount, keep=False,
                                current_version=current_version)

    def _mark_finished(self, session: Session) -> None:
        self._finished[session.id] = None
        if self._finished_changed is not None:
            self._finished_changed.set()

    async def collect(self, max_sessions: int, *, wait_timeout: float = 0.0, style: ExportStyle = DEFAULT_EXPORT_STYLE,
                      discount: float = NO_DISCOUNT, where: Callable[[Session], bool] | None = None) -> list[dict[str, Any]]:
        """Exports of up to ``max_sessions`` finished sessions (ended or interrupted, nothing in
        flight, not exported yet; ``where``: those it accepts), in the order they finished; waits up to ``wait_timeout``
        seconds for the first. Each is exported as by :meth:`export` (dropped once the response
        is sent): a trainer drains every finished trajectory without naming sessions."""
        deadline = time.monotonic() + max(0.0, wait_timeout)
        while True:
            ready = [sid for sid in self._finished
                     if (s := self.sessions.get(sid)) is not None and s.exported_at is None and not s.in_flight
                     and s.status != "active" and (where is None or where(s))][:max_sessions]
            left = deadline - time.monotonic()
            if ready or left <= 0:
                break
            if self._finished_changed is None:
                self._finished_changed = asyncio.Event()
            self._finished_changed.clear()
            try:
                await asyncio.wait_for(self._finished_changed.wait(), min(left, 0.5))
            except TimeoutError:
                pass
        out = []
        for sid in ready:
            try:
                out.append(await self.export(sid, style=style, discount=discount))
            except NotFound:  # another collector took it meanwhile
                continue
        return out

    # ------------------------------------------------------------------ data deletion (online/rights.py)

    def delete_session(self, session: Session) -> None:
        """Forget a session and its interactions, in memory and in the store; its key stops working."""
        held = self.sessions.get(session.id) is session
        if held:
            del self.sessions[session.id]
        mapped = self._by_key.get(session.key_hash) == session.id
        if mapped:
            del self._by_key[session.key_hash]
        finished = self._finished.pop(session.id, 0) is None
        self.rate_limiter.forget(session.id)
        self.store.delete_session(session.id)

        def undo() -> None:  # not deleted from the store: keep it reachable in memory too
            if held:
                self.sessions[session.id] = session
            if mapped:
                self._by_key[session.key_hash] = session.id
            if finished:
                self._finished[session.id] = None

        on_write_failure(undo)
        log.info("session %s deleted", session.id)

    def forget_interactions(self, session: Session, interaction_ids: list[str]) -> None:
        """Drop these interactions (a whole tree: none is the parent of one kept) from the session in
        memory; the caller deletes their rows."""
        gone = set(interaction_ids)
        before = dict(session.interactions), {k: list(v) for k, v in session.prefix_index.items()}
        for iid in gone:
            session.interactions.pop(iid, None)
        for key, ids in list(session.prefix_index.items()):
            kept = [i for i in ids if i not in gone]
            if kept:
                session.prefix_index[key] = kept
            else:
                del session.prefix_index[key]
        session.digest_memo.clear()

        def undo() -> None:  # the rows were not deleted: the turns stay reachable (a retry deletes them)
            session.interactions.clear()
            session.interactions.update(before[0])
            session.prefix_index.clear()
            session.prefix_index.update(before[1])

        on_write_failure(undo)

    # ------------------------------------------------------------------ housekeeping

    def sweep(self, now: float | None = None) -> list[str]:
        """End active sessions idle for longer than the timeout; purge retained exports."""
        now = time.time() if now is None else now
        ended = []
        for s in list(self.sessions.values()):
            if s.status == "active" and not s.in_flight and now - s.last_active > self.config.session_idle_timeout:
                self.end_session(s)
                ended.append(s.id)
                self.metrics["sessions_swept"] += 1
                log.warning("session %s idle for %.0f s: ended by the sweeper (not deleted; still exportable)",
                            s.id, now - s.last_active)
            elif (s.exported_at is not None and self.config.retain_exported > 0
                  and now - s.exported_at > self.config.retain_exported):
                self.sessions.pop(s.id, None)
                self.rate_limiter.forget(s.id)
                self.store.delete_session(s.id)
        self.rate_limiter.prune()
        return ended
