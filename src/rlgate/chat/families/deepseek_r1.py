"""DeepSeek-R1 distills (R1-Distill-Qwen / -Llama) and R1's own template.

The generation prompt is ``<｜Assistant｜><think>\\n``: replies start inside reasoning. Earlier
assistant turns are rendered with everything up to ``</think>`` removed — history is rewritten
at every turn. Renderer: the checkpoint's Jinja template (``renderers``' ``deepseek-r1`` needs
DeepSeek-V3's atomic tool-call tokens, which the distills' Qwen vocabulary does not have).
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.jinja import jinja_backend


def detect(info: CheckpointInfo) -> bool:
    return "<｜Assistant｜>" in info.chat_template and "<｜User｜>" in info.chat_template


FAMILY = ModelFamily(
    name="deepseek_r1",
    title="DeepSeek-R1 (distill)",
    detect=detect,
    build_renderer=jinja_backend(),
    tool_parser="deepseek_v3",
    reasoning_parser="think",
    stop_tokens=("<｜end▁of▁sentence｜>",),
    history="drops the reasoning (everything up to </think>) of every earlier assistant turn",
)
