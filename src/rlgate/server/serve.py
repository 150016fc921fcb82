"""Serving an app with uvicorn, with the gateway's own graceful shutdown.

On SIGTERM (or Ctrl+C), in this order:

1. the signal handler stops session admission (``/rl/start_session`` answers 503);
2. uvicorn stops listening, closes idle connections and lets requests in flight,
   streams included, finish — for at most ``shutdown_timeout`` seconds, after which
   they are cancelled (each cancelled generation is recorded with ``finish_reason``
   ``"abort"``);
3. the app's lifespan shutdown stops the sweeper, closes the engine, then flushes and
   closes the store;
4. the process exits with status 0 (uvicorn would re-raise the signal instead).

A second Ctrl+C forces an immediate exit (writes not yet acknowledged may be lost;
acknowledged ones are already durable).

Connections (``server/connections.py``): request headers must arrive within
``header_timeout``, at most ``max_connections`` are served (more get a 503), and the soft
open-file limit is raised to fit them when the hard limit allows (else ``max_connections``
is lowered to fit, with a warning). The log handlers get a repeat filter (no floods) and
the access log a filter that drops query strings (``server/logging_filters.py``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import signal
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import uvicorn

from rlgate.config import LOG_LEVEL, GatewayConfig
from rlgate.server import logging_filters
from rlgate.server.connections import gateway_protocol

log = logging.getLogger("rlgate.server")

EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Idle keep-alive connections are closed after this long. Longer than clients' own idle
# expiry (httpx, and so the OpenAI / Anthropic SDKs: 5 s), so that the client, not the
# server, retires an idle connection: otherwise a request sent on a connection the server
# is closing at that moment fails (uvicorn's default is also 5 s: the load benchmark hit it).
KEEP_ALIVE_S = 65
# Request line + headers of one request; larger -> 400 and closed (server/connections.py).
MAX_HEADER_BYTES = 64 * 1024
# Allocations between young-generation collections (CPython's default: 700); see tune_gc.
GC_GEN0_THRESHOLD = 50_000
# Open files kept free for everything but client connections (store, logs, checkpoints) and
# for the connections over max_connections that are being answered 503.
FD_RESERVE = 128


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway: Any) -> None:
        super().__init__(config)
        self.gateway = gateway

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in EXIT_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        # Unlike uvicorn, do not re-raise the signal: a graceful shutdown exits 0.

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.gateway is not None:  # None: the cluster router (it holds no sessions)
            self.gateway.sessions.accepting = False  # first: no new sessions from here on
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        if self.gateway is None:
            await super().shutdown(sockets)
            return
        self.gateway.sessions.accepting = False
        in_flight = sum(s.in_flight for s in self.gateway.sessions.sessions.values())
        log.warning("shutting down: admitting no new sessions; %d generations in flight get up to %.0f s",
                    in_flight, self.config.timeout_graceful_shutdown or 0)
        await super().shutdown(sockets)


def fit_connections(max_connections: int) -> int:
    """Raise the soft open-file limit to fit ``max_connections`` (up to the hard limit); return
    the number of connections that fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft - FD_RESERVE < max_connections:
        fitted = max(1, soft - FD_RESERVE)
        log.warning("open-file limit %d: serving at most %d connections (max_connections=%d)", soft, fitted,
                    max_connections)
        return fitted
    return max_connections


def tune_gc() -> None:
    """Garbage collection for a long-running gateway (issue 14: it was the largest source of
    tail latency). CPython's collector walks every tracked object of a generation; a gateway
    holds a large, long-lived heap (the tokenizer, transformers, pydantic schemas, then every
    session's interactions), and with the default thresholds a young collection ran every 700
    allocations, a full one every few thousand requests, each pausing all requests. So: the
    objects that exist once the app is built are frozen (never collected: they live as long as
    the process), and young collections run every ``GC_GEN0_THRESHOLD`` allocations. Reference
    counting still frees everything that is not in a cycle at once; cycles wait a little longer.
    Measured (benchmarks/hot_path.py, 32 concurrent, same run): p99 latency 450-500 ms with the
    defaults, 90-100 ms with this, and about 40% more requests/s (docs/architecture.md)."""
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = LOG_LEVEL, access_log: bool = False,
                   shutdown_timeout: float = GatewayConfig.shutdown_timeout, max_connections: int | None = None,
                   timeout_keep_alive: int = KEEP_ALIVE_S) -> uvicorn.Config:
    """The uvicorn settings every way of serving the gateway shares (``serve``, ``ServerThread``).
    Other apps (the fake inference servers of tests) get the same settings with uvicorn's
    httptools protocol as it is."""
    gateway = getattr(app.state, "gateway", None) if hasattr(app, "state") else None
    http: Any = "httptools"
    if gateway is not None:
        http = gateway_protocol(gateway.config.header_timeout, max_connections or gateway.config.max_connections,
                                MAX_HEADER_BYTES)
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on",
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]
        timeout_keep_alive=timeout_keep_alive, http=http,
    )


def serve(app: Any, *, host: str, port: int, log_level: str = LOG_LEVEL, access_log: bool = False,
          shutdown_timeout: float = GatewayConfig.shutdown_timeout) -> int:
    """Serve ``app`` (from ``create_app``) until SIGTERM / SIGINT; return the exit status."""
    gateway = app.state.gateway
    config = uvicorn_config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                            shutdown_timeout=shutdown_timeout,
                            max_connections=fit_connections(gateway.config.max_connections))
    # uvicorn configured its log handlers in Config(): filter them, and the root logger's.
    logging_filters.install(logging_filters.RepeatFilter())
    logging_filters.install(logging_filters.RedactQueryFilter(), ("uvicorn.access",))
    server = GatewayServer(config, gateway)
    tune_gc()
    try:
        server.run()
    finally:
        gateway.store.close()  # idempotent; covers a forced exit that skipped the lifespan shutdown
    return 0
