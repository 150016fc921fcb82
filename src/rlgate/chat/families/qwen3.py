"""Qwen3 (hybrid thinking: ``enable_thinking``), e.g. Qwen3-0.6B … Qwen3-235B-A22B.

Template: ChatML; tools listed in the system turn, ``<tool_call>`` JSON in assistant turns,
tool results grouped in a user turn of ``<tool_response>`` blocks. It renders the reasoning of
assistant turns after the last user query only, and an empty ``<think>\\n\\n</think>\\n\\n``
block on the last assistant turn: history is rewritten at every new user query.
Renderer: ``renderers`` ``qwen3`` (token-for-token parity with the template, tested).
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def detect(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return ("<|im_start|>" in t and "enable_thinking" in t and "<tool_call>" in t and "<function=" not in t
            and info.has_tokens("<think>", "</think>", "<tool_response>"))


FAMILY = ModelFamily(
    name="qwen3",
    title="Qwen3 (hybrid thinking)",
    detect=detect,
    build_renderer=renderers_backend("qwen3"),
    tool_parser="hermes",
    reasoning_parser="think",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    history="drops the reasoning of assistant turns before the last user query",
)
