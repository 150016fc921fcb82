"""gpt-oss (harmony format): ``analysis`` / ``commentary`` / ``final`` channels.

A reply is one or more harmony messages: ``<|channel|>analysis<|message|>…<|end|>`` (reasoning),
then either ``<|start|>assistant<|channel|>final<|message|>…<|return|>`` (the answer) or
``<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>``
(a tool call). The template drops the analysis of earlier turns and writes ``<|end|>`` where
the model generated ``<|return|>``; in token_exact mode the generated ``<|return|>`` stays.
Renderer: the checkpoint's Jinja template (``renderers``' ``gpt-oss`` uses ``openai-harmony``,
whose encoding is downloaded on first use and so cannot load offline).
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.jinja import jinja_backend


def detect(info: CheckpointInfo) -> bool:
    return "<|channel|>" in info.chat_template and "<|start|>" in info.chat_template


FAMILY = ModelFamily(
    name="gpt_oss",
    title="gpt-oss (harmony)",
    detect=detect,
    build_renderer=jinja_backend(reasoning_start=None, close_aliases={"<|return|>": "<|end|>"}),
    tool_parser=None,  # the harmony parser yields reasoning, content and tool calls together
    reasoning_parser="harmony",
    stop_tokens=("<|return|>", "<|call|>"),
    history="drops the analysis (reasoning) of turns before the last final answer; <|return|> becomes <|end|>",
)
