"""Issue 15, defects 1 and 4: no request-controlled rendering or tokenization blocks the
event loop or grows memory without a bound.

* client chat templates (and the other reserved template kwargs) are refused on every surface;
* the assistant-suffix cache is bounded and belongs to its session;
* a prompt that cannot fit the context is refused before it is tokenized, and large prompts are
  tokenized off the event loop: ``/health`` and other sessions keep answering meanwhile;
* ``count_tokens`` refuses ended keys.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import httpx
import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.chat.conversation import Message, ToolSpec
from rlgate.chat.render import ChatRenderer
from rlgate.engine.fake import FakeEngine

USER = [{"role": "user", "content": "hi"}]
# A template whose assistant suffix is ~1 MB: the landed renderer cached one per context for ever.
HUGE_SUFFIX_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% if m.role == 'assistant' %}"
    "{% for i in range(20000) %}padding-padding-padding-padding-padding-padding{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIMPLE_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


def body_for(path: str, kwargs: dict, content: str = "hi", max_tokens: int = 4) -> dict:
    if path == "/v1/responses":
        return {"input": content, "max_output_tokens": max_tokens, "chat_template_kwargs": kwargs}
    msgs = [{"role": "user", "content": content}]
    return {"messages": msgs, "max_tokens": max_tokens, "chat_template_kwargs": kwargs}


SURFACES = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"]


@pytest.mark.parametrize("path", SURFACES)
@pytest.mark.parametrize("kwarg", ["chat_template", "tokenize", "messages", "eos_token", "return_dict"])
async def test_reserved_template_kwargs_are_refused_on_every_surface(make_app, asgi_client, path, kwarg):
    value = "{{ 'pwned' }}" if kwarg == "chat_template" else "x"
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        r = await c.post(path, json=body_for(path, {kwarg: value}), headers=key_headers(key))
        assert r.status_code == 400, r.text
        if path.startswith("/v1/messages"):
            assert r.json()["error"]["type"] == "invalid_request_error"
        else:
            assert r.json()["error"]["code"] == "reserved_template_kwarg"
            assert r.json()["error"]["param"] == f"chat_template_kwargs.{kwarg}"
        # ordinary template kwargs still work
        r = await c.post(path, json=body_for(path, {"enable_thinking": False}), headers=key_headers(key))
        assert r.status_code == 200, r.text


def test_reserved_kwargs_follow_the_tokenizer(tokenizer):
    from rlgate.chat.render import reserved_template_kwargs

    reserved = reserved_template_kwargs(tokenizer)
    assert {"chat_template", "tokenize", "add_generation_prompt", "continue_final_message", "return_tensors",
            "messages", "tools", "documents", "eos_token"} <= reserved
    assert "enable_thinking" not in reserved


async def test_client_templates_cannot_grow_memory(make_app, asgi_client):
    """The landed gateway rendered a client's template and cached its ~1 MB suffix per context,
    for ever (issue 15: 354 -> 922 MiB after 40 episodes, still held after export)."""
    app = make_app()
    async with asgi_client(app) as c:
        gw = app.state.gateway
        statuses = []
        for episode in range(4):
            sid, key = await start_session(c)
            msgs = [{"role": "user", "content": f"q{episode}"}]
            kwargs = {"chat_template": HUGE_SUFFIX_TEMPLATE, "episode": episode}  # a new context each time
            r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2,
                                                           "chat_template_kwargs": kwargs}, headers=key_headers(key))
            statuses.append(r.status_code)
            if r.status_code == 200:
                msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
                r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2,
                                                               "chat_template_kwargs": kwargs}, headers=key_headers(key))
                statuses.append(r.status_code)
            await c.post("/rl/end_session", headers=key_headers(key))
            await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        held = sum(len(v) for v in vars(gw.generation.renderer).values() if isinstance(v, dict)
                   for v in v.values() if isinstance(v, str))
    assert set(statuses) == {400}, statuses
    assert held == 0


def test_render_cache_is_bounded():
    from rlgate.chat.render_cache import RenderCache

    cache = RenderCache(max_entries=3, max_value_chars=10)
    for k in range(10):
        cache.put(f"k{k}", "v")
    assert len(cache) == 3 and cache.get("k0") is None and cache.get("k9") == "v"
    cache.put("big", "x" * 11)  # over the value bound: never kept
    assert cache.get("big") is None
    assert cache.chars() <= 3 * (3 + 1)


async def test_suffix_cache_is_per_session_and_freed_with_it(make_app, asgi_client):
    app = make_app()
    async with asgi_client(app) as c:
        gw = app.state.gateway
        sid, key = await start_session(c)
        msgs = [{"role": "user", "content": "hi"}]
        for turn in range(40):  # 40 distinct contexts (tool sets) in one session
            tools = [{"type": "function", "function": {"name": f"tool{turn}", "parameters": {"type": "object"}}}]
            r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2, "tools": tools},
                             headers=key_headers(key))
            assert r.status_code == 200, r.text
            r = await c.post("/v1/chat/completions", json={
                "messages": msgs + [r.json()["choices"][0]["message"], {"role": "user", "content": "again"}],
                "max_tokens": 2, "tools": tools}, headers=key_headers(key))
            assert r.status_code == 200, r.text
            assert r.json()["id"]
        session = gw.sessions.sessions[sid]
        assert 0 < len(session.render_cache) <= session.render_cache.max_entries
        ref = weakref.ref(session.render_cache)
        del session
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())
        assert r.status_code == 200
    gc.collect()
    assert ref() is None, "the session's render cache outlived its export"


# --------------------------------------------------------------------------- large prompts


def test_encode_of_long_text_matches_the_tokenizer(tokenizer):
    """Long texts go through the Rust batch call (which releases the GIL): same ids."""
    renderer = ChatRenderer(tokenizer)
    text = ("héllo wörld 123 <|im_end|> \n\t " * 3000)[:50_000]
    assert renderer.encode(text) == tokenizer.encode(text, add_special_tokens=False)


def test_max_token_chars_bounds_every_token(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert all(len(tokenizer.decode([i])) <= renderer.max_token_chars for i in range(len(tokenizer)))


@pytest.mark.parametrize("path", SURFACES)
async def test_prompt_that_cannot_fit_is_refused_before_tokenizing(make_app, asgi_client, path, monkeypatch):
    engine = FakeEngine(max_context_length=256)
    app = make_app(engine)
    gw = app.state.gateway
    calls = []
    real = gw.generation.renderer.encode
    monkeypatch.setattr(gw.generation.renderer, "encode", lambda text: calls.append(len(text)) or real(text))
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        # no token of the tiny vocabulary covers more than 13 characters: 100k cannot fit 256 tokens
        r = await c.post(path, json=body_for(path, {}, content="x" * 100_000), headers=key_headers(key))
        assert r.status_code == 400, r.text
        if not path.startswith("/v1/messages"):
            assert r.json()["error"]["code"] == "context_length_exceeded"
        assert calls == [], "the over-long prompt was tokenized"


@pytest.mark.slow
async def test_a_huge_prompt_does_not_block_other_requests(make_app):
    """Issue 15: a 30 MB prompt blocked every other request for 118 s (tokenization on the event
    loop). Here a prompt that takes a while to tokenize runs while /health and another session's
    chat must answer promptly, and at least once before it is done."""
    from rlgate.server.runner import ServerThread

    app = make_app(FakeEngine(max_context_length=10**7))
    with ServerThread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:
            _, big_key = await start_session(c)
            _, small_key = await start_session(c)
            big_text = "lorem ipsum dolor 12345 " * 16_000  # 384k characters
            big = asyncio.create_task(c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": big_text}], "max_tokens": 1}, headers=key_headers(big_key)))
            worst = 0.0
            answered_meanwhile = 0
            while not big.done():
                t0 = time.perf_counter()
                assert (await c.get("/health")).status_code == 200
                r = await c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 1},
                                 headers=key_headers(small_key))
                assert r.status_code == 200
                worst = max(worst, time.perf_counter() - t0)
                answered_meanwhile += not big.done()
            assert (await big).status_code == 200
    assert answered_meanwhile >= 1, "nothing was answered while the big prompt was being built"
    assert worst < 2.0, f"other requests waited {worst:.2f} s behind the big prompt"


async def test_render_timeout_answers_503(make_app, asgi_client):
    app = make_app(allow_template_override=True, render_timeout=0.05)
    slow = "{% for i in range(100000) %}{% for j in range(5) %}{% endfor %}{% endfor %}" + SIMPLE_TEMPLATE
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        t0 = time.perf_counter()
        r = await c.post("/v1/chat/completions", json=body_for("/v1/chat/completions", {"chat_template": slow}),
                         headers=key_headers(key))
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "render_timeout"
        assert time.perf_counter() - t0 < 5


async def test_allowed_client_template_renders_off_the_loop(make_app, asgi_client):
    app = make_app(allow_template_override=True)
    async with asgi_client(app) as c:
        _, key = await start_session(c)
        r = await c.post("/v1/chat/completions", json=body_for("/v1/chat/completions",
                                                                {"chat_template": SIMPLE_TEMPLATE}),
                         headers=key_headers(key))
        assert r.status_code == 200, r.text
        assert app.state.gateway.generation.render_pool.submitted == 1


async def test_count_tokens_refuses_ended_keys(make_app, asgi_client):
    async with asgi_client(make_app()) as c:
        _, key = await start_session(c)
        body = {"messages": USER}
        assert (await c.post("/v1/messages/count_tokens", json=body, headers=key_headers(key))).status_code == 200
        await c.post("/rl/end_session", headers=key_headers(key))
        r = await c.post("/v1/messages/count_tokens", json=body, headers=key_headers(key))
        assert r.status_code == 409, r.text
        assert r.json()["type"] == "error"


def test_bridge_and_render_stay_exact_with_a_cache(tokenizer):
    from rlgate.chat.render_cache import RenderCache

    renderer = ChatRenderer(tokenizer)
    cache = RenderCache()
    tools = [ToolSpec("add", "adds", {"type": "object", "properties": {}})]
    a = renderer.assistant_suffix(tools, {}, "k", cache)
    assert cache.get("k") == a == renderer.assistant_suffix(tools, {}, "k", None)
    msgs = [Message.of("user", "hi")]
    assert renderer.render_ids(msgs, tools) == renderer.render_ids(msgs, tools, max_chars=10**6)


@pytest.mark.torch  # the family checkpoints are built with weights
@pytest.mark.parametrize("family", ["kimi_k2", "llama3", "gpt_oss"])
async def test_bounds_cover_every_family_renderer(tmp_path, family, monkeypatch):
    """The bounds sit in front of whichever renderer the model family brings (``renderers``-backed:
    Kimi-K2, Llama 3; the checkpoint's Jinja template: gpt-oss): reserved kwargs refused, an
    over-long prompt refused before the renderer runs, large prompts (first turn and bridged
    turn) built on the render pool."""
    from transformers import AutoTokenizer

    from helpers import ADMIN_KEY
    from rlgate.config import GatewayConfig
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore
    from rlgate.testing.families import build_family_checkpoint

    path = build_family_checkpoint(family, tmp_path)
    tok = AutoTokenizer.from_pretrained(path)
    app = create_app(GatewayConfig(admin_key=ADMIN_KEY), FakeEngine(tok, output_tokens=3, max_context_length=1024),
                     MemoryStore(), tok, stop_token_ids=stop_token_ids(tok, path))
    gen = app.state.gateway.generation
    assert gen.family.name == family
    calls: list[str] = []
    for name in ("render_ids", "bridge_ids"):
        real = getattr(gen.renderer, name)
        monkeypatch.setattr(gen.renderer, name, lambda *a, _n=name, _f=real, **kw: calls.append(_n) or _f(*a, **kw))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        _, key = await start_session(c)
        r = await c.post("/v1/chat/completions", json=body_for("/v1/chat/completions", {"chat_template": "x"}),
                         headers=key_headers(key))
        assert r.status_code == 400 and r.json()["error"]["code"] == "reserved_template_kwarg", r.text
        too_long = "x" * (gen.max_prompt_chars(1024) + 1)
        r = await c.post("/v1/chat/completions", json=body_for("/v1/chat/completions", {}, content=too_long),
                         headers=key_headers(key))
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert calls == [], "the over-long prompt reached the renderer"

        gen.inline_chars = 0  # every prompt counts as large: built on the pool
        msgs = [{"role": "user", "content": "hi"}]
        r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3}, headers=key_headers(key))
        assert r.status_code == 200, r.text
        msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"] or ""},
                 {"role": "user", "content": "again"}]
        r = await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 3}, headers=key_headers(key))
        assert r.status_code == 200, r.text
    assert gen.render_pool.submitted == 2
    assert calls[0] == "render_ids" and len(calls) >= 2
