"""Qwen3-2507: Thinking (generation prompt opens ``<think>\\n``) and Instruct (no reasoning).

Same ChatML markup and tool format as Qwen3, without ``enable_thinking``. The Thinking
template ends the generation prompt with ``<think>\\n`` — replies start inside reasoning and
never write ``<think>`` themselves. ``renderers`` maps these checkpoints to its plain Qwen3
renderer, which omits that ``<think>\\n``; we add it (tested against the real template).
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def _qwen3_markup(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return ("<|im_start|>" in t and "<tool_call>" in t and "last_query_index" in t and "enable_thinking" not in t
            and "<function=" not in t and info.has_tokens("<think>", "</think>", "<tool_response>"))


def detect_thinking(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return _qwen3_markup(info) and "assistant\\n<think>\\n'" in t.replace("\n", "\\n")


def detect_instruct(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return _qwen3_markup(info) and "reasoning_content" in t and not detect_thinking(info)


THINKING = ModelFamily(
    name="qwen3_2507_thinking",
    title="Qwen3-2507 Thinking",
    detect=detect_thinking,
    build_renderer=renderers_backend("qwen3", generation_prefix="<think>\n"),
    tool_parser="hermes",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    history="drops the reasoning of assistant turns before the last user query",
)

INSTRUCT = ModelFamily(
    name="qwen3_2507_instruct",
    title="Qwen3-2507 Instruct",
    detect=detect_instruct,
    build_renderer=renderers_backend("qwen3"),
    tool_parser="hermes",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    history="keeps history verbatim (it renders reasoning only after the last user query)",
)
