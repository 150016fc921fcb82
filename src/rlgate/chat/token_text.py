"""Token ids to text, the way the gateway needs it on every request.

``tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)`` on a
fast (Rust-backed) Hugging Face tokenizer is the Rust tokenizer's own ``decode`` after
``to_py_obj`` walks the ids with several ``isinstance`` checks each; on the hot path that walk
cost more than the decoding (issue 14's profile: about 0.15 ms per request). :func:`decode`
calls the Rust tokenizer directly when there is one, and the tokenizer's ``decode`` otherwise
(a slow tokenizer, or an object that is not a Hugging Face tokenizer). The text is the same
(``tests/test_tokenizers.py``).
"""

from __future__ import annotations

from typing import Any


def decode(tokenizer: Any, ids: list[int]) -> str:
    """The text of ``ids``, special tokens included, no clean-up of spaces."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return str(backend.decode(ids, skip_special_tokens=False))
    return str(tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))
