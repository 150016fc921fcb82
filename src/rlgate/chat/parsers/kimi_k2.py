"""Kimi-K2 tool calls: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{JSON}<|tool_call_end|>…<|tool_calls_section_end|>``."""

from __future__ import annotations

import json
import re

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser
from rlgate.chat.parsers.blocks import BlockToolParser, call

_CALL = re.compile(r"\s*<\|tool_call_begin\|>\s*(?:functions\.)?([^:<\s]+)(?::\d+)?\s*"
                   r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>\s*", re.S)


@register_tool_parser("kimi_k2")
class KimiK2ToolParser(BlockToolParser):
    START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    markers = (START,)

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        calls: list[ParsedToolCall] = []
        pos = 0
        while pos < len(body):
            m = _CALL.match(body, pos)
            if m is None:
                return None
            try:
                c = call(m.group(1), json.loads(m.group(2)))
            except json.JSONDecodeError:
                return None
            if c is None:
                return None
            calls.append(c)
            pos = m.end()
        return calls or None
