"""The tiny offline model: deterministic, loadable by Auto*, template renders everything."""

from __future__ import annotations

import hashlib

import pytest

from rlgate.demo.tiny import SPECIAL_TOKENS, build_tiny_model


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.mark.slow
def test_build_is_deterministic(tmp_path, tiny_model_dir):
    other = build_tiny_model(tmp_path / "again", seed=0)
    assert _digest(other) == _digest(tiny_model_dir)
    different = build_tiny_model(tmp_path / "seed1", seed=1)
    assert _digest(different)["model.safetensors"] != _digest(tiny_model_dir)["model.safetensors"]


def test_loads_with_auto_classes(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n = sum(p.numel() for p in model.parameters())
    assert 2_000_000 <= n <= 6_000_000
    assert model.config.model_type == "llama"
    for t in SPECIAL_TOKENS:
        ids = tokenizer.encode(t, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.decode(ids) == t


def test_roundtrip_text(tokenizer):
    text = "Hello, world! 12345 {\"a\": [1, 2]} ünïcödé\n\ttabs"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_template_renders_all_roles_and_tools(tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "description": "Add",
                                               "parameters": {"type": "object", "properties": {}}}}]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
        {"role": "assistant", "content": "3"},
    ]
    text = tokenizer.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert '{"type": "function", "function": {"name": "add"' in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>\n' in text
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n3<|im_end|>\n")
    gen = tokenizer.apply_chat_template(msgs[:2], tokenize=False, add_generation_prompt=True)
    assert gen == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n"
