"""A weight update in the middle of a stream, on every engine kind, through a gateway replica.

Each case runs one :class:`~rlgate.cluster.replica.GatewayReplica` (the class Ray runs as an
actor, here in-process, no Ray) and drives the cluster barrier's phases on it exactly as
:class:`~rlgate.cluster.controller.WeightController` does: ``pause`` (admission and generation
paused in the engine), ``load`` (the next version), ``resume``. A client streams a chat
completion with the OpenAI SDK; the update happens after it received its first tokens.

Checked for every engine: no client-visible error and no ``abort`` (the stream ends with
``length``); the trajectory's versions are the old version for every token produced before the
pause and the new one after; the generated tokens are exactly those of the same request run
without an update (greedy decoding, the checkpoint loaded is the same weights, so a stream that
was held, retracted, or aborted and resumed from its prefix must continue token for token).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from helpers import ADMIN_KEY, admin_headers, key_headers
from rlgate.cluster.engines import FakeEngineSpec, LocalEngineSpec, RemoteEngineSpec
from rlgate.cluster.replica import GatewayReplica, ReplicaSpec
from rlgate.config import GatewayConfig
from rlgate.engine.remote.options import RemoteOptions
from rlgate.server.runner import ServerThread

MAX_TOKENS = 48
CHUNK_DELAY = 0.05  # seconds per event from the fake inference servers (a stream lasts ~2.4 s: the pause must
# land mid-stream on a busy machine; at 0.01 s a stream once finished before a pause that took 0.3 s)

# name: (engine kind, the inference server's pause mode). vLLM "keep" tags tokens when they arrive, so
# a token produced just before the pause and read after the update could carry the new version: the
# check below (old versions, then new ones) holds, the exact split is not guaranteed for it.
CASES = {
    "fake": ("fake", None),
    "local": ("local", None),
    "sglang-retract": ("sglang", "retract"),
    "sglang-in_place": ("sglang", "in_place"),
    "sglang-abort": ("sglang", "abort"),
    "vllm-abort": ("vllm", "abort"),
    "vllm-keep": ("vllm", "keep"),
}


@contextlib.contextmanager
def replica_for(case: str, tiny_model_dir: Any, tokenizer: Any):
    """(replica, fake inference server's FakeBackend or None) for ``case``."""
    kind, mode = CASES[case]
    with contextlib.ExitStack() as stack:
        fb = None
        if kind == "fake":
            engine: Any = FakeEngineSpec(output_tokens=MAX_TOKENS + 8, token_delay=CHUNK_DELAY)
        elif kind == "local":
            engine = LocalEngineSpec(model=str(tiny_model_dir), device="cpu")
        else:
            from remote_helpers import fake_app
            from rlgate.engine.local import LocalEngine

            app = fake_app(kind, LocalEngine(tiny_model_dir, device="cpu"), tokenizer, tiny_model_dir,
                           chunk_delay=CHUNK_DELAY)
            fb = app.state.fake
            url = stack.enter_context(ServerThread(app))
            engine = RemoteEngineSpec(kind, [[url]], options=RemoteOptions(**{f"{kind}_pause_mode": mode}, health_interval=0))
        spec = ReplicaSpec(model=str(tiny_model_dir), config=GatewayConfig(admin_key=ADMIN_KEY), engine=engine)
        replica = GatewayReplica(0, spec)
        try:
            yield replica, fb
        finally:
            replica.stop()


async def run_turn(oai: AsyncOpenAI, key: str, received: list[int] | None = None) -> tuple[str, str | None]:
    """Stream one turn; count chunks with content into ``received[0]``."""
    stream = await oai.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "count with me: one two three"}], stream=True,
        temperature=0, max_tokens=MAX_TOKENS, extra_headers=key_headers(key))
    parts, finish = [], None
    async for ch in stream:
        if ch.choices:
            parts.append(ch.choices[0].delta.content or "")
            finish = ch.choices[0].finish_reason or finish
            if received is not None and ch.choices[0].delta.content:
                received[0] += 1
    return "".join(parts), finish


async def output_of(admin: httpx.AsyncClient, session_id: str, key: str) -> tuple[list[int], list[int], str]:
    """End the session; its one turn's generated tokens, their versions, the finish reason."""
    r = await admin.post("/rl/end_session", headers=key_headers(key))
    assert r.status_code == 200, r.text
    r = await admin.post("/export_trajectories", json={"session_id": session_id}, headers=admin_headers())
    assert r.status_code == 200, r.text
    (s,) = r.json()["interactions"]
    mask = s["loss_mask"]
    ids = [t for t, m in zip(s["input_ids"], mask, strict=True) if m]
    versions = [v for v, m in zip(s["versions"], mask, strict=True) if m]
    return ids, versions, s["finish_reason"]


FAST = ("fake", "local", "sglang-abort", "vllm-abort")  # the others are slow (~25 s each on a busy machine)


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
async def test_weight_update_mid_stream_is_invisible_to_the_client(case, tiny_model_dir, tokenizer):
    with replica_for(case, tiny_model_dir, tokenizer) as (replica, fb):
        async with httpx.AsyncClient(base_url=replica.url, timeout=120) as admin:
            async def session(task: str) -> tuple[str, str]:
                r = await admin.post("/rl/start_session", json={"task_id": task}, headers=admin_headers())
                assert r.status_code == 200, r.text
                return r.json()["session_id"], r.json()["api_key"]

            oai = AsyncOpenAI(base_url=replica.url + "/v1", api_key="per-request", max_retries=0, timeout=120)
            ref_sid, ref_key = await session("reference")
            ref_text, ref_finish = await run_turn(oai, ref_key)
            ref_ids, ref_versions, _ = await output_of(admin, ref_sid, ref_key)
            assert ref_finish == "length" and set(ref_versions) == {0}

            sid, key = await session("updated")
            received = [0]
            turn = asyncio.create_task(run_turn(oai, key, received))
            while received[0] < 2 and not turn.done():
                await asyncio.sleep(0.005)
            assert not turn.done(), "the stream ended before the update could start"
            await asyncio.to_thread(replica.pause)
            seen_at_pause = received[0]
            assert await asyncio.to_thread(replica.load, str(tiny_model_dir), 1) == 1
            assert await asyncio.to_thread(replica.resume) == 1
            text, finish = await turn  # raises if the client saw an error
            ids, versions, stored_finish = await output_of(admin, sid, key)

        assert finish == "length", f"finish_reason {finish!r}"
        assert stored_finish == "length"
        assert ids == ref_ids, "the stream did not continue token for token"
        assert text == ref_text
        k = versions.count(0)
        assert versions == [0] * k + [1] * (len(versions) - k), versions
        assert seen_at_pause <= k < len(ids), (seen_at_pause, k, len(ids))
        if fb is not None and CASES[case][1] == "abort":
            assert fb.aborted_by_pause >= 1  # the backend really aborted it; the engine resumed it
            assert len(fb.requests) >= 3  # reference, the aborted request, its continuation

