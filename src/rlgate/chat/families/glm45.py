"""GLM-4.5 / 4.5-Air: ``[gMASK]<sop>``, role tokens, XML-ish tool calls, ``<think>`` reasoning.

A tool call is ``<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n…</tool_call>``;
a reply ends with the next role token the model writes (``<|user|>`` or ``<|observation|>``),
which is also the start of the next turn. Renderer: ``renderers`` ``glm-4.5``.
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def detect(info: CheckpointInfo) -> bool:
    t = info.chat_template
    return "[gMASK]<sop>" in t and "<arg_key>" in t and info.has_tokens("<|observation|>", "<arg_key>", "<think>")


FAMILY = ModelFamily(
    name="glm45",
    title="GLM-4.5",
    detect=detect,
    build_renderer=renderers_backend("glm-4.5"),
    tool_parser="glm45",
    reasoning_parser="think",
    stop_tokens=("<|endoftext|>", "<|user|>", "<|observation|>"),
    history="drops the reasoning of assistant turns before the last user query",
)
