"""schemathesis against the app's own OpenAPI schema (fake engine, SQLite store).

Every route, valid and invalid inputs, with valid auth: the admin key on control routes,
a fresh session key on session routes. Properties: never a 5xx; every error body in
the surface's shape (Anthropic for /v1/messages*, OpenAI elsewhere).

``RLGATE_FUZZ_EXAMPLES`` examples per route (default small so the suite stays fast);
``make fuzz`` runs 2000.
"""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from helpers import ADMIN_KEY

EXAMPLES = int(os.environ.get("RLGATE_FUZZ_EXAMPLES", "8"))

ADMIN_ROUTES = {"/grant_capacity", "/rl/start_session", "/rl/start_sessions", "/export_trajectories",
                "/rl/finish_session", "/rl/update_weights", "/rl/metrics", "/rl/collect", "/metrics",
                "/rl/policies", "/rl/policies/unload"}


@pytest.fixture(scope="module")
def fuzz_app(tokenizer, stop_ids, tmp_path_factory):
    from rlgate.config import GatewayConfig
    from rlgate.engine.fake import FakeEngine
    from rlgate.server.app import create_app
    from rlgate.store.sqlite import SQLiteStore

    store = SQLiteStore(tmp_path_factory.mktemp("fuzz") / "fuzz.sqlite", synchronous="normal")
    config = GatewayConfig(admin_key=ADMIN_KEY, max_body_bytes=256 * 1024, max_tokens_cap=8)
    app = create_app(config, FakeEngine(tokenizer, output_tokens=6), store, tokenizer, stop_token_ids=stop_ids)
    yield OwnLifespan(app)
    store.close()


class OwnLifespan:
    """The app without its lifespan: schemathesis ends an app's lifespan after every test
    (closing the store); this module keeps one app, and its store, for all of them."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_app):
    return schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)


# Every operation of the schema (test_every_operation_is_fuzzed keeps this list complete).
OPERATIONS = [
    ("POST", "/grant_capacity"), ("POST", "/rl/start_session"), ("POST", "/rl/start_sessions"),
    ("POST", "/rl/end_session"), ("POST", "/rl/set_reward"), ("POST", "/export_trajectories"),
    ("POST", "/rl/finish_session"), ("POST", "/rl/collect"),
    ("POST", "/rl/update_weights"), ("POST", "/rl/policies"), ("GET", "/rl/policies"), ("POST", "/rl/policies/unload"),
    ("GET", "/rl/metrics"), ("GET", "/metrics"), ("GET", "/health"), ("GET", "/v1/models"), ("GET", "/models"),
    ("POST", "/chat/completions"), ("POST", "/v1/chat/completions"), ("POST", "/responses"),
    ("POST", "/v1/responses"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
]


# Operations with something to make invalid (a request body); the others are fuzzed with
# valid input only (a GET without parameters has no invalid form).
WITH_BODY = [op for op in OPERATIONS if op[0] == "POST" and op[1] != "/rl/end_session"]
CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + \
        [(m, p, GenerationMode.NEGATIVE) for m, p in WITH_BODY]


def test_every_operation_is_fuzzed(fuzz_schema):
    ops = {(r.ok().method.upper(), r.ok().path) for r in fuzz_schema.get_all_operations()}
    assert ops == set(OPERATIONS)


def _session_key(app) -> str:
    from schemathesis.python.asgi import get_client

    with get_client(app) as client:
        r = client.post("/rl/start_session", json={"task_id": "fuzz"},
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status_code == 200, r.text
        return r.json()["api_key"]


def check_error_shape(path: str, status: int, body) -> None:
    assert status < 500, (status, body)
    if status < 400:
        return
    assert isinstance(body, dict), body
    if path.startswith("/v1/messages"):
        assert body.get("type") == "error", body
        assert set(body["error"]) == {"type", "message"} and isinstance(body["error"]["message"], str), body
    else:
        assert set(body) == {"error"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


def check_stream(path: str, text: str) -> None:
    """An error after a stream started is one in-band event in the surface's shape."""
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if isinstance(event, dict) and ("error" in event) and (event.get("type") in ("error", None)):
            check_error_shape(path, 400, event)


@pytest.mark.parametrize("method,path,mode", CASES,
                         ids=[f"{m} {p} {'valid' if g == GenerationMode.POSITIVE else 'invalid'}" for m, p, g in CASES])
def test_no_5xx_and_errors_in_the_surface_shape(fuzz_app, fuzz_schema, method, path, mode):
    operation = fuzz_schema[path][method]
    strategy = operation.as_strategy(mode)

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @given(case=strategy)
    def run(case):
        if path in ADMIN_ROUTES:
            key = ADMIN_KEY
        elif path == "/health":
            key = None
        else:
            key = _session_key(fuzz_app)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        wait = case.body.get("wait_timeout") if isinstance(case.body, dict) else None
        if path == "/rl/collect" and isinstance(wait, int | float) and not isinstance(wait, bool) and 0.05 < wait <= 10:
            case.body["wait_timeout"] = 0.05  # a valid long poll, kept short: it waits for a session that never ends
        response = case.call(headers=headers)
        ctype = ",".join(response.headers.get("content-type", []))
        if "text/event-stream" in ctype:
            assert response.status_code == 200
            check_stream(path, response.text)
            return
        body = response.json() if "json" in ctype else response.text
        check_error_shape(path, response.status_code, body)

    run()
