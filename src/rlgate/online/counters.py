"""The online counters after a restart: feedback from the store, as the turns are (issue 40).

The feedback-rate and reward metrics (``metrics/feedback.py``) count what happens in one process.
Turns come back after a restart by themselves: the implicit scan looks at every held turn of the
restored sessions once per process, and counts it. Feedback did not: one thumbs up, a restart on the
same store, another one, and the page showed 1 feedback event and one turn with feedback.

:func:`replay_feedback` counts every stored event once at startup, as if it had just arrived:
``rlgate_feedback_events_total`` by kind and source; a turn with explicit or delayed feedback in
``rlgate_online_turns_with_feedback_total`` when the turn is still held (so the rate's numerator and
denominator count the same turns); each target's current reward in the reward gauges. It reads the
store once, a page at a time, keeping the events of held turns and conversations grouped by target
until the last page (O(stored events) once, at startup).

The implicit scan finds the implicit events of restored turns again (their ids are digests, so the
store keeps each once): the ids returned here are those not to count twice; the caller drops them
after its first scan.
"""

from __future__ import annotations

from rlgate.metrics.feedback import FeedbackMetrics
from rlgate.online.conversations import Conversations
from rlgate.online.reward_map import RewardMap
from rlgate.online.scoped import ScopedOnlineRecords
from rlgate.records.feedback import FeedbackEvent

__all__ = ["replay_feedback"]

PAGE = 1000


def replay_feedback(records: ScopedOnlineRecords, conversations: Conversations, metrics: FeedbackMetrics,
                    reward_map: RewardMap) -> set[str]:
    """Count the stored feedback in ``metrics`` (see module docstring); the ids of the implicit events."""
    held = {i for s in conversations.online_sessions() for i in s.interactions}
    by_target: dict[str, list[FeedbackEvent]] = {}
    implicit: set[str] = set()
    after = 0
    while True:
        page = records.list_feedback(after=after, limit=PAGE)
        for e in page.events:
            if e.source == "implicit":
                implicit.add(e.id)
            turn = e.interaction_id if e.interaction_id in held else None
            metrics.record_event(e.kind, e.source, turn, e.policy_version)
            if e.interaction_id is None or turn is not None:
                by_target.setdefault(e.interaction_id or f"{e.tenant}/{e.conversation_id}", []).append(e)
        if not page.events or page.cursor == after:
            break
        after = page.cursor
    for target, events in by_target.items():
        metrics.record_reward(target, events[-1].policy_version, reward_map.reward(events))
    return implicit
