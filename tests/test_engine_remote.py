"""Remote engines (SGLang, vLLM): wire parsing, routing and weight updates, against scripted
HTTP answers (httpx.MockTransport). The same engines against fake servers over real sockets
are in test_remote_engines.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from helpers import dummy_checkpoint
from rlgate.engine.base import EngineError, GenerateRequest, SamplingParams, WeightUpdateError, collect
from rlgate.engine.remote.sglang import SGLangEngine
from rlgate.engine.remote.vllm import VLLMEngine

PROMPT = [5, 6, 7]
STOP = 2


def req(session: str | None = "s1", max_new: int = 8, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(list(PROMPT), SamplingParams(max_new_tokens=max_new, stop_token_ids=(STOP,), **sampling),
                           request_id="chatcmpl-1", session_id=session)


class Body(httpx.AsyncByteStream):
    """A response body sent in parts, optionally failing afterwards (a reset mid-stream)."""

    def __init__(self, parts: list[bytes], error: Exception | None = None) -> None:
        self.parts = parts
        self.error = error

    async def __aiter__(self):
        for p in self.parts:
            yield p
        if self.error is not None:
            raise self.error


def sse(*objs: Any, done: bool = True) -> list[bytes]:
    out = [b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs]
    return out + ([b"data: [DONE]\n\n"] if done else [])


def stream_response(parts: list[bytes], error: Exception | None = None) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Body(parts, error))


# ------------------------------------------------------------------ SGLang events


def sg_event(ids: list[int], *, done: int | None = None, finish: Any = None, label: str = "default",
             entries: list[Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": "chatcmpl-1", "finish_reason": finish, "prompt_tokens": len(PROMPT),
                            "weight_version": label, "completion_tokens": len(ids) if done is None else done,
                            "cached_tokens": 0,
                            "output_token_logprobs": entries if entries is not None else
                            [[-0.5 - 0.1 * i, t, None] for i, t in enumerate(ids)]}
    return {"text": "", "output_ids": ids, "meta_info": meta}


def sg_info(label: str = "default", ctx: int = 4096) -> Callable[[httpx.Request], httpx.Response | None]:
    def info(request: httpx.Request) -> httpx.Response | None:
        if request.url.path in ("/model_info", "/get_model_info"):
            return httpx.Response(200, json={"model_path": "/ckpt/launch", "weight_version": label})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "max_model_len": ctx}]})
        if request.url.path == "/server_info":
            return httpx.Response(200, json={"incremental_streaming_output": False})
        if request.url.path == "/health":
            return httpx.Response(200)
        return None

    return info


def sglang(handler: Callable[[httpx.Request], httpx.Response], urls: tuple[str, ...] = ("http://a:1",),
           info: Callable[[httpx.Request], httpx.Response | None] | None = None, **kw: Any) -> SGLangEngine:
    info = info or sg_info()

    def route(request: httpx.Request) -> httpx.Response:
        return info(request) or handler(request)

    kw.setdefault("health_interval", 0)
    return SGLangEngine(list(urls), transport=httpx.MockTransport(route), **kw)


CUMULATIVE = [sg_event([11]), sg_event([11, 12]), sg_event([11, 12, STOP], finish={"type": "stop", "matched": STOP})]
INCREMENTAL = [sg_event([11], done=1), sg_event([12], done=2),
               sg_event([STOP], done=3, finish={"type": "stop", "matched": STOP})]


@pytest.mark.parametrize("events", [CUMULATIVE, INCREMENTAL], ids=["cumulative", "incremental"])
async def test_sglang_request_body_and_both_streaming_modes(events):
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/generate"
        seen.append({"body": json.loads(request.content), "headers": dict(request.headers)})
        return stream_response(sse(*events))

    engine = sglang(handler)
    result = await collect(engine.stream(req(seed=7, temperature=0.7, top_k=0)))
    assert result.output_ids == [11, 12, STOP] and result.finish_reason == "stop"
    expected = [-0.5, -0.6, -0.7] if events is CUMULATIVE else [-0.5, -0.5, -0.5]
    assert result.output_logprobs == pytest.approx(expected)
    assert result.output_versions == [0, 0, 0]
    body = seen[0]["body"]
    assert body["input_ids"] == PROMPT and body["return_logprob"] is True and body["stream"] is True
    assert body["rid"] == "chatcmpl-1"
    assert body["sampling_params"] == {"max_new_tokens": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1,
                                       "stop_token_ids": [STOP], "skip_special_tokens": False,
                                       "no_stop_trim": True, "sampling_seed": 7}
    assert seen[0]["headers"]["x-rlgate-session"] == "s1"
    assert engine.max_context_length == 4096


async def test_sglang_length_finish_and_labels_to_versions():
    events = [sg_event([11, 12], finish={"type": "length", "length": 2})]
    engine = sglang(lambda r: stream_response(sse(*events)))
    result = await collect(engine.stream(req(max_new=2)))
    assert result.finish_reason == "length" and result.output_versions == [0, 0]


def broken(name: str) -> list[bytes]:
    good = sg_event([11])
    if name == "non_json":
        return sse(good, b"{not json")
    if name == "missing_logprobs":
        bad = sg_event([11, 12])
        del bad["meta_info"]["output_token_logprobs"]
        return sse(good, bad)
    if name == "wrong_lengths":
        return sse(good, sg_event([11, 12], entries=[[-0.1, 11, None]]))
    if name == "wrong_token_ids":
        return sse(good, sg_event([11, 12], entries=[[-0.1, 11, None], [-0.2, 99, None]]))
    if name == "rewritten_prefix":
        return sse(good, sg_event([10, 12]))
    if name == "nan_logprob":
        return sse(good, sg_event([11, 12], entries=[[-0.1, 11, None], [float("nan"), 12, None]]))
    if name == "positive_logprob":
        return sse(good, sg_event([11, 12], entries=[[-0.1, 11, None], [3.5, 12, None]]))
    if name == "truncated":
        return sse(good, done=False)
    if name == "done_without_finish":
        return sse(good)
    if name == "too_many_tokens":
        return sse(sg_event(list(range(20, 40))))
    if name == "not_sse":
        return [b'{"text": "plain json, not a stream"}\n']
    if name == "unknown_finish":
        return sse(sg_event([11], finish={"type": "exploded"}))
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["non_json", "missing_logprobs", "wrong_lengths", "wrong_token_ids",
                                  "rewritten_prefix", "nan_logprob", "positive_logprob", "truncated",
                                  "done_without_finish", "too_many_tokens", "not_sse", "unknown_finish"])
async def test_sglang_malformed_answers_are_502(name):
    engine = sglang(lambda r: stream_response(broken(name)))
    got: list[Any] = []
    with pytest.raises(EngineError) as err:
        async for delta in engine.stream(req()):
            got.append(delta)
    assert err.value.status == 502 and "malformed" in err.value.message
    assert all(len(d.token_ids) == len(d.logprobs) == len(d.versions) for d in got)


async def test_error_event_abort_and_http_statuses():
    cases = {
        "error_event": (lambda r: stream_response(sse(sg_event([11]), {"error": {"message": "boom"}})), 502, "boom"),
        "abort": (lambda r: stream_response(sse(sg_event([11], finish={"type": "abort", "message": "evicted",
                                                                       "status_code": None}))), 503, "evicted"),
        "http_400": (lambda r: httpx.Response(400, json={"error": {"message": "The input (9 tokens) is longer "
                                                                   "than the model's context length (8 tokens)."}}),
                     400, "context length"),
        "http_500": (lambda r: httpx.Response(500, text="Internal Server Error"), 502, "Internal Server Error"),
        "http_503": (lambda r: httpx.Response(503, json={"error": {"message": "overloaded"}}), 503, "overloaded"),
        "http_401": (lambda r: httpx.Response(401, json={"error": "Unauthorized"}), 502, "--backend-api-key"),
    }
    for name, (handler, status, text) in cases.items():
        engine = sglang(handler)
        with pytest.raises(EngineError) as err:
            await collect(engine.stream(req()))
        assert err.value.status == status, name
        assert text in err.value.message, (name, err.value.message)
    engine = sglang(cases["http_400"][0])
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.code == "context_length_exceeded"


async def test_reset_mid_stream_is_502_if_backend_alive_else_503():
    def alive(request: httpx.Request) -> httpx.Response:
        return stream_response(sse(sg_event([11]), done=False), httpx.ReadError("connection reset by peer"))

    engine = sglang(alive)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 502 and "broke the stream after 1 tokens" in err.value.message
    assert engine.backends[0].state == "healthy"

    dead = {"on": False}

    def info(request: httpx.Request) -> httpx.Response | None:
        if dead["on"] and request.url.path == "/health":
            raise httpx.ConnectError("connection refused")
        return sg_info()(request)

    def dies(request: httpx.Request) -> httpx.Response:
        dead["on"] = True
        return stream_response(sse(sg_event([11]), done=False), httpx.RemoteProtocolError("peer closed"))

    engine = sglang(dies, info=info)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 503 and "went away" in err.value.message
    assert engine.backends[0].state == "down"


async def test_a_connection_closed_before_any_response_is_retried_once():
    """The keep-alive race: the backend closes an idle pooled connection just as a request is
    written to it. Nothing reached the backend, so the request is sent once more; a second such
    failure is the backend's problem (502)."""
    calls = {"n": 0, "fail": 1}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] <= calls["fail"]:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return stream_response(sse(*CUMULATIVE))

    engine = sglang(flaky)
    result = await collect(engine.stream(req()))
    assert result.output_ids == [11, 12, STOP] and calls["n"] == 2

    calls.update(n=0, fail=2)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 502 and "broke the stream after 0 tokens" in err.value.message and calls["n"] == 2


async def test_unreachable_backend_is_503_and_timeout_is_504():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    engine = sglang(refuse)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 503 and "unreachable" in err.value.message

    def slow(request: httpx.Request) -> httpx.Response:
        return stream_response(sse(sg_event([11]), done=False), httpx.ReadTimeout("timed out"))

    engine = sglang(slow)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 504


async def test_finish_then_reset_keeps_the_result():
    """A connection lost after the last event (only [DONE] missing) does not fail the request."""
    events = sse(sg_event([11, STOP], finish={"type": "stop", "matched": STOP}), done=False)
    engine = sglang(lambda r: stream_response(events, httpx.ReadError("reset")))
    result = await collect(engine.stream(req()))
    assert result.output_ids == [11, STOP] and result.finish_reason == "stop"


async def test_prompt_longer_than_backend_context_is_refused_locally():
    calls = []
    engine = sglang(lambda r: calls.append(r) or stream_response([]), info=sg_info(ctx=3))
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 400 and err.value.code == "context_length_exceeded" and not calls


async def test_unknown_weight_label_is_refused_and_quarantines():
    events = [sg_event([11, STOP], finish={"type": "stop", "matched": STOP}, label="someone-else")]
    engine = sglang(lambda r: stream_response(sse(*events)))
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == 503 and "rlgate did not load" in err.value.message
    assert engine.backends[0].state == "stale"
    with pytest.raises(EngineError) as err:  # the session's backend is out of rotation now
        await collect(engine.stream(req()))
    assert err.value.status == 503 and "pinned" in err.value.message


# ------------------------------------------------------------------ routing


async def test_affinity_least_loaded_and_failover_modes():
    served: dict[str, list[str]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        served.setdefault(request.headers["x-rlgate-session"], []).append(str(request.url.host))
        return stream_response(sse(sg_event([11, STOP], finish={"type": "stop", "matched": STOP})))

    urls = ("http://a:1", "http://b:1", "http://c:1")
    engine = sglang(handler, urls=urls)
    for _turn in range(3):
        for s in range(6):
            await collect(engine.stream(req(session=f"s{s}")))
    assert all(len(set(hosts)) == 1 and len(hosts) == 3 for hosts in served.values())
    per_backend = sorted(b.sessions for b in engine.backends)
    assert per_backend == [2, 2, 2]
    victim = engine.backend_for("s0")
    victim.set_state("down", "test")
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req(session="s0")))
    assert err.value.status == 503 and victim.url in err.value.message and "pinned" in err.value.message
    await collect(engine.stream(req(session="new")))  # new sessions avoid the down backend
    assert engine.backend_for("new") is not victim

    engine.failover = "move"
    await collect(engine.stream(req(session="s0")))
    assert engine.backend_for("s0") is not victim
    for b in engine.backends:
        b.set_state("down", "test")
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req(session="s1")))
    assert err.value.status == 503 and "no sglang backend is available" in err.value.message


# ------------------------------------------------------------------ weight updates


@pytest.fixture
def v1(tmp_path) -> str:
    """A checkpoint directory the gateway can see (every engine checks it before any backend hears of it)."""
    return dummy_checkpoint(tmp_path / "v1")


@pytest.fixture
def v2(tmp_path) -> str:
    return dummy_checkpoint(tmp_path / "v2")


class Fleet:
    """Scripted SGLang backends for weight-update tests."""

    def __init__(self, n: int = 2) -> None:
        self.labels = {f"b{i}": "default" for i in range(n)}
        self.refuse: set[str] = set()
        self.break_on: set[str] = set()  # transport error on update
        self.refuse_rollback: set[str] = set()
        self.calls: list[tuple[str, str, Any]] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        self.calls.append((host, path, body))
        if path in ("/model_info", "/get_model_info"):
            return httpx.Response(200, json={"model_path": "/ckpt/launch", "weight_version": self.labels[host]})
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        if path in ("/server_info", "/health", "/pause_generation", "/continue_generation"):
            return httpx.Response(200, json={})
        if path == "/update_weights_from_disk":
            if host in self.break_on and body["model_path"] != "/ckpt/launch":
                raise httpx.ReadError("connection reset during the update")
            if host in self.refuse or (host in self.refuse_rollback and body["model_path"] == "/ckpt/launch"):
                return httpx.Response(400, json={"success": False, "message": "Failed to load",
                                                 "num_paused_requests": 0})
            self.labels[host] = body["weight_version"]
            return httpx.Response(200, json={"success": True, "message": "ok", "num_paused_requests": 0})
        if path == "/generate":
            return stream_response(sse(sg_event([11, STOP], finish={"type": "stop", "matched": STOP},
                                                label=self.labels[host])))
        raise AssertionError(path)

    def engine(self) -> SGLangEngine:
        return SGLangEngine([f"http://b{i}:1" for i in range(len(self.labels))],
                            transport=httpx.MockTransport(self.handler), health_interval=0)

    def paths(self, host: str, path: str) -> list[Any]:
        return [b for h, p, b in self.calls if h == host and p == path]


async def test_update_pauses_loads_everywhere_then_bumps(v1):
    fleet = Fleet()
    engine = fleet.engine()
    assert await engine.update_weights_from_path(v1) == 1
    for host in ("b0", "b1"):
        assert fleet.paths(host, "/pause_generation") == [{"mode": "retract"}]
        assert fleet.paths(host, "/update_weights_from_disk") == [{"model_path": v1, "weight_version": "1"}]
        assert len(fleet.paths(host, "/continue_generation")) == 1
    order = [p for h, p, _ in fleet.calls if h == "b0" and p in ("/pause_generation", "/update_weights_from_disk",
                                                                  "/continue_generation")]
    assert order == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    result = await collect(engine.stream(req()))
    assert result.output_versions == [1, 1]


async def test_refused_update_rolls_back_the_others_and_keeps_the_version(v1):
    fleet = Fleet()
    fleet.refuse.add("b1")
    engine = fleet.engine()
    with pytest.raises(WeightUpdateError) as err:
        await engine.update_weights_from_path(v1)
    msg = err.value.message
    assert "failed on 1 of 2" in msg and "http://b1:1" in msg and "keeps weight version 0" in msg
    assert "rolled back to the previous weights: http://b0:1" in msg
    assert engine.version == 0
    assert [b["model_path"] for b in fleet.paths("b0", "/update_weights_from_disk")] == [v1, "/ckpt/launch"]
    assert fleet.labels == {"b0": "default", "b1": "default"}
    assert all(b.state == "healthy" for b in engine.backends)
    assert len(fleet.paths("b0", "/continue_generation")) == 1  # generation resumed everywhere
    assert len(fleet.paths("b1", "/continue_generation")) == 1
    for s in ("x", "y"):
        assert (await collect(engine.stream(req(session=s)))).output_versions == [0, 0]


async def test_interrupted_update_and_failed_rollback_quarantine(v1):
    fleet = Fleet(3)
    fleet.break_on.add("b1")  # transport error: state unknown, rolled back
    fleet.refuse.add("b2")
    fleet.refuse_rollback.add("b0")  # b0 loaded v1 but cannot go back
    engine = fleet.engine()
    with pytest.raises(WeightUpdateError) as err:
        await engine.update_weights_from_path(v1)
    states = {b.url: b.state for b in engine.backends}
    assert states == {"http://b0:1": "stale", "http://b1:1": "healthy", "http://b2:1": "healthy"}
    assert "out of rotation until resynced" in err.value.message and "http://b0:1" in err.value.message
    assert engine.version == 0
    # b0 is never used while stale; a later successful update brings everyone to version 1
    for s in range(4):
        await collect(engine.stream(req(session=f"s{s}")))
    assert engine.backends[0].served == 0
    fleet.refuse.clear()
    fleet.break_on.clear()
    fleet.refuse_rollback.clear()
    assert await engine.update_weights_from_path(v1) == 1
    await engine.check_backends()  # the health loop resyncs b0 to version 1
    assert engine.backends[0].state == "healthy" and engine.backends[0].version == 1
    assert fleet.labels["b0"] == "1"


async def test_backend_down_during_update_is_resynced_before_it_rejoins(v1):
    fleet = Fleet()
    engine = fleet.engine()
    await engine.ensure_ready()
    engine.backends[1].set_state("down", "test")
    assert await engine.update_weights_from_path(v1) == 1
    assert fleet.paths("b1", "/update_weights_from_disk") == []
    fleet.labels["b1"] = "default"  # it restarted with its launch weights
    await engine.check_backends()
    assert engine.backends[1].state == "healthy" and engine.backends[1].version == 1
    assert fleet.paths("b1", "/update_weights_from_disk") == [{"model_path": v1, "weight_version": "1"}]


async def test_no_backend_available_for_update_is_503(v1):
    fleet = Fleet(1)
    engine = fleet.engine()
    await engine.ensure_ready()
    engine.backends[0].set_state("down", "test")
    with pytest.raises(WeightUpdateError) as err:
        await engine.update_weights_from_path(v1)
    assert err.value.status == 503 and engine.version == 0


# ------------------------------------------------------------------ vLLM


def vl_event(ids: list[int], finish: str | None = None, first: bool = False, **choice: Any) -> dict[str, Any]:
    c = {"index": 0, "text": "", "finish_reason": finish, "stop_reason": None,
         "logprobs": {"text_offset": list(range(len(ids))), "token_logprobs": [-0.25] * len(ids),
                      "tokens": [f"token_id:{t}" for t in ids], "top_logprobs": [{} for _ in ids]},
         "prompt_token_ids": list(PROMPT) if first else None, "token_ids": ids}
    c.update(choice)
    return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m", "choices": [c], "usage": None}


def vllm(handler: Callable[[httpx.Request], httpx.Response], **kw: Any) -> VLLMEngine:
    def route(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [
                {"id": "served-name", "root": "/ckpt/launch", "max_model_len": 2048}]})
        if request.url.path == "/server_info":
            return httpx.Response(404, json={"detail": "Not Found"})
        return handler(request)

    kw.setdefault("health_interval", 0)
    return VLLMEngine(["http://v:1"], transport=httpx.MockTransport(route), **kw)


async def test_vllm_request_body_and_stream():
    bodies = []
    events = [vl_event([11], first=True), vl_event([12, STOP], finish="stop"),
              {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": {"completion_tokens": 3}}]

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        bodies.append(json.loads(request.content))
        return stream_response(sse(*events))

    engine = vllm(handler)
    result = await collect(engine.stream(req(seed=3, top_k=5, temperature=0.0)))
    assert result.output_ids == [11, 12, STOP] and result.finish_reason == "stop"
    assert result.output_logprobs == [-0.25] * 3
    b = bodies[0]
    assert b["model"] == "served-name" and b["prompt"] == PROMPT and b["max_tokens"] == 8
    assert b["logprobs"] == 1 and b["return_token_ids"] is True and b["return_tokens_as_token_ids"] is True
    assert b["stream"] is True and b["seed"] == 3 and b["top_k"] == 5 and b["stop_token_ids"] == [STOP]
    assert engine.max_context_length == 2048 and engine.logprobs_mode == "raw"


@pytest.mark.parametrize("name", ["no_token_ids", "no_logprobs", "lengths", "token_names", "prompt_changed",
                                  "two_choices", "error_event", "abort"])
async def test_vllm_malformed_answers(name):
    bad = {
        "no_token_ids": vl_event([12], token_ids=None),
        "no_logprobs": vl_event([12], logprobs=None),
        "lengths": vl_event([12, 13], logprobs={"token_logprobs": [-1.0], "tokens": []}),
        "token_names": vl_event([12], logprobs={"token_logprobs": [-1.0], "tokens": ["token_id:99"]}),
        "prompt_changed": vl_event([12], prompt_token_ids=[1, 2]),
        "two_choices": {"choices": [vl_event([12])["choices"][0]] * 2},
        "error_event": {"error": {"message": "boom", "type": "BadRequestError", "param": None, "code": 400}},
        "abort": vl_event([12], finish="abort"),
    }[name]
    engine = vllm(lambda r: stream_response(sse(vl_event([11], first=True), bad)))
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req()))
    assert err.value.status == (503 if name == "abort" else 502), err.value.message


async def test_vllm_weight_update_protocol_and_missing_dev_mode(v1, v2):
    calls: list[tuple[str, Any]] = []
    dev = {"on": True}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((request.url.path + (f"?{request.url.query.decode()}" if request.url.query else ""), body))
        if not dev["on"]:
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [None]})
        return httpx.Response(200, json={"status": "ok"})

    engine = vllm(handler)
    assert await engine.update_weights_from_path(v1) == 1
    assert calls == [
        ("/pause?mode=abort", None),
        ("/collective_rpc", {"method": "reload_weights", "timeout": 1800.0, "kwargs": {"weights_path": v1}}),
        ("/reset_prefix_cache", None),
        ("/resume", None),
    ]
    dev["on"] = False
    with pytest.raises(WeightUpdateError) as err:
        await engine.update_weights_from_path(v2)
    assert "VLLM_SERVER_DEV_MODE=1" in err.value.message and engine.version == 1
    assert engine.backends[0].state == "healthy"  # it refused before touching its weights


async def test_vllm_lora_adapters_go_through_the_runtime_lora_api(tmp_path, v1):
    calls: list[tuple[str, Any]] = []
    lora = {"on": True}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        calls.append((request.url.path, body))
        if request.url.path == "/v1/completions":
            return stream_response(sse(vl_event([11, STOP], finish="stop", first=True)))
        if "lora_adapter" in request.url.path and not lora["on"]:
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [None]})
        return httpx.Response(200, json={"status": "ok"})

    def adapter(name: str) -> str:
        path = dummy_checkpoint(tmp_path / name)
        (tmp_path / name / "adapter_config.json").write_text("{}")
        return path

    engine = vllm(handler)
    a1, a2 = adapter("a1"), adapter("a2")

    async def served_model() -> str:
        calls.clear()
        await collect(engine.stream(req()))
        return next(b["model"] for p, b in calls if p == "/v1/completions")

    assert await engine.update_weights_from_path(a1) == 1
    assert [p for p, _ in calls] == ["/pause", "/v1/load_lora_adapter", "/reset_prefix_cache", "/resume"]
    assert calls[1][1] == {"lora_name": "rlgate-1", "lora_path": a1}
    assert await served_model() == "rlgate-1"
    assert await engine.update_weights_from_path(a2) == 2
    assert [(p, b) for p, b in calls if "lora" in p] == [
        ("/v1/load_lora_adapter", {"lora_name": "rlgate-2", "lora_path": a2}),
        ("/v1/unload_lora_adapter", {"lora_name": "rlgate-1"})]
    assert await served_model() == "rlgate-2"
    assert await engine.update_weights_from_path(v1) == 3  # full weights: the base model again
    assert ("/v1/unload_lora_adapter", {"lora_name": "rlgate-2"}) in calls
    assert await served_model() == "served-name"
    lora["on"] = False
    with pytest.raises(WeightUpdateError) as err:
        await engine.update_weights_from_path(a1)
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in err.value.message and engine.version == 3
    assert await served_model() == "served-name"


async def test_strict_logprobs_refuses_what_the_backend_cannot_report():
    ok = stream_response(sse(vl_event([11, STOP], finish="stop", first=True)))
    engine = vllm(lambda r: ok, strict_logprobs=True)
    with pytest.raises(EngineError) as err:
        await collect(engine.stream(req(temperature=0.7)))
    assert err.value.status == 400 and err.value.code == "logprobs_unavailable"
    assert engine.logprobs_follow_contract(SamplingParams(temperature=1.0, top_p=0.9))
    processed = vllm(lambda r: ok, logprobs_mode="processed_logprobs")
    assert processed.logprobs_follow_contract(SamplingParams(temperature=0.7))
    assert not processed.logprobs_follow_contract(SamplingParams(temperature=0.7, top_p=0.9))
    sg = SGLangEngine(["http://a:1"], health_interval=0)
    assert sg.logprobs_follow_contract(SamplingParams(temperature=0.3, top_k=5, top_p=0.5))
    assert not SGLangEngine(["http://a:1"], return_original_logprob=True).logprobs_follow_contract(
        SamplingParams(temperature=0.3))


def test_constructor_validation():
    with pytest.raises(ValueError):
        SGLangEngine([])
    with pytest.raises(ValueError):
        SGLangEngine(["http://a:1", "http://a:1/"])
    with pytest.raises(ValueError):
        SGLangEngine(["a:1"])
    with pytest.raises(ValueError):
        VLLMEngine(["http://a:1"], logprobs_mode="raw_logits")  # type: ignore[arg-type]
