"""``rlgate view EXPORT --out view.html``: the viewer as one self-contained HTML file.

Every view (sessions list, each session, each turn, each GRPO group) is rendered here, by
the same functions as the live ``/ui``, and stored as text in a non-executed
``<script type="text/html" data-view="KEY">`` element; the page's script puts the one the URL
fragment names into ``<main>`` (``innerHTML`` of HTML this module rendered, every data string
in it escaped). Measured (benchmarks/viewer_open.py, 200 sessions, 129k token elements, 14 MB):
as ``<template>`` elements the browser built every view's DOM at open, 6.6-7.2 s in Chromium on
the 2-core machine; as text it only scans the file and builds the shown view.

A long turn is cut as in the live ``/ui`` (``render.py``: parts of 4,096 tokens, 16,384
characters of messages and of the raw request), but a file cannot fetch a part: it holds the
first and the last part of each turn (the prompt's start, and the end, where the generated
tokens are), as views of their own, with a note saying which parts are left out. So each view
is bounded, and so is a turn's share of the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from rlgate.config import STALE_LAG
from rlgate.ui.files import read_samples
from rlgate.ui.model import Episode, Run, Turn, episodes_from_rows, mark_stale, row_of
from rlgate.ui.page import document
from rlgate.ui.render import (
    StaticLinks,
    TextsFor,
    TokenTexts,
    e,
    group_view,
    interaction_view,
    session_view,
    sessions_list,
    turn_part_count,
)
from rlgate.ui.tokens import token_texts_window


def build_run(rows: Sequence[dict[str, Any]], *, title: str, max_sessions: int | None = None,
              stale_lag: int = STALE_LAG) -> Run:
    episodes = episodes_from_rows(rows)
    omitted = 0
    if max_sessions is not None and len(episodes) > max_sessions:
        omitted = len(episodes) - max_sessions
        episodes = episodes[:max_sessions]
    mark_stale(episodes, stale_lag)
    return Run(title, episodes, stale_lag=stale_lag, omitted=omitted)


def static_parts(turn: Turn) -> list[int]:
    """The parts of a turn's page that a static file holds: the first and the last."""
    n = turn_part_count(turn)
    return [1] if n == 1 else [1, n]


def render_static(run: Run, texts_for: TextsFor) -> str:
    links = StaticLinks()
    newest = run.newest_versions
    parts = [_template("home", sessions_list(run.title, [row_of(ep) for ep in run.episodes], links,
                                             omitted=run.omitted))]
    for ep in run.episodes:
        parts.append(_template(_key(links.session(ep.id)), session_view(ep, links)))
        for t in ep.turns:
            texts = texts_for(t)
            have = static_parts(t)
            for p in have:
                parts.append(_template(_key(links.turn(ep.id, t.id, p)), interaction_view(
                    ep, t, texts, links, newest_version=newest, stale_lag=run.stale_lag, part=p, available=have)))
    for gid, members in run.groups().items():
        parts.append(_template(_key(links.group(gid)), group_view(gid, members, links)))
    return document(run.title, "", mode="static", templates="".join(parts))


def _key(href: str) -> str:
    """The view key a static link points at."""
    return unquote(href[1:])


def _template(key: str, body: str) -> str:
    # Script data ends at "</script" and changes state at "<!--": neither can occur in the rendered
    # views (every data string went through html.escape, so no "<" comes from data), but check.
    low = body.lower()
    if "</script" in low or "<!--" in low:
        raise ValueError(f"view {key!r}: unexpected markup in rendered HTML")
    return f'<script type="text/html" data-view="{e(key)}">{body}</script>'


def write_view(paths: Sequence[str | Path], out: str | Path, *, tokenizer: Any = None, title: str | None = None,
               max_sessions: int | None = None, stale_lag: int = STALE_LAG) -> tuple[Path, Run]:
    rows = read_samples(paths)
    run = build_run(rows, title=title or ", ".join(Path(p).name for p in paths), max_sessions=max_sessions,
                    stale_lag=stale_lag)

    def texts(t: Turn) -> TokenTexts:
        if tokenizer is None:
            return None

        def window(start: int, end: int) -> list[str]:
            return token_texts_window(tokenizer, t.input_ids, start, end)

        return window

    out = Path(out)
    out.write_text(render_static(run, texts), encoding="utf-8")
    return out, run


__all__ = ["Episode", "build_run", "render_static", "write_view"]
