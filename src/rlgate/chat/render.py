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

Bounds (issue 15)
-----------------
* ``max_chars``: a rendered text longer than this raises :class:`PromptTooLong` before it
  is tokenized. The caller derives it from the context length and
  :attr:`ChatRenderer.max_token_chars` (no token of the vocabulary covers more characters),
  so a text over it cannot fit the context, whatever its tokenization.
* Tokenization of a long text goes through the Rust tokenizer's batch call, which releases
  the GIL, so that it can run on a worker thread while the event loop keeps serving.
* :attr:`ChatRenderer.reserved_kwargs`: template kwargs that would override the renderer's
  own arguments (``chat_template``, ``tokenize``, ``messages``, special tokens...). The
  gateway refuses them from clients unless the operator allows it.
* The assistant suffix is memoised in a :class:`~rlgate.chat.render_cache.RenderCache`
  owned by the caller (one per session), never in the renderer.
"""

from __future__ import annotations

import inspect
from typing import Any

from rlgate.chat.conversation import ImagePart, Message, TextPart, ToolSpec, canonical_json
from rlgate.chat.render_cache import RenderCache

_SENTINEL = "RLGATE_SENTINEL_7f3a"
_PLACEHOLDER_USER = Message.of("user", "hi")


class BridgeError(Exception):
    """The chat template cannot be rendered incrementally for this conversation."""


class TemplateError(Exception):
    """The chat template refused the conversation (e.g. a role it does not support)."""


class PromptTooLong(Exception):
    """The rendered text has more characters than the caller's ``max_chars``: it cannot fit."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"the rendered prompt has {chars} characters; at most {max_chars} can fit the context")
        self.chars = chars
        self.max_chars = max_chars


# Template variables the renderer sets itself, besides apply_chat_template's own parameters.
_RENDERER_VARIABLES = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt"})
# Texts shorter than this are tokenized with the plain call (holding the GIL costs less than
# a batch call's set-up); longer ones with the batch call, which releases the GIL.
_BATCH_ENCODE_CHARS = 16384


def reserved_template_kwargs(tokenizer: Any) -> frozenset[str]:
    """Kwargs a client must not pass to the chat template: apply_chat_template's parameters
    (``chat_template``, ``tokenize``, ``return_*``...), the variables the renderer sets, and the
    tokenizer's special-token names (``eos_token``...)."""
    params = {
        name for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    specials = set(getattr(tokenizer, "special_tokens_map", {}) or {})
    return frozenset(params | _RENDERER_VARIABLES | specials | {"chat_template"})


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of the vocabulary stands for (added tokens included).

    A byte-level token's string has one character per byte, so its length bounds the text
    it decodes to; the same holds for SentencePiece pieces and byte-fallback tokens."""
    vocab = tokenizer.get_vocab()
    return max((len(t) for t in vocab), default=1) or 1


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
        self.reserved_kwargs = reserved_template_kwargs(tokenizer)
        self.max_token_chars = max_token_chars(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer, if fast

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
        if self._backend is not None and len(text) >= _BATCH_ENCODE_CHARS:
            # encode_batch releases the GIL (encode does not): a worker thread tokenizing a long
            # prompt leaves the event loop free. Same ids as tokenizer.encode (tested).
            return list(self._backend.encode_batch([text], add_special_tokens=False)[0].ids)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _encode_bounded(self, text: str, max_chars: int | None) -> list[int]:
        if max_chars is not None and len(text) > max_chars:
            raise PromptTooLong(len(text), max_chars)
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ------------------------------------------------------------------ prompts

    def render_ids(
        self,
        messages: list[Message],
        tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        *,
        max_chars: int | None = None,
    ) -> list[int]:
        """Fresh rendering of the whole conversation, ending with the generation prompt.

        Raises :class:`PromptTooLong` instead of tokenizing a text over ``max_chars``."""
        return self._encode_bounded(self.render_text(messages, tools, template_kwargs=template_kwargs), max_chars)

    def assistant_suffix(
        self,
        tools: list[ToolSpec] | None,
        template_kwargs: dict[str, Any] | None,
        cache_key: str | None = None,
        cache: RenderCache | None = None,
    ) -> str:
        key = cache_key or canonical_json([[t.to_openai() for t in tools or []], template_kwargs or {}])
        cached = cache.get(key) if cache is not None else None
        if cached is not None:
            return cached
        text = self.render_text(
            [_PLACEHOLDER_USER, Message.of("assistant", _SENTINEL)],
            tools,
            add_generation_prompt=False,
            template_kwargs=template_kwargs,
        )
        if _SENTINEL not in text:
            raise BridgeError("the chat template does not render assistant content verbatim")
        suffix = text.split(_SENTINEL, 1)[1]
        if cache is not None:
            cache.put(key, suffix)
        return suffix

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
        cache: RenderCache | None = None,
        max_chars: int | None = None,
    ) -> list[int]:
        """Tokens that follow a parent's generated tokens (see module docstring).

        ``parent_stop_text`` is the text of the stop token the parent's output ended
        with, or None if it ended on length / abort / a stop string. ``cache_key``
        identifies ``(tools, template_kwargs)`` for memoising the assistant suffix in
        ``cache``; ``max_chars`` bounds the bridge text (:class:`PromptTooLong`).
        """
        suffix = self.assistant_suffix(tools, template_kwargs, cache_key, cache)
        glue = suffix
        if parent_stop_text and suffix.startswith(parent_stop_text):
            glue = suffix[len(parent_stop_text):]
        base = ([leading_system] if leading_system is not None else []) + [_PLACEHOLDER_USER, parent_reply]
        head = self.render_text(base, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
        full = self.render_text(base + new_messages, tools, template_kwargs=template_kwargs)
        if not full.startswith(head) or not head.endswith(suffix):
            raise BridgeError("the chat template does not render new messages incrementally")
        return self._encode_bounded(glue + full[len(head):], max_chars)

