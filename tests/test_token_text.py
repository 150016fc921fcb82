"""chat/token_text.decode: the Rust tokenizer called directly gives the text the Hugging Face
tokenizer's own decode gives (special tokens kept, no clean-up), on real vocabularies."""

from __future__ import annotations

import random

import pytest

from rlgate.chat.token_text import decode


def _reference(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _samples(tok, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    n = len(tok)
    text = "Hello, world!  Ça va? 東京 🙂 <think>x</think> don't , . ?\n\n\tend"
    ids = tok.encode(text, add_special_tokens=False)
    specials = list(tok.all_special_ids)
    out = [[], ids, ids[:3], ids[1:], specials, ids + specials + ids]
    out += [[rng.randrange(n) for _ in range(rng.randrange(1, 40))] for _ in range(200)]  # partial characters too
    return out


@pytest.mark.parametrize("family", ["qwen3", "llama3", "gpt_oss"])
def test_decode_equals_the_tokenizers_own(family):
    from rlgate.testing.families import build_family_tokenizer

    tok = build_family_tokenizer(family)
    assert getattr(tok, "backend_tokenizer", None) is not None  # the fast path is what runs
    for ids in _samples(tok, seed=len(family)):
        assert decode(tok, ids) == _reference(tok, ids), ids


def test_decode_on_the_tiny_model(tokenizer):
    for ids in _samples(tokenizer, seed=1):
        assert decode(tokenizer, ids) == _reference(tokenizer, ids), ids


def test_a_tokenizer_without_a_rust_backend_is_called_as_is():
    class Plain:
        def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=True):
            return f"{ids}:{skip_special_tokens}:{clean_up_tokenization_spaces}"

    assert decode(Plain(), [1, 2]) == "[1, 2]:False:False"
