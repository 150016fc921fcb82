"""SmolLM2 Instruct (135M / 360M / 1.7B): ChatML with a default system prompt.

The checkpoint's template writes ``<|im_start|>role\\n…<|im_end|>\\n`` and, when the conversation
has no system message, adds "You are a helpful AI assistant named SmolLM, trained by Hugging
Face". It renders no tools: an agent that wants tool calls describes them in its prompt, and
replies of the ``<tool_call>{"name": …, "arguments": …}</tool_call>`` form are parsed (the Hermes
format SmolLM2's function-calling data uses). Rendered by the checkpoint's own template.
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.jinja import jinja_backend


def detect(info: CheckpointInfo) -> bool:
    return "<|im_start|>" in info.chat_template and "SmolLM" in info.chat_template


FAMILY = ModelFamily(
    name="smollm2",
    title="SmolLM2 Instruct",
    detect=detect,
    build_renderer=jinja_backend(reasoning_start=None),
    tool_parser="hermes",
    reasoning_parser=None,
    stop_tokens=("<|im_end|>",),
    history="keeps history verbatim",
)
