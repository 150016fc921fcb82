"""Hermes / Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Repeatable; text around the calls is content. A block may also hold a JSON list of calls,
``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``: the form SmolLM2's
function-calling data (and its model card's tool prompt) uses. A block whose body is not a call
object or a non-empty list of them (or that is never closed) is returned verbatim as content.
"""

from __future__ import annotations

import json

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser, tool_call_from_obj
from rlgate.chat.parsers.blocks import BlockToolParser


@register_tool_parser("hermes", "qwen", "qwen25")
class HermesToolParser(BlockToolParser):
    START, END = "<tool_call>", "</tool_call>"
    markers = (START,)

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        calls = [tool_call_from_obj(o) for o in (obj if isinstance(obj, list) else [obj])]
        if not calls or any(c is None for c in calls):
            return None
        return [c for c in calls if c is not None]
