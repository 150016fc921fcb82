"""Kimi-K2 tool calls: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{JSON}<|tool_call_end|>…<|tool_calls_section_end|>``."""

from __future__ import annotations

import re

from rlgate.chat.parsers.base import register_tool_parser
from rlgate.chat.parsers.blocks import RegexBlockToolParser

_CALL = re.compile(r"\s*<\|tool_call_begin\|>\s*(?:functions\.)?([^:<\s]+)(?::\d+)?\s*"
                   r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>\s*", re.S)


@register_tool_parser("kimi_k2")
class KimiK2ToolParser(RegexBlockToolParser):
    START, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
    markers = (START,)
    CALL = _CALL
