"""One gateway replica: a Ray actor that serves the ordinary gateway app on its own HTTP port.

The actor builds everything where Ray placed it: tokenizer, engine (from an
:class:`~rlgate.cluster.engines.EngineSpec`), its own durable store
(``DATA_DIR/replica-<i>/rlgate.sqlite``) and the app from ``server.app.create_app`` with a
:class:`~rlgate.cluster.keys.ReplicaNaming`, then serves it from a thread
(``server.runner.ServerThread``). The router talks HTTP to that port; Ray calls the actor
only for control: :meth:`info` (health, load) and the weight-update phases.

If the process dies, Ray restarts the actor (``max_restarts=-1``): the store is reopened,
sessions that were live become ``interrupted`` (as after any gateway restart), ended ones
are exportable again, and the weights of the last completed update (recorded in the store)
are loaded back under the same version before the replica reports ``healthy``.

Weight updates are driven by :class:`~rlgate.cluster.controller.WeightController` in
phases, each an actor call:

1. :meth:`pause`: admission paused (generation requests that arrive wait at the door, see
   :class:`AdmissionGate`) and in-flight generation paused inside the engine
   (``pause_generation``): the fake engine holds tokens; the local engine stops between two
   decoding steps; SGLang / vLLM engines pause every backend with the server's pause mode
   (held requests continue later, aborted ones are resumed from their prefix, see
   ``engine/remote/engine.py``);
2. :meth:`load`: the checkpoint is loaded; the engine's version goes up by one;
3. :meth:`resume`: generation continues, then admission reopens.

A pause that is never followed by a resume (the controller died) ends by itself after
``max_pause_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rlgate.cluster.engines import EngineSpec
from rlgate.cluster.keys import ReplicaNaming, derive_routing_secret
from rlgate.config import GatewayConfig
from rlgate.engine.base import Engine
from rlgate.engine.capabilities import Pausable, VersionRestorable
from rlgate.store.base import StoreOptions, Synchronous

log = logging.getLogger("rlgate.cluster.replica")

T = TypeVar("T")

GENERATION_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/responses", "/responses", "/v1/messages")
_WEIGHTS_META = "cluster_weights"  # store meta key: {"path", "version"} of the last completed update


@dataclass
class ReplicaSpec:
    """How to build a replica (shipped by Ray to wherever the replica runs)."""

    model: str  # checkpoint / tokenizer directory (readable on every node)
    config: GatewayConfig  # the gateway configuration (admin key included), same for every replica
    engine: EngineSpec
    data_dir: str | None = None  # replica i keeps DATA_DIR/replica-i/rlgate.sqlite; None: memory only
    store_sync: Synchronous = StoreOptions.store_sync
    host: str = "127.0.0.1"  # interface the replica's HTTP port binds ("0.0.0.0" across nodes)
    routing_secret: bytes | None = None  # None: derived from the admin key
    stop_token_ids: list[int] | None = None
    max_pause_s: float = 600.0  # a weight-update pause ends by itself after this long
    log_level: str = "warning"


class AdmissionGate:
    """ASGI wrapper: while closed, generation requests wait at the door (they are not refused)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._open = asyncio.Event()
        self._open.set()
        self.waiting = 0

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and not self._open.is_set() and scope["method"] == "POST"
                and scope["path"] in GENERATION_PATHS):
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        await self.app(scope, receive, send)

    def __getattr__(self, name: str) -> Any:  # app.state etc. reach the wrapped app
        return getattr(self.app, name)


class GatewayReplica:
    """The actor class (``ray.remote`` is applied by ``cluster/launch.py``)."""

    def __init__(self, index: int, spec: ReplicaSpec) -> None:
        from rlgate.model import load_tokenizer, stop_token_ids
        from rlgate.server.app import create_app
        from rlgate.server.runner import ServerThread
        from rlgate.server.serve import KEEP_ALIVE_S, tune_gc
        from rlgate.store import open_store

        logging.basicConfig(level=spec.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.index = index
        self.spec = spec
        self.started_at = time.time()
        tokenizer = load_tokenizer(spec.model)
        self.engine: Engine = spec.engine(tokenizer, index)
        if spec.data_dir is None:
            store = open_store(":memory:")
        else:
            store_dir = Path(spec.data_dir) / f"replica-{index}"
            store_dir.mkdir(parents=True, exist_ok=True)
            store = open_store(store_dir / "rlgate.sqlite", synchronous=spec.store_sync)
        self.store = store
        secret = spec.routing_secret or derive_routing_secret(spec.config.admin_key)
        app = create_app(spec.config, self.engine, store, tokenizer,
                         stop_token_ids=spec.stop_token_ids or stop_token_ids(tokenizer, spec.model),
                         naming=ReplicaNaming(index, secret))
        self.gateway = app.state.gateway
        self.gate = AdmissionGate(app)
        self.state = "starting"
        self.reason = ""
        self._paused_at: float | None = None
        self.server = ServerThread(self.gate, host=spec.host, port=0, log_level=spec.log_level,
                                   timeout_keep_alive=KEEP_ALIVE_S)
        self.url = self.server.start()
        tune_gc()  # this actor's process is the replica's: GC tuned as `rlgate serve` tunes it
        if spec.host in ("0.0.0.0", "::"):  # reachable from other nodes: advertise the node's address
            port = self.url.rsplit(":", 1)[1]
            self.url = f"http://{_node_ip()}:{port}"
        self.state = "healthy"
        try:
            self._on_loop(self._restore_weights())
        except Exception as exc:  # noqa: BLE001 - serve nothing new until an update brings it to the version
            self.state, self.reason = "stale", f"could not reload the last weights after a restart: {exc}"
            log.error("replica %d: %s", index, self.reason)
        log.info("replica %d serving at %s (pid %d)", index, self.url, os.getpid())

    # ------------------------------------------------------------------ plumbing

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the server's event loop (where the gateway lives) and wait for it."""
        assert self.server.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.server.loop).result(timeout)

    async def _restore_weights(self) -> None:
        meta = self.store.load_meta().get(_WEIGHTS_META)
        if not isinstance(meta, dict) or not meta.get("version"):
            return
        path, version = str(meta["path"]), int(meta["version"])
        log.warning("replica %d restarted: loading the weights of version %d from %s", self.index, version, path)
        await self.engine.update_weights_from_path(path)
        _restore_version(self.engine, version)

    # ------------------------------------------------------------------ actor methods

    def info(self) -> dict[str, Any]:
        import ray

        if self._paused_at is not None and time.monotonic() - self._paused_at > self.spec.max_pause_s:
            log.error("replica %d: paused for more than %.0f s without a resume; resuming", self.index,
                      self.spec.max_pause_s)
            self.resume()
        sessions = self.gateway.sessions
        in_flight = sum(s.in_flight for s in sessions.sessions.values())
        ctx = ray.get_runtime_context()
        return {
            "index": self.index,
            "url": self.url,
            "state": self.state,
            "reason": self.reason,
            "pid": os.getpid(),
            "node": ctx.get_node_id(),
            "node_ip": _node_ip(),
            "load": sessions.open_sessions() + in_flight,
            "open_sessions": sessions.open_sessions(),
            "in_flight": in_flight,
            "waiting": self.gate.waiting,
            "version": self.engine.version,
            "started_at": self.started_at,
        }

    def pause(self) -> int:
        """Close admission and pause generation in the engine; returns the current version."""
        self.gate_close()
        self._on_loop(self._pause_engine())
        return int(self.engine.version)

    def gate_close(self) -> None:
        assert self.server.loop is not None
        self.server.loop.call_soon_threadsafe(self.gate.close)
        self.state = "paused"
        self._paused_at = time.monotonic()

    async def _pause_engine(self) -> None:
        if isinstance(self.engine, Pausable):  # else the closed admission gate is the only barrier
            await self.engine.pause_generation()

    def load(self, path: str, version: int) -> int:
        """Load ``path`` into the engine (generation is paused) as weight version ``version``."""
        return self._on_loop(self._load(path, version))

    async def _load(self, path: str, version: int) -> int:
        await self.engine.update_weights_from_path(path)
        if self.engine.version != version:  # e.g. it missed an update while it was stale
            _restore_version(self.engine, version)
        seq = self.store.save_meta(_WEIGHTS_META, {"path": path, "version": version})  # a restart reloads it
        await self.store.wait_durable([seq])
        return int(self.engine.version)

    def resume(self) -> int:
        """Continue generation, then reopen admission; returns the current version."""
        self._on_loop(self._resume_engine())
        assert self.server.loop is not None
        self.server.loop.call_soon_threadsafe(self.gate.open)
        self._paused_at = None
        if self.state == "paused":
            self.state = "healthy"
        return int(self.engine.version)

    async def _resume_engine(self) -> None:
        if isinstance(self.engine, Pausable):
            await self.engine.continue_generation()

    def mark(self, state: str, reason: str = "") -> None:
        """Set the replica's state as the controller sees it (``stale`` after a failed load)."""
        self.state, self.reason = state, reason

    def stop(self) -> None:
        """Graceful stop: no new sessions, let requests finish, flush and close the store."""
        self.gateway.sessions.accepting = False
        self.server.stop()


def _restore_version(engine: Engine, version: int) -> None:
    if not isinstance(engine, VersionRestorable):
        raise RuntimeError(f"{type(engine).__name__} cannot set its weight version to {version}")
    engine.restore_version(version)


def _node_ip() -> str:
    try:
        import ray

        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - outside Ray (tests of the class itself)
        return socket.gethostbyname(socket.gethostname())
