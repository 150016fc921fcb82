"""Qwen3.5 / Qwen3.6: ChatML with XML tool calls (``<function=NAME><parameter=K>V</parameter>``).

Thinking is on by default for the larger checkpoints (the generation prompt opens
``<think>\\n``); reasoning of turns before the last user query is dropped (3.6 keeps it with
``preserve_thinking``). Renderers: ``renderers`` ``qwen3.5`` / ``qwen3.6``.
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def _qwen35(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return ("<|im_start|>" in t and "<function=" in t and "enable_thinking" in t
            and info.has_tokens("<think>", "</think>", "<tool_response>", "<|vision_start|>"))


def detect_36(info: CheckpointInfo) -> bool:
    return _qwen35(info) and "preserve_thinking" in info.chat_template


def detect_35(info: CheckpointInfo) -> bool:
    return _qwen35(info) and not detect_36(info)


QWEN35 = ModelFamily(
    name="qwen3_5",
    title="Qwen3.5",
    detect=detect_35,
    build_renderer=renderers_backend("qwen3.5"),
    tool_parser="qwen3_xml",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    history="drops the reasoning of assistant turns before the last user query",
)

QWEN36 = ModelFamily(
    name="qwen3_6",
    title="Qwen3.6",
    detect=detect_36,
    build_renderer=renderers_backend("qwen3.6"),
    tool_parser="qwen3_xml",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    history="drops the reasoning of assistant turns before the last user query (unless preserve_thinking)",
)
