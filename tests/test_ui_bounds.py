"""The viewer's bounds (issue 23, finding 7): a turn's page is bounded whatever the turn's size (it
shows one part of a long turn, with a pager), and characters that a reader cannot see (bidi
controls, zero-width and other format characters, controls) are shown as visible escapes in
every page and in the static export, never raw."""

from __future__ import annotations

import html
import json
import re
import sys
import unicodedata

import pytest

from helpers import admin_headers, key_headers, start_session
from rlgate.cli import main as cli
from rlgate.engine.fake import FakeEngine
from rlgate.trajectory.export import write_jsonl
from rlgate.ui.escape import INVISIBLE, e, et
from rlgate.ui.model import Episode, Turn
from rlgate.ui.render import (
    RAW_CHARS_PER_PART,
    TEXT_CHARS_PER_PART,
    TOKENS_PER_PART,
    StaticLinks,
    interaction_view,
)
from rlgate.ui.tokens import token_texts, token_texts_window

# One part of a turn's page: with ordinary text about 0.5 MB; the most it can be (every character
# an escaped control character) is checked below against MAX_PART_BYTES.
ORDINARY_PART_BYTES = 1_000_000
MAX_PART_BYTES = 3_000_000
TOKEN_SPAN = re.compile(r'<span class="[pcbg][^"]*" data-token-id="(\d+)" data-logprob="[^"]+" '
                        r'data-version="-?\d+" data-loss="[01]">(.*?)</span>(?=<span class="[pcbg]|</div>)', re.S)
STRIP = re.compile(r'data-count="(\d+)" data-start="(\d+)" data-end="(\d+)"')
NEXT = re.compile(r'<a href="([^"]+)" rel="next"')
LAST = re.compile(r'<a href="([^"]+)" rel="last"')
# bidi controls, and other characters that show nothing: zero-width space, BOM, a tag character
# (invisible "ASCII smuggling"), soft hyphen, an escape character, a Hangul filler
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
HIDDEN = BIDI + "\u200b\ufeff\U000e0041\u00ad\x1b\u3164"


def _strip_text(span_html: str) -> str:
    """A token span's text as the token's text (the strip shows newlines and tabs as ↵ and →)."""
    return html.unescape(span_html).replace("↵\n", "\n").replace("→\t", "\t")


async def _long_turn(c, content: str) -> tuple[str, str, dict]:
    """One turn with this prompt; (session id, turn id, its exported sample); the gateway keeps it."""
    sid, key = await start_session(c, task_id="long")
    r = await c.post("/v1/chat/completions", headers=key_headers(key),
                     json={"messages": [{"role": "user", "content": content}], "max_tokens": 64})
    assert r.status_code == 200, r.text
    tid = r.json()["id"]
    assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
    r = await c.post("/export_trajectories", json={"session_id": sid, "keep": True}, headers=admin_headers())
    [sample] = r.json()["interactions"]
    return sid, tid, sample


async def test_a_2mb_prompt_page_is_bounded_and_the_pager_reaches_the_end(make_app, asgi_client, tokenizer):
    """Before: one 120 MB page (1.25 M token elements), about 7 s to render and minutes in Chromium."""
    content = ("The quick brown fox jumps over the lazy dog 0123456789. " * 40_000)[:2_000_000]
    engine = FakeEngine(tokenizer, script=["the end of the reply"], max_context_length=10**7)
    async with asgi_client(make_app(engine, ui=True)) as c:
        sid, tid, sample = await _long_turn(c, content)
        n = len(sample["input_ids"])
        assert n > 100 * TOKENS_PER_PART
        first = await c.get("/ui/turn", params={"session": sid, "id": tid}, headers=admin_headers())
        assert first.status_code == 200
        assert len(first.content) < ORDINARY_PART_BYTES, len(first.content)
        assert STRIP.search(first.text).groups() == (str(n), "0", str(TOKENS_PER_PART))
        parts = -(-n // TOKENS_PER_PART)
        assert f"part 1 of {parts:,}" in first.text
        assert [int(t) for t, _ in TOKEN_SPAN.findall(first.text)] == sample["input_ids"][:TOKENS_PER_PART]
        # next -> the following window; last -> the end of the sequence, the generated tokens included
        second = await c.get(html.unescape(NEXT.search(first.text).group(1)), headers=admin_headers())
        assert len(second.content) < ORDINARY_PART_BYTES
        assert STRIP.search(second.text).groups() == (str(n), str(TOKENS_PER_PART), str(2 * TOKENS_PER_PART))
        assert [int(t) for t, _ in TOKEN_SPAN.findall(second.text)] == \
            sample["input_ids"][TOKENS_PER_PART:2 * TOKENS_PER_PART]
        last = await c.get(html.unescape(LAST.search(first.text).group(1)), headers=admin_headers())
        assert len(last.content) < ORDINARY_PART_BYTES
        assert STRIP.search(last.text).groups() == (str(n), str((parts - 1) * TOKENS_PER_PART), str(n))
        assert [int(t) for t, _ in TOKEN_SPAN.findall(last.text)] == sample["input_ids"][(parts - 1) * TOKENS_PER_PART:]
        assert "the end of the reply" in "".join(_strip_text(x) for _, x in TOKEN_SPAN.findall(last.text))
        assert NEXT.search(last.text) is None  # the end
        # a part out of range shows the nearest one
        beyond = await c.get("/ui/turn", params={"session": sid, "id": tid, "part": parts + 5}, headers=admin_headers())
        assert STRIP.search(beyond.text).groups() == STRIP.search(last.text).groups()


async def test_walking_the_parts_shows_the_whole_turn_exactly(make_app, asgi_client, tokenizer):
    """Every token, every character of the messages and of the raw request, once, in order: the
    token texts of each window are those of the whole sequence (multi-byte characters included)."""
    content = "".join(f"line {k}: héllo wörld 😀 数据 → ok\n" for k in range(1300))  # 3-4 parts of tokens
    engine = FakeEngine(tokenizer, script=["réponse 😀 finale"], max_context_length=10**6)
    async with asgi_client(make_app(engine, ui=True)) as c:
        sid, tid, sample = await _long_turn(c, content)
        url, pages = f"/ui/turn?session={sid}&id={tid}", []
        while url:
            r = await c.get(url, headers=admin_headers())
            assert r.status_code == 200 and len(r.content) < ORDINARY_PART_BYTES
            pages.append(r.text)
            m = NEXT.search(r.text)
            url = html.unescape(m.group(1)) if m else ""
    assert len(pages) == -(-len(sample["input_ids"]) // TOKENS_PER_PART) >= 3
    spans = [s for p in pages for s in TOKEN_SPAN.findall(p)]
    assert [int(t) for t, _ in spans] == sample["input_ids"]
    assert [_strip_text(x) for _, x in spans] == token_texts(tokenizer, sample["input_ids"])
    texts = [html.unescape(re.sub(r"<span class=\"cut\"[^>]*>⋯</span>", "", t)) for p in pages
             for t in re.findall(r'<div class="text">(.*?)</div>', p, re.S)]
    assert "".join(texts[:-1]) == content and texts[-1] == "réponse 😀 finale"
    raw = "".join(html.unescape(re.search(r'<aside class="raw"><h3>raw request</h3>(?:<p class="window">[^<]*'
                                          r'</p>)?<pre>(.*?)</pre>', p, re.S).group(1)) for p in pages)
    assert json.loads(raw)["messages"] == [{"role": "user", "content": content}]


def test_windowed_token_texts_match_the_whole_decode(tokenizer):
    ids = tokenizer.encode("naïve café 😀😀 数据库 ∑ — fin " * 40, add_special_tokens=False)
    whole = token_texts(tokenizer, ids)
    for start, end in [(0, 7), (1, 2), (3, 50), (len(ids) - 9, len(ids)), (17, 17), (0, len(ids) + 5)]:
        assert token_texts_window(tokenizer, ids, start, end) == whole[start:end], (start, end)


def _turn(n_tokens: int, content: str, reply: str) -> Turn:
    return Turn(id="t\u202e1", session_id="s", parent_id=None, relation="root", fork_reason=None, api="chat",
                finish_reason="stop", reward=1.0, input_ids=list(range(n_tokens)),
                loss_mask=[0] * (n_tokens - 10) + [1] * 10, logprobs=[-0.5] * n_tokens, versions=[0] * n_tokens,
                messages=[{"role": "user", "content": content}],
                output_message={"role": "assistant", "content": reply}, sampling={}, flags=[])


def test_the_largest_part_is_bounded():
    """The worst case we found: every other character an invisible one (each its own escape),
    "&" (5 bytes escaped) between them, 16 characters per token."""
    hostile = "&\u202e" * 1_000_000
    turn = _turn(1_250_000, hostile, hostile[:100_000])
    ep = Episode(id="s", task_id="x", group="x", step=None, status="ended", turns=[turn])

    def texts(start: int, end: int) -> list[str]:
        return [hostile[:16]] * (end - start)

    for part in (1, 2, 300):
        page = interaction_view(ep, turn, texts, StaticLinks(), newest_version=0, stale_lag=4, part=part)
        assert len(page.encode()) < MAX_PART_BYTES, (part, len(page.encode()))
        assert "\u202e" not in page and "\u2066" not in page
    assert TEXT_CHARS_PER_PART == RAW_CHARS_PER_PART == 16_384


def test_the_static_export_holds_the_first_and_last_part(tokenizer, tiny_model_dir, tmp_path):
    content = ("The quick brown fox jumps over the lazy dog 0123456789. " * 40_000)[:2_000_000]
    ids = tokenizer.encode(content, add_special_tokens=False)
    turn = _turn(len(ids), content, "the end")
    row = {"session_id": "big", "task_id": "t", "id": "turn-1", "relation": "root", "input_ids": ids,
           "loss_mask": turn.loss_mask, "logprobs": turn.logprobs, "versions": turn.versions,
           "messages": turn.messages, "output_message": turn.output_message, "reward": 1.0, "api": "chat"}
    path = write_jsonl([row], tmp_path / "big.jsonl")
    out = tmp_path / "view.html"
    assert cli(["view", str(path), "--out", str(out), "--tokenizer", str(tiny_model_dir)]) == 0
    page = out.read_text()
    parts = -(-len(ids) // TOKENS_PER_PART)
    assert len(page.encode()) < 2 * ORDINARY_PART_BYTES  # was 120 MB
    views = dict(re.findall(r'<script type="text/html" data-view="(t:[^"]+)">(.*?)</script>', page, re.S))
    keys = {html.unescape(k) for k in views}
    assert keys == {'t:["big","turn-1"]', f't:["big","turn-1","{parts}"]'}
    by_key = {html.unescape(k): v for k, v in views.items()}
    last = by_key[f't:["big","turn-1","{parts}"]']
    assert STRIP.search(last).groups() == (str(len(ids)), str((parts - 1) * TOKENS_PER_PART), str(len(ids)))
    assert [int(t) for t, _ in TOKEN_SPAN.findall(last)] == ids[(parts - 1) * TOKENS_PER_PART:]
    first = by_key['t:["big","turn-1"]']
    assert f"This file holds parts 1 and {parts:,} of {parts:,}" in first
    # the pager links only to the views the file holds
    targets = {html.unescape(h) for h in re.findall(r'<nav class="pager".*?</nav>', first, re.S)[0].split('"')
               if h.startswith("#")}
    assert targets == {StaticLinks().turn("big", "turn-1", parts)}


def test_invisible_characters_are_a_closed_list():
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if unicodedata.category(ch) == "Cf" or (unicodedata.category(ch) == "Cc" and ch not in "\t\n\r"):
            assert INVISIBLE.fullmatch(ch), f"U+{cp:04X} is not escaped"
    for ch in BIDI:
        assert INVISIBLE.fullmatch(ch)
    assert not INVISIBLE.search("plain text, ümlauts, 数据, emoji 😀, tab\tnewline\n")
    assert e("a\u202eb") == "a⟨U+202E⟩b" and et("<\u200b\u200b\u202e") == '&lt;<kbd class="cc">⟨U+200B⟩×2⟨U+202E⟩</kbd>'


async def test_invisible_characters_show_as_escapes_in_every_page(make_app, asgi_client, tokenizer, tiny_model_dir,
                                                                  tmp_path):
    hidden = f"pay {HIDDEN} now"
    engine = FakeEngine(tokenizer, script=[f"reply {HIDDEN} end"])
    async with asgi_client(make_app(engine, ui=True)) as c:
        # a live task id must be printable (the gateway refuses Cf / Cc there); a group id may hold anything
        sid, key = await start_session(c, task_id="task", metadata={"group": f"group{BIDI}"})
        r = await c.post("/v1/chat/completions", headers=key_headers(key),
                         json={"messages": [{"role": "user", "content": hidden}]})
        assert r.status_code == 200, r.text
        tid = r.json()["id"]
        pages = {name: await c.get(path, params=q, headers=admin_headers()) for name, path, q in (
            ("list", "/ui", {}), ("session", "/ui/session", {"id": sid}),
            ("turn", "/ui/turn", {"session": sid, "id": tid}), ("group", "/ui/group", {"id": f"group{BIDI}"}),
            ("not found", "/ui/session", {"id": f"nope{BIDI}"}))}
        assert (await c.post("/rl/end_session", headers=key_headers(key))).status_code == 200
        exported = (await c.post("/export_trajectories", json={"session_id": sid}, headers=admin_headers())).json()
    assert [r.status_code for r in pages.values()] == [200, 200, 200, 200, 404]
    turn = pages["turn"].text
    assert "⟨U+202E⟩" in turn and "⟨U+E0041⟩" in turn and "⟨U+001B⟩" in turn
    assert '<kbd class="cc">⟨U+202A⟩⟨U+202B⟩⟨U+202C⟩⟨U+202D⟩⟨U+202E⟩⟨U+2066⟩' in turn  # styled, a run in one
    # in a token of the strip too, not only in the messages
    assert any("⟨U+202E⟩" in x for _, x in TOKEN_SPAN.findall(turn))
    assert all("⟨U+202E⟩" in pages[p].text for p in ("list", "session", "group"))
    rows = [{**s, "session_id": exported["session_id"], "task_id": f"task{HIDDEN}"}  # a file may hold anything
            for s in exported["interactions"]]
    path = write_jsonl(rows, tmp_path / "hidden.jsonl")
    out = tmp_path / "view.html"
    assert cli(["view", str(path), "--out", str(out), "--tokenizer", str(tiny_model_dir), "--title", hidden]) == 0
    static = out.read_text()
    assert "⟨U+202E⟩" in static
    for name, body in [*((p, r.text) for p, r in pages.items()), ("rlgate view", static)]:
        raw = INVISIBLE.findall(body)
        assert not raw, f"{name}: raw {[f'U+{ord(ch):04X}' for ch in raw]}"


@pytest.mark.parametrize("part", [1, 2])
def test_token_strip_counts(part):
    turn = _turn(TOKENS_PER_PART + 5, "hi", "there")
    ep = Episode(id="s", task_id=None, group=None, step=None, status=None, turns=[turn])
    page = interaction_view(ep, turn, None, StaticLinks(), newest_version=0, stale_lag=4, part=part)
    n = len(TOKEN_SPAN.findall(page))
    assert n == (TOKENS_PER_PART if part == 1 else 5)
