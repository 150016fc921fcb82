"""Text deltas that arrive together are sent as one; nothing else is merged or reordered."""

from __future__ import annotations

from rlgate.chat.output import ContentDelta, ReasoningDelta, ToolCallDelta
from rlgate.core.generation import merge_text_deltas


def test_adjacent_text_deltas_merge_in_order():
    call = ToolCallDelta(index=0, id="c", name="f", arguments="{}")
    events = [ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("x"), ContentDelta("y"), call,
              ContentDelta("z"), ReasoningDelta("r"), ContentDelta("w")]
    out = merge_text_deltas(events)
    assert out == [ReasoningDelta("ab"), ContentDelta("xy"), call, ContentDelta("z"), ReasoningDelta("r"),
                   ContentDelta("w")]
    assert merge_text_deltas([]) == []
