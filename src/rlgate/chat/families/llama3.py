"""Llama 3.x Instruct (3.1 / 3.2 / 3.3): JSON tool calls, tool results in the ``ipython`` role.

Tools are described in the first user turn (``tools_in_user_message``, the default); a tool
call is the whole assistant reply ``{"name": …, "parameters": {…}}``; results come back as
``<|start_header_id|>ipython<|end_header_id|>``. The system turn carries today's date:
rlgate pins ``date_string`` to the template's own fallback ("26 Jul 2024") so prompts do not
change at midnight; pass ``chat_template_kwargs={"date_string": …}`` to override.
Renderer: ``renderers`` ``llama-3`` (parity with the Llama 3.2 template, tested).
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.renderers_backend import renderers_backend


def detect(info: CheckpointInfo) -> bool:
    return ("<|start_header_id|>" in info.chat_template and "<|eot_id|>" in info.chat_template
            and info.has_tokens("<|begin_of_text|>", "<|eom_id|>", "<|end_of_text|>"))


FAMILY = ModelFamily(
    name="llama3",
    title="Llama 3.x Instruct",
    detect=detect,
    build_renderer=renderers_backend("llama-3", reasoning_start=None),
    tool_parser="llama3_json",
    reasoning_parser=None,
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    history="keeps history verbatim",
)
