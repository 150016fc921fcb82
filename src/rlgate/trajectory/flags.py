"""Silent-failure flags of one recorded reply: what a trainer (or a person) should not miss.

The same functions feed the gateway's guards (:mod:`rlgate.metrics`, as replies finish),
the ``flags`` field of exported samples and the viewer's badges, so the three agree.

=====================  ==============================================================
flag                   meaning
=====================  ==============================================================
``empty_reply``        finished with no text, reasoning or tool call
``unparsed_tool_call`` the visible text holds tool-call markup (any known format):
                       the parser failed, the wrong parser ran, or parsing was off
``aborted``            cut short (client disconnect, shutdown): finish_reason "abort"
``fork``               started a new branch instead of extending a parent (see
                       ``fork_reason``)
``no_reward``          export only: neither it nor a descendant was rewarded
``unaligned``          concat export only: a turn of the chain is not a token prefix
                       of the leaf (that turn gets no loss)
``dropped_<part>``     the chat template left this part of the request out of the
                       prompt (tools, tool_calls, tool_results, reasoning, images:
                       chat/template_support.py): the model never saw it
=====================  ==============================================================
"""

from __future__ import annotations

from rlgate.chat.conversation import Message, TextPart
from rlgate.chat.parsers import unparsed_tool_blocks
from rlgate.trajectory.interaction import Interaction


def visible_text(message: Message | None) -> str:
    """The text parts of a reply, joined (what the client shows as content)."""
    if message is None:
        return ""
    return "".join(p.text for p in message.content if isinstance(p, TextPart))


def is_empty_reply(message: Message | None) -> bool:
    if message is None:
        return True
    return not visible_text(message).strip() and not message.tool_calls and not (message.reasoning or "").strip()


def reply_flags(i: Interaction) -> list[str]:
    """Flags of a recorded interaction (see module docstring); [] for a clean one."""
    flags: list[str] = []
    if i.completed:
        if i.finish_reason == "abort":
            flags.append("aborted")
        elif is_empty_reply(i.output_message):
            flags.append("empty_reply")
        if unparsed_tool_blocks(visible_text(i.output_message)):
            flags.append("unparsed_tool_call")
    if i.relation == "fork":
        flags.append("fork")
    flags += [f"dropped_{part}" for part in i.template_dropped]
    return flags
