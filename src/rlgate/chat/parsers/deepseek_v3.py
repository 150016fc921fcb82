"""DeepSeek-V3 / R1 tool calls: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
```json\\n{…}\\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>``."""

from __future__ import annotations

import re

from rlgate.chat.parsers.base import register_tool_parser
from rlgate.chat.parsers.blocks import RegexBlockToolParser

_CALL = re.compile(r"\s*<｜tool▁call▁begin｜>\s*(?:\w+)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```"
                   r"\s*<｜tool▁call▁end｜>\s*", re.S)


@register_tool_parser("deepseek_v3", "deepseek_r1")
class DeepSeekV3ToolParser(RegexBlockToolParser):
    START, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    markers = (START,)
    CALL = _CALL
