"""Requests re-send the whole conversation: the messages a session already holds are shared, not copied."""

from __future__ import annotations

from rlgate.chat.conversation import Message
from rlgate.trajectory.interaction import Interaction


def share_prefix(parent: Interaction, messages: list[Message], covered: int) -> None:
    """Replace the leading request messages that equal the parent's by the parent's own objects.

    Every request re-sends the whole conversation: kept as sent, a session would hold each
    message (and image) once per later turn, O(turns^2) memory; shared, it holds it once, as
    the store does. Only exactly equal messages are shared, so nothing recorded changes."""
    known = [*parent.messages, parent.output_message]
    for k in range(min(covered, len(known))):
        m = known[k]
        if m is not None and messages[k] is not m and messages[k] == m:
            messages[k] = m
