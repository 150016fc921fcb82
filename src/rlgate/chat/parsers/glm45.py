"""GLM-4.5 tool calls: ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n…</tool_call>``.

Values are typed by the tool's parameter schema (see :func:`~rlgate.chat.parsers.blocks.typed_value`)."""

from __future__ import annotations

import re

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser
from rlgate.chat.parsers.blocks import BlockToolParser, call, parameter_schema, typed_value

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


@register_tool_parser("glm45", "glm")
class Glm45ToolParser(BlockToolParser):
    START, END = "<tool_call>", "</tool_call>"
    markers = (START,)

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        name, _, rest = body.partition("<arg_key>")
        rest = "<arg_key>" + rest if rest else ""
        if _ARG.sub("", rest).strip():
            return None
        fn = name.strip()
        c = call(fn, {k.strip(): typed_value(v, parameter_schema(self.schemas, fn, k.strip()))
                      for k, v in _ARG.findall(rest)})
        return [c] if c else None
