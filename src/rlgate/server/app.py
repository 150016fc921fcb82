"""The app factory: ``create_app(config, engine, store, tokenizer)``.

Everything the routes need hangs off ``app.state.gateway`` (a :class:`Gateway`); there
is no module-level mutable state, so tests build as many isolated apps as they like.

Control routes (original AReaL paths):

=========================  ===========  ==========================================
route                      key          what
=========================  ===========  ==========================================
POST /grant_capacity       admin        admit one more session (granted mode)
POST /rl/start_session     admin        new session + its API key
POST /rl/end_session       session      end the session (idempotent)
POST /rl/set_reward        session/adm  reward an interaction (default: last one)
POST /export_trajectories  admin        samples of an ended session
POST /rl/update_weights    admin        load a checkpoint into the engine
GET  /rl/metrics           admin        counters
GET  /health               none         liveness + weight version
GET  /v1/models, /models   any key      the served model
=========================  ===========  ==========================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlgate.api.common import validation_message
from rlgate.api.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    Unavailable,
    error_body,
    from_status,
    surface_of,
)
from rlgate.api.generation import GenerationService
from rlgate.config import GatewayConfig
from rlgate.engine.base import Engine, EngineError
from rlgate.server.auth import is_admin_request, require_admin, session_from_request
from rlgate.server.durability import DurabilityMiddleware
from rlgate.server.limits import BodyLimitMiddleware
from rlgate.server.openapi import install_openapi
from rlgate.server.sessions import SessionManager
from rlgate.store.base import Store, StoreError

log = logging.getLogger("rlgate.server")


@dataclass
class Gateway:
    """Everything a request handler may touch."""

    config: GatewayConfig
    engine: Engine
    store: Store
    tokenizer: Any
    sessions: SessionManager
    generation: GenerationService
    started_at: float


# --------------------------------------------------------------------------- bodies


class GrantCapacityRequest(BaseModel):
    count: int = Field(default=1, ge=1, le=1_000_000)


class StartSessionRequest(BaseModel):
    task_id: str = Field(min_length=1, max_length=256)
    api_key: str | None = Field(default=None, max_length=512)
    mode: Literal["token_exact", "rerender"] | None = None  # per-session trajectory mode
    metadata: dict[str, Any] | None = None


class SetRewardRequest(BaseModel):
    reward: float = Field(allow_inf_nan=False)
    interaction_id: str | None = None
    session_id: str | None = None  # admin key only: which session


class ExportRequest(BaseModel):
    session_id: str
    discount: float = Field(default=1.0, ge=0.0, le=1.0)
    style: Literal["individual", "concat"] = "individual"
    keep: bool = False  # leave the session in place (export again later)
    wait_timeout: float = Field(default=0.0, ge=0.0, le=3600.0)  # seconds to wait for the session to end


class UpdateWeightsRequest(BaseModel):
    path: str = Field(min_length=1)


# --------------------------------------------------------------------------- factory


def create_app(
    config: GatewayConfig,
    engine: Engine,
    store: Store,
    tokenizer: Any,
    *,
    stop_token_ids: list[int] | None = None,
) -> FastAPI:
    sessions = SessionManager(config, store)
    sessions.restore()
    stops = config.stop_token_ids or stop_token_ids
    if not stops:
        from rlgate.model import stop_token_ids as default_stops

        stops = default_stops(tokenizer)
    generation = GenerationService(
        config=config, engine=engine, tokenizer=tokenizer, sessions=sessions, stop_token_ids=stops
    )
    gateway = Gateway(config, engine, store, tokenizer, sessions, generation, time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        sweeper = asyncio.create_task(_sweep_forever(sessions, config.sweep_interval))
        try:
            yield
        finally:
            # Shutdown order: no new sessions; stop the sweeper; close the engine (aborts what is
            # still generating, which records those interactions); then flush and close the store.
            sessions.accepting = False
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            try:
                await engine.close()
            finally:
                await asyncio.to_thread(store.close)
                log.info("gateway stopped: store flushed and closed")

    app = FastAPI(title="rlgate", version="0.1.0", lifespan=lifespan,
                  description="RL gateway: OpenAI / Anthropic APIs served token-in/token-out by the training policy.")
    app.state.gateway = gateway
    _install_error_handlers(app)
    _install_control_routes(app)

    from rlgate.api.anthropic import router as anthropic
    from rlgate.api.openai_chat import router as chat
    from rlgate.api.openai_responses import router as responses

    body_models: list[type[BaseModel]] = []
    for surface in (chat, responses, anthropic):
        app.include_router(surface.router)
        body_models += surface.BODY_MODELS
    install_openapi(app, body_models)

    app.add_middleware(DurabilityMiddleware, store=store)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    return app


async def _sweep_forever(sessions: SessionManager, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            sessions.sweep()
        except Exception:  # noqa: BLE001 - the sweeper must never die
            log.exception("session sweep failed")


# --------------------------------------------------------------------------- errors


def _error_response(request: Request, exc: GatewayError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(exc, surface_of(request.url.path)), status_code=exc.status, headers=headers)


def _is_api_route(path: str) -> bool:
    return path.endswith(("/chat/completions", "/responses", "/messages", "/messages/count_tokens")) or \
        path.startswith("/v1/")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"msg": "invalid request", "loc": ()}
        loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        msg = f"{loc}: {first['msg']}" if loc else str(first["msg"])
        # API surfaces answer 400 (as OpenAI / Anthropic do); control routes 422 (as the original).
        status = 400 if _is_api_route(request.url.path) else 422
        return _error_response(request, InvalidRequest(msg, param=loc or None, status=status))

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error on %s %s: %s", request.method, request.url.path, exc)
        return _error_response(request, Unavailable(str(exc), code="store_unavailable"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error_response(request, from_status(exc.status_code, str(exc.detail)), headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error_response(request, GatewayError("internal error; see the gateway log", status=500,
                                                     code="internal_error"))


# --------------------------------------------------------------------------- control routes


def _install_control_routes(app: FastAPI) -> None:
    def gw(request: Request) -> Gateway:
        return request.app.state.gateway

    @app.post("/grant_capacity", tags=["control"],
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

    @app.post("/rl/start_session", tags=["control"])
    async def start_session(request: Request, body: StartSessionRequest) -> dict[str, str]:
        require_admin(request)
        session, key = gw(request).sessions.start_session(
            body.task_id, body.api_key, mode=body.mode, metadata=body.metadata
        )
        return {"session_id": session.id, "api_key": key}

    @app.post("/rl/end_session", tags=["control"])
    async def end_session(request: Request) -> dict[str, Any]:
        session = session_from_request(request)
        n = gw(request).sessions.end_session(session)
        return {"message": "success", "session_id": session.id, "interaction_count": n}

    @app.post("/rl/set_reward", tags=["control"])
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

    @app.post("/export_trajectories", tags=["control"])
    async def export_trajectories(request: Request, body: ExportRequest) -> dict[str, Any]:
        require_admin(request)
        return await gw(request).sessions.export(
            body.session_id, style=body.style, discount=body.discount, keep=body.keep,
            wait_timeout=body.wait_timeout,
        )

    @app.post("/rl/update_weights", tags=["control"])
    async def update_weights(request: Request, body: UpdateWeightsRequest) -> dict[str, Any]:
        require_admin(request)
        g = gw(request)
        try:
            version = await g.engine.update_weights_from_path(body.path)
        except EngineError as exc:
            raise InvalidRequest(exc.message, param="path", code=exc.code,
                                 status=exc.status if 400 <= exc.status < 600 else 400) from exc
        log.info("weights updated: version %d", version)
        return {"message": "success", "version": version}

    @app.get("/rl/metrics", tags=["control"])
    async def metrics(request: Request) -> dict[str, Any]:
        require_admin(request)
        g = gw(request)
        return {
            **g.sessions.metrics,
            "open_sessions": g.sessions.open_sessions(),
            "sessions": len(g.sessions.sessions),
            "capacity": g.sessions.capacity,
            "engine_version": g.engine.version,
            **({"engine": g.engine.describe()} if hasattr(g.engine, "describe") else {}),  # remote: backends
        }

    @app.get("/health", tags=["control"])
    async def health(request: Request) -> dict[str, Any]:
        g = gw(request)
        body = {"status": "ok", "version": g.engine.version, "uptime_s": round(time.time() - g.started_at, 3)}
        if hasattr(g.engine, "describe"):  # remote engines: backend counts only (URLs are in /rl/metrics)
            states = [b["state"] for b in g.engine.describe()["backends"]]
            body["backends"] = {"total": len(states), "healthy": states.count("healthy")}
            body["status"] = "ok" if "healthy" in states else "degraded"
        return body

    async def list_models(request: Request) -> dict[str, Any]:
        g = gw(request)
        if not is_admin_request(request):
            session_from_request(request)
        return {"object": "list", "data": [
            {"id": g.config.model_name, "object": "model", "created": int(g.started_at), "owned_by": "rlgate"}
        ]}

    app.add_api_route("/v1/models", list_models, methods=["GET"], tags=["openai"])
    app.add_api_route("/models", list_models, methods=["GET"], tags=["openai"])
