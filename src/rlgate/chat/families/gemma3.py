"""Gemma 3 (270M … 27B): ``<start_of_turn>user|model … <end_of_turn>`` turns.

A system message is folded into the first user turn (Gemma has no system role); a turn ends
with ``<end_of_turn>``, which is a stop token besides ``<eos>`` (the base GGUF's generation
config names only ``<eos>``: without it a reply would run past its turn). A base checkpoint
ships no template: ``rlgate`` writes Gemma 3's published turn format
(``checkpoints/templates/gemma3.jinja``) into a GGUF it converts, used only when the checkpoint
has no template of its own. Rendered by the checkpoint's template.
"""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.jinja import jinja_backend


def detect(info: CheckpointInfo) -> bool:
    return info.model_type in ("gemma3", "gemma3_text") or (
        "<start_of_turn>" in info.chat_template and "<end_of_turn>" in info.chat_template)


FAMILY = ModelFamily(
    name="gemma3",
    title="Gemma 3",
    detect=detect,
    build_renderer=jinja_backend(reasoning_start=None),
    tool_parser=None,
    reasoning_parser=None,
    stop_tokens=("<end_of_turn>", "<eos>"),
    history="keeps history verbatim",
)
