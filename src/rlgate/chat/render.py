"""Messages to token ids with the model's own Jinja chat template (the generic renderer).

Two ways to build a prompt:

* :meth:`ChatRenderer.render_ids` — a fresh rendering of the whole conversation
  (template -> text -> tokens). Used for the first turn of a conversation and in
  ``rerender`` mode.
* :meth:`ChatRenderer.bridge_ids` — the tokens that come *after* a parent turn's
  generated tokens (token-exact mode). The parent's prompt and output tokens are
  reused verbatim; only the new messages are rendered, in context, so that turn
  separators come out exactly as the full template writes them (verl #6501 lost the
  separator at assistant -> tool boundaries).

How the bridge is computed. The parent's reply is rendered with its text replaced by a
sentinel (its tool calls kept, its reasoning dropped), after the leading system message
and a placeholder user turn::

    suffix   = what the template writes after an assistant message's text up to the end
               of that turn (ChatML: "<|im_end|>\\n"), found once with the sentinel alone
    full     = render(system? + [user, sentinel reply] + new, add_generation_prompt)
    new_text = full after the first `suffix` that follows the sentinel
    glue     = suffix minus the stop token's text if the parent ended with that stop
               token (ChatML: "\\n"), else the whole suffix
    bridge   = encode(glue + new_text)

so that ``child_prompt = parent_prompt + parent_output + bridge``. What the template does
*before* the sentinel — dropping the reply's reasoning, writing an empty ``<think>`` block
for the last assistant turn only (Qwen3), rewriting earlier turns — does not matter: only
the text after the parent's turn is used. The cost of a turn does not depend on the length
of the conversation. :class:`BridgeError` is raised only when the sentinel or the suffix
cannot be found (a template that does not write assistant text verbatim).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from rlgate.chat.conversation import ImagePart, Message, TextPart, ToolSpec, canonical_json
from rlgate.chat.families.base import BridgeError, ParentTurn, TemplateError

__all__ = ["BridgeError", "ChatRenderer", "TemplateError", "message_to_template"]

_SENTINEL = "RLGATE_SENTINEL_7f3a"
# Prompts remembered by render_ids (exact inputs -> token ids). A GRPO group sends the same
# prompt once per sample, and an agent's retries send it again: rendering a ~40-token
# prompt (Jinja + tokenizer) costs more than the rest of the request (benchmarks/hot_path.py).
PROMPT_CACHE_SIZE = 4096
_PLACEHOLDER_USER = Message.of("user", "hi")


def message_to_template(msg: Message) -> dict[str, Any]:
    """The dict shape Hugging Face chat templates expect."""
    out: dict[str, Any] = {"role": msg.role}
    if msg.has_images:
        out["content"] = [
            {"type": "text", "text": p.text} if isinstance(p, TextPart) else {"type": "image"}
            for p in msg.content
            if isinstance(p, (TextPart, ImagePart))
        ]
    else:
        out["content"] = msg.text
    if msg.tool_calls:
        calls = []
        for tc in msg.tool_calls:
            args = tc.arguments_obj()
            calls.append({
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.name, "arguments": args if isinstance(args, dict) else tc.arguments},
            })
        out["tool_calls"] = calls
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    if msg.reasoning:
        out["reasoning_content"] = msg.reasoning
    return out


class ChatRenderer:
    """Renders conversations with a tokenizer's chat template (see module docstring)."""

    name = "jinja"

    def __init__(self, tokenizer: Any, *, reasoning_start: str | None = "<think>",
                 default_kwargs: dict[str, Any] | None = None, close_aliases: dict[str, str] | None = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.reasoning_start = reasoning_start  # text that opens reasoning, if the family has it
        self.default_kwargs = dict(default_kwargs or {})
        # Stop tokens that stand for the template's turn close (harmony: the generated <|return|>
        # takes the place of the <|end|> the template writes after a historical reply).
        self.close_aliases = dict(close_aliases or {})
        # Memoised per (tools, template kwargs): the text after an assistant message.
        self._suffix_cache: dict[str, str] = {}
        # Exact template inputs -> prompt ids (least recently used first).
        self._prompts: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()

    # ------------------------------------------------------------------ primitives

    def render_text(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        continue_final = bool(messages) and messages[-1].role == "assistant" and add_generation_prompt
        kwargs = {**self.default_kwargs, **(template_kwargs or {})}
        try:
            return self.tokenizer.apply_chat_template(
                [message_to_template(m) for m in messages],
                tools=[t.to_openai() for t in tools] if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt and not continue_final,
                continue_final_message=continue_final,
                **kwargs,
            )
        except Exception as exc:  # jinja raises TemplateError, ValueError, TypeError...
            raise TemplateError(f"the chat template could not render the conversation: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ prompts

    def render_ids(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Fresh rendering of the whole conversation, ending with the generation prompt.

        Remembered by the exact template inputs (the messages as the template sees them, the
        tools and the template arguments), so rendering the same prompt again is a lookup.
        """
        key = _prompt_key(messages, tools, template_kwargs)
        cached = self._prompts.get(key)
        if cached is not None:
            self._prompts.move_to_end(key)
            return list(cached)
        ids = self.encode(self.render_text(messages, tools, template_kwargs=template_kwargs))
        self._prompts[key] = tuple(ids)
        if len(self._prompts) > PROMPT_CACHE_SIZE:
            self._prompts.popitem(last=False)
        return ids

    def reasoning_open(self, prompt_ids: list[int]) -> bool:
        if not self.reasoning_start or not prompt_ids:
            return False
        return self.decode(prompt_ids[-8:]).rstrip().endswith(self.reasoning_start)

    def assistant_suffix(
        self, tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None, cache_key: str | None = None
    ) -> str:
        """What the template writes after an assistant message's text, up to the next turn."""
        key = cache_key or canonical_json([[t.to_openai() for t in tools or []], template_kwargs or {}])
        if key not in self._suffix_cache:
            base = [_PLACEHOLDER_USER, Message.of("assistant", _SENTINEL)]
            text = self.render_text(base, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
            if _SENTINEL not in text:
                raise BridgeError("the chat template does not render assistant content verbatim")
            suffix = text.split(_SENTINEL, 1)[1]
            if not suffix:
                # The last assistant turn may be left open; take what follows it when a user turn comes.
                nxt = self.render_text(base + [_PLACEHOLDER_USER], tools, add_generation_prompt=False,
                                       template_kwargs=template_kwargs)
                user = self.render_text([_PLACEHOLDER_USER], tools, add_generation_prompt=False,
                                        template_kwargs=template_kwargs)
                after = nxt.split(_SENTINEL, 1)[1]
                suffix = after[: len(after) - len(user)] if user and after.endswith(user) else ""
                if not suffix:
                    raise BridgeError("the chat template writes nothing after an assistant turn")
            self._suffix_cache[key] = suffix
        return self._suffix_cache[key]

    def bridge_ids(
        self,
        *,
        parent: ParentTurn,
        leading_system: Message | None,
        new_messages: list[Message],
        tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        cache_key: str | None = None,
    ) -> list[int]:
        """Tokens that follow a parent's generated tokens (see module docstring)."""
        suffix = self.assistant_suffix(tools, template_kwargs, cache_key)
        glue = suffix
        if parent.stop_text:
            close = self.close_aliases.get(parent.stop_text, parent.stop_text)
            if suffix.startswith(close):
                glue = suffix[len(close):]
        reply = Message(role="assistant", content=[TextPart(_SENTINEL)], tool_calls=list(parent.reply.tool_calls))
        base = ([leading_system] if leading_system is not None else []) + [_PLACEHOLDER_USER, reply]
        full = self.render_text(base + new_messages, tools, template_kwargs=template_kwargs)
        at = full.find(_SENTINEL)
        end = full.find(suffix, at + len(_SENTINEL)) if at >= 0 else -1
        if end < 0:
            raise BridgeError("the chat template does not render the parent's reply verbatim")
        return self.encode(glue + full[end + len(suffix):])


def _prompt_key(messages: list[Message], tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None) -> bytes:
    """A digest of exactly what the template receives (nothing canonicalised away)."""
    payload = [[message_to_template(m) for m in messages], [t.to_openai() for t in tools or []],
               template_kwargs or {}]
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
