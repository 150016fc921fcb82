"""Feedback -> rewarded training samples and canary observations, as events arrive.

:class:`FeedbackTail` tails the store's feedback (``list_feedback(after=cursor)``, part 1's
contract) and, for each event about a turn, asks the RewardMap for the turn's reward over *all* its
events so far (a change of mind or a delayed outcome changes it):

* the first time a turn has a reward, it is credited to the version that generated the turn
  (the canary's test, ``Canary.observe``) and queued for training (``OnlineTrainer.add_feedback``)
  as an individual sample with the recorded tokens, logprobs and versions;
* every sample passes the operator's redaction hook first (``--redaction-hook``; None: withheld,
  counted);
* a later event that changes a turn's reward (a delayed outcome hours later) queues the turn again
  with the new reward, if it is still within the staleness bounds (the trainer checks); the canary
  keeps the first reward (one observation per turn).

Conversation-level events (no ``interaction_id``: "the ticket was solved") are credited to the
conversation's latest completed turn, whose sample holds the conversation so far: its reward is the
RewardMap's over its own events and the conversation's, and it reaches the trainer and the canary
like any turn's. Every reward is clipped to ``[reward_low, reward_high]`` (counted) and a
non-finite one is dropped (counted; the HTTP edge already refuses such values). Turns already
deleted are skipped (the store no longer holds them). The maps of turns already rewarded are bounded
(oldest forgotten first).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rlgate.online.canary import Canary
from rlgate.online.reward_map import RewardMap
from rlgate.online.trainer import OnlineTrainer
from rlgate.records.feedback import FeedbackEvent
from rlgate.trajectory.export import individual_sample
from rlgate.trajectory.interaction import Interaction, Session
from rlgate.trajectory.sample import Sample

log = logging.getLogger("rlgate.online.feedback_source")

# Turns whose last reward is remembered (to tell a first reward from a changed one).
KEEP_TURNS = 100_000

FindTurn = Callable[[str | None, str], "tuple[Session, Interaction] | None"]


class FeedbackTail:
    """Tails feedback into the trainer and the canary (see the module docstring)."""

    def __init__(self, store: Any, reward_map: RewardMap, trainer: OnlineTrainer | None, canary: Canary | None, *,
                 find_turn: FindTurn, conversation_of: Callable[[Session, Interaction], str],
                 last_turn: Callable[[str, str], Interaction | None] | None = None,
                 redact: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
                 bounds: tuple[float, float] = (-1.0, 1.0),
                 accepts: Callable[[Interaction], bool] | None = None) -> None:
        """``store``: part 1's ``OnlineRecords`` (``list_feedback``); ``find_turn(tenant, interaction_id)``;
        ``conversation_of(session, turn)``; ``last_turn(tenant, conversation_id)`` for conversation-level
        events (None: those are skipped); ``redact``: the operator's redaction hook, applied to every sample
        before the trainer sees it (None: withheld); ``bounds``: the reward range (``reward_low``,
        ``reward_high``); ``accepts(turn)``: the turns this tail takes (None: all; an adapter policy's learner takes
        its own policy's turns, online/learners.py)."""
        self.store = store
        self.reward_map = reward_map
        self.trainer = trainer
        self.canary = canary
        self.find_turn = find_turn
        self.conversation_of = conversation_of
        self.last_turn = last_turn
        self.redact = redact
        self.bounds = bounds
        self.accepts = accepts
        self.cursor = 0
        self.rewards: OrderedDict[str, float] = OrderedDict()  # turn id -> its last reward
        self.credited: OrderedDict[str, str] = OrderedDict()  # turn id -> the conversation whose events it carries
        self.counts = {"events": 0, "rewarded_turns": 0, "reward_changes": 0, "turn_not_found": 0,
                       "withheld_by_redaction": 0, "conversation_events": 0, "rewards_clipped": 0,
                       "rewards_nonfinite": 0}

    def poll(self, limit: int = 1000) -> int:
        """Read the events since the cursor; how many were read."""
        page = self.store.list_feedback(after=self.cursor, limit=limit)
        for event in page.events:
            self._take(event)
        self.cursor = page.cursor
        return len(page.events)

    def _take(self, event: FeedbackEvent) -> None:
        self.counts["events"] += 1
        if event.kind == "comment":
            return
        turn_id = event.interaction_id
        if turn_id is None:
            last = self.last_turn(event.tenant, event.conversation_id) if self.last_turn else None
            if last is None:
                self.counts["turn_not_found"] += 1
                return
            self.counts["conversation_events"] += 1
            turn_id = last.id
            self.credited[turn_id] = event.conversation_id
            self.credited.move_to_end(turn_id)
            while len(self.credited) > KEEP_TURNS:
                self.credited.popitem(last=False)
        found = self.find_turn(event.tenant, turn_id)
        if found is None or not found[1].completed:
            self.counts["turn_not_found"] += 1
            return
        session, turn = found
        if self.accepts is not None and not self.accepts(turn):
            return
        events = self.store.list_feedback(tenant=event.tenant, interaction_id=turn_id).events
        conversation = self.credited.get(turn_id)
        if conversation is not None:  # the conversation's own events count on the turn they were credited to
            events += [e for e in self.store.list_feedback(tenant=event.tenant, conversation_id=conversation).events
                       if e.interaction_id is None]
        if event.interaction_id is None and all(e.id != event.id for e in events):
            events = [*events, event]
        reward = self.reward_map.reward(events)
        if reward is None:
            return
        if not math.isfinite(reward):
            self.counts["rewards_nonfinite"] += 1
            log.error("feedback on turn %s gave a non-finite reward (%r): dropped", turn_id, reward)
            return
        low, high = self.bounds
        if not low <= reward <= high:
            self.counts["rewards_clipped"] += 1
            reward = min(max(reward, low), high)
        previous = self.rewards.get(turn_id)
        if previous == reward:
            return
        self.rewards[turn_id] = reward
        self.rewards.move_to_end(turn_id)
        while len(self.rewards) > KEEP_TURNS:
            self.rewards.popitem(last=False)
        if previous is None:
            self.counts["rewarded_turns"] += 1
            if self.canary is not None and turn.output_versions:
                self.canary.observe(max(turn.output_versions), reward)
        else:
            self.counts["reward_changes"] += 1
        if self.trainer is not None:
            sample: Sample | None = individual_sample(turn, reward, task_id=session.task_id)
            if self.redact is not None and sample is not None:
                out = self.redact(sample.to_dict())
                sample = Sample.from_dict(out) if out is not None else None
            if sample is None:
                self.counts["withheld_by_redaction"] += 1
                return
            self.trainer.add_feedback(sample, self.conversation_of(session, turn), event.tenant, turn.created_at)
