"""The app factory: ``create_app(config, engine, store, tokenizer)``.

Pure wiring: builds the :class:`~rlgate.core.gateway.Gateway` (sessions, generation
service), mounts the API surfaces and control routes, installs the error handlers and
the ASGI middleware, and runs the engine / sweeper / store lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from rlgate.api.anthropic import router as anthropic
from rlgate.api.control import router as control
from rlgate.api.error_handlers import install_error_handlers
from rlgate.api.openai_chat import router as chat
from rlgate.api.openai_responses import router as responses
from rlgate.api.openapi import install_openapi
from rlgate.config import GatewayConfig
from rlgate.core.gateway import Gateway
from rlgate.core.generation import GenerationService
from rlgate.core.sessions import SessionManager
from rlgate.engine.base import Engine
from rlgate.server.body_limit import BodyLimitMiddleware
from rlgate.server.durability import DurabilityMiddleware
from rlgate.store.base import Store

log = logging.getLogger("rlgate.server")


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
            await asyncio.wait([sweeper])  # its end, not its outcome (a cancelled shutdown still raises)
            try:
                await engine.close()
            finally:
                await asyncio.to_thread(store.close)
                log.info("gateway stopped: store flushed and closed")

    app = FastAPI(title="rlgate", version="0.1.0", lifespan=lifespan,
                  description="RL gateway: OpenAI / Anthropic APIs served token-in/token-out by the training policy.")
    app.state.gateway = gateway
    install_error_handlers(app)

    body_models: list[type[BaseModel]] = []
    for surface in (chat, responses, anthropic):  # first: routes are matched in order
        app.include_router(surface.router)
        body_models += surface.BODY_MODELS
    app.include_router(control.router)
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
        except Exception:  # the sweeper must never die: log and sweep again next time
            log.exception("session sweep failed")
