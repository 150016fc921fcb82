"""Data rights: deleting a tenant's or a conversation's data on request, everywhere it is.

:class:`DataRights` deletes, in this order: the turns (the conversation's sessions, or its tree
of turns in the tenant's shared session) from memory and from the store, the feedback events,
and - for a tenant - the tenant itself when asked; then :class:`DeletionNotifier` tells every
subscriber (``on_delete``), so that whoever holds copies drops them: the continuous trainer's
pending batches and replay buffer (part 2), an exporter's queue. A subscriber is called once the
store writes were submitted, on the event loop; it must not block. A 2xx answer to a deletion
request means the deletion is durable (the request's writes joined its durability barrier).

Exports already handed out (``/export_trajectories``, ``/rl/collect``) are outside the gateway:
the deletion names their session and interaction ids so that their holder can act on them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Deletion", "DeletionNotifier"]

log = logging.getLogger("rlgate.online.rights")


@dataclass(frozen=True)
class Deletion:
    """What was deleted (a subscriber drops everything that names one of these)."""

    tenant: str
    conversation_ids: tuple[str, ...]  # the deleted conversations (all the tenant's for a tenant deletion)
    session_ids: tuple[str, ...]  # sessions removed whole
    interaction_ids: tuple[str, ...]  # every deleted turn, whole sessions' turns included
    reason: str = "request"  # "request" | "retention"
    whole_tenant: bool = False


@dataclass
class DeletionNotifier:
    """Subscribers to deletions (``on_delete``); :meth:`notify` calls each, logging any failure."""

    _callbacks: list[Callable[[Deletion], None]] = field(default_factory=list)

    def on_delete(self, callback: Callable[[Deletion], None]) -> Callable[[], None]:
        """Call ``callback`` with every future :class:`Deletion`; returns a function that unsubscribes."""
        self._callbacks.append(callback)

        def unsubscribe() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return unsubscribe

    def notify(self, deletion: Deletion) -> None:
        for callback in list(self._callbacks):
            try:
                callback(deletion)
            except Exception:  # noqa: BLE001 - one subscriber's bug must not stop the others' deletion
                log.exception("a deletion subscriber failed (tenant %s)", deletion.tenant)
