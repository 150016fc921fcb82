"""HTML for the viewer's four views: sessions list, session tree, interaction, GRPO group.

Every string that comes from data (messages, model output, ids, tasks) goes through
:func:`e` (``html.escape``): a model's output is hostile HTML. No inline ``style``
attributes and no inline event handlers, so the page runs under a strict CSP
(``ui/assets.py``). Links are made by a :class:`Links` object: real URLs for the live
``/ui``, ``#view`` fragments for the static export.

Token elements are ``<span>`` s carrying ``data-token-id``, ``data-logprob``,
``data-version`` and ``data-loss`` (the exported values, position by position) and
classes for their kind (``p`` prompt, ``c`` context carried over from the parent turn,
``b`` bridge / glue tokens between turns, ``g`` generated), their probability bucket
(``l0``..``l9``: exp(logprob) in tenths) and their version lag (``v0``..``v3``).
"""

from __future__ import annotations

import html
import json
import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, Protocol
from urllib.parse import quote

from rlgate.ui.model import FLAG_WORDS, Episode, SessionRow, Turn


def e(x: Any) -> str:
    return html.escape(str(x), quote=True)


class Links(Protocol):
    def home(self) -> str: ...
    def session(self, sid: str) -> str: ...
    def turn(self, sid: str, tid: str) -> str: ...
    def group(self, gid: str) -> str: ...


class LiveLinks:
    def home(self) -> str:
        return "/ui"

    def session(self, sid: str) -> str:
        return f"/ui/session?id={quote(sid, safe='')}"

    def turn(self, sid: str, tid: str) -> str:
        return f"/ui/turn?session={quote(sid, safe='')}&id={quote(tid, safe='')}"

    def group(self, gid: str) -> str:
        return f"/ui/group?id={quote(gid, safe='')}"


class StaticLinks:
    """Views of the static export are ``<template data-view="KEY">``; links are ``#KEY``."""

    def home(self) -> str:
        return "#"

    def session(self, sid: str) -> str:
        return "#" + quote(view_key("s", sid), safe="")

    def turn(self, sid: str, tid: str) -> str:
        return "#" + quote(view_key("t", sid, tid), safe="")

    def group(self, gid: str) -> str:
        return "#" + quote(view_key("g", gid), safe="")


def view_key(kind: str, *parts: str) -> str:
    return kind + ":" + json.dumps(list(parts), ensure_ascii=True, separators=(",", ":"))


# --------------------------------------------------------------------------- small pieces


def badges(flags: Sequence[str]) -> str:
    return "".join(f'<span class="badge f-{e(f)}">{e(FLAG_WORDS.get(f, f))}</span>' for f in flags)


def fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"


def _a(href: str, text: str, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<a href="{e(href)}"{c}>{e(text)}</a>'


def _kv(pairs: Sequence[tuple[str, str]]) -> str:
    """A definition list; values are already HTML."""
    return '<dl class="kv">' + "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in pairs) + "</dl>"


# --------------------------------------------------------------------------- sessions list


def sessions_list(title: str, sessions: Sequence[SessionRow], links: Links, *, omitted: int = 0,
                  omitted_hint: str = "--max-sessions") -> str:
    tasks = sorted({ep.task_id for ep in sessions if ep.task_id is not None})
    flags = sorted({f for ep in sessions for f in ep.flags})
    rows = []
    for ep in sessions:
        group = _a(links.group(ep.group), ep.group) if ep.group is not None else "–"
        rows.append(
            f'<tr class="srow" data-task="{e(ep.task_id or "")}" data-reward="{e(ep.reward if ep.reward is not None else "")}"'
            f' data-relations="{e(" ".join(ep.relations))}" data-flags="{e(" ".join(ep.flags))}">'
            f'<td>{_a(links.session(ep.id), ep.id, "sid")}</td><td>{e(ep.task_id or "–")}</td><td>{group}</td>'
            f'<td class="num">{e(ep.step if ep.step is not None else "–")}</td><td>{e(ep.status or "–")}</td>'
            f'<td class="num">{ep.turns}</td><td class="num">{ep.tokens}</td>'
            f'<td class="num">{fmt(ep.reward)}</td><td class="num">{fmt(ep.advantage)}</td>'
            f'<td>{e(" ".join(ep.relations))}</td><td>{badges(ep.flags)}</td></tr>')
    task_opts = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in tasks[:2000])
    flag_opts = "".join(f'<option value="{e(f)}">{e(FLAG_WORDS.get(f, f))}</option>' for f in flags)
    more = (f'<p class="note">{omitted} more sessions are not listed (<code>{e(omitted_hint)}</code>).</p>'
            if omitted else "")
    return (
        f'<h1>{e(title)}</h1>{more}'
        '<form class="filters" id="filters" autocomplete="off">'
        f'<label>task <input name="task" list="tasks" placeholder="any"></label><datalist id="tasks">{task_opts}'
        '</datalist>'
        '<label>reward ≥ <input name="rmin" type="number" step="any"></label>'
        '<label>reward ≤ <input name="rmax" type="number" step="any"></label>'
        '<label>relation <select name="relation"><option value="">any</option><option value="root">root</option>'
        '<option value="extend">extend</option><option value="fork">fork</option></select></label>'
        '<label>failures <select name="failures"><option value="">any</option><option value="*">with failures'
        f'</option><option value="-">without</option>{flag_opts}</select></label>'
        f'<span class="count" id="count">{len(sessions)} sessions</span></form>'
        '<table class="sessions"><thead><tr><th>session</th><th>task</th><th>group</th><th>step</th>'
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
        rel = f'<span class="rel r-{e(t.relation)}">{e(t.relation)}</span>'
        if t.relation == "fork":
            rel += f' <span class="why">{e(t.fork_reason or "reason not recorded")}</span>'
        kids = by_parent.get(t.id, [])
        sub = "<ul>" + "".join(node(k) for k in kids) + "</ul>" if kids else ""
        chain = f' · chain of {len(t.chain)}' if t.chain else ""
        return (f'<li class="turn">{rel} {_a(links.turn(ep.id, t.id), t.id, "tid")}'
                f' <span class="meta">{len(t.input_ids)} tokens ({t.n_generated} generated){e(chain)} · '
                f'{e(t.finish_reason or "–")} · reward {fmt(t.reward)}</span> {badges(t.flags)}{sub}</li>')

    tree = "<ul class=\"tree\">" + "".join(node(t) for t in by_parent.get(None, [])) + "</ul>"
    group = _a(links.group(ep.group), ep.group) if ep.group is not None else "–"
    adv = fmt(ep.advantage) + (" (reward − group mean)" if ep.advantage_computed else "")
    head = _kv([("task", e(ep.task_id or "–")), ("group", group), ("step", e(ep.step if ep.step is not None else "–")),
                ("status", e(ep.status or "–")), ("reward", fmt(ep.reward)), ("advantage", e(adv)),
                ("turns", f"{len(ep.turns)}" + (f", {ep.failed_turns} failed" if ep.failed_turns else "")),
                ("failures", badges(ep.flags) or "none")])
    return (f'<nav class="crumbs">{_a(links.home(), "sessions")} › session</nav>'
            f'<h1>session <span class="sid">{e(ep.id)}</span></h1>{head}<h2>conversation tree</h2>{tree}')


# --------------------------------------------------------------------------- one interaction


def token_kinds(turn: Turn, parent: Turn | None) -> list[str]:
    """Kind of each position: p prompt, c context carried from the parent, b bridge / glue, g generated."""
    n = len(turn.input_ids)
    kinds = ["g" if m else "p" for m in turn.loss_mask]
    first = turn.prompt_len
    if turn.chain and len(turn.chain) > 1:  # concat: non-loss tokens after the first generated one glue turns
        for k in range(first, n):
            if kinds[k] == "p":
                kinds[k] = "b"
    elif parent is not None:
        plen = len(parent.input_ids)
        if plen <= first and turn.input_ids[:plen] == parent.input_ids:
            kinds[:plen] = ["c"] * plen
            kinds[plen:first] = ["b"] * (first - plen)
    return kinds


_LOG_TENTHS = [math.log(k / 10) for k in range(1, 10)]  # bucket k: exp(logprob) in [k/10, (k+1)/10)


def _show(text: str) -> str:
    return e(text.replace("\n", "↵\n").replace("\t", "→\t"))


def token_strip(turn: Turn, parent: Turn | None, texts: Sequence[str] | None, ref_version: int) -> str:
    """One span per token (hot loop: ~1 µs per token matters on 10,000-token turns)."""
    kinds = token_kinds(turn, parent)
    shown: dict[str, str] = {}  # escaped text per distinct token text
    out = []
    for k, (tid, m, lp, v) in enumerate(zip(turn.input_ids, turn.loss_mask, turn.logprobs, turn.versions,
                                            strict=True)):
        kind = kinds[k]
        if kind == "g":
            bucket = 9 if lp != lp or lp > 0 else bisect_right(_LOG_TENTHS, lp)  # NaN / >0: top bucket
            lag = ref_version - v
            kind = f"g l{bucket} v{3 if lag > 3 else lag if lag > 0 else 0}"
        text = texts[k] if texts is not None else f"#{tid} "
        html_text = shown.get(text)
        if html_text is None:
            html_text = shown[text] = _show(text)
        out.append(f'<span class="{kind}" data-token-id="{tid}" data-logprob="{lp:.7g}" data-version="{v}" '
                   f'data-loss="{m}">{html_text}</span>')
    return "".join(out)


def _message_html(m: dict[str, Any], cls: str = "") -> str:
    role = m.get("role", "?")
    parts = []
    if m.get("reasoning_content") or m.get("reasoning"):
        parts.append(f'<div class="reasoning">{e(m.get("reasoning_content") or m.get("reasoning"))}</div>')
    content = m.get("content")
    if isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append(f'<div class="text">{e(p.get("text", ""))}</div>')
            else:
                parts.append(f'<div class="text other">[{e(p.get("type", "part") if isinstance(p, dict) else "part")}]</div>')
    elif content:
        parts.append(f'<div class="text">{e(content)}</div>')
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f'<div class="call">→ {e(fn.get("name", "?"))}(<code>{e(fn.get("arguments", ""))}</code>)</div>')
    extra = f' <span class="meta">{e(m["tool_call_id"])}</span>' if m.get("tool_call_id") else ""
    return f'<div class="msg m-{e(role)} {cls}"><div class="role">{e(role)}{extra}</div>{"".join(parts)}</div>'


def interaction_view(ep: Episode, turn: Turn, texts: Sequence[str] | None, links: Links, *,
                     newest_version: int, stale_lag: int) -> str:
    by_id = {t.id: t for t in ep.turns}
    parent = by_id.get(turn.parent_id) if turn.parent_id else None
    ref = turn.train_version if turn.train_version is not None else newest_version
    gen = turn.generated_versions()
    lps = [lp for lp, m in zip(turn.logprobs, turn.loss_mask, strict=False) if m]
    parent_link = _a(links.turn(ep.id, parent.id), parent.id) if parent is not None else e(turn.parent_id or "–")
    rel = e(turn.relation) + (f" ({e(turn.fork_reason or 'reason not recorded')})" if turn.relation == "fork" else "")
    head = _kv([
        ("session", _a(links.session(ep.id), ep.id)), ("relation", rel), ("parent", parent_link),
        ("surface", e(turn.api or "–")), ("finish", e(turn.finish_reason or "–")), ("reward", fmt(turn.reward)),
        ("advantage", fmt(turn.advantage if turn.advantage is not None else ep.advantage)),
        ("tokens", f"{len(turn.input_ids)} ({len(gen)} generated)"),
        ("mean logprob", fmt(sum(lps) / len(lps)) if lps else "–"),
        ("versions", e(f"{min(gen)}–{max(gen)} (reference {ref}; stale when > {stale_lag} behind)") if gen else "–"),
        ("failures", badges(turn.flags) or "none"),
    ])
    request = {"messages": turn.messages, **({"tools": turn.tools} if turn.tools else {}), "sampling": turn.sampling}
    messages = "".join(_message_html(m) for m in turn.messages)
    if turn.output_message:
        messages += _message_html(turn.output_message, "reply")
    group = f' · {_a(links.group(ep.group), "group " + ep.group)}' if ep.group is not None else ""
    return (
        f'<nav class="crumbs">{_a(links.home(), "sessions")} › {_a(links.session(ep.id), ep.id)}{group} › turn</nav>'
        f'<h1>turn <span class="tid">{e(turn.id)}</span></h1>{head}'
        '<div class="controls"><button type="button" class="toggle" data-show="tokens">rendered tokens</button>'
        '<button type="button" class="toggle" data-show="messages">messages</button>'
        '<label>colour <select class="colour"><option value="logprob">logprob</option>'
        '<option value="version">version lag</option><option value="loss">loss mask</option></select></label>'
        '<span class="legend"><span class="p">prompt</span><span class="c">context</span><span class="b">bridge</span>'
        '<span class="g l9">p≈1</span><span class="g l5">p≈.5</span><span class="g l0">p≈0</span></span></div>'
        '<div class="turnview show-tokens">'
        f'<div class="pane tokens"><div class="strip colour-logprob" data-turn="{e(turn.id)}" data-count="{len(turn.input_ids)}">'
        f'{token_strip(turn, parent, texts, ref)}</div></div>'
        f'<div class="pane messages">{messages}</div>'
        f'<aside class="raw"><h3>raw request</h3><pre>{e(json.dumps(request, indent=1, ensure_ascii=False))}</pre>'
        '</aside></div>'
    )


# --------------------------------------------------------------------------- GRPO group


def group_view(gid: str, members: list[Episode], links: Links) -> str:
    rewards = [m.reward for m in members if m.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    cols = []
    for ep in sorted(members, key=lambda m: (m.reward is None, -(m.reward or 0.0))):
        last = ep.turns[-1] if ep.turns else None
        reply = _message_html(last.output_message, "reply") if last is not None and last.output_message else \
            '<p class="meta">no reply</p>'
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
            f'<h1>group <span class="gid">{e(gid)}</span></h1>'
            + _kv([("episodes", str(len(members))), ("mean reward", fmt(mean)),
                   ("rewards", e(" ".join(fmt(r) for r in sorted(rewards, reverse=True))))])
            + f'{note}<div class="group">{"".join(cols)}</div>')


TextsFor = Callable[[Turn], Sequence[str] | None]
