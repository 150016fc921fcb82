"""What bounds the work a request can cause while its prompt is built (issue 15).

Every renderer (:mod:`rlgate.chat.families`) is bound by these:

* :class:`PromptTooLong`: a rendered text longer than the caller's ``max_chars`` is refused
  before it is tokenized. The caller derives ``max_chars`` from the context length and
  :func:`max_token_chars` (no token of the vocabulary covers more characters), so a text over
  it cannot fit the context, whatever its tokenization.
* :func:`reserved_template_kwargs`: template kwargs that would override the renderer's own
  arguments (``chat_template``, ``tokenize``, ``messages``, special tokens...). The gateway
  refuses them from clients unless the operator allows it.
* :func:`encode`: long texts go through the Rust tokenizer's batch call, which releases the
  GIL, so a worker thread tokenizing a long prompt leaves the event loop free.
"""

from __future__ import annotations

import inspect
from typing import Any

# Template variables a renderer sets itself, besides apply_chat_template's own parameters.
_RENDERER_VARIABLES = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt"})
# Texts shorter than this are tokenized with the plain call (holding the GIL costs less than
# a batch call's set-up); longer ones with the batch call, which releases the GIL.
BATCH_ENCODE_CHARS = 16384


class PromptTooLong(Exception):
    """The rendered text has more characters than the caller's ``max_chars``: it cannot fit."""

    def __init__(self, chars: int, max_chars: int) -> None:
        super().__init__(f"the rendered prompt has {chars} characters; at most {max_chars} can fit the context")
        self.chars = chars
        self.max_chars = max_chars
        self.offset = 0  # tokens already in the prompt before this text (a bridge: the parent's)


def check_chars(text: str, max_chars: int | None) -> None:
    if max_chars is not None and len(text) > max_chars:
        raise PromptTooLong(len(text), max_chars)


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


def encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``, releasing the GIL for long texts."""
    backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer, if fast
    if backend is not None and len(text) >= BATCH_ENCODE_CHARS:
        # encode_batch releases the GIL (encode does not). Same ids as tokenizer.encode (tested).
        return list(backend.encode_batch([text], add_special_tokens=False)[0].ids)
    return list(tokenizer.encode(text, add_special_tokens=False))
