"""Tool-call and reasoning parsers (importing this package registers all formats)."""

from __future__ import annotations

from rlgate.chat.parsers import (  # noqa: F401  (registration)
    deepseek_v3,
    glm45,
    harmony,
    hermes,
    kimi_k2,
    llama3_json,
    qwen3_xml,
    think,
)
from rlgate.chat.parsers.base import (
    ContentText,
    ParsedToolCall,
    ReasoningParser,
    ReasoningText,
    ToolParser,
    get_reasoning_parser,
    get_tool_parser,
    reasoning_parser_names,
    register_reasoning_parser,
    register_tool_parser,
    tool_parser_names,
    unparsed_tool_blocks,
)

__all__ = [
    "ContentText",
    "ParsedToolCall",
    "ReasoningParser",
    "ReasoningText",
    "ToolParser",
    "get_reasoning_parser",
    "get_tool_parser",
    "reasoning_parser_names",
    "register_reasoning_parser",
    "register_tool_parser",
    "tool_parser_names",
    "unparsed_tool_blocks",
]
