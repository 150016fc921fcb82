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
