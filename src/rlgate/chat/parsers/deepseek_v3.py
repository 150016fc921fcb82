"""DeepSeek-V3 / R1 tool calls: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
```json\\n{…}\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``."""

from __future__ import annotations

import json
import re

from rlgate.chat.parsers.base import ParsedToolCall, register_tool_parser
from rlgate.chat.parsers.blocks import BlockToolParser, call

_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>\s*(?:\w+)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```"
                   r"\s*<｜tool▁call▁end｜>\s*", re.S)


@register_tool_parser("deepseek_v3", "deepseek_r1")
class DeepSeekV3ToolParser(BlockToolParser):
    START, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    markers = (START,)

    def parse_body(self, body: str) -> list[ParsedToolCall] | None:
        calls: list[ParsedToolCall] = []
        pos = 0
        while pos < len(body):
            m = _CALL.match(body, pos)
            if m is None:
                return None
            try:
                c = call(m.group(1).strip(), json.loads(m.group(2)))
            except json.JSONDecodeError:
                return None
            if c is None:
                return None
            calls.append(c)
            pos = m.end()
        return calls or None
