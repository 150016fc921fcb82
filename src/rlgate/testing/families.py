"""Tiny random checkpoints of real model families, built offline and deterministically.

``build_family_checkpoint("qwen3", out_dir)`` writes a Hugging Face checkpoint directory
(tokenizer with the family's vocabulary and chat template, ``config.json`` of the family's
architecture, random weights, ``generation_config.json``) that ``rlgate serve --model`` and
:mod:`rlgate.chat.families` detection treat like the real thing.

| family | vocabulary | chat template | architecture (tiny) |
|---|---|---|---|
| qwen3 | Qwen ranks + Qwen3 added tokens | Qwen3 (hybrid thinking) | qwen3 |
| qwen3_2507_thinking / _instruct | same | Qwen3-2507 Thinking / Instruct | qwen3 |
| qwen3_5 | Qwen3.5/3.6 ranks + added tokens | stand-in (see templates/README.md) | qwen3 (*) |
| deepseek_r1 | Qwen ranks + DeepSeek added tokens | DeepSeek-R1-Distill-Qwen | qwen2 |
| llama3 | synthetic + Llama 3 special tokens | Llama 3.2 | llama |
| gpt_oss | synthetic + harmony special tokens | gpt-oss | gpt_oss |
| glm45 | synthetic + GLM-4.5 special tokens | stand-in | glm4_moe |
| kimi_k2 | synthetic + Kimi-K2 special tokens | stand-in | llama (*) |

(*) The local engine runs attention-only models: Qwen3.5's hybrid linear attention and
Kimi-K2's MLA are replaced by a dense architecture of the same vocabulary; detection uses the
tokenizer and template, which are the family's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgate.testing.vocab import (
    DEEPSEEK_DISTILL_ADDED,
    QWEN3_ADDED,
    TokenizerSpec,
    qwen35_added,
    qwen_bpe,
    synthetic_bpe,
    wrap,
)

TEMPLATES = Path(__file__).parent / "templates"

_LLAMA3 = [("<|begin_of_text|>", True), ("<|end_of_text|>", True), ("<|start_header_id|>", True),
           ("<|end_header_id|>", True), ("<|eot_id|>", True), ("<|eom_id|>", True), ("<|python_tag|>", True),
           ("<|finetune_right_pad_id|>", True)]
_HARMONY = [("<|startoftext|>", True), ("<|endoftext|>", True), ("<|start|>", True), ("<|end|>", True),
            ("<|message|>", True), ("<|channel|>", True), ("<|constrain|>", True), ("<|return|>", True),
            ("<|call|>", True)]
_GLM45 = [("<|endoftext|>", True), ("[gMASK]", True), ("<sop>", True), ("<|system|>", True), ("<|user|>", True),
          ("<|assistant|>", True), ("<|observation|>", True), ("<think>", False), ("</think>", False),
          ("<tool_call>", False), ("</tool_call>", False), ("<arg_key>", False), ("</arg_key>", False),
          ("<arg_value>", False), ("</arg_value>", False), ("<tool_response>", False), ("</tool_response>", False)]
_KIMI = [("[BOS]", True), ("[EOS]", True), ("<|im_end|>", True), ("<|im_user|>", True), ("<|im_assistant|>", True),
         ("<|im_system|>", True), ("<|im_middle|>", True), ("<|tool_calls_section_begin|>", True),
         ("<|tool_calls_section_end|>", True), ("<|tool_call_begin|>", True), ("<|tool_call_argument_begin|>", True),
         ("<|tool_call_end|>", True), ("[PAD]", True), ("<think>", False), ("</think>", False)]


@dataclass(frozen=True)
class FamilyCheckpoint:
    """How to build one family's tiny checkpoint."""

    bpe: str  # "qwen3" | "qwen3_5" | "synthetic"
    spec: TokenizerSpec
    template: str  # file name under templates/
    model_type: str
    eos: tuple[str, ...]  # generation_config eos tokens
    arch: dict[str, Any] = field(default_factory=dict)


CHECKPOINTS: dict[str, FamilyCheckpoint] = {
    "qwen3": FamilyCheckpoint("qwen3", TokenizerSpec(QWEN3_ADDED, "<|im_end|>", "<|endoftext|>", None, 151643),
                              "qwen3.jinja", "qwen3", ("<|im_end|>", "<|endoftext|>")),
    "qwen3_2507_thinking": FamilyCheckpoint(
        "qwen3", TokenizerSpec(QWEN3_ADDED, "<|im_end|>", "<|endoftext|>", None, 151643),
        "qwen3_thinking_2507.jinja", "qwen3", ("<|im_end|>", "<|endoftext|>")),
    "qwen3_2507_instruct": FamilyCheckpoint(
        "qwen3", TokenizerSpec(QWEN3_ADDED, "<|im_end|>", "<|endoftext|>", None, 151643),
        "qwen3_instruct_2507.jinja", "qwen3", ("<|im_end|>", "<|endoftext|>")),
    "qwen3_5": FamilyCheckpoint("qwen3_5", TokenizerSpec(qwen35_added(), "<|im_end|>", "<|endoftext|>", None, 248044),
                                "qwen3_5.jinja", "qwen3", ("<|im_end|>", "<|endoftext|>")),
    "deepseek_r1": FamilyCheckpoint(
        "qwen3", TokenizerSpec(DEEPSEEK_DISTILL_ADDED, "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                               "<｜begin▁of▁sentence｜>", 151643),
        "deepseek_r1_distill.jinja", "qwen2", ("<｜end▁of▁sentence｜>",)),
    "llama3": FamilyCheckpoint("synthetic", TokenizerSpec(_LLAMA3, "<|eot_id|>", "<|finetune_right_pad_id|>",
                                                          "<|begin_of_text|>"),
                               "llama3.jinja", "llama", ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")),
    "gpt_oss": FamilyCheckpoint("synthetic", TokenizerSpec(_HARMONY, "<|return|>", "<|endoftext|>", "<|startoftext|>"),
                                "gpt_oss.jinja", "gpt_oss", ("<|return|>", "<|call|>"),
                                {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 128,
                                 "layer_types": ["sliding_attention", "full_attention"]}),
    "glm45": FamilyCheckpoint("synthetic", TokenizerSpec(_GLM45, "<|endoftext|>", "<|endoftext|>"),
                              "glm45.jinja", "glm4_moe", ("<|endoftext|>", "<|user|>", "<|observation|>"),
                              {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                               "first_k_dense_replace": 1, "n_shared_experts": 1, "partial_rotary_factor": 0.5}),
    "kimi_k2": FamilyCheckpoint("synthetic", TokenizerSpec(_KIMI, "<|im_end|>", "[PAD]", "[BOS]"),
                                "kimi_k2.jinja", "llama", ("<|im_end|>", "[EOS]")),
}


def build_family_tokenizer(family: str, bpe_cache: dict[str, Any] | None = None) -> Any:
    """The family's ``PreTrainedTokenizerFast`` (``bpe_cache`` shares the slow Qwen BPE builds)."""
    ck = CHECKPOINTS[family]
    cache = bpe_cache if bpe_cache is not None else {}
    if ck.bpe not in cache:
        build: Callable[[], Any] = synthetic_bpe if ck.bpe == "synthetic" else (lambda: qwen_bpe(ck.bpe))
        cache[ck.bpe] = build()
    return wrap(cache[ck.bpe], ck.spec, (TEMPLATES / ck.template).read_text())


def build_family_checkpoint(
    family: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    bpe_cache: dict[str, Any] | None = None,
) -> Path:
    """Write the family's tiny checkpoint to ``out_dir`` and return the path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    ck = CHECKPOINTS[family]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_family_tokenizer(family, bpe_cache)
    tok.save_pretrained(out)
    eos_ids = [tok.convert_tokens_to_ids(t) for t in ck.eos]
    pad = tok.pad_token_id
    bos = tok.bos_token_id if tok.bos_token_id is not None else pad
    config = AutoConfig.for_model(
        ck.model_type,
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=bos,
        eos_token_id=eos_ids,
        pad_token_id=pad,
        **ck.arch,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos_ids, pad_token_id=pad)
    model.save_pretrained(out)
    return out
