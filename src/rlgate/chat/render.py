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

Bounds (issue 15, :mod:`rlgate.chat.prompt_bounds`): ``max_chars`` refuses a rendered text
that cannot fit the context before it is tokenized (:class:`PromptTooLong`); long texts are
tokenized with the GIL released (the caller runs them on a worker thread); the assistant
suffix is memoised in a :class:`~rlgate.chat.render_cache.RenderCache` owned by the caller
(one per session, bounded), never in the renderer; :attr:`ChatRenderer.reserved_kwargs` names
the template kwargs a client must not set (``chat_template``...).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from typing import Any

from rlgate.chat.conversation import ImagePart, Message, TextPart, ToolSpec, canonical_json
from rlgate.chat.families.base import REASONING_TAIL, BridgeError, ParentTurn, TemplateError
from rlgate.chat.prompt_bounds import (
    PromptTooLong,
    check_chars,
    encode,
    max_token_chars,
    reserved_template_kwargs,
)
from rlgate.chat.render_cache import RenderCache
from rlgate.chat.token_text import decode
from rlgate.json_text import dumps

__all__ = ["BridgeError", "ChatRenderer", "PromptTooLong", "TemplateError", "message_to_template",
           "max_token_chars", "reserved_template_kwargs"]

_SENTINEL = "RLGATE_SENTINEL_7f3a"
# Prompts remembered by render_ids (exact inputs -> token ids). A GRPO group sends the same
# prompt once per sample, and an agent's retries send it again: rendering a ~40-token
# prompt (Jinja + tokenizer) costs more than the rest of the request (benchmarks/hot_path.py),
# and a tool-using agent's first turn (a 46 KB tool list: ~35 ms of rendering) costs that
# much once per episode. At most PROMPT_CACHE_SIZE prompts of at most PROMPT_CACHE_MAX_TOKENS
# each, and PROMPT_CACHE_BUDGET_TOKENS in all (4-byte ids: 16 MiB), least recently used first out.
PROMPT_CACHE_SIZE = 1024
PROMPT_CACHE_MAX_TOKENS = 256 * 1024
PROMPT_CACHE_BUDGET_TOKENS = 4 * 1024 * 1024
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
        self.reserved_kwargs = reserved_template_kwargs(tokenizer)
        self.max_token_chars = max_token_chars(tokenizer)
        # Exact template inputs of small prompts -> (prompt ids, characters rendered); bounded
        # in entries and in size, and locked (rendering may run on a worker thread).
        self._prompts: OrderedDict[bytes, tuple[array[int], int]] = OrderedDict()
        self._prompt_tokens = 0  # ids held in _prompts
        self._prompts_lock = threading.Lock()

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
        return encode(self.tokenizer, text)  # long texts: GIL released

    def _encode_bounded(self, text: str, max_chars: int | None) -> list[int]:
        check_chars(text, max_chars)
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return decode(self.tokenizer, ids)

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

        Raises :class:`PromptTooLong` instead of tokenizing a text over ``max_chars``.
        Small prompts are remembered by their exact template inputs (the messages as the
        template sees them, the tools and the template arguments), so rendering the same
        prompt again is a lookup.
        """
        key = _prompt_key(messages, tools, template_kwargs)
        with self._prompts_lock:
            hit = self._prompts.get(key)
            if hit is not None:
                self._prompts.move_to_end(key)
        if hit is not None:
            ids, chars = hit
            if max_chars is not None and chars > max_chars:
                raise PromptTooLong(chars, max_chars)
            return ids.tolist()
        text = self.render_text(messages, tools, template_kwargs=template_kwargs)
        ids_list = self._encode_bounded(text, max_chars)
        if len(ids_list) <= PROMPT_CACHE_MAX_TOKENS:
            with self._prompts_lock:
                old = self._prompts.pop(key, None)  # another thread rendered it meanwhile
                if old is not None:
                    self._prompt_tokens -= len(old[0])
                self._prompts[key] = (array("i", ids_list), len(text))
                self._prompt_tokens += len(ids_list)
                while len(self._prompts) > PROMPT_CACHE_SIZE or self._prompt_tokens > PROMPT_CACHE_BUDGET_TOKENS:
                    _, (evicted, _) = self._prompts.popitem(last=False)
                    self._prompt_tokens -= len(evicted)
        return ids_list

    def reasoning_open(self, prompt_ids: list[int]) -> bool:
        if not self.reasoning_start or not prompt_ids:
            return False
        return self.decode(prompt_ids[-REASONING_TAIL:]).rstrip().endswith(self.reasoning_start)

    def assistant_suffix(
        self, tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None, cache_key: str | None = None,
        cache: RenderCache | None = None,
    ) -> str:
        """What the template writes after an assistant message's text, up to the next turn
        (memoised in ``cache``, the caller's, when given)."""
        key = cache_key or canonical_json([[t.to_openai() for t in tools or []], template_kwargs or {}])
        cached = cache.get(key) if cache is not None else None
        if cached is None:
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
            if cache is not None:
                cache.put(key, suffix)
            return suffix
        return cached

    def bridge_ids(
        self,
        *,
        parent: ParentTurn,
        leading_system: Message | None,
        new_messages: list[Message],
        tools: list[ToolSpec] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        cache_key: str | None = None,
        cache: RenderCache | None = None,
        max_chars: int | None = None,
    ) -> list[int]:
        """Tokens that follow a parent's generated tokens (see module docstring). ``cache_key``
        identifies ``(tools, template_kwargs)`` for memoising the assistant suffix in ``cache``;
        ``max_chars`` bounds the bridge text (:class:`PromptTooLong`)."""
        suffix = self.assistant_suffix(tools, template_kwargs, cache_key, cache)
        glue = suffix
        close = self.close_aliases.get(parent.stop_text, parent.stop_text) if parent.stop_text else ""
        if close and suffix.startswith(close):
            glue = suffix[len(close):]
        reply = Message(role="assistant", content=[TextPart(_SENTINEL)], tool_calls=list(parent.reply.tool_calls))
        base = ([leading_system] if leading_system is not None else []) + [_PLACEHOLDER_USER, reply]
        full = self.render_text(base + new_messages, tools, template_kwargs=template_kwargs)
        at = full.find(_SENTINEL)
        end = full.find(suffix, at + len(_SENTINEL)) if at >= 0 else -1
        if end < 0:
            raise BridgeError("the chat template does not render the parent's reply verbatim")
        if close:
            # The turn ends where the template writes the stop token the parent generated, when that
            # comes after the first suffix: gpt-oss closes the reply's analysis block with <|end|>
            # (the suffix), then writes the tool call, ended by <|call|> (the parent's stop). Both
            # are in the parent's output already; the bridge starts after them.
            stop = full.find(close, at + len(_SENTINEL))
            if stop > end:
                return self._encode_bounded(full[stop + len(close):], max_chars)
        return self._encode_bounded(glue + full[end + len(suffix):], max_chars)


def _prompt_key(messages: list[Message], tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None) -> bytes:
    """A digest of exactly what the template receives (nothing canonicalised away)."""
    payload = [[message_to_template(m) for m in messages], [t.to_openai() for t in tools or []],
               template_kwargs or {}]
    # ASCII-escaped where orjson refuses (lone surrogates): still one text per payload
    return hashlib.blake2b(dumps(payload, ascii_fallback=True, default=repr), digest_size=16).digest()
