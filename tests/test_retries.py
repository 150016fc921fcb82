"""A request an SDK retries (x-stainless-retry-count > 0) is one turn, not a second branch (issue 26).

The OpenAI and Anthropic SDKs resend a request that timed out on their side; the gateway, which never
saw the client leave (a JSON answer is not watched for a disconnect), generated the first attempt to
its end. The retry supersedes that attempt: it is recorded as failed (never received), and the retry
takes its place in the tree, so the conversation stays one chain.
"""

from __future__ import annotations

import contextlib

import anthropic
import httpx
import openai

from helpers import admin_headers, eventually, key_headers, start_session
from rlgate.engine.base import GenerateRequest
from rlgate.engine.fake import FakeEngine, Scripted
from rlgate.server.runner import ServerThread

SLOW_TOKENS = 80  # at 0.05 s a token: 4 s, well past the client's 1 s timeout


class SlowFirst:
    """The first request of the script gets a long reply (generated slowly), the others short ones."""

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tokenizer = tokenizer
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, request: GenerateRequest) -> Scripted:
        self.calls += 1
        if self.calls == 1:
            return Scripted(text=" ".join(["slow"] * SLOW_TOKENS))
        return Scripted(text=self.answers.pop(0))


@contextlib.asynccontextmanager
async def served(app):
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
            sid, key = await start_session(admin, "retry")
            yield url, admin, sid, key


async def export(admin, sid, key) -> dict:
    assert (await admin.post("/rl/end_session", headers=key_headers(key))).status_code == 200
    r = await admin.post("/export_trajectories", json={"session_id": sid, "style": "concat"},
                         headers=admin_headers())
    assert r.status_code == 200, r.text
    return r.json()


async def test_openai_sdk_retry_after_a_timeout_is_recorded_once(make_app, tokenizer):
    script = SlowFirst(tokenizer, ["It is 3.", "You're welcome."])
    engine = FakeEngine(tokenizer, script=script, token_delay=0.05)
    app = make_app(engine)
    async with served(app) as (url, admin, sid, key):
        oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, timeout=1.0, max_retries=2)
        messages = [{"role": "user", "content": "What is 1 + 2?"}]
        r1 = await oai.chat.completions.with_raw_response.create(model="tiny", messages=messages)
        assert r1.retries_taken == 1  # the first attempt timed out on the client's side, the retry did not
        engine.token_delay = 0.0
        first = r1.parse()
        assert first.choices[0].message.content == "It is 3."
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "user", "content": "Thanks!"}]
        second = await oai.chat.completions.create(model="tiny", messages=messages)
        assert second.choices[0].message.content == "You're welcome."
        await oai.close()
        # the attempt the client gave up on is generated to its end, then recorded as failed
        sessions = app.state.gateway.sessions.sessions
        await eventually(lambda: not any(s.in_flight for s in sessions.values()), timeout=60,
                         what="the first attempt ended")
        exp = await export(admin, sid, key)
    stats = exp["stats"]
    assert (stats["completed"], stats["failed"], stats["fork"], stats["conversations"]) == (2, 1, 0, 1)
    (sample,) = exp["interactions"]  # one chain: the retry (the root), then the next turn extending it
    assert sample["chain"] == [first.id, second.id]
    assert sample["relation"] == "extend" and sample["fork_reason"] is None


async def test_a_retry_of_a_completed_attempt_replaces_it(make_app, tokenizer):
    """The first attempt ended before the retry came (the client gave up just before): it is taken out
    of the tree (recorded as failed), and the retry extends the same parent. The Anthropic SDK sends the
    same header (here set by hand, to order the two attempts)."""
    engine = FakeEngine(tokenizer, script=["Hi.", "First try.", "Second try.", "Next."])
    async with served(make_app(engine)) as (url, admin, sid, key):
        body = {"model": "tiny", "max_tokens": 32, "messages": [{"role": "user", "content": "hello"}]}
        hdr = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        r0 = (await admin.post("/v1/messages", json=body, headers=hdr)).json()
        body["messages"] += [{"role": "assistant", "content": r0["content"]}, {"role": "user", "content": "more"}]
        lost = await admin.post("/v1/messages", json=body, headers={**hdr, "x-stainless-retry-count": "0"})
        assert lost.status_code == 200
        retry = (await admin.post("/v1/messages", json=body, headers={**hdr, "x-stainless-retry-count": "1"})).json()
        assert retry["content"][0]["text"] == "Second try."
        ant = anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0)
        body["messages"] += [{"role": "assistant", "content": "Second try."}, {"role": "user", "content": "go"}]
        nxt = await ant.messages.create(**body)
        await ant.close()
        exp = await export(admin, sid, key)
    stats = exp["stats"]
    assert (stats["completed"], stats["failed"], stats["fork"], stats["conversations"]) == (3, 1, 0, 1)
    (sample,) = exp["interactions"]
    assert sample["chain"] == [r0["id"], retry["id"], nxt.id]
