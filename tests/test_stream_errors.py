"""A failure after a stream started: the same path on every surface (api/streaming.py).

Each surface must send one in-band error event in its own format, then end the stream;
the interaction is recorded as failed; and nothing of the exception (its text, its type)
reaches the client, which gets a generic internal error. Two faults are injected: a
third-party engine that raises a plain exception mid-stream, and a bug in rlgate's own
output parsing (a ValueError, which must not be reported as the engine's fault).
"""

from __future__ import annotations

import json

import pytest

from helpers import ADMIN_KEY, key_headers, start_session
from rlgate.chat.output import IncrementalDetokenizer
from rlgate.engine.fake import FakeEngine
from rlgate.server.runner import ServerThread

SECRET = "s3cret-internal-detail"
GENERIC = "internal error; see the gateway log"

SURFACES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    "responses": ("/v1/responses", {"input": "hi", "stream": True}),
    "anthropic": ("/v1/messages", {"max_tokens": 32, "messages": [{"role": "user", "content": "hi"}],
                                   "stream": True}),
}


class BrokenEngine(FakeEngine):
    """A third-party engine with a bug: a plain exception after its first token."""

    async def stream(self, request):
        async for delta in super().stream(request):
            yield delta
            raise RuntimeError(SECRET)


@pytest.fixture(params=["engine", "parser"])
def fault(request, monkeypatch, tokenizer):
    """Returns the engine to serve with; "parser" breaks rlgate's own output parsing instead."""
    if request.param == "parser":
        push = IncrementalDetokenizer.push
        calls = {"n": 0}

        def broken_push(self, token_id):
            calls["n"] += 1
            if calls["n"] == 2:
                raise ValueError(SECRET)
            return push(self, token_id)

        monkeypatch.setattr(IncrementalDetokenizer, "push", broken_push)
        return FakeEngine(tokenizer, script=lambda r: "a reply long enough to stream in several pieces")
    return BrokenEngine(tokenizer, script=lambda r: "a reply long enough to stream in several pieces")


def events(body: str) -> list[tuple[str | None, dict | str]]:
    out = []
    for frame in body.split("\n\n"):
        if not frame.strip():
            continue
        name, data = None, None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
        out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_failure_mid_stream_is_one_in_band_error_event(surface, fault, make_app, asgi_client, caplog):
    path, body = SURFACES[surface]
    app = make_app(fault)
    async with asgi_client(app) as c:
        sid, key = await start_session(c)
        r = await c.post(path, json=body, headers=key_headers(key))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert SECRET not in r.text and "RuntimeError" not in r.text and "ValueError" not in r.text
    if surface == "chat":
        assert evs[0][1]["choices"][0]["delta"]["role"] == "assistant"  # the stream had started
        name, last = evs[-1]
        assert last == {"error": {"message": GENERIC, "type": "server_error", "param": None,
                                  "code": "internal_error"}}
        assert all(d != "[DONE]" for _, d in evs)  # the error ends the stream
    elif surface == "responses":
        assert evs[0][0] == "response.created"
        (err_name, err), (failed_name, failed) = evs[-2], evs[-1]
        assert err_name == "error" and err["code"] == "internal_error" and err["message"] == GENERIC
        assert failed_name == "response.failed" and failed["response"]["status"] == "failed"
        assert failed["response"]["error"] == {"code": "server_error", "message": GENERIC}
        assert [e[1]["sequence_number"] for e in evs] == list(range(len(evs)))
    else:
        assert evs[0][0] == "message_start"
        name, last = evs[-1]
        assert name == "error" and last == {"type": "error", "error": {"type": "api_error", "message": GENERIC}}
        assert not any(n == "message_stop" for n, _ in evs)
    # recorded as failed, with the cause kept for the operator (not the client)
    session = app.state.gateway.sessions.sessions[sid]
    (interaction,) = session.interactions.values()
    assert interaction.status == "failed" and SECRET in (interaction.error or "")
    assert "engine error" not in interaction.error  # rlgate's own bug is not blamed on the engine
    assert any(SECRET in (rec.exc_text or "") or (rec.exc_info and SECRET in str(rec.exc_info[1]))
               for rec in caplog.records)  # the traceback went to the log


async def test_an_engine_error_mid_stream_keeps_its_message_and_status(make_app, asgi_client, tokenizer):
    """An rlgate error (here: the engine reports a failure) is sent as it is, in-band."""
    from rlgate.engine.base import EngineError

    class FailingEngine(FakeEngine):
        async def stream(self, request):
            async for delta in super().stream(request):
                yield delta
                raise EngineError("the backend went away after 1 tokens", status=503, code="backend_unavailable")

    app = make_app(FailingEngine(tokenizer, script=lambda r: "several tokens of reply"))
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        for surface, (path, body) in SURFACES.items():
            r = await c.post(path, json=body, headers=key_headers(key))
            text = json.dumps(events(r.text)[-2 if surface == "responses" else -1][1])
            assert "the backend went away after 1 tokens" in text, surface
            assert ("overloaded_error" if surface == "anthropic" else "backend_unavailable") in text, surface


def test_the_sdks_raise_the_in_band_error(make_app, tokenizer):
    """The official SDKs turn each surface's error event into an exception with the generic message."""
    import anthropic
    import openai

    app = make_app(BrokenEngine(tokenizer, script=lambda r: "a reply long enough to stream"))
    with ServerThread(app) as url:
        import httpx

        r = httpx.post(url + "/rl/start_session", json={"task_id": "t"},
                       headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        key = r.json()["api_key"]
        oai = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.APIError, match="internal error"):
            for _ in oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 stream=True):
                pass
        # the Responses stream reports it as events (the SDK does not raise): error, then response.failed
        kinds = [(e.type, e) for e in oai.responses.create(model="m", input="hi", stream=True)]
        assert [k for k, _ in kinds[-2:]] == ["error", "response.failed"]
        assert kinds[-1][1].response.error.message == GENERIC and kinds[-1][1].response.status == "failed"
        ant = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
        with pytest.raises(anthropic.APIStatusError, match="internal error"):
            with ant.messages.stream(model="m", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as s:
                for _ in s:
                    pass
