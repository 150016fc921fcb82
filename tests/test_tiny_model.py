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


def test_the_tokenizer_directory_is_the_model_directory_without_weights(tiny_model_dir, tiny_tokenizer_dir):
    """What the tokenizer-only fixture serves from is what the model directory holds, less the weights."""
    import json

    with_weights, without = _digest(tiny_model_dir), _digest(tiny_tokenizer_dir)
    assert set(with_weights) - set(without) == {"model.safetensors"}
    for name in set(without) - {"config.json", "generation_config.json"}:  # tokenizer files: byte for byte
        assert without[name] == with_weights[name], name
    for name in ("config.json", "generation_config.json"):  # every field written has the model's value
        full, short = (json.loads((d / name).read_text()) for d in (tiny_model_dir, tiny_tokenizer_dir))
        assert {k: full.get(k) for k in short} == short, name


def test_a_gateway_on_the_tokenizer_directory_imports_no_torch(tmp_path):
    """The fixtures most tests use (tokenizer directory, tokenizer, fake engine, app) run without torch:
    here in a process where torch cannot be imported, as make test-core runs every such test."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = f"""
import asyncio, sys, httpx
from transformers import PreTrainedTokenizerFast
from rlgate.config import GatewayConfig
from rlgate.demo.tiny import build_tiny_tokenizer
from rlgate.engine.fake import FakeEngine
from rlgate.model import stop_token_ids
from rlgate.server.app import create_app
from rlgate.store.base import MemoryStore

d = build_tiny_tokenizer({str(tmp_path / "tok")!r})
tok = PreTrainedTokenizerFast.from_pretrained(d)
app = create_app(GatewayConfig(admin_key="k" * 40), FakeEngine(tok), MemoryStore(), tok,
                 stop_token_ids=stop_token_ids(tok, d))

async def main():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://g") as c:
        r = await c.post("/rl/start_session", json={{"task_id": "t"}}, headers={{"Authorization": "Bearer " + "k" * 40}})
        key = r.json()["api_key"]
        r = await c.post("/v1/chat/completions", json={{"messages": [{{"role": "user", "content": "hi"}}]}},
                         headers={{"Authorization": "Bearer " + key}})
        return r.status_code

print(asyncio.run(main()), "torch" in sys.modules)
"""
    no_torch = Path(__file__).parent / "no_torch"
    env = {**os.environ, "RLGATE_TESTS_NO_TORCH": "1", "PYTHONPATH": os.pathsep.join(
        [str(no_torch), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["200", "False"]
