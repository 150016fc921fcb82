"""Per-step training metrics: served on their own port, pushed to a (local) Pushgateway."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from prometheus_client.parser import text_string_to_metric_families

from helpers import free_port
from rlgate.config import GatewayConfig
from rlgate.metrics.gateway import GatewayMetrics
from rlgate.metrics.training import TrainingMetrics, metric_name
from rlgate.train.telemetry import MetricsSettings, StepExporter

STEP = {"reward": 0.75, "loss": -0.01, "rollout_s": 2.5, "episodes": 64, "eval_accuracy": None,
        "weird key/name": 3.0, "nan": float("nan"), "flag": True}


def samples(text: str) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_step_values_become_gauges():
    m = TrainingMetrics()
    m.record_step(3, STEP, version=3)
    m.record_step(4, {**STEP, "reward": 0.8}, version=4)
    from prometheus_client import generate_latest

    got = samples(generate_latest(m.registry).decode())
    assert got["rlgate_train_step"] == 4 and got["rlgate_train_steps_total"] == 2
    assert got["rlgate_train_weight_version"] == 4
    assert got["rlgate_train_reward"] == 0.8 and got["rlgate_train_episodes"] == 64
    assert got[metric_name("weird key/name")] == 3.0 and metric_name("weird key/name") == "rlgate_train_weird_key_name"
    assert "rlgate_train_nan" not in got and "rlgate_train_flag" not in got and "rlgate_train_eval_accuracy" not in got


async def test_exporter_serves_the_run_and_the_gateway():
    gateway = GatewayMetrics(GatewayConfig(admin_key="k" * 40))
    exporter = StepExporter(MetricsSettings(port=0), extra_registries=(gateway.registry,))
    try:
        await exporter.step(1, STEP, version=1)
        assert exporter.url is not None
        got = samples(httpx.get(exporter.url, timeout=10).text)
    finally:
        exporter.close()
    assert got["rlgate_train_reward"] == 0.75
    assert "rlgate_guard_firing" in got  # the in-process gateway's guards, on the same scrape


class _Pushgateway(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]] = []

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def test_push_to_a_pushgateway_and_survive_its_outage(caplog):
    _Pushgateway.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pushgateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    exporter = StepExporter(MetricsSettings(pushgateway=url, job="demo-run"))
    try:
        await exporter.step(7, STEP, version=7)
    finally:
        server.shutdown()
        server.server_close()
    [(path, body)] = _Pushgateway.bodies
    assert path == "/metrics/job/demo-run"
    got = samples(body.decode())
    assert got["rlgate_train_step"] == 7 and got["rlgate_train_reward"] == 0.75
    # the Pushgateway goes away: training goes on, one warning per outage
    down = StepExporter(MetricsSettings(pushgateway=f"http://127.0.0.1:{free_port()}"))
    caplog.set_level(logging.WARNING, logger="rlgate.train")
    for step in range(3):
        await down.step(step, STEP)
    assert len([r for r in caplog.records if "push failed" in r.getMessage()]) == 1
