"""The fake engine keeps a bounded history of its requests (a long `rlgate serve --engine fake`)."""

from __future__ import annotations

from rlgate.engine import fake
from rlgate.engine.base import GenerateRequest, SamplingParams
from rlgate.engine.fake import FakeEngine


async def test_request_history_is_bounded(monkeypatch):
    monkeypatch.setattr(fake, "KEEP_REQUESTS", 10)
    engine = FakeEngine(output_tokens=2)
    for i in range(25):
        req = GenerateRequest([1, 2, i + 3], SamplingParams(max_new_tokens=2), request_id=f"r{i}")
        deltas = [d async for d in engine.stream(req)]
        assert sum(len(d.token_ids) for d in deltas) == 2
    assert engine.served == 25
    assert len(engine.requests) <= 10
    assert engine.requests[-1].request_id == "r24"  # the newest are kept, in order
    ids = [int(r.request_id[1:]) for r in engine.requests]
    assert ids == list(range(ids[0], 25))
