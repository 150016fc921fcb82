"""LocalEngine: real generation with the tiny checkpoint (no mocks)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from helpers import eventually
from rlgate.engine import (
    Engine,
    EngineError,
    GenerateRequest,
    GenerateResult,
    SamplingParams,
    WeightUpdateError,
    collect,
)
from rlgate.engine.local import LocalEngine

PROMPTS = [
    [5, 17, 301, 44],
    [900, 12, 7, 7, 7, 33, 81, 510, 6, 9, 11, 400, 14],
    [60],
    list(range(100, 160)),
    [3, 1000, 3, 1000, 3, 1000, 22, 8],
]


def req(prompt: Sequence[int], **sampling) -> GenerateRequest:
    return GenerateRequest(list(prompt), SamplingParams(**sampling))


def teacher_forced(
    model, prompt: Sequence[int], output: Sequence[int], temperature: float = 1.0
) -> torch.Tensor:
    """log_softmax(logits / T) of ``output`` under a plain full forward pass."""
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(output)[:, None])[:, 0]


@pytest.fixture(scope="module")
def ref_model(tiny_model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


@pytest.fixture(scope="module")
async def engine(tiny_model_dir: Path):
    eng = LocalEngine(tiny_model_dir, device="cpu")
    await eng.start()
    yield eng
    await eng.close()


@pytest.fixture
async def fresh_engine(tiny_model_dir: Path):
    """An engine of its own, for tests that change weights or close it."""
    eng = LocalEngine(tiny_model_dir, device="cpu")
    yield eng
    await eng.close()


# -- contract and fidelity ------------------------------------------------------------------


async def test_engine_properties(engine: LocalEngine) -> None:
    assert isinstance(engine, Engine)
    assert engine.version == 0
    assert engine.max_context_length == 2048  # the tiny config's max_position_embeddings
    assert engine.device == torch.device("cpu")
    assert not engine.model.training


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_teacher_forcing(engine: LocalEngine, ref_model, temperature: float) -> None:
    # Concurrent prompts of different lengths: rows are left padded in one batch.
    results = await asyncio.gather(*(
        engine.generate(req(p, max_new_tokens=24, temperature=temperature, seed=i))
        for i, p in enumerate(PROMPTS)
    ))
    for prompt, res in zip(PROMPTS, results, strict=False):
        assert len(res.output_ids) == len(res.output_logprobs) == len(res.output_versions) == 24
        expected = teacher_forced(ref_model, prompt, res.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-4, rtol=0)


async def test_truncated_sampling_reports_untruncated_logprobs(engine: LocalEngine, ref_model) -> None:
    prompt = PROMPTS[1]
    res = await engine.generate(req(prompt, max_new_tokens=20, temperature=0.8, top_k=3, seed=7))
    expected = teacher_forced(ref_model, prompt, res.output_ids, 0.8)
    torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-4, rtol=0)
    # every sampled token is among the 3 most likely ones
    ids = torch.tensor([prompt + res.output_ids])
    with torch.no_grad():
        top3 = ref_model(ids).logits[0, len(prompt) - 1 : -1].topk(3).indices
    assert all(tok in row.tolist() for tok, row in zip(res.output_ids, top3, strict=False))

    nucleus = await engine.generate(req(prompt, max_new_tokens=20, top_p=1e-6, seed=3))
    greedy = await engine.generate(req(prompt, max_new_tokens=20, temperature=0))
    assert nucleus.output_ids == greedy.output_ids  # a tiny nucleus keeps only the top token


async def test_greedy_matches_hf_generate(engine: LocalEngine, ref_model) -> None:
    results = await asyncio.gather(
        *(engine.generate(req(p, max_new_tokens=32, temperature=0)) for p in PROMPTS)
    )
    for prompt, res in zip(PROMPTS, results, strict=False):
        with torch.no_grad():
            out = ref_model.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=32, eos_token_id=None, pad_token_id=0
            )
        assert res.output_ids == out[0, len(prompt) :].tolist()
        assert res.finish_reason == "length"
        # greedy logprobs are the plain log-softmax
        expected = teacher_forced(ref_model, prompt, res.output_ids)
        torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-4, rtol=0)


async def test_seed_gives_same_tokens_whatever_the_batch(engine: LocalEngine) -> None:
    target = req(PROMPTS[1], max_new_tokens=40, temperature=1.0, top_p=0.95, top_k=50, seed=1234)
    alone = await engine.generate(target)
    others = [
        req(list(range(10, 10 + n)), max_new_tokens=10 + 5 * i, temperature=0.9, seed=i)
        for i, n in enumerate([1, 3, 7, 20, 45, 70, 5, 2])
    ]
    together = await asyncio.gather(*(engine.generate(r) for r in [*others[:4], target, *others[4:]]))
    batched = together[4]
    assert batched.output_ids == alone.output_ids
    torch.testing.assert_close(
        torch.tensor(batched.output_logprobs), torch.tensor(alone.output_logprobs), atol=1e-5, rtol=0
    )
    again = await engine.generate(target)
    assert again.output_ids == alone.output_ids
    different_seed = await engine.generate(req(PROMPTS[1], max_new_tokens=40, seed=4321))
    assert different_seed.output_ids != alone.output_ids


async def test_unseeded_requests_differ(engine: LocalEngine) -> None:
    a, b = await asyncio.gather(*(engine.generate(req(PROMPTS[0], max_new_tokens=16)) for _ in range(2)))
    assert a.output_ids != b.output_ids


async def test_late_request_joins_running_batch(engine: LocalEngine) -> None:
    long_req = req(PROMPTS[3], max_new_tokens=200, seed=1)
    late_req = req(PROMPTS[4], max_new_tokens=20, seed=2)
    long_alone = await engine.generate(long_req)
    late_alone = await engine.generate(late_req)

    long_deltas = []
    long_done = asyncio.Event()
    late_started = asyncio.Event()

    async def run_long() -> GenerateResult:
        async for d in engine.stream(long_req):
            long_deltas.append(d)
            if sum(len(x.token_ids) for x in long_deltas) >= 10:
                late_started.set()
        long_done.set()
        return GenerateResult.from_deltas(long_deltas)

    async def run_late() -> tuple[GenerateResult, bool]:
        await late_started.wait()
        deltas = []
        first_before_long_done = None
        async for d in engine.stream(late_req):
            if first_before_long_done is None and d.token_ids:
                first_before_long_done = not long_done.is_set()
            deltas.append(d)
        return GenerateResult.from_deltas(deltas), bool(first_before_long_done)

    long_res, (late_res, first_early) = await asyncio.gather(run_long(), run_late())
    assert first_early, "the late request waited for the running one to finish"
    assert long_res.output_ids == long_alone.output_ids
    assert late_res.output_ids == late_alone.output_ids
    assert long_res.finish_reason == late_res.finish_reason == "length"


async def test_more_requests_than_batch_slots(tiny_model_dir: Path) -> None:
    eng = LocalEngine(tiny_model_dir, device="cpu", max_batch_size=2)
    try:
        reqs = [req(p, max_new_tokens=8, seed=i) for i, p in enumerate(PROMPTS)]
        alone = [await eng.generate(r) for r in reqs]
        largest = 0

        async def watch() -> None:
            nonlocal largest
            while True:
                batch = eng._batch
                largest = max(largest, len(batch) if batch is not None else 0)
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        together = await asyncio.gather(*(eng.generate(r) for r in reqs))
        watcher.cancel()
        assert [r.output_ids for r in together] == [r.output_ids for r in alone]
        assert largest <= 2
    finally:
        await eng.close()


async def test_event_loop_stays_responsive(engine: LocalEngine) -> None:
    gaps = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    t0 = time.perf_counter()
    await asyncio.gather(*(engine.generate(req(p, max_new_tokens=30, seed=1)) for p in PROMPTS * 4))
    took = time.perf_counter() - t0
    stop.set()
    await tick
    # the loop kept ticking all along: never blocked for a large part of the generation
    # (relative to the generation's own duration, so a loaded machine slows both alike)
    assert len(gaps) >= 10
    assert max(gaps) < took / 4


# -- finishing --------------------------------------------------------------------------------


async def test_stop_token_ends_generation_and_is_included(engine: LocalEngine) -> None:
    greedy = await engine.generate(req(PROMPTS[0], max_new_tokens=30, temperature=0))
    stop_tok = greedy.output_ids[5]
    first = greedy.output_ids.index(stop_tok)
    res = await engine.generate(
        req(PROMPTS[0], max_new_tokens=30, temperature=0, stop_token_ids=(stop_tok, 99999))
    )
    assert res.finish_reason == "stop"
    assert res.output_ids == greedy.output_ids[: first + 1]
    assert res.output_ids[-1] == stop_tok


async def test_max_new_tokens(engine: LocalEngine) -> None:
    for n in (1, 2, 17):
        res = await engine.generate(req(PROMPTS[2], max_new_tokens=n, seed=0))
        assert len(res.output_ids) == n and res.finish_reason == "length"


async def test_stream_deltas(engine: LocalEngine) -> None:
    deltas = [d async for d in engine.stream(req(PROMPTS[0], max_new_tokens=12, seed=5))]
    assert deltas[-1].finish_reason == "length"
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert all(len(d.token_ids) == len(d.logprobs) == len(d.versions) for d in deltas)
    res = GenerateResult.from_deltas(deltas)
    assert res.output_ids == (await engine.generate(req(PROMPTS[0], max_new_tokens=12, seed=5))).output_ids


async def test_context_length_limit(tiny_model_dir: Path) -> None:
    eng = LocalEngine(tiny_model_dir, device="cpu", max_context_length=32)
    try:
        assert eng.max_context_length == 32
        res = await eng.generate(req(list(range(10, 37)), max_new_tokens=100, seed=0))  # 27 prompt tokens
        assert len(res.output_ids) == 5 and res.finish_reason == "length"
        with pytest.raises(EngineError) as err:
            await eng.generate(req(list(range(10, 42)), max_new_tokens=1))  # 32 prompt tokens
        assert err.value.status == 400 and err.value.code == "context_length_exceeded"
        await eventually(lambda: eng.num_active == 0, what='eng.num_active == 0')
    finally:
        await eng.close()


async def test_invalid_prompts_are_refused(engine: LocalEngine) -> None:
    for bad in ([], [-1, 5], [5, 10**6]):
        with pytest.raises(EngineError) as err:
            await engine.generate(req(bad))
        assert err.value.status == 400 and err.value.code == "invalid_request"
    # the engine still serves
    assert len((await engine.generate(req(PROMPTS[0], max_new_tokens=3))).output_ids) == 3


# -- aborting -----------------------------------------------------------------------------------


async def test_closing_the_stream_aborts_the_request(engine: LocalEngine) -> None:
    stream = engine.stream(req(PROMPTS[0], max_new_tokens=1000, seed=0))
    got = 0
    async for d in stream:
        got += len(d.token_ids)
        if got >= 3:
            break
    await stream.aclose()
    await eventually(lambda: engine.num_active == 0 and engine._batch is None, what='the engine idle')
    # cancelling the consuming task aborts as well
    task = asyncio.create_task(engine.generate(req(PROMPTS[1], max_new_tokens=1000, seed=0)))
    await eventually(lambda: engine._batch is not None, what='engine._batch is not None')
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await eventually(lambda: engine.num_active == 0 and engine._batch is None, what='the engine idle')
    res = await engine.generate(req(PROMPTS[0], max_new_tokens=4, seed=0))
    assert len(res.output_ids) == 4


async def test_close_aborts_in_flight_requests(fresh_engine: LocalEngine) -> None:
    eng = fresh_engine
    stream = eng.stream(req(PROMPTS[0], max_new_tokens=1000, seed=0))
    first = await stream.__anext__()
    assert first.token_ids
    await eng.close()
    rest = [d async for d in stream]
    assert rest[-1].finish_reason == "abort"
    await eng.close()  # idempotent
    # a closed engine starts again on demand
    res = await eng.generate(req(PROMPTS[0], max_new_tokens=3))
    assert res.finish_reason == "length"


# -- weights --------------------------------------------------------------------------------------


def perturbed_model(tiny_model_dir: Path, scale: float = 0.05):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return model


async def test_weight_update_mid_generation_tags_versions(
    fresh_engine: LocalEngine, tiny_model_dir: Path
) -> None:
    eng = fresh_engine
    stream = eng.stream(req(PROMPTS[0], max_new_tokens=1500, seed=0))
    deltas = [await stream.__anext__()]
    assert await eng.update_weights_from_path(str(tiny_model_dir)) == 1
    assert eng.version == 1
    async for d in stream:
        deltas.append(d)
        if sum(len(x.token_ids) for x in deltas) > len(deltas[0].token_ids) + 5:
            break
    await stream.aclose()
    versions = [v for d in deltas for v in d.versions]
    assert versions[0] == 0 and versions[-1] == 1
    assert versions == sorted(versions)  # 0 ... 0 1 ... 1
    assert await eng.bump_version() == 2


async def settle() -> None:
    """Let tasks run until nothing is ready (deltas already queued reach their consumers)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_pause_holds_tokens_and_an_update_mid_stream_recomputes_with_the_new_weights(
    fresh_engine: LocalEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """pause -> load -> continue mid-stream: nothing is produced while paused, the stream ends
    normally, tokens before the pause are version 0 and exactly the old model's greedy tokens,
    tokens after are version 1 and exactly the new model's greedy continuation of that prefix
    (the prefix's KV cache was recomputed with the new weights, so logprobs match too)."""
    eng = fresh_engine
    new_model = perturbed_model(tiny_model_dir)
    new_model.save_pretrained(tmp_path / "ckpt")
    prompt, n = PROMPTS[1], 400
    uninterrupted = await eng.generate(req(prompt, max_new_tokens=n, temperature=0))
    got: list = []
    other: list = []

    async def consume(stream, into: list) -> None:
        async for d in stream:
            into.append(d)

    tasks = [asyncio.create_task(consume(eng.stream(req(prompt, max_new_tokens=n, temperature=0)), got)),
             asyncio.create_task(consume(eng.stream(req(PROMPTS[0], max_new_tokens=n, temperature=0)), other))]
    await eventually(lambda: got and other, what='got and other')
    await eng.pause_generation()
    assert eng.paused
    await settle()
    k = sum(len(d.token_ids) for d in got)
    assert await eng.update_weights_from_path(tmp_path / "ckpt") == 1  # runs while paused
    await settle()
    assert sum(len(d.token_ids) for d in got) == k, "tokens were produced while paused"
    await eng.continue_generation()
    await asyncio.gather(*tasks)
    assert got[-1].finish_reason == "length" and other[-1].finish_reason == "length"
    assert 1 <= k < n, "the update did not happen mid-stream"

    ids = [t for d in got for t in d.token_ids]
    versions = [v for d in got for v in d.versions]
    lps = [lp for d in got for lp in d.logprobs]
    assert len(ids) == n
    assert versions == [0] * k + [1] * (n - k)
    assert ids[:k] == uninterrupted.output_ids[:k]
    # after the update: the new model's greedy continuation of the prefix, with its logprobs
    with torch.no_grad():
        logits = new_model(torch.tensor([list(prompt) + ids])).logits[0, len(prompt) - 1 : -1].float()
    assert ids[k:] == logits.argmax(-1).tolist()[k:]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(lps[k:]), expected[k:], atol=1e-4, rtol=0)


async def test_bad_weight_updates_keep_old_weights(
    fresh_engine: LocalEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    eng = fresh_engine
    probe = req(PROMPTS[1], max_new_tokens=16, temperature=0)
    before = await eng.generate(probe)
    good = load_file(tiny_model_dir / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"

    def write(case: str, state: dict) -> str:
        (tmp_path / case).mkdir()
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / case / "model.safetensors"))
        return str(tmp_path / case)

    (tmp_path / "empty").mkdir()
    broken = {k: v * 0 for k, v in good.items()}  # would change outputs if any of it were loaded
    cases = {
        str(tmp_path / "does-not-exist"): "not found",
        str(tmp_path / "empty"): "no .*safetensors files",
        write("missing", {k: v for k, v in broken.items() if k != name}): "missing",
        write("unexpected", {**broken, "model.extra.weight": torch.zeros(2)}): "unexpected",
        write("shape", {**broken, name: torch.zeros(3, 3)}): "shape",
    }
    for path, message in cases.items():
        with pytest.raises(WeightUpdateError, match=message) as err:
            await eng.update_weights_from_path(path)
        assert err.value.status == 400 and err.value.code == "weight_update_failed"
    with pytest.raises(WeightUpdateError, match="missing"):
        await eng.update_weights_from_state_dict({})
    assert eng.version == 0
    after = await eng.generate(probe)
    assert after.output_ids == before.output_ids
    assert after.output_logprobs == before.output_logprobs
    assert set(after.output_versions) == {0}


async def test_good_weight_update_changes_outputs(
    fresh_engine: LocalEngine, tiny_model_dir: Path, tmp_path: Path
) -> None:
    eng = fresh_engine
    probe = req(PROMPTS[1], max_new_tokens=16, temperature=0)
    before = await eng.generate(probe)
    new_model = perturbed_model(tiny_model_dir)
    new_model.save_pretrained(tmp_path / "ckpt", max_shard_size="2MB")  # sharded, tied lm_head omitted
    assert len(list((tmp_path / "ckpt").glob("*.safetensors"))) > 1

    assert await eng.update_weights_from_path(tmp_path / "ckpt") == 1
    after = await eng.generate(probe)
    assert after.output_ids != before.output_ids
    assert set(after.output_versions) == {1}
    expected = teacher_forced(new_model, probe.input_ids, after.output_ids)
    torch.testing.assert_close(torch.tensor(after.output_logprobs), expected, atol=1e-4, rtol=0)

    # back to the original weights from an in-memory state dict (colocated training)
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert await eng.update_weights_from_state_dict(original) == 2
    restored = await eng.generate(probe)
    assert restored.output_ids == before.output_ids
    assert set(restored.output_versions) == {2}


async def test_shared_model_and_bump_version(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    eng = LocalEngine(model=model)
    try:
        assert eng.model is model
        probe = req(PROMPTS[2], max_new_tokens=10, temperature=0)
        before = await eng.generate(probe)
        with torch.no_grad():  # a colocated trainer updates the shared model in place
            model.lm_head.weight.mul_(-1.0)
        assert await eng.bump_version() == 1
        after = await collect(eng.stream(probe))
        assert after.output_ids != before.output_ids
        assert set(after.output_versions) == {1}
    finally:
        await eng.close()


@pytest.mark.parametrize("arch", ["qwen2", "mistral-sliding-window"])
async def test_other_architectures(arch: str, tmp_path: Path) -> None:
    """Any HF causal LM: Qwen2 (qkv bias, tied embeddings), Mistral with a sliding window."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    else:
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=8))
    model.eval().save_pretrained(tmp_path)
    eng = LocalEngine(tmp_path, device="cpu")
    try:
        assert eng.max_context_length == 256
        prompts = [[7, 8], list(range(3, 14)), list(range(20, 50))]  # shorter and longer than the window
        results = await asyncio.gather(
            *(eng.generate(req(p, max_new_tokens=20, seed=i)) for i, p in enumerate(prompts))
        )
        for prompt, res in zip(prompts, results, strict=False):
            expected = teacher_forced(model, prompt, res.output_ids)
            torch.testing.assert_close(torch.tensor(res.output_logprobs), expected, atol=1e-4, rtol=0)
        assert await eng.update_weights_from_path(tmp_path) == 1
    finally:
        await eng.close()


def test_import_does_not_need_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rlgate.engine as e; e.GenerateRequest; "
        "assert 'torch' not in sys.modules; e.LocalEngine"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- issue 15 ---------------------------------------------------------------------------------


async def test_tiny_temperatures_are_greedy(engine: LocalEngine) -> None:
    """temperature=1e-300 is 0 in float32: it was sampled at T=1 while recorded as 1e-300."""
    greedy = await engine.generate(req(PROMPTS[1], max_new_tokens=16, temperature=0.0))
    for t in (1e-300, 1e-7):
        tiny = await engine.generate(req(PROMPTS[1], max_new_tokens=16, temperature=t, seed=3))
        assert tiny.output_ids == greedy.output_ids, t
        assert tiny.output_logprobs == greedy.output_logprobs
    assert SamplingParams(temperature=1e-300).temperature == 0.0
    assert SamplingParams(temperature=1e-3).temperature == 1e-3


async def test_the_recorded_temperature_is_the_one_sampled_with(tiny_model_dir: Path, make_app, asgi_client) -> None:
    from helpers import admin_headers, key_headers, start_session

    app = make_app(LocalEngine(tiny_model_dir, device="cpu"))
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
        greedy = await c.post("/v1/chat/completions", json={**body, "temperature": 0}, headers=key_headers(key))
        tiny = await c.post("/v1/chat/completions", json={**body, "temperature": 1e-300, "seed": 5},
                            headers=key_headers(key))
        assert tiny.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]
        await c.post("/rl/end_session", headers=key_headers(key))
        exp = (await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())).json()
    assert [i["sampling"]["temperature"] for i in exp["interactions"]] == [0.0, 0.0]


def _state(session: str | None, n: int = 4):
    from rlgate.engine.local.batch import RequestState

    return RequestState([1] * n, SamplingParams(), torch.Generator(), loop=None, queue=None,
                        session_id=session)


def test_admission_is_round_robin_with_a_cap_per_session() -> None:
    from collections import deque

    from rlgate.engine.local.admission import admit_fairly

    a = [_state("a") for _ in range(5)]
    b, c = _state("b"), _state("c")
    pending = deque([*a, b, c])
    got = admit_fairly(pending, [], free=4, max_rows_per_session=2, prefill_token_budget=10**6)
    assert got == [a[0], b, c, a[1]]
    assert list(pending) == a[2:]
    # "a" is at its cap: a free row stays free rather than go to it
    assert admit_fairly(pending, got, free=4, max_rows_per_session=2, prefill_token_budget=10**6) == []
    # requests without a session are their own sessions
    free = [_state(None) for _ in range(3)]
    assert admit_fairly(deque(free), [], free=3, max_rows_per_session=1, prefill_token_budget=10**6) == free


async def test_one_session_cannot_take_the_whole_batch(tiny_model_dir: Path) -> None:
    """Issue 15: one key filled the whole batch; another session's request waited behind all of it."""
    eng = LocalEngine(tiny_model_dir, device="cpu", max_batch_size=4)
    done: list[str] = []

    async def run(name: str, session: str, n: int) -> None:
        r = GenerateRequest(list(PROMPTS[0]), SamplingParams(max_new_tokens=n, seed=1, stop_token_ids=()),
                            session_id=session)
        await eng.generate(r)
        done.append(name)

    try:
        await eng.start()
        hog = [asyncio.create_task(run(f"a{k}", "hog", 48)) for k in range(8)]
        await eventually(lambda: eng.num_active == 8, what='eng.num_active == 8')
        other = asyncio.create_task(run("b", "other", 4))
        await asyncio.gather(*hog, other)
    finally:
        await eng.close()
    assert done.index("b") == 0, done  # it got a row at once and finished first


# -- identical prompts arriving together (GRPO groups) ---------------------------------------


async def test_identical_prompts_arriving_together_are_prefilled_once(tiny_model_dir: Path, ref_model) -> None:
    """A group of n samples of one prompt costs one prefill row; every row samples with its own seed,
    and its tokens and logprobs are those of the same requests prefilled row by row."""
    eng = LocalEngine(tiny_model_dir, device="cpu")
    group = [req(PROMPTS[1], max_new_tokens=12, temperature=1.0, seed=s) for s in range(6)]
    batch = [*group, req(PROMPTS[3], max_new_tokens=12, seed=99), req(PROMPTS[0], max_new_tokens=12, temperature=0)]

    async def arrive_together() -> tuple[list[GenerateResult], dict[str, int]]:
        before = eng.stats()
        await eng.pause_generation()  # the requests queue; they are admitted in one step on continue
        tasks = [asyncio.create_task(eng.generate(r)) for r in batch]
        await eventually(lambda: eng.stats()["waiting"] == len(batch), what='eng.stats()["waiting"] == len(batch)')
        await eng.continue_generation()
        results = list(await asyncio.gather(*tasks))
        after = eng.stats()
        return results, {k: after[k] - before[k] for k in ("prefill_passes", "prefill_rows")}

    try:
        await eng.start()
        shared, counts = await arrive_together()
        assert counts == {"prefill_passes": 1, "prefill_rows": 3}  # 8 requests, 3 distinct prompts
        eng.dedup_prefill = False
        separate, counts = await arrive_together()
        assert counts == {"prefill_passes": 1, "prefill_rows": 8}
    finally:
        await eng.close()
    assert len({tuple(r.output_ids) for r in shared[:6]}) > 1  # the group's rows did not all sample alike
    for r, prompt, one, other in zip(batch, [p.input_ids for p in batch], shared, separate, strict=True):
        assert one.output_ids == other.output_ids
        temperature = r.sampling.temperature or 1.0
        expected = teacher_forced(ref_model, prompt, one.output_ids, temperature)
        torch.testing.assert_close(torch.tensor(one.output_logprobs), expected, atol=1e-4, rtol=0)


async def test_threads_sets_the_workers_torch_threads_only(tiny_model_dir: Path, engine: LocalEngine) -> None:
    ours = torch.get_num_threads()
    if ours < 2:
        pytest.skip("torch runs one thread here: nothing to tell apart")
    eng = LocalEngine(tiny_model_dir, device="cpu", threads=1)
    try:
        await eng.start()
        assert await eng._run_command(torch.get_num_threads) == 1  # runs on the worker thread
        assert torch.get_num_threads() == ours
        assert await asyncio.to_thread(torch.get_num_threads) == ours  # another thread
        r = req(PROMPTS[3], max_new_tokens=16, temperature=0)
        one, default = await asyncio.gather(eng.generate(r), engine.generate(r))
    finally:
        await eng.close()
    assert one.output_ids == default.output_ids
    torch.testing.assert_close(torch.tensor(one.output_logprobs), torch.tensor(default.output_logprobs),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="threads"):
        LocalEngine(tiny_model_dir, device="cpu", threads=0)
