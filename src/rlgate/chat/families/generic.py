"""Any other checkpoint: its own Jinja template; parsers guessed from the template's markup."""

from __future__ import annotations

from rlgate.chat.families.base import CheckpointInfo, ModelFamily
from rlgate.chat.families.jinja import jinja_backend


def guess_tool_parser(info: CheckpointInfo) -> str | None:
    t = info.chat_template
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3_json"
    return None


def guess_reasoning_parser(info: CheckpointInfo) -> str | None:
    return "think" if "<think>" in info.chat_template or "</think>" in info.chat_template else None


def generic_family(info: CheckpointInfo) -> ModelFamily:
    """The fallback family for ``info`` (parsers chosen from what the template writes)."""
    return ModelFamily(
        name="generic",
        title="generic Jinja chat template",
        detect=lambda _: True,
        build_renderer=jinja_backend(),
        tool_parser=guess_tool_parser(info),
        reasoning_parser=guess_reasoning_parser(info),
        history="whatever the template does (token_exact keeps the generated tokens)",
    )
