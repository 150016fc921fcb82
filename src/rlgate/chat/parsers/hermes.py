"""Hermes / Qwen tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.

Repeatable; text around the calls is content. A call whose body is not a JSON object
with a ``name`` (or that is never closed) is returned verbatim as content.
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
            call = tool_call_from_obj(json.loads(body))
        except json.JSONDecodeError:
            return None
        return [call] if call is not None else None
