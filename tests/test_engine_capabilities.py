"""Engine capabilities (engine/capabilities.py): which engine has which, and that the gateway and the
cluster find them through the protocols (a new engine gets them by implementing the methods)."""

from __future__ import annotations

from collections.abc import Mapping

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import admin_headers
from rlgate.cluster.replica import _restore_version
from rlgate.engine.capabilities import (
    ChecksWeights,
    DescribesBackends,
    HasModel,
    HasStats,
    LoadsStateDict,
    Pausable,
    QueueWaitObservable,
    ServesAdapters,
    VersionRestorable,
)
from rlgate.engine.fake import FakeEngine
from rlgate.engine.remote.sglang import SGLangEngine
from rlgate.engine.remote.vllm import VLLMEngine

ALL = (Pausable, VersionRestorable, HasStats, QueueWaitObservable, DescribesBackends, HasModel, ChecksWeights,
       ServesAdapters, LoadsStateDict)


def capabilities(engine: object) -> set[str]:
    return {c.__name__ for c in ALL if isinstance(engine, c)}


def test_the_fake_engine_pauses_and_restores_its_version(tokenizer):
    assert capabilities(FakeEngine(tokenizer)) == {"Pausable", "VersionRestorable", "ServesAdapters"}


@pytest.mark.parametrize("engine_class", [SGLangEngine, VLLMEngine])
def test_remote_engines_pause_restore_and_describe_their_backends(engine_class):
    engine = engine_class(["http://127.0.0.1:9"], transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    assert capabilities(engine) == {"Pausable", "VersionRestorable", "DescribesBackends", "ChecksWeights",
                                    "ServesAdapters"}


def test_the_local_engine_has_stats_queue_times_and_its_model(tiny_model_dir):
    from rlgate.engine.local import LocalEngine

    engine = LocalEngine(tiny_model_dir, device="cpu")
    assert capabilities(engine) == {"Pausable", "VersionRestorable", "HasStats", "QueueWaitObservable", "HasModel",
                                    "ChecksWeights", "ServesAdapters", "LoadsStateDict"}


class StatsEngine(FakeEngine):
    """A fake that reports batch occupancy and queue times: what a new engine writes to be in the metrics."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.on_queue_wait = None

    def stats(self) -> Mapping[str, float]:
        return {"running": 3, "waiting": 2, "max_batch_size": 8}


async def test_an_engine_with_stats_is_in_the_metrics_and_one_without_is_not(make_app, asgi_client, tokenizer):
    async def scrape(c: httpx.AsyncClient) -> dict[str, float]:
        r = await c.get("/metrics", headers=admin_headers())
        assert r.status_code == 200
        return {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}

    engine = StatsEngine(tokenizer)
    async with asgi_client(make_app(engine=engine)) as c:
        values = await scrape(c)
        assert values["rlgate_engine_running_requests"] == 3
        assert values["rlgate_engine_batch_occupancy"] == 3 / 8
        assert values["rlgate_queue_seconds_count"] == 0
        assert engine.on_queue_wait is not None  # the gateway wired its queue-time histogram
        engine.on_queue_wait(0.25)
        assert (await scrape(c))["rlgate_queue_seconds_count"] == 1
    async with asgi_client(make_app()) as c:
        assert "rlgate_engine_running_requests" not in await scrape(c)


async def test_a_restarted_replica_restores_the_version_through_the_protocol(tokenizer):
    engine = FakeEngine(tokenizer)
    _restore_version(engine, 7)
    assert engine.version == 7

    class Plain:  # an engine without restore_version: named in the error, never a silent no-op
        version = 0

    with pytest.raises(RuntimeError, match="Plain cannot set its weight version to 3"):
        _restore_version(Plain(), 3)  # type: ignore[arg-type]


async def test_the_two_slot_engine_of_online_training_is_in_the_metrics(asgi_client, tokenizer, stop_ids):
    """Under --online-train the gateway serves a TwoSlotEngine: its slots' numbers, summed, are in /metrics,
    and the queue-time histogram reaches both slots."""
    from helpers import ADMIN_KEY
    from rlgate.config import GatewayConfig, OnlineConfig
    from rlgate.online.canary import Canary
    from rlgate.online.versions import TwoSlotEngine
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    slots = [StatsEngine(tokenizer), StatsEngine(tokenizer)]
    engine = TwoSlotEngine(slots[0], slots[1], Canary(OnlineConfig()))
    assert capabilities(engine) == {"HasStats", "QueueWaitObservable"}
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), engine, MemoryStore(), tokenizer, stop_token_ids=stop_ids)
    async with asgi_client(app) as c:
        r = await c.get("/metrics", headers=admin_headers())
        values = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
        assert values["rlgate_engine_running_requests"] == 6 and values["rlgate_engine_waiting_requests"] == 4
        assert values["rlgate_engine_batch_occupancy"] == 6 / 16
        assert slots[0].on_queue_wait is not None and slots[0].on_queue_wait is slots[1].on_queue_wait
        slots[1].on_queue_wait(0.5)
        r = await c.get("/metrics", headers=admin_headers())
        values = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
        assert values["rlgate_queue_seconds_count"] == 1
    plain = TwoSlotEngine(FakeEngine(tokenizer), FakeEngine(tokenizer), Canary(OnlineConfig()))
    assert plain.stats() == {}  # fakes report nothing: /metrics shows 0 running, no occupancy
