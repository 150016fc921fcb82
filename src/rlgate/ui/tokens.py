"""Token ids -> the text each token adds, for the token strip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlgate.chat.output import IncrementalDetokenizer


def token_texts(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Text per token, decoded incrementally: a multi-byte character split over several tokens
    is shown on the token that completes it (the others show as empty). Joined, the texts are
    the decoded sequence."""
    det = IncrementalDetokenizer(tokenizer)
    out = [det.push(int(t)) for t in ids]
    tail = det.flush()
    if tail and out:
        out[-1] += tail
    return out


CONTEXT_TOKENS = 16  # decoded before and after a window, so characters split over tokens come out whole


def token_texts_window(tokenizer: Any, ids: Sequence[int], start: int, end: int) -> list[str]:
    """:func:`token_texts` of ``ids[start:end]`` without decoding the whole sequence (a page of a
    long turn): a few tokens before and after the window are decoded with it, so the texts are
    those of the whole sequence as long as no character spans more than ``CONTEXT_TOKENS`` tokens."""
    end = min(end, len(ids))
    start = max(0, min(start, end))
    lo, hi = max(0, start - CONTEXT_TOKENS), min(len(ids), end + CONTEXT_TOKENS)
    texts = token_texts(tokenizer, ids[lo:hi])
    return texts[start - lo:end - lo]
