"""Qwen3.5 / 3.6 / Qwen3-Coder tool calls:
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.

Values are typed by the tool's parameter schema (a string parameter keeps "123" as text); without
one they are taken as JSON when they parse as JSON (numbers, booleans, objects), else as text.
"""

from __future__ import annotations

import re

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser
from rlgate.chat.parsers.blocks import BlockToolParser, call, parameter_schema, typed_value

_FUNC = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


@register_tool_parser("qwen3_xml", "qwen3_coder")
class Qwen3XmlToolParser(BlockToolParser):
    START, END = "<tool_call>", "</tool_call>"
    markers = (START,)

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        m = _FUNC.match(body)
        if m is None:
            return None
        name = m.group(1).strip()
        args = {k.strip(): typed_value(v, parameter_schema(self.schemas, name, k.strip()))
                for k, v in _PARAM.findall(m.group(2))}
        c = call(name, args)
        return [c] if c else None
