"""The app factory: ``create_app(config, engine, store, tokenizer)``.

Pure wiring: builds the :class:`~rlgate.core.gateway.Gateway` (sessions, generation
service), mounts the API surfaces and control routes, installs the error handlers and
the ASGI middleware, and runs the engine / sweeper / store lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import BaseRoute, Route

from rlgate.api.anthropic import router as anthropic
from rlgate.api.common import JsonResponse
from rlgate.api.control import router as control
from rlgate.api.control.policies import router as policy_routes
from rlgate.api.error_handlers import install_error_handlers
from rlgate.api.openai_chat import router as chat
from rlgate.api.openai_responses import router as responses
from rlgate.api.openapi import install_openapi
from rlgate.config import GatewayConfig, OnlineConfig
from rlgate.core.gateway import Gateway
from rlgate.core.generation import GenerationService
from rlgate.core.naming import SessionNaming
from rlgate.core.sessions import SessionManager
from rlgate.engine.base import Engine
from rlgate.engine.capabilities import HasStats, QueueWaitObservable
from rlgate.metrics.gateway import GatewayMetrics
from rlgate.metrics.policies import PolicyMetrics
from rlgate.online.conversations import tenant_of
from rlgate.online.learners import PolicyLearners
from rlgate.online.service import OnlineGateway
from rlgate.online.training import OnlineTraining
from rlgate.server.auth_gate import AuthGateMiddleware
from rlgate.server.body_limit import BodyLimitMiddleware
from rlgate.server.durability import DurabilityMiddleware
from rlgate.server.inflight import InFlight, InFlightMiddleware
from rlgate.server.metrics_http import MetricsServer
from rlgate.server.online_training import bind_online_training
from rlgate.server.request_metrics import RequestMetricsMiddleware
from rlgate.store.base import HasWriteStats, Store
from rlgate.supervised import forever

log = logging.getLogger("rlgate.server")

# FastAPI >= 0.16x asks OpenTelemetry on every request whether a tracer / meter provider is
# configured (an environment lookup each time: ~6% of a request's CPU in issue 14's profile).
# rlgate's telemetry is its Prometheus metrics (docs/operations.md); FastAPI's is turned off
# where the version has it.
_NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})

# At shutdown, how long requests cut by the server's shutdown timeout get to unwind (record
# their interactions, answer 503) before the engine and the store close under them.
DRAIN_TIMEOUT_S = 10.0


def add_routes(app: FastAPI, router: APIRouter, *, plain: bool = False) -> None:
    """The router's routes, in order, on the app's own route list. FastAPI >= 0.16x wraps an
    included router in a lazily resolved branch that re-derives each route's context on every
    match (issue 14's profile: ~0.1 ms of a request's CPU to reach /health); the routes here
    have no prefix, dependencies or tags to merge, so a flat list is the same app.

    ``plain`` (the generation surfaces): a route whose handler takes the request alone and
    returns a response is served as a Starlette route; FastAPI's wrapper around it (dependency
    solving, response handling it never uses) cost 0.1-0.25 ms per request, 10-17% of a
    generation's CPU (issue 14). Errors take the same way (the app's exception handlers). The
    OpenAPI document still describes it (from ``PlainRoute.api_route``).
    """
    app.router.routes.extend(_plain(r) if plain else r for r in router.routes)


def hot_routes_first(app: FastAPI) -> None:
    """The generation routes first in the list Starlette matches a request against, one route
    after the other (FastAPI puts its docs routes first): a chat completion then matches at the
    first or second route instead of the fifth or sixth (each route tried costs ~1.4 µs). Their
    paths are static and no other route has them, so the order changes which route is tried
    first, never which one matches."""
    routes = app.router.routes
    hot = [r for r in routes if isinstance(r, PlainRoute)]
    rest = [r for r in routes if not isinstance(r, PlainRoute)]
    paths = {r.path for r in hot}
    if any(getattr(r, "path", None) in paths or "{" in getattr(r, "path", "") for r in rest):
        return  # a route that could answer the same path: keep the order as declared
    routes[:] = hot + rest


def _plain(route: BaseRoute) -> BaseRoute:
    if not isinstance(route, APIRoute) or route.response_model is not None or route.status_code is not None:
        return route
    d = route.dependant
    if (d.request_param_name is None or d.dependencies or d.path_params or d.query_params or d.header_params
            or d.cookie_params or d.body_params or not inspect.iscoroutinefunction(route.endpoint)):
        return route
    endpoint = route.endpoint

    async def respond(request: Request) -> Response:
        response = await endpoint(request)
        if not isinstance(response, Response):  # every surface returns one; kept honest here
            raise TypeError(f"{route.path}: the handler returned {type(response).__name__}, not a Response")
        return response

    return PlainRoute(route, respond)


class PlainRoute(Route):
    """A FastAPI route served by Starlette (see ``add_routes``); ``api_route`` documents it."""

    def __init__(self, api_route: APIRoute, endpoint: Any) -> None:
        super().__init__(api_route.path, endpoint, methods=sorted(api_route.methods or ()), name=api_route.name)
        self.api_route = api_route


def create_app(
    config: GatewayConfig,
    engine: Engine,
    store: Store,
    tokenizer: Any,
    *,
    stop_token_ids: list[int] | None = None,
    naming: SessionNaming | None = None,
    online: OnlineConfig | None = None,
    online_training: OnlineTraining | PolicyLearners | None = None,
) -> FastAPI:
    """``naming``: how session keys and ids are made (default: random keys, ``{task_id}-{k}``
    ids; gateway replicas behind a router pass one whose keys name the replica). ``online``: serve
    real traffic when ``online.online`` is on (tenants, feedback, data rights: docs/online.md).
    ``online_training``: learn from that traffic (needs ``online``; server/online_training.py): bound
    here, its canary routes mounted, started and stopped with the app; :class:`PolicyLearners`: every adapter
    policy learns from its own traffic (``online/learners.py``; ``engine`` is then their ``PolicyRouter``)."""
    metrics = GatewayMetrics(config)
    sessions = SessionManager(config, store, naming, metrics)
    # a tenant's conversation open at the stop is ordinary (its next turn opens a new session), not an alarm
    sessions.restore(conversation=(lambda s: tenant_of(s) is not None) if online is not None and online.online
                     else None)
    stops = config.stop_token_ids or stop_token_ids
    if not stops:
        from rlgate.model import stop_token_ids as default_stops

        stops = default_stops(tokenizer)
    generation = GenerationService(
        config=config, engine=engine, tokenizer=tokenizer, sessions=sessions, stop_token_ids=stops
    )
    gateway = Gateway(config, engine, store, tokenizer, sessions, generation, time.time())
    _bind_metrics(metrics, sessions, engine, store)
    _bind_policy_metrics(metrics, generation)
    inflight = InFlight()
    online_state = _online_state(online, sessions, store, metrics)
    if online_state is not None:  # each tenant bound to its policy, or to the default (online/tenant_policies.py)
        from rlgate.online.tenant_policies import TenantPolicies

        app_tenant_policies = TenantPolicies(sessions.store, generation.policies)
        online_state.conversations.policy_of = app_tenant_policies.policy_of
        online_state.rights.notifier.on_delete(
            lambda d: app_tenant_policies.forget(d.tenant) if d.whole_tenant else None)
    if online_training is not None:
        bind_online_training(gateway, online_state, online_training)
    if isinstance(online_training, PolicyLearners):  # a promoted candidate's directory is what a restart loads
        online_training.on_promoted = generation.policies.record_weights

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        await generation.policies.restore()  # the adapter policies the store lists (a restart)
        # Guards that watch counters kept elsewhere (store writes) alarm even without traffic.
        background = [
            asyncio.create_task(forever(sessions.sweep, wait=config.sweep_interval, what="session sweep", log=log)),
            asyncio.create_task(forever(metrics.poll, wait=config.guard_poll_interval, what="metrics poll", log=log)),
        ]
        if online_state is not None:  # implicit feedback and retention (online/service.py)
            background.append(asyncio.create_task(online_state.run()))
        side = MetricsServer(metrics.registry, config.metrics_host, config.metrics_port) \
            if config.metrics_port is not None else None
        try:
            if online_training is not None:  # the trainer and the feedback tail, for the app's lifetime
                await online_training.start()
                try:
                    yield
                finally:
                    await online_training.close()
            else:
                yield
        finally:
            # Shutdown order: no new sessions; stop the sweeper; let the requests still unwinding
            # (cut by the server's shutdown timeout) record their interactions; close the engine
            # (aborts what is still generating, which records those interactions); then flush and
            # close the store.
            sessions.accepting = False
            for task in background:
                task.cancel()
            await asyncio.wait(background)  # their end, not their outcome (a cancelled shutdown still raises)
            if side is not None:
                await asyncio.to_thread(side.stop)
            if not await inflight.drain(DRAIN_TIMEOUT_S):
                log.error("%d requests still running at shutdown; closing the engine under them", inflight.count)
            try:
                await engine.close()
            finally:
                generation.render_pool.close()
                await asyncio.to_thread(store.close)
                log.info("gateway stopped: store flushed and closed")

    app = FastAPI(title="rlgate", version="0.1.0", lifespan=lifespan,
                  description="RL gateway: OpenAI / Anthropic APIs served token-in/token-out by the training policy.",
                  default_response_class=JsonResponse, **_NO_NATIVE_TELEMETRY)
    app.state.gateway = gateway
    app.state.online = online_state
    app.state.online_training = online_training if isinstance(online_training, OnlineTraining) else None
    app.state.online_learners = online_training if isinstance(online_training, PolicyLearners) else None
    if online_state is not None:
        app.state.tenant_policies = app_tenant_policies
    install_error_handlers(app)

    body_models: list[type[BaseModel]] = []
    for surface in (chat, responses, anthropic):  # first: routes are matched in order
        add_routes(app, surface.router, plain=True)
        body_models += surface.BODY_MODELS
    add_routes(app, control.router)
    add_routes(app, policy_routes)
    if online_state is not None:
        from rlgate.api.online.router import router as online_router
        from rlgate.api.online.tenant_policy import router as tenant_policy_router

        add_routes(app, online_router)
        add_routes(app, tenant_policy_router)
    if online_training is not None:
        from rlgate.api.canary.router import router as canary_router

        add_routes(app, canary_router)
    install_openapi(app, body_models)
    if config.ui:  # the trajectory viewer (off by default; admin only, see ui/auth.py)
        from rlgate.ui.auth import UiLogins
        from rlgate.ui.data_routes import router as ui_data_router
        from rlgate.ui.routes import router as ui_router

        app.state.ui_logins = UiLogins(config.ui_login_ttl)
        add_routes(app, ui_router)
        add_routes(app, ui_data_router)  # the model as JSON: what a cluster router's /ui merges
        if online_state is not None:
            from rlgate.ui.online import router as ui_online_router

            add_routes(app, ui_online_router)  # feedback rate and reward per policy version
    hot_routes_first(app)

    # Outermost last: RequestMetrics(InFlight(CORS(AuthGate(BodyLimit(Durability(routes)))))). The gate
    # refuses unauthenticated bodies before BodyLimit reads them; CORS headers reach every answer; the
    # request metrics see every final status.
    app.add_middleware(DurabilityMiddleware, store=store)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes, body_timeout=config.body_timeout,
                       max_buffered_bytes=config.max_buffered_body_bytes)
    app.add_middleware(AuthGateMiddleware, sessions=sessions, limiter=sessions.rate_limiter,
                       tenants=online_state.tenants if online_state is not None else None)
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.add_middleware(InFlightMiddleware, inflight=inflight)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # outermost: sees every final status
    return app


def _bind_metrics(metrics: GatewayMetrics, sessions: SessionManager, engine: Engine, store: Store) -> None:
    """Point the scrape-time collectors at the numbers kept by the sessions, engine and store."""
    metrics.bind(session_counters=lambda: sessions.metrics, sessions_by_status=sessions.sessions_by_status,
                 engine_version=lambda: engine.version)
    if isinstance(engine, HasStats):  # the local engine: batch occupancy
        metrics.bind(engine_stats=engine.stats)
    if isinstance(engine, QueueWaitObservable):
        engine.on_queue_wait = metrics.queue_seconds.observe
    if isinstance(store, HasWriteStats):  # SQLiteStore: writes and failed writes
        metrics.bind(store_stats=lambda: store.stats)


def _bind_policy_metrics(metrics: GatewayMetrics, generation: GenerationService) -> None:
    """``rlgate_policy_*``: each policy's version, turns, tokens and active sessions (metrics/policies.py)."""
    policies = generation.policies
    counts = PolicyMetrics(metrics.registry, policies.versions, lambda name: policies.usage(name)[0])
    generation.completed_listeners.append(
        lambda p: counts.record_turn(p.interaction.policy, len(p.interaction.output_ids)))


def _online_state(online: OnlineConfig | None, sessions: SessionManager, store: Store,
                  metrics: GatewayMetrics) -> OnlineGateway | None:
    if online is None or not online.online:
        return None
    from rlgate.metrics.feedback import FeedbackMetrics
    from rlgate.store.online import OnlineRecords

    if not isinstance(store, OnlineRecords):
        raise ValueError(f"--online: the store {type(store).__name__} keeps no tenants or feedback")
    return OnlineGateway.build(online, sessions, store, FeedbackMetrics(metrics.registry))
