"""HTML for the viewer's four views: sessions list, session tree, interaction, GRPO group.

Every string that comes from data (messages, model output, ids, tasks) goes through
:func:`e` / :func:`et` (``ui/escape.py``): a model's output is hostile HTML, and may hold
bidi controls and other invisible characters, which are shown as visible ``⟨U+202E⟩``
escapes, never raw. No inline ``style`` attributes and no inline event handlers, so the page
runs under a strict CSP (``ui/page.py``). Links are made by a :class:`Links` object: real URLs
for the live ``/ui``, ``#view`` fragments for the static export.

A turn's page is bounded whatever the turn's size: it shows one **part** of it at a time,
:data:`TOKENS_PER_PART` tokens of the strip, :data:`TEXT_CHARS_PER_PART` characters of the
messages and :data:`RAW_CHARS_PER_PART` of the raw request, with a pager between the parts
(:func:`turn_part_count`).

Token elements are ``<span>`` s carrying ``data-token-id``, ``data-logprob``,
``data-version`` and ``data-loss`` (the exported values, position by position) and
classes for their kind (``p`` prompt, ``c`` context carried over from the parent turn,
``b`` bridge / glue tokens between turns, ``g`` generated), their probability bucket
(``l0``..``l9``: exp(logprob) in tenths) and their version lag (``v0``..``v3``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, Protocol
from urllib.parse import quote

from rlgate.ui.escape import e, ejson, et, ev
from rlgate.ui.model import FLAG_WORDS, Episode, SessionRow, Turn

# One part of a turn's page (see the module docstring): with ordinary text about 0.5 MB of
# HTML, at most about 2 MB when every character is an escaped control character.
TOKENS_PER_PART = 4096
TEXT_CHARS_PER_PART = 16_384
RAW_CHARS_PER_PART = 16_384
FIELD_CHARS = 200  # names, roles, tool call ids: shown up to this many characters

# Token texts of a window: ``texts(start, end)`` -> the text of tokens start..end-1 (or all of them)
TokenTexts = Callable[[int, int], Sequence[str]] | Sequence[str] | None


class Links(Protocol):
    def home(self) -> str: ...
    def session(self, sid: str) -> str: ...
    def turn(self, sid: str, tid: str, part: int = 1) -> str: ...
    def group(self, gid: str) -> str: ...


class LiveLinks:
    def home(self) -> str:
        return "/ui"

    def session(self, sid: str) -> str:
        return f"/ui/session?id={quote(sid, safe='')}"

    def turn(self, sid: str, tid: str, part: int = 1) -> str:
        more = f"&part={part}" if part != 1 else ""
        return f"/ui/turn?session={quote(sid, safe='')}&id={quote(tid, safe='')}{more}"

    def group(self, gid: str) -> str:
        return f"/ui/group?id={quote(gid, safe='')}"


class StaticLinks:
    """Views of the static export are ``<template data-view="KEY">``; links are ``#KEY``."""

    def home(self) -> str:
        return "#"

    def session(self, sid: str) -> str:
        return "#" + quote(view_key("s", sid), safe="")

    def turn(self, sid: str, tid: str, part: int = 1) -> str:
        key = view_key("t", sid, tid) if part == 1 else view_key("t", sid, tid, str(part))
        return "#" + quote(key, safe="")

    def group(self, gid: str) -> str:
        return "#" + quote(view_key("g", gid), safe="")


def view_key(kind: str, *parts: str) -> str:
    return kind + ":" + json.dumps(list(parts), ensure_ascii=True, separators=(",", ":"))


# --------------------------------------------------------------------------- small pieces


def badges(flags: Sequence[str]) -> str:
    return "".join(f'<span class="badge f-{e(f)}">{et(FLAG_WORDS.get(f, f))}</span>' for f in flags)


def clip(text: str, limit: int = FIELD_CHARS) -> str:
    """A short field (a name, a role, an id) cut to ``limit`` characters (an ellipsis says so)."""
    return text if len(text) <= limit else text[:limit] + "…"


def fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"


def _a(href: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<a href="{e(href)}"{c}>{et(text)}</a>'


def _kv(pairs: Sequence[tuple[str, str]]) -> str:
    """A definition list; values are already HTML."""
    return '<dl class="kv">' + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


# --------------------------------------------------------------------------- sessions list


def sessions_list(title: str, sessions: Sequence[SessionRow], links: Links, *, omitted: int = 0,
                  omitted_hint: str = "--max-sessions") -> str:
    tasks = sorted({ep.task_id for ep in sessions if ep.task_id is not None})
    policies = sorted({ep.policy for ep in sessions if ep.policy is not None})
    flags = sorted({f for ep in sessions for f in ep.flags})
    rows = []
    for ep in sessions:
        group = _a(links.group(ep.group), ep.group) if ep.group is not None else "–"
        rows.append(
            f'<tr class="srow" data-task="{e(ep.task_id or "")}" data-reward="{e(ep.reward if ep.reward is not None else "")}"'
            f' data-relations="{e(" ".join(ep.relations))}" data-flags="{e(" ".join(ep.flags))}"'
            f' data-policy="{e(ep.policy or "")}">'
            f'<td>{_a(links.session(ep.id), ep.id, "sid")}</td><td>{et(ep.task_id or "–")}</td>'
            f'<td>{et(ep.policy or "–")}</td><td>{group}</td>'
            f'<td class="num">{e(ep.step if ep.step is not None else "–")}</td><td>{et(ep.status or "–")}</td>'
            f'<td class="num">{ep.turns}</td><td class="num">{ep.tokens}</td>'
            f'<td class="num">{fmt(ep.reward)}</td><td class="num">{fmt(ep.advantage)}</td>'
            f'<td>{et(" ".join(ep.relations))}</td><td>{badges(ep.flags)}</td></tr>')
    task_opts = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in tasks[:2000])
    policy_opts = "".join(f'<option value="{e(p)}">{e(p)}</option>' for p in policies)
    flag_opts = "".join(f'<option value="{e(f)}">{e(FLAG_WORDS.get(f, f))}</option>' for f in flags)
    more = (f'<p class="note">{omitted} more sessions are not listed (<code>{et(omitted_hint)}</code>).</p>'
            if omitted else "")
    return (
        f'<h1>{et(title)}</h1>{more}'
        '<form class="filters" id="filters" autocomplete="off">'
        f'<label>task <input name="task" list="tasks" placeholder="any"></label><datalist id="tasks">{task_opts}'
        '</datalist>'
        f'<label>policy <select name="policy"><option value="">any</option>{policy_opts}</select></label>'
        '<label>reward ≥ <input name="rmin" type="number" step="any"></label>'
        '<label>reward ≤ <input name="rmax" type="number" step="any"></label>'
        '<label>relation <select name="relation"><option value="">any</option><option value="root">root</option>'
        '<option value="extend">extend</option><option value="fork">fork</option></select></label>'
        '<label>failures <select name="failures"><option value="">any</option><option value="*">with failures'
        f'</option><option value="-">without</option>{flag_opts}</select></label>'
        f'<span class="count" id="count">{len(sessions)} sessions</span></form>'
        '<table class="sessions"><thead><tr><th>session</th><th>task</th><th>policy</th><th>group</th><th>step</th>'
        '<th>status</th><th>turns</th><th>tokens</th><th>reward</th><th>advantage</th><th>relations</th>'
        f'<th>failures</th></tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


# --------------------------------------------------------------------------- session tree


def session_view(ep: Episode, links: Links) -> str:
    by_parent: dict[str | None, list[Turn]] = {}
    ids = {t.id for t in ep.turns}
    for t in ep.turns:
        by_parent.setdefault(t.parent_id if t.parent_id in ids else None, []).append(t)

    def node(t: Turn) -> str:
        rel = f'<span class="rel r-{e(t.relation)}">{et(t.relation)}</span>'
        if t.relation == "fork":
            rel += f' <span class="why">{et(t.fork_reason or "reason not recorded")}</span>'
        kids = by_parent.get(t.id, [])
        sub = "<ul>" + "".join(node(k) for k in kids) + "</ul>" if kids else ""
        chain = f' · chain of {len(t.chain)}' if t.chain else ""
        return (f'<li class="turn">{rel} {_a(links.turn(ep.id, t.id), t.id, "tid")}'
                f' <span class="meta">{len(t.input_ids)} tokens ({t.n_generated} generated){e(chain)} · '
                f'{et(t.finish_reason or "–")} · reward {fmt(t.reward)}</span> {badges(t.flags)}{sub}</li>')

    tree = "<ul class=\"tree\">" + "".join(node(t) for t in by_parent.get(None, [])) + "</ul>"
    group = _a(links.group(ep.group), ep.group) if ep.group is not None else "–"
    adv = fmt(ep.advantage) + (" (reward − group mean)" if ep.advantage_computed else "")
    head = _kv([("task", et(ep.task_id or "–")), ("policy", et(ep.policy or "–")), ("group", group),
                ("step", e(ep.step if ep.step is not None else "–")),
                ("status", et(ep.status or "–")), ("reward", fmt(ep.reward)), ("advantage", e(adv)),
                ("turns", f"{len(ep.turns)}" + (f", {ep.failed_turns} failed" if ep.failed_turns else "")),
                ("failures", badges(ep.flags) or "none")])
    return (f'<nav class="crumbs">{_a(links.home(), "sessions")} › session</nav>'
            f'<h1>session <span class="sid">{et(ep.id)}</span></h1>{head}<h2>conversation tree</h2>{tree}')


# --------------------------------------------------------------------------- one interaction


def token_kinds(turn: Turn, parent: Turn | None, start: int = 0, end: int | None = None) -> list[str]:
    """Kind of each position start..end-1: p prompt, c context carried from the parent, b bridge / glue,
    g generated."""
    n = len(turn.input_ids)
    end = n if end is None else min(end, n)
    start = max(0, min(start, end))
    kinds = ["g" if m else "p" for m in turn.loss_mask[start:end]]
    first = turn.prompt_len
    if turn.chain and len(turn.chain) > 1:  # concat: non-loss tokens after the first generated one glue turns
        for k in range(max(first, start), end):
            if kinds[k - start] == "p":
                kinds[k - start] = "b"
    elif parent is not None:
        plen = len(parent.input_ids)
        if plen <= first and turn.input_ids[:plen] == parent.input_ids:
            for k in range(start, min(end, first)):
                kinds[k - start] = "c" if k < plen else "b"
    return kinds


_LOG_TENTHS = [math.log(k / 10) for k in range(1, 10)]  # bucket k: exp(logprob) in [k/10, (k+1)/10)


def _show(text: str) -> str:
    return et(text.replace("\n", "↵\n").replace("\t", "→\t"))


def _texts(texts: TokenTexts, start: int, end: int) -> Sequence[str] | None:
    if texts is None:
        return None
    if callable(texts):
        out = texts(start, end)
        if len(out) != end - start:
            raise ValueError(f"token texts for {start}..{end}: got {len(out)}")
        return out
    return texts[start:end]


def token_strip(turn: Turn, parent: Turn | None, texts: TokenTexts, ref_version: int,
                start: int = 0, end: int | None = None) -> str:
    """One span per token of positions ``start..end-1`` (hot loop: ~1 µs per token matters)."""
    end = len(turn.input_ids) if end is None else min(end, len(turn.input_ids))
    start = max(0, min(start, end))
    kinds = token_kinds(turn, parent, start, end)
    window = _texts(texts, start, end)
    shown: dict[str, str] = {}  # escaped text per distinct token text
    out = []
    for k in range(start, end):
        tid, m, lp, v = turn.input_ids[k], turn.loss_mask[k], turn.logprobs[k], turn.versions[k]
        kind = kinds[k - start]
        if kind == "g":
            bucket = 9 if lp != lp or lp > 0 else bisect_right(_LOG_TENTHS, lp)  # NaN / >0: top bucket
            lag = ref_version - v
            kind = f"g l{bucket} v{3 if lag > 3 else lag if lag > 0 else 0}"
        text = window[k - start] if window is not None else f"#{tid} "
        html_text = shown.get(text)
        if html_text is None:
            html_text = shown[text] = _show(text)
        out.append(f'<span class="{kind}" data-token-id="{tid}" data-logprob="{lp:.7g}" data-version="{v}" '
                   f'data-loss="{m}">{html_text}</span>')
    return "".join(out)


# Messages as the client saw them, paged as one stream of text: every text of every message (its
# reasoning, content parts, tool-call arguments) counts its characters, at least 1 each.

@dataclass
class _Block:
    kind: str  # reasoning, text, other, call
    text: str
    label: str = ""  # call: the function's name

    @property
    def units(self) -> int:
        return max(1, len(self.text))


def _blocks(m: Any) -> list[_Block]:
    if not isinstance(m, dict):
        return [_Block("other", "[not a message]")]
    out = []
    reasoning = m.get("reasoning_content") or m.get("reasoning")
    if reasoning:
        out.append(_Block("reasoning", str(reasoning)))
    content = m.get("content")
    if isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                out.append(_Block("text", str(p.get("text", ""))))
            else:
                out.append(_Block("other", f'[{clip(str(p.get("type", "part") if isinstance(p, dict) else "part"))}]'))
    elif content:
        out.append(_Block("text", str(content)))
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        fn = fn if isinstance(fn, dict) else {}
        out.append(_Block("call", str(fn.get("arguments", "")), label=clip(str(fn.get("name", "?")))))
    return out


def _units(blocks: Sequence[_Block]) -> int:
    return sum(b.units for b in blocks) or 1  # a message without text still takes a place


def messages_units(messages: Sequence[tuple[Any, str]]) -> int:
    """Units of text of ``(message, css class)`` pairs (what :func:`messages_html` pages through)."""
    return sum(_units(_blocks(m)) for m, _ in messages)


_CUT_BEFORE = '<span class="cut" title="continued from the previous part">⋯</span>'
_CUT_AFTER = '<span class="cut" title="continued on the next part">⋯</span>'


def _block_html(b: _Block, lo: int, hi: int) -> str:
    """Characters lo..hi-1 of the block's text (with marks where it is cut)."""
    body = (_CUT_BEFORE if lo > 0 else "") + et(b.text[lo:hi]) + (_CUT_AFTER if hi < len(b.text) else "")
    if b.kind == "call":
        return f'<div class="call">→ {et(b.label)}(<code>{body}</code>)</div>'
    if b.kind == "reasoning":
        return f'<div class="reasoning">{body}</div>'
    return f'<div class="text{" other" if b.kind == "other" else ""}">{body}</div>'


def _message_html(m: Any, blocks: Sequence[_Block], cls: str, lo: int, hi: int) -> str:
    """The message's header and the parts of its blocks within units lo..hi-1 (of this message)."""
    parts, off = [], 0
    for b in blocks:
        a, z = max(lo - off, 0), min(hi - off, b.units)
        if a < z:
            parts.append(_block_html(b, a, min(z, len(b.text))))
        off += b.units
    role = str(m.get("role", "?")) if isinstance(m, dict) else "?"
    call_id = m.get("tool_call_id") if isinstance(m, dict) else None
    extra = f' <span class="meta">{et(clip(str(call_id)))}</span>' if call_id else ""
    return (f'<div class="msg m-{e(clip(role, 32))} {cls}"><div class="role">{et(clip(role))}{extra}</div>'
            f'{"".join(parts)}</div>')


def messages_html(messages: Sequence[tuple[Any, str]], lo: int = 0, hi: int | None = None) -> str:
    """``(message, css class)`` pairs; only the text within units lo..hi-1 of the whole stream."""
    out, off = [], 0
    for m, cls in messages:
        blocks = _blocks(m)
        n = _units(blocks)
        if hi is None or (off < hi and off + n > lo):
            out.append(_message_html(m, blocks, cls, lo - off, (hi if hi is not None else off + n) - off))
        off += n
    return "".join(out)


def _turn_messages(turn: Turn) -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = [(m, "") for m in turn.messages]
    if turn.output_message:
        out.append((turn.output_message, "reply"))
    return out


def _raw_request(turn: Turn) -> str:
    request = {"messages": turn.messages, **({"tools": turn.tools} if turn.tools else {}), "sampling": turn.sampling}
    return json.dumps(request, indent=1, ensure_ascii=False)


@dataclass(frozen=True)
class TurnSize:
    tokens: int
    text: int  # units of the messages' text
    raw: int  # characters of the raw request

    @property
    def parts(self) -> int:
        return max(1, -(-self.tokens // TOKENS_PER_PART), -(-self.text // TEXT_CHARS_PER_PART),
                   -(-self.raw // RAW_CHARS_PER_PART))


def turn_size(turn: Turn) -> TurnSize:
    return TurnSize(len(turn.input_ids), messages_units(_turn_messages(turn)), len(_raw_request(turn)))


def turn_part_count(turn: Turn) -> int:
    """How many parts the turn's page has."""
    return turn_size(turn).parts


def _n(x: int) -> str:
    return f"{x:,}"


def _window_note(what: str, unit: str, lo: int, hi: int, total: int, per_part: int) -> str:
    """What this part shows of one pane (nothing when the whole pane fits on one part)."""
    if total <= per_part:
        return ""
    if lo >= total:
        last = -(-total // per_part)
        return f'<p class="window">{what}all {_n(total)} {unit} are on parts 1–{_n(last)}</p>'
    return f'<p class="window">{what}{unit} {_n(lo)}–{_n(min(hi, total) - 1)} of {_n(total)}</p>'


def pager(links: Links, sid: str, tid: str, part: int, parts: int,
          available: Collection[int] | None = None) -> str:
    """Links between the parts of a turn's page (``available``: the parts that exist, default all)."""
    if parts <= 1:
        return ""
    have = sorted(p for p in available if 1 <= p <= parts) if available is not None else None

    def exists(p: int) -> bool:
        return 1 <= p <= parts and (have is None or p in have)

    if have is None:
        prev, nxt = part - 1, part + 1
    else:
        prev = max((p for p in have if p < part), default=0)
        nxt = min((p for p in have if p > part), default=0)
    items = [f'<span class="where">part {_n(part)} of {_n(parts)}</span>']
    for label, target, rel in (("« first", 1, "first"), ("‹ previous", prev, "prev"), ("next ›", nxt, "next"),
                               (f"last ({_n(parts)}) »", parts, "last")):
        if exists(target) and target != part:
            items.append(f'<a href="{e(links.turn(sid, tid, target))}" rel="{rel}" data-part="{target}">{label}</a>')
        else:
            items.append(f'<span class="off">{label}</span>')
    if isinstance(links, LiveLinks):  # a server to ask: any part by its number
        items.append(f'<form method="get" action="/ui/turn" class="jump"><input type="hidden" name="session" '
                     f'value="{ev(sid)}"><input type="hidden" name="id" value="{ev(tid)}"><label>part <input '
                     f'type="number" name="part" min="1" max="{parts}" value="{part}" required></label>'
                     '<button type="submit">go</button></form>')
    missing = ""
    if have is not None and len(have) < parts:
        shown = " and ".join(_n(p) for p in have)
        missing = (f'<p class="note">This file holds parts {shown} of {_n(parts)} of this turn (its start and its '
                   f'end); the other parts are left out to keep the file small. Every part is in the live viewer '
                   f'(<code>rlgate serve --ui</code>, <code>/ui/turn?…&amp;part=N</code>) while the gateway holds the '
                   f'session.</p>')
    return f'<nav class="pager" data-part="{part}" data-parts="{parts}">{" ".join(items)}</nav>{missing}'


def interaction_view(ep: Episode, turn: Turn, texts: TokenTexts, links: Links, *,
                     newest_version: int | Mapping[str | None, int], stale_lag: int, part: int = 1,
                     available: Collection[int] | None = None) -> str:
    """One part of a turn's page (``part`` 1-based, clamped to the turn's parts): a window of the
    token strip, of the messages and of the raw request, and the pager between the parts.
    ``newest_version``: the reference version, or one per policy."""
    by_id = {t.id: t for t in ep.turns}
    parent = by_id.get(turn.parent_id) if turn.parent_id else None
    newest = newest_version if isinstance(newest_version, int) else newest_version.get(turn.policy, -1)
    ref = turn.train_version if turn.train_version is not None else newest
    gen = turn.generated_versions()
    lps = list(compress(turn.logprobs, turn.loss_mask))
    parent_link = _a(links.turn(ep.id, parent.id), parent.id) if parent is not None else et(turn.parent_id or "–")
    rel = et(turn.relation) + (f" ({et(turn.fork_reason or 'reason not recorded')})" if turn.relation == "fork" else "")
    head = _kv([
        ("session", _a(links.session(ep.id), ep.id)), ("policy", et(turn.policy or "–")), ("relation", rel),
        ("parent", parent_link),
        ("surface", et(turn.api or "–")), ("finish", et(turn.finish_reason or "–")), ("reward", fmt(turn.reward)),
        ("advantage", fmt(turn.advantage if turn.advantage is not None else ep.advantage)),
        ("tokens", f"{len(turn.input_ids)} ({len(gen)} generated)"),
        ("mean logprob", fmt(sum(lps) / len(lps)) if lps else "–"),
        ("versions", e(f"{min(gen)}–{max(gen)} (reference {ref}; stale when > {stale_lag} behind)") if gen else "–"),
        ("failures", badges(turn.flags) or "none"),
    ])
    msgs = _turn_messages(turn)
    raw = _raw_request(turn)
    size = TurnSize(len(turn.input_ids), messages_units(msgs), len(raw))
    parts = size.parts
    part = max(1, min(part, parts))
    t0, t1 = (part - 1) * TOKENS_PER_PART, part * TOKENS_PER_PART
    m0, m1 = (part - 1) * TEXT_CHARS_PER_PART, part * TEXT_CHARS_PER_PART
    r0, r1 = (part - 1) * RAW_CHARS_PER_PART, part * RAW_CHARS_PER_PART
    if parts == 1:
        messages = messages_html(msgs)
    else:
        messages = (_window_note("messages: ", "characters", m0, m1, size.text, TEXT_CHARS_PER_PART)
                    + messages_html(msgs, m0, m1))
    raw_note = _window_note("", "characters", r0, r1, size.raw, RAW_CHARS_PER_PART)
    strip_note = _window_note("", "tokens", t0, t1, size.tokens, TOKENS_PER_PART)
    shown_end = min(t1, size.tokens)
    nav = pager(links, ep.id, turn.id, part, parts, available)
    group = f' · {_a(links.group(ep.group), "group " + ep.group)}' if ep.group is not None else ""
    return (
        f'<nav class="crumbs">{_a(links.home(), "sessions")} › {_a(links.session(ep.id), ep.id)}{group} › turn</nav>'
        f'<h1>turn <span class="tid">{et(turn.id)}</span></h1>{head}'
        '<div class="controls"><button type="button" class="toggle" data-show="tokens">rendered tokens</button>'
        '<button type="button" class="toggle" data-show="messages">messages</button>'
        '<label>colour <select class="colour"><option value="logprob">logprob</option>'
        '<option value="version">version lag</option><option value="loss">loss mask</option></select></label>'
        '<span class="legend"><span class="p">prompt</span><span class="c">context</span><span class="b">bridge</span>'
        '<span class="g l9">p≈1</span><span class="g l5">p≈.5</span><span class="g l0">p≈0</span></span></div>'
        f'{nav}<div class="turnview show-tokens">'
        f'<div class="pane tokens">{strip_note}<div class="strip colour-logprob" data-turn="{e(turn.id)}" '
        f'data-count="{size.tokens}" data-start="{min(t0, shown_end)}" data-end="{shown_end}">'
        f'{token_strip(turn, parent, texts, ref, t0, t1)}</div></div>'
        f'<div class="pane messages">{messages}</div>'
        f'<aside class="raw"><h3>raw request</h3>{raw_note}<pre>{ejson(raw[r0:r1])}</pre>'
        f'</aside></div>{nav}'
    )


# --------------------------------------------------------------------------- GRPO group


def group_view(gid: str, members: list[Episode], links: Links) -> str:
    rewards = [m.reward for m in members if m.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    cols = []
    for ep in sorted(members, key=lambda m: (m.reward is None, -(m.reward or 0.0))):
        last = ep.turns[-1] if ep.turns else None
        if last is not None and last.output_message:
            reply = messages_html([(last.output_message, "reply")], 0, TEXT_CHARS_PER_PART)
            if messages_units([(last.output_message, "reply")]) > TEXT_CHARS_PER_PART:
                reply += f'<p class="note">the reply is cut at {_n(TEXT_CHARS_PER_PART)} characters: see its turn</p>'
        else:
            reply = '<p class="meta">no reply</p>'
        adv = fmt(ep.advantage) + (" *" if ep.advantage_computed else "")
        last_link = _a(links.turn(ep.id, last.id), "last turn") if last is not None else ""
        cols.append(
            f'<section class="member" data-session="{e(ep.id)}"><h3>{_a(links.session(ep.id), ep.id)}</h3>'
            + _kv([("reward", fmt(ep.reward)), ("advantage", e(adv)), ("turns", str(len(ep.turns))),
                   ("tokens", str(ep.n_tokens)), ("failures", badges(ep.flags) or "none")])
            + f'{reply}<p>{last_link}</p></section>')
    computed = any(m.advantage_computed for m in members)
    note = '<p class="note">* advantage computed here as reward − group mean (the file has none).</p>' \
        if computed else ""
    return (f'<nav class="crumbs">{_a(links.home(), "sessions")} › group</nav>'
            f'<h1>group <span class="gid">{et(gid)}</span></h1>'
            + _kv([("episodes", str(len(members))), ("mean reward", fmt(mean)),
                   ("rewards", e(" ".join(fmt(r) for r in sorted(rewards, reverse=True))))])
            + f'{note}<div class="group">{"".join(cols)}</div>')


TextsFor = Callable[[Turn], TokenTexts]
