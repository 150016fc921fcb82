"""LoRA adapters on the local engine: several adapters and the base in one batch, each row's tokens and
logprobs those of PEFT's model of its adapter alone (no mocks: the tiny checkpoint, real PEFT)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from rlgate.engine import EngineError, GenerateRequest, SamplingParams, WeightUpdateError
from rlgate.engine.capabilities import ServesAdapters
from rlgate.engine.local import LocalEngine

PROMPTS = [[5, 17, 301, 44], [900, 12, 7, 7, 7, 33, 81, 510, 6, 9, 11, 400, 14], [60], list(range(100, 140))]


def make_adapter(base: Path, out: Path, *, seed: int, r: int = 4, alpha: int = 8, targets: object = "all-linear",
                 rslora: bool = False, scale: float = 0.5) -> Path:
    """A PEFT adapter whose update is far from zero (B is random, as after training), saved as PEFT saves it."""
    model = AutoModelForCausalLM.from_pretrained(base)
    peft = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                                            task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft.save_pretrained(out)
    return out


def peft_alone(base: Path, adapter: Path | None):
    model = AutoModelForCausalLM.from_pretrained(base)
    return (PeftModel.from_pretrained(model, adapter) if adapter is not None else model).eval()


def teacher_forced(model, prompt: list[int], output: list[int]) -> tuple[torch.Tensor, list[int]]:
    """log_softmax of ``output`` and the greedy choice at each position, under one plain forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1:-1].float()
    logp = torch.log_softmax(logits, -1)
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0], logits.argmax(-1).tolist()


def greedy(prompt: list[int], adapter: str | None, n: int = 24, **kw) -> GenerateRequest:
    return GenerateRequest(list(prompt), SamplingParams(max_new_tokens=n, temperature=0), adapter=adapter, **kw)


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three adapters unlike each other: all linear layers at r=4; attention only at r=8; rsLoRA at r=2."""
    d = tmp_path_factory.mktemp("adapters")
    return {
        "a": make_adapter(tiny_model_dir, d / "a", seed=1),
        "b": make_adapter(tiny_model_dir, d / "b", seed=2, r=8, alpha=4, targets=["q_proj", "v_proj", "o_proj"]),
        "c": make_adapter(tiny_model_dir, d / "c", seed=3, r=2, alpha=2, rslora=True),
    }


@pytest.fixture
async def engine(tiny_model_dir: Path):
    eng = LocalEngine(tiny_model_dir, device="cpu")
    yield eng
    await eng.close()


async def test_mixed_batch_rows_match_each_adapter_alone(engine: LocalEngine, tiny_model_dir: Path,
                                                         adapters: dict[str, Path]) -> None:
    assert isinstance(engine, ServesAdapters)
    for name, path in adapters.items():
        assert await engine.load_adapter(name, str(path)) == 0
    assert engine.adapter_versions() == {"a": 0, "b": 0, "c": 0}
    # every adapter and the base on every prompt, all in flight together: one batch of 16 mixed rows
    plan = [(p, a) for p in PROMPTS for a in [None, "a", "b", "c"]]
    results = await asyncio.gather(*(engine.generate(greedy(p, a)) for p, a in plan))
    refs = {a: peft_alone(tiny_model_dir, adapters[a] if a else None) for a in [None, "a", "b", "c"]}
    outputs: dict[str | None, set[tuple[int, ...]]] = {}
    for (prompt, name), res in zip(plan, results, strict=True):
        assert res.output_versions == [0] * 24
        expected, argmax = teacher_forced(refs[name], prompt, res.output_ids)
        assert res.output_ids == argmax, f"adapter {name}: not the greedy tokens of PEFT's model of it alone"
        torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-4, rtol=0)
        outputs.setdefault(name, set()).add(tuple(res.output_ids))
    assert len({frozenset(v) for v in outputs.values()}) == 4, "the adapters did not change the outputs"


async def test_the_stacks_are_the_only_copy_of_the_adapters_and_survive_changes(
        engine: LocalEngine, tiny_model_dir: Path, adapters: dict[str, Path]) -> None:
    """Resident memory: each adapter's weights are views of its layers' stacks (the tensors read from its
    directory are not kept beside them), and adding or removing another adapter (a restack that reads them back
    from the stacks) leaves every adapter's outputs exactly as they were."""
    for name, path in adapters.items():
        await engine.load_adapter(name, str(path))
    bank = engine._adapters
    for adapter in bank._adapters.values():
        for layer, (a, b) in adapter.weights.items():
            stack = bank._stacks[layer]
            assert a.untyped_storage().data_ptr() == stack.a.untyped_storage().data_ptr()
            assert b.untyped_storage().data_ptr() == stack.b.untyped_storage().data_ptr()
    assert bank.parameter_bytes() == sum(
        s.a.untyped_storage().nbytes() + s.b.untyped_storage().nbytes() for s in bank._stacks.values())
    before = {a: await engine.generate(greedy(PROMPTS[0], a)) for a in ("a", "b", "c")}
    await engine.unload_adapter("a")  # a restack from the views: b and c read back from the old stacks
    await engine.load_adapter("a", str(adapters["a"]))  # and again, a now last
    for name in ("a", "b", "c"):
        again = await engine.generate(greedy(PROMPTS[0], name))
        assert again.output_ids == before[name].output_ids
        torch.testing.assert_close(torch.tensor(again.output_logprobs), torch.tensor(before[name].output_logprobs),
                                   atol=1e-6, rtol=0)


async def test_seeded_adapter_row_is_the_same_whatever_the_batch(engine: LocalEngine, adapters: dict[str, Path]) -> None:
    for name, path in adapters.items():
        await engine.load_adapter(name, str(path))
    target = GenerateRequest(PROMPTS[1], SamplingParams(max_new_tokens=30, temperature=1.0, seed=77), adapter="b")
    alone = await engine.generate(target)
    others = [GenerateRequest(list(range(10, 10 + n)), SamplingParams(max_new_tokens=12, seed=i), adapter=a)
              for i, (n, a) in enumerate([(3, "a"), (20, None), (7, "c"), (45, "a"), (2, None)])]
    together = await asyncio.gather(*(engine.generate(r) for r in [*others[:3], target, *others[3:]]))
    assert together[3].output_ids == alone.output_ids
    torch.testing.assert_close(torch.tensor(together[3].output_logprobs), torch.tensor(alone.output_logprobs),
                               atol=1e-5, rtol=0)


async def test_base_rows_are_untouched_by_resident_adapters(engine: LocalEngine, tiny_model_dir: Path,
                                                            adapters: dict[str, Path]) -> None:
    before = [await engine.generate(greedy(p, None)) for p in PROMPTS]
    for name, path in adapters.items():
        await engine.load_adapter(name, str(path))
    after = await asyncio.gather(*(engine.generate(greedy(p, None)) for p in PROMPTS),
                                 *(engine.generate(greedy(p, "a")) for p in PROMPTS))
    for b, a in zip(before, after[:len(PROMPTS)], strict=True):
        assert a.output_ids == b.output_ids
        torch.testing.assert_close(torch.tensor(a.output_logprobs), torch.tensor(b.output_logprobs), atol=1e-5, rtol=0)


async def test_replacing_one_adapter_mid_stream_changes_only_its_rows(engine: LocalEngine, tiny_model_dir: Path,
                                                                      adapters: dict[str, Path], tmp_path: Path) -> None:
    """A push of adapter a while a, b and the base generate: a's row carries version 0 then 1, and its tokens
    after the push are the new adapter's greedy continuation; b's and the base's rows are exactly what they
    would have been without the push (version 0 throughout)."""
    await engine.load_adapter("a", str(adapters["a"]))
    await engine.load_adapter("b", str(adapters["b"]))
    new_a = make_adapter(tiny_model_dir, tmp_path / "a2", seed=11)
    n = 300
    calm = await asyncio.gather(*(engine.generate(greedy(PROMPTS[1], x, n)) for x in ("b", None)))
    got: dict[str | None, list] = {"a": [], "b": [], None: []}

    async def consume(name: str | None) -> None:
        async for d in engine.stream(greedy(PROMPTS[1], name, n)):
            got[name].append(d)

    tasks = [asyncio.create_task(consume(x)) for x in ("a", "b", None)]
    deadline = asyncio.get_running_loop().time() + 30
    while not all(got.values()) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)
    assert await engine.load_adapter("a", str(new_a)) == 1
    await asyncio.gather(*tasks)
    ids = {k: [t for d in v for t in d.token_ids] for k, v in got.items()}
    versions = {k: [x for d in v for x in d.versions] for k, v in got.items()}
    k = versions["a"].count(0)
    assert 1 <= k < n and versions["a"] == [0] * k + [1] * (n - k)
    _, argmax = teacher_forced(peft_alone(tiny_model_dir, new_a), PROMPTS[1], ids["a"])
    assert ids["a"][k:] == argmax[k:], "after the push, adapter a's row is not the new adapter's greedy continuation"
    assert versions["b"] == [0] * n and versions[None] == [0] * n
    assert ids["b"] == calm[0].output_ids and ids[None] == calm[1].output_ids
    assert engine.version == 0  # the base weights did not change


async def test_bad_adapters_are_refused_and_change_nothing(engine: LocalEngine, tiny_model_dir: Path,
                                                           adapters: dict[str, Path], tmp_path: Path) -> None:
    await engine.load_adapter("a", str(adapters["a"]))
    before = await engine.generate(greedy(PROMPTS[0], "a"))

    def variant(name: str, **config_changes: object) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f in adapters["a"].iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        cfg = json.loads((d / "adapter_config.json").read_text())
        cfg.update(config_changes)
        (d / "adapter_config.json").write_text(json.dumps(cfg))
        return d

    cases = {
        "dora": (variant("dora", use_dora=True), "use_dora"),
        "rank": (variant("rank", r=5), "r is 5"),
        "other": (make_adapter(tiny_model_dir, tmp_path / "emb", seed=4, targets=["embed_tokens"]), "not a LoRA A or B"),
        "full": (tiny_model_dir, "adapter_config.json"),
        "relative": (Path("adapter"), "not absolute"),
    }
    for path, message in cases.values():
        with pytest.raises(WeightUpdateError, match=message):
            await engine.load_adapter("a", str(path))
    assert engine.adapter_versions() == {"a": 0}
    after = await engine.generate(greedy(PROMPTS[0], "a"))
    assert after.output_ids == before.output_ids


async def test_unknown_and_unloaded_adapters(engine: LocalEngine, adapters: dict[str, Path]) -> None:
    with pytest.raises(EngineError) as err:
        await engine.generate(greedy(PROMPTS[0], "nope"))
    assert err.value.status == 404 and err.value.code == "adapter_not_found"
    base = await engine.generate(greedy(PROMPTS[0], None))
    await engine.load_adapter("a", str(adapters["a"]))
    stream = engine.stream(greedy(PROMPTS[0], "a", 1500))
    first = await stream.__anext__()
    assert first.token_ids
    await engine.unload_adapter("a")
    with pytest.raises(EngineError) as err:
        async for _ in stream:
            pass
    assert err.value.status == 410 and err.value.code == "adapter_unloaded"
    assert engine.adapter_versions() == {}
    assert engine._adapters.parameter_bytes() == 0  # the stacked weights are gone (and their hooks)
    assert not any(m._forward_hooks for m in engine.model.modules())
    again = await engine.generate(greedy(PROMPTS[0], None))
    assert again.output_ids == base.output_ids
