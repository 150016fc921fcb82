"""Kimi-K2 Instruct: ``<|im_user|>…<|im_middle|>…<|im_end|>`` turns, sectioned tool calls.

A tool call is ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{…}<|tool_call_end|><|tool_calls_section_end|>``.
Renderer: ``renderers`` ``kimi-k2``.
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def detect(info: CheckpointInfo) -> bool:
    return ("<|im_middle|>" in info.chat_template and "<|im_user|>" in info.chat_template
            and info.has_tokens("<|tool_calls_section_begin|>", "<|tool_call_argument_begin|>"))


FAMILY = ModelFamily(
    name="kimi_k2",
    title="Kimi-K2",
    detect=detect,
    build_renderer=renderers_backend("kimi-k2"),
    tool_parser="kimi_k2",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>",),
    history="keeps history verbatim",
)
