"""``GET /ui/online``: feedback rate and live reward per policy version (``rlgate serve --online --ui``).

Read from the gateway's :class:`~rlgate.metrics.feedback.FeedbackMetrics` (the same numbers
``/metrics`` exposes), plus the tenants and what data-rights deletions did. Part 2 adds the canary's
state and decisions and the staleness of what is trained (docs/online.md).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from rlgate.api.app_state import online_learners, online_state, online_training
from rlgate.online.service import OnlineGateway
from rlgate.ui.auth import is_viewer
from rlgate.ui.escape import e
from rlgate.ui.page import SECURITY_HEADERS, content_security_policy, document

router = APIRouter(include_in_schema=False)


def _fmt(x: float | None, pattern: str) -> str:
    return "-" if x is None else pattern.format(x)


def online_section(online: OnlineGateway) -> str:
    """The page's body: one row per policy version (newest last), then tenants and deletions."""
    rows = "".join(
        f"<tr><td>{e(v.version)}</td><td>{v.turns}</td><td>{v.turns_with_feedback}</td>"
        f"<td>{e(_fmt(v.feedback_rate, '{:.1%}'))}</td><td>{v.rewarded}</td>"
        f"<td>{e(_fmt(v.reward_mean, '{:+.3f}'))}</td></tr>"
        for v in online.metrics.by_version.values())
    active = sum(1 for t in online.tenants.tenants.values() if t.active)
    deleted = ", ".join(f"{n} {what}" for what, n in online.rights.deleted.items())
    return (
        "<h1>online: feedback per policy version</h1>"
        "<table class=\"online\"><thead><tr><th>policy version</th><th>turns</th><th>turns with feedback</th>"
        "<th>feedback rate</th><th>rewarded turns</th><th>mean reward</th></tr></thead>"
        f"<tbody>{rows or '<tr><td colspan=6>no turns yet</td></tr>'}</tbody></table>"
        f"<p>{active} active tenants ({len(online.tenants.tenants)} in all); deleted on request or by "
        f"retention: {e(deleted)}</p><p><a href=\"/ui\">sessions</a></p>")


@router.get("/ui/online")
async def online_page(request: Request) -> Response:
    resp: Response
    if not is_viewer(request):
        resp = RedirectResponse("/ui/login", status_code=303)
    else:
        online = online_state(request.app)
        assert online is not None  # this page is routed only in the online mode
        body = online_section(online)
        training = online_training(request.app)
        learners = online_learners(request.app)  # --online-train-adapters: one section per learning policy
        trainings = [training] if training is not None else learners.all() if learners is not None else []
        if trainings:
            from rlgate.ui.online_training import training_section

            body += "".join(training_section(t) for t in trainings)
        resp = HTMLResponse(document("online", body, mode="live"))
    resp.headers.update(SECURITY_HEADERS)
    resp.headers["Content-Security-Policy"] = content_security_policy()
    return resp
