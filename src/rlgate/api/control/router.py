"""Control routes (original AReaL paths).

=========================  ===========  ==========================================
route                      key          what
=========================  ===========  ==========================================
POST /grant_capacity       admin        admit one more session (granted mode)
POST /rl/start_session     admin        new session + its API key
POST /rl/start_sessions    admin        several sessions in one call (rlgate)
POST /rl/end_session       session      end the session (idempotent)
POST /rl/set_reward        session/adm  reward an interaction (default: last one)
POST /export_trajectories  admin        samples of an ended session
POST /rl/finish_session    admin        end + rewards + export in one call (rlgate)
POST /rl/collect           admin        exports of finished sessions, oldest first
POST /rl/update_weights    admin        load a checkpoint into the engine (or a policy's adapter)
GET/POST /rl/policies      admin        the policies served; load an adapter policy (api/control/policies.py)
POST /rl/policies/unload   admin        unload an adapter policy
GET  /rl/metrics           admin        counters (JSON)
GET  /metrics              admin        Prometheus text format (docs/operations.md)
GET  /health               none         liveness, weight version, degraded guards
GET  /v1/models, /models   any key      the served policies (the default first)
=========================  ===========  ==========================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from rlgate.api.auth import is_admin_request, require_admin, session_from_request, tenant_from_request
from rlgate.api.common import check_depth, has_lone_surrogate, has_non_finite, validation_message
from rlgate.api.control.protocol import (
    CollectRequest,
    ExportRequest,
    FinishSessionRequest,
    GrantCapacityRequest,
    SetRewardRequest,
    StartSessionRequest,
    StartSessionsRequest,
    UpdateWeightsRequest,
)
from rlgate.core.gateway import Gateway
from rlgate.engine.base import EngineError
from rlgate.engine.capabilities import ChecksWeights, DescribesBackends
from rlgate.engine.weight_check import WeightCheck
from rlgate.errors import GatewayError, InvalidRequest, NotFound, PermissionDenied, engine_failure, error_body
from rlgate.trajectory.interaction import Session

log = logging.getLogger("rlgate.server")

router = APIRouter()


def gw(request: Request) -> Gateway:
    return request.app.state.gateway

@router.post("/grant_capacity", tags=["control"],
          openapi_extra={"requestBody": {"required": False, "content": {"application/json": {
              "schema": GrantCapacityRequest.model_json_schema()}}}})
async def grant_capacity(request: Request) -> dict[str, int]:
    """Admit one more session (the original), or ``{"count": n}`` more (rlgate extension)."""
    require_admin(request)
    raw = await request.body()
    count = 1
    if raw.strip():
        try:
            count = GrantCapacityRequest.model_validate_json(raw).count
        except ValidationError as exc:
            raise InvalidRequest(validation_message(exc)[0], status=422) from exc
    return {"capacity": gw(request).sessions.grant_capacity(count)}

@router.post("/rl/start_session", tags=["control"])
async def start_session(request: Request, body: StartSessionRequest) -> dict[str, str]:
    require_admin(request)
    return _start(request, body)

@router.post("/rl/start_sessions", tags=["control"])
async def start_sessions(request: Request, body: StartSessionsRequest) -> dict[str, Any]:
    """Start each session as ``/rl/start_session`` would, in order (rlgate extension: a rollout
    starts a step's episodes in one call). Each item is the session (``session_id``, ``api_key``)
    or, where that one was refused, ``{"status": <HTTP status>, "error": {...}}`` as the single
    call would have answered (e.g. 429 ``no_capacity`` past the granted capacity); the others
    stand."""
    require_admin(request)
    out: list[dict[str, Any]] = []
    for item in body.sessions:
        try:
            out.append(_start(request, item))
        except GatewayError as exc:
            out.append({"status": exc.status, **error_body(exc, "openai")})
    return {"sessions": out}

def _start(request: Request, body: StartSessionRequest) -> dict[str, str]:
    check_depth(body.metadata, gw(request).config.max_json_depth, "metadata", "metadata")
    for name in ("task_id", "api_key", "metadata"):
        if has_lone_surrogate(getattr(body, name)):  # could be neither stored nor sent back
            raise InvalidRequest(f"{name} contains an unpaired UTF-16 surrogate (e.g. \\ud800)", param=name,
                                 code="invalid_unicode")
    if has_non_finite(body.metadata):
        raise InvalidRequest("metadata holds NaN or an infinite number, which is not valid JSON", param="metadata",
                             code="invalid_json")
    policy = gw(request).policies.require(body.policy).name if body.policy is not None else None
    session, key = gw(request).sessions.start_session(
        body.task_id, body.api_key, mode=body.mode, metadata=body.metadata, policy=policy
    )
    return {"session_id": session.id, "api_key": key}

@router.post("/rl/end_session", tags=["control"])
async def end_session(request: Request) -> dict[str, Any]:
    session = session_from_request(request)
    n = gw(request).sessions.end_session(session)
    return {"message": "success", "session_id": session.id, "interaction_count": n}

@router.post("/rl/set_reward", tags=["control"])
async def set_reward(request: Request, body: SetRewardRequest) -> dict[str, Any]:
    mgr = gw(request).sessions
    if is_admin_request(request):
        if body.session_id is None:
            raise InvalidRequest("with the admin key, session_id is required", param="session_id")
        session = mgr.sessions.get(body.session_id)
        if session is None or session.exported_at is not None:
            raise NotFound(f"session {body.session_id!r} not found")
    else:
        session = session_from_request(request)
        if body.session_id is not None and body.session_id != session.id:
            raise PermissionDenied("a session key can only reward its own session")
        if session.status != "active":
            mgr.require_generating(session)  # raises 409 / 410 with the reason
    target = mgr.set_reward(session, body.reward, body.interaction_id)
    return {"message": "success", "session_id": session.id, "interaction_id": target.id, "reward": target.reward}

@router.post("/export_trajectories", tags=["control"])
async def export_trajectories(request: Request, body: ExportRequest) -> dict[str, Any]:
    require_admin(request)
    return await gw(request).sessions.export(
        body.session_id, style=body.style, discount=body.discount, keep=body.keep,
        wait_timeout=body.wait_timeout, current_version=gw(request).policies.session_version(body.session_id),
    )

@router.post("/rl/finish_session", tags=["control"])
async def finish_session(request: Request, body: FinishSessionRequest) -> dict[str, Any]:
    """End an active session, set its rewards and return its export (``/export_trajectories``'s
    answer), all or nothing: what ``end_session``, ``set_reward`` and ``export_trajectories`` do one
    after the other, in one call (rlgate extension; a rollout's episode costs two control calls
    instead of four)."""
    require_admin(request)
    return await gw(request).sessions.finish(
        body.session_id, reward=body.reward, rewards=body.rewards, style=body.style, discount=body.discount,
        wait_timeout=body.wait_timeout, current_version=gw(request).policies.session_version(body.session_id),
    )

@router.post("/rl/collect", tags=["control"])
async def collect(request: Request, body: CollectRequest) -> dict[str, Any]:
    """Exports of up to ``max_sessions`` finished (ended or interrupted) sessions, in the order they
    finished, without naming them (rlgate extension; a long poll with ``wait_timeout``)."""
    require_admin(request)
    where: Callable[[Session], bool] | None = None
    if body.policy is not None:  # one trainer's sessions on a gateway several train on (docs/policies.md)
        name, default = gw(request).policies.require(body.policy).name, gw(request).policies.default.name

        def of_policy(s: Session) -> bool:
            return (s.policy or default) == name

        where = of_policy
    sessions = await gw(request).sessions.collect(body.max_sessions, wait_timeout=body.wait_timeout,
                                                  style=body.style, discount=body.discount, where=where)
    return {"sessions": sessions}

@router.post("/rl/update_weights", tags=["control"])
async def update_weights(request: Request, body: UpdateWeightsRequest) -> dict[str, Any]:
    """Load the checkpoint ``path`` into the engine; the engine checks what it then serves against
    the checkpoint's probe when it has one (engine/weight_check.py). A checkpoint the engine cannot
    use is a 400 (``param: path``); a backend's failure or a failed check is the server side's (502
    / 503, ``backend_error``, ``weight_check_failed``, ...), and the previous weights keep serving."""
    require_admin(request)
    g = gw(request)
    before = _last_check(g)
    policy = g.policies.require(body.policy) if body.policy is not None else g.policies.default
    try:
        if policy.adapter is not None:  # an adapter policy: its adapter alone (the others go on untouched)
            version = await g.policies.push(policy.name, body.path)
            log.info("policy %s updated: version %d", policy.name, version)
            return {"message": "success", "version": version, "policy": policy.name}
        g.policies.check_full_push()
        version = await g.engine.update_weights_from_path(body.path)
    except EngineError as exc:
        _record_check(g, before)
        if 400 <= exc.status < 500:
            raise InvalidRequest(exc.message, param="path", code=exc.code, status=exc.status) from exc
        raise engine_failure(exc.message, status=exc.status if 500 <= exc.status < 600 else 502,
                             code=exc.code) from exc
    check = _record_check(g, before)
    log.info("weights updated: version %d", version)
    out: dict[str, Any] = {"message": "success", "version": version}
    if check is not None:
        out["weight_check"] = check.describe()
    return out


def _last_check(g: Gateway) -> WeightCheck | None:
    return g.engine.last_weight_check if isinstance(g.engine, ChecksWeights) else None


def _record_check(g: Gateway, before: WeightCheck | None) -> WeightCheck | None:
    """The check of the update that just ran (None if the engine ran none), counted in the metrics."""
    check = _last_check(g)
    if check is None or check is before:
        return None
    g.metrics.record_weight_check(check.result, check.max_diff if check.skipped is None else None)
    if check.result == "fail":
        log.error("weight check failed: %s", check.describe())
    return check

@router.get("/rl/metrics", tags=["control"])
async def metrics(request: Request) -> dict[str, Any]:
    require_admin(request)
    g = gw(request)
    return {
        **g.sessions.metrics,
        "open_sessions": g.sessions.open_sessions(),
        "requests_in_flight": sum(s.in_flight for s in g.sessions.sessions.values()),
        "sessions": len(g.sessions.sessions),
        "capacity": g.sessions.capacity,
        "engine_version": g.engine.version,
        "policies": g.policies.versions(),  # name -> version (the default first)
        **({"engine": g.engine.describe()} if isinstance(g.engine, DescribesBackends) else {}),  # remote: backends
    }

@router.get("/metrics", tags=["control"], response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def prometheus_metrics(request: Request) -> Response:
    """Every metric and silent-failure guard of this gateway, in Prometheus text format (admin key;
    ``--metrics-port`` serves the same without a key on a separate bind)."""
    require_admin(request)
    return Response(gw(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

@router.get("/health", tags=["control"])
async def health(request: Request) -> dict[str, Any]:
    """``status``: ``ok``, or ``degraded`` with the reasons (``degraded``: a list of ``{guard, reason}``:
    silent-failure guards that are firing, or no healthy backend). Always HTTP 200 while serving."""
    g = gw(request)
    body: dict[str, Any] = {"status": "ok", "version": g.engine.version,
                            "uptime_s": round(time.time() - g.started_at, 3)}
    reasons = g.metrics.degraded()
    if isinstance(g.engine, DescribesBackends):  # remote engines: backend counts only (URLs are in /rl/metrics)
        states = [b["state"] for b in g.engine.describe()["backends"]]
        body["backends"] = {"total": len(states), "healthy": states.count("healthy")}
        if "healthy" not in states:
            reasons.insert(0, {"guard": "backends", "reason": f"no healthy backend ({len(states)} configured)"})
    if reasons:
        body["status"] = "degraded"
        body["degraded"] = reasons
    return body

async def list_models(request: Request) -> dict[str, Any]:
    g = gw(request)
    tenant = tenant_from_request(request)  # rlgate serve --online
    if not is_admin_request(request) and tenant is None:
        session_from_request(request)
    default = g.policies.default.name
    shown = g.policies.all()
    if tenant is not None:  # a tenant sees the policy that serves it, never the others' (online/tenant_policies.py)
        own = request.app.state.tenant_policies.policy_of(tenant.id)
        shown = [p for p in shown if p.name == own]
    return {"object": "list", "data": [
        {"id": p.name, "object": "model", "created": int(p.loaded_at if p.adapter else g.started_at),
         "owned_by": "rlgate", "parent": default if p.adapter else None, "root": default}
        for p in shown
    ]}

router.add_api_route("/v1/models", list_models, methods=["GET"], tags=["openai"])
router.add_api_route("/models", list_models, methods=["GET"], tags=["openai"])
