"""``/ui/data/...``: the viewer's model as JSON, for a cluster router that shows every replica.

The router (``cluster/router_viewer.py``) asks each replica for these and renders one page with
the same functions ``/ui`` uses, so the sessions list and a group's page show the whole cluster
(a GRPO group's episodes are spread over replicas). Admin only, like every ``/ui`` route.

=====================================  =========================================
route                                  what
=====================================  =========================================
GET /ui/data/sessions?limit=N          ``{"total", "rows"}``: newest rows first
GET /ui/data/group?id=GID              ``{"episodes"}``: the group's episodes
=====================================  =========================================
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Request

from rlgate.errors import AuthenticationFailed
from rlgate.ui.auth import is_viewer
from rlgate.ui.live import group_episodes, session_rows

router = APIRouter(include_in_schema=False)
MAX_ROWS = 100_000


def _require_viewer(request: Request) -> None:
    if not is_viewer(request):
        raise AuthenticationFailed("the viewer's data needs the admin key")


@router.get("/ui/data/sessions")
async def sessions_data(request: Request, limit: int = 2000) -> dict[str, Any]:
    _require_viewer(request)
    mgr = request.app.state.gateway.sessions
    held = sorted(mgr.sessions.values(), key=lambda s: s.created_at, reverse=True)
    shown = held[:max(1, min(limit, MAX_ROWS))]
    rows = [{**asdict(r), "created_at": s.created_at} for r, s in zip(session_rows(shown), shown, strict=True)]
    return {"total": len(held), "rows": rows}


@router.get("/ui/data/group")
async def group_data(request: Request, id: str = "") -> dict[str, Any]:  # noqa: A002 - the query parameter
    _require_viewer(request)
    return {"episodes": [asdict(ep) for ep in group_episodes(request.app.state.gateway.sessions, id)]}
