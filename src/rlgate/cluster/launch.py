"""The Python API: start N gateway replicas on Ray and a router in front of them.

::

    from rlgate.cluster import Cluster, FakeEngineSpec, ReplicaSpec
    from rlgate.config import ClusterConfig, GatewayConfig

    spec = ReplicaSpec(model="tiny-model", config=GatewayConfig(admin_key=KEY), engine=FakeEngineSpec(),
                       data_dir="data")
    with Cluster(spec, ClusterConfig(replicas=3)) as cluster:
        url = cluster.start_router()          # http://127.0.0.1:PORT, the same API as one gateway
        ...                                   # agents, GatewayClient(url, KEY), the trainer
        cluster.update_weights("/ckpt/step-10")

``ClusterConfig.ray_address`` joins an existing cluster (replicas are placed on its nodes; it must
require Ray's token authentication, see ``cluster/ray_security.py``); otherwise a local Ray cluster
is started with a small object store, no dashboard, token authentication and every port on loopback.
Replica actors are named ``rlgate-replica-<i>`` in the Ray namespace.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from typing import Any, Self

from rlgate.cluster.controller import WeightController
from rlgate.cluster.directory import ReplicaTable
from rlgate.cluster.keys import derive_routing_secret
from rlgate.cluster.replica import GatewayReplica, ReplicaSpec
from rlgate.cluster.router import Router
from rlgate.config import ClusterConfig

log = logging.getLogger("rlgate.cluster")

ACTOR_PREFIX = "rlgate-replica-"


def ray_environment() -> None:
    """Environment for Ray on this machine: no usage reporting (no network), quiet worker logs.
    Authentication and binds: :mod:`rlgate.cluster.ray_security` (``init_ray``)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def local_num_cpus(config: ClusterConfig) -> int | None:
    """The CPUs a local Ray cluster may schedule: ``ray_num_cpus``, else the machine's, but never
    fewer than the replicas reserve (Ray's CPUs are scheduling slots: on a 2-core machine
    ``--replicas 3`` waited for ever for its third replica). None: Ray's own default."""
    if config.ray_num_cpus is not None:
        return config.ray_num_cpus
    need = math.ceil(config.replicas * config.replica_num_cpus)
    machine = os.cpu_count() or 1
    return need if need > machine else None


def init_ray(config: ClusterConfig, *, log_to_driver: bool = False) -> None:
    """Connect to ``config.ray_address`` or start a small local Ray cluster (idempotent).
    ``log_to_driver``: print the workers' stdout/stderr here (``ray.trainer``: the run's output).

    Joining needs the cluster's token, and refuses (SystemExit) a cluster without authentication
    unless ``config.ray_allow_unauthenticated``; a local cluster gets a new token in
    ``config.ray_token_file`` (0600) and binds every port to loopback (``cluster/ray_security.py``)."""
    from rlgate.cluster.ray_security import prepare_join, prepare_local

    ray_environment()
    import ray

    if ray.is_initialized():
        return
    if config.ray_address:
        address = prepare_join(config.ray_address, token_file=config.ray_token_file,
                               allow_unauthenticated=config.ray_allow_unauthenticated)
        ray.init(address=address, namespace=config.namespace, log_to_driver=log_to_driver)
        return
    token_file = prepare_local(config.ray_token_file)
    log.info("local Ray cluster: token authentication (token file %s, mode 0600), every port on 127.0.0.1",
             token_file)
    for attempt in range(3):
        try:
            # a local cluster talks over loopback only; address="local": a new one even if another
            # Ray cluster runs on this machine (without it ray.init joins that one, and refuses
            # num_cpus there); joining one is what --ray-address is for
            ray.init(address="local", num_cpus=local_num_cpus(config), include_dashboard=False, namespace=config.namespace,
                     _node_ip_address="127.0.0.1", object_store_memory=config.object_store_mb * 1024 * 1024,
                     log_to_driver=log_to_driver, configure_logging=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray gives its raylet a fixed 30 s to register
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            log.warning("local Ray cluster did not start in time (a busy machine?); trying again")
            ray.shutdown()


class RayDirectory:
    """Replica reports through Ray (``GatewayReplica.info``)."""

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors

    @property
    def size(self) -> int:
        return len(self.actors)

    async def fetch(self, index: int) -> dict[str, Any]:
        return await self.actors[index].info.remote()


class Cluster:
    def __init__(self, spec: ReplicaSpec, config: ClusterConfig) -> None:
        if config.replicas < 1:
            raise ValueError("a cluster needs at least one replica")
        self.spec = spec
        self.config = config
        self.actors: list[Any] = []
        self._router_thread: Any = None
        self.router: Router | None = None
        self.controller: WeightController | None = None

    # ------------------------------------------------------------------ replicas

    def start(self, timeout: float = 900.0) -> Cluster:
        """Start the replica actors and wait until every one serves."""
        import ray

        init_ray(self.config)
        cls = ray.remote(GatewayReplica)
        for i in range(self.config.replicas):
            self.actors.append(cls.options(
                name=f"{ACTOR_PREFIX}{i}", namespace=self.config.namespace, get_if_exists=False,
                max_restarts=-1, max_task_retries=0, max_concurrency=16,
                num_cpus=self.config.replica_num_cpus, num_gpus=self.config.replica_num_gpus,
            ).remote(i, self.spec))
        ray.get([a.info.remote() for a in self.actors], timeout=timeout)
        log.info("%d gateway replicas up", len(self.actors))
        return self

    def info(self) -> list[dict[str, Any]]:
        import ray

        return list(ray.get([a.info.remote() for a in self.actors]))

    # ------------------------------------------------------------------ router

    def make_router(self) -> Router:
        """A router ASGI app for these replicas (with the weight-update controller)."""
        table = ReplicaTable(RayDirectory(self.actors), interval=self.config.refresh_interval)
        self.controller = WeightController(self.actors, table)
        secret = self.spec.routing_secret or derive_routing_secret(self.spec.config.admin_key)
        self.router = Router(table, admin_key=self.spec.config.admin_key, routing_secret=secret,
                             update_weights=self.controller.update, config=self.spec.config)
        return self.router

    def start_router(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve a router from a background thread; returns its URL."""
        from rlgate.server.runner import ServerThread
        from rlgate.server.serve import KEEP_ALIVE_S

        self._router_thread = ServerThread(self.make_router(), host=host, port=port,
                                           timeout_keep_alive=KEEP_ALIVE_S)
        return str(self._router_thread.start())

    def update_weights(self, path: str, timeout: float = 600.0) -> int:
        """Load ``path`` on every replica behind one barrier (see ``cluster/controller.py``)."""
        if self.controller is None or self._router_thread is None or self._router_thread.loop is None:
            raise RuntimeError("start_router() first: the controller runs in the router's event loop")
        fut = asyncio.run_coroutine_threadsafe(self.controller.update(path), self._router_thread.loop)
        return int(fut.result(timeout))

    # ------------------------------------------------------------------ faults, shutdown

    def kill_replica(self, index: int, *, restart: bool = True) -> int:
        """SIGKILL a replica's process (tests, chaos drills); Ray restarts it. Returns the pid killed."""
        import signal

        pid = int(self.info_of(index)["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid

    def info_of(self, index: int) -> dict[str, Any]:
        import ray

        return dict(ray.get(self.actors[index].info.remote(), timeout=30))

    def stop(self) -> None:
        import ray

        if self._router_thread is not None:
            self._router_thread.stop()
            self._router_thread = None
        for a in self.actors:
            try:
                ray.get(a.stop.remote(), timeout=30)
            except Exception as exc:  # noqa: BLE001 - already gone: nothing to stop gracefully
                log.debug("replica stop: %s", exc)
            ray.kill(a, no_restart=True)
        self.actors = []

    def __enter__(self) -> Self:
        if not self.actors:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
