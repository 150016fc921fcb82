"""Qwen3.5 / 3.6 / Qwen3-Coder tool calls:
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.

Values are taken as JSON when they parse as JSON (numbers, booleans, objects), else as text.
"""

from __future__ import annotations

import re

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser
from rlgate.chat.parsers.blocks import BlockToolParser, call, value_from_text

_FUNC = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


@register_tool_parser("qwen3_xml", "qwen3_coder")
class Qwen3XmlToolParser(BlockToolParser):
    START, END = "<tool_call>", "</tool_call>"

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        m = _FUNC.match(body)
        if m is None:
            return None
        args = {k.strip(): value_from_text(v) for k, v in _PARAM.findall(m.group(2))}
        c = call(m.group(1).strip(), args)
        return [c] if c else None
