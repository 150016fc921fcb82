"""Messages to token ids, with the model's own chat template.

Two ways to build a prompt:

* :meth:`ChatRenderer.render_ids` — a fresh rendering of the whole conversation
  (template -> text -> tokens). Used for the first turn of a conversation and in
  ``rerender`` mode.
* :meth:`ChatRenderer.bridge_ids` — the tokens that come *after* a parent turn's
  generated tokens (token-exact mode). The parent's prompt and output tokens are
  reused verbatim; only the new messages are rendered, and they are rendered in
  context so that turn separators come out exactly as the full template would
  produce them (verl #6501 lost the separator at assistant -> tool boundaries).

How the bridge is computed (``base`` is the leading system message if any, a
placeholder user turn, and the parent's assistant message)::

    suffix   = what the template writes after an assistant message's content
               (ChatML: "<|im_end|>\\n"), found once with a sentinel message
    glue     = suffix minus the stop token's text if the parent ended with that
               stop token (ChatML: "\\n"), else the whole suffix
    new_text = render(base + new, add_generation_prompt)[len(render(base)):]
    bridge   = encode(glue + new_text)

so that ``child_prompt = parent_prompt + parent_output + bridge``. The rendering of
the new messages only depends on a bounded context, so the cost of a turn does not
grow with the length of the conversation. If a template does not render
incrementally (``render(base + new)`` does not start with ``render(base)``),
:class:`BridgeError` is raised and the caller starts a fresh rendering instead.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from rlgate.chat.conversation import ImagePart, Message, TextPart, ToolSpec, canonical_json

_SENTINEL = "RLGATE_SENTINEL_7f3a"
# Prompts remembered by render_ids (exact inputs -> token ids). A GRPO group sends the same
# prompt once per sample, and an agent's retries send it again: rendering a ~40-token
# prompt (Jinja + tokenizer) costs more than the rest of the request (benchmarks/hot_path.py).
PROMPT_CACHE_SIZE = 4096
_PLACEHOLDER_USER = Message.of("user", "hi")


class BridgeError(Exception):
    """The chat template cannot be rendered incrementally for this conversation."""


class TemplateError(Exception):
    """The chat template refused the conversation (e.g. a role it does not support)."""


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
    """Renders conversations with a tokenizer's chat template."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
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
        try:
            return self.tokenizer.apply_chat_template(
                [message_to_template(m) for m in messages],
                tools=[t.to_openai() for t in tools] if tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt and not continue_final,
                continue_final_message=continue_final,
                **(template_kwargs or {}),
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

    def assistant_suffix(
        self, tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None, cache_key: str | None = None
    ) -> str:
        key = cache_key or canonical_json([[t.to_openai() for t in tools or []], template_kwargs or {}])
        if key not in self._suffix_cache:
            text = self.render_text(
                [_PLACEHOLDER_USER, Message.of("assistant", _SENTINEL)],
                tools,
                add_generation_prompt=False,
                template_kwargs=template_kwargs,
            )
            if _SENTINEL not in text:
                raise BridgeError("the chat template does not render assistant content verbatim")
            self._suffix_cache[key] = text.split(_SENTINEL, 1)[1]
        return self._suffix_cache[key]

    def bridge_ids(
        self,
        *,
        leading_system: Message | None,
        parent_reply: Message,
        parent_stop_text: str | None,
        new_messages: list[Message],
        tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        cache_key: str | None = None,
    ) -> list[int]:
        """Tokens that follow a parent's generated tokens (see module docstring).

        ``parent_stop_text`` is the text of the stop token the parent's output ended
        with, or None if it ended on length / abort / a stop string. ``cache_key``
        identifies ``(tools, template_kwargs)`` for memoising the assistant suffix.
        """
        suffix = self.assistant_suffix(tools, template_kwargs, cache_key)
        glue = suffix
        if parent_stop_text and suffix.startswith(parent_stop_text):
            glue = suffix[len(parent_stop_text):]
        base = ([leading_system] if leading_system is not None else []) + [_PLACEHOLDER_USER, parent_reply]
        head = self.render_text(base, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
        full = self.render_text(base + new_messages, tools, template_kwargs=template_kwargs)
        if not full.startswith(head) or not head.endswith(suffix):
            raise BridgeError("the chat template does not render new messages incrementally")
        return self.encode(glue + full[len(head):])


def _prompt_key(messages: list[Message], tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None) -> bytes:
    """A digest of exactly what the template receives (nothing canonicalised away)."""
    payload = [[message_to_template(m) for m in messages], [t.to_openai() for t in tools or []],
               template_kwargs or {}]
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
