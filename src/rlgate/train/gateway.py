"""The gateway a run talks to: started in this process, a running one named by ``gateway.url``,
or ``ray.replicas`` replicas on Ray behind a router in this process.

In-process: a :class:`~rlgate.engine.local.LocalEngine` behind the app on
``gateway.host`` (127.0.0.1; 0.0.0.0 when episodes run on other nodes, which then get this
node's IP) and ``gateway.port`` (default a free one), ``granted`` capacity, an in-memory store, a
random admin key, and :class:`~rlgate.train.sync.ColocatedSync`. Remote: the URL is
checked (reachable, an rlgate gateway, the admin key accepted) before anything else
happens, and weights go through :class:`~rlgate.train.sync.RemoteSync`. Replicas
(``cluster/``): each a gateway with its own local engine on ``ray.replica_num_gpus`` GPUs,
stores under ``ray.data_dir``; weights go through the router's controller (RemoteSync against
the router: every replica loads them behind one barrier), so ``gateway.sync_dir`` must be
readable on every node. Any ``ray:`` section connects to (or starts) Ray first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rlgate.client import GatewayClient, GatewayClientError
from rlgate.config import ClusterConfig, GatewayConfig
from rlgate.engine.factory import EnginePlan
from rlgate.engine.options import EngineOptions
from rlgate.rollout.errors import RunError
from rlgate.rollout.runner import CONCURRENCY
from rlgate.train.config import GatewaySettings, RaySettings, TrainConfig


@dataclass(frozen=True)
class GatewayPlan:
    """What :func:`open_gateway` reads: the run's ``gateway:`` and ``ray:`` sections and four more settings
    (``rlgate train`` takes them from its config, :meth:`of`; the TRL adapter builds one itself)."""

    model: str  # as configured: the name the gateway serves (served_name)
    out_dir: Path  # the sync directory's default and the viewer's admin_key file
    gateway: GatewaySettings
    seed: int | None = None  # the in-process engine's sampling seed (rollout.seed)
    connections: int = CONCURRENCY + 8  # the control client's pool: the episodes in flight, and a few
    ray: RaySettings | None = None
    lora: bool = False  # train.lora is set (a push of the adapter alone needs one)

    @classmethod
    def of(cls, cfg: TrainConfig) -> GatewayPlan:
        return cls(str(cfg.model), Path(cfg.out_dir), cfg.gateway, cfg.rollout.seed, cfg.rollout.concurrency + 8,
                   cfg.ray, cfg.train.lora is not None)

    @property
    def replicas(self) -> int:
        return self.ray.replicas if self.ray is not None else 0

    def engine(self, weights: Path, *, seed: int | None = None, threads: int | None = None) -> EnginePlan:
        """The local engine serving ``weights`` (in process, or in each replica) as the ``gateway:`` section
        says (``engine/factory.py`` builds it)."""
        return EnginePlan(EngineOptions(engine="local", device=self.gateway.device), str(weights),
                          self.gateway.context_length, seed=seed, threads=threads)


@dataclass
class OpenGateway:
    client: GatewayClient
    sync: Any  # WeightSync
    server: Any = None  # ServerThread of the in-process gateway
    tokenizer: Any = None  # in-process: the tokenizer the gateway renders with
    cluster: Any = None  # rlgate.cluster.launch.Cluster of the replicas (ray.replicas)
    remote: bool = False  # a running gateway (gateway.url): a resumed run must push its weights there
    registries: tuple[Any, ...] = ()  # in-process: the gateway's Prometheus registry (served with the run's)

    @property
    def policy(self) -> str | None:
        """gateway.policy: the adapter policy this run trains on a shared gateway (None: the gateway's default)."""
        return self.client.policy

    async def start_policy(self, model: Any, resumed_version: int | None) -> None:
        """gateway.policy: create the run's policy on the gateway (or push a resumed run's adapter to it)."""
        from rlgate.train.sync import AdapterSync

        if isinstance(self.sync, AdapterSync):
            await self.sync.start(model, resumed_version)

    @property
    def url(self) -> str:
        return self.client.base_url

    async def close(self) -> None:
        await self.client.aclose()
        if self.server is not None:
            # The run is over: episodes still in flight are the next step's, nobody waits for them. Cut
            # them after 1 s, without the lines a gateway shutting down under clients prints (uvicorn's
            # ERROR "Cancel N running task(s)", a 503 warning per request, the guards' abort alarm).
            self.server.config.timeout_graceful_shutdown = 1
            with _quiet(*SHUTDOWN_LOGGERS):
                await asyncio.to_thread(self.server.stop)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop)


SHUTDOWN_LOGGERS = ("uvicorn.error", "rlgate.server", "rlgate.guards")


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """Drop records below CRITICAL on these loggers while the block runs."""
    def drop(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL

    loggers = [logging.getLogger(n) for n in names]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


class PooledGatewayClient(GatewayClient):
    """The trainer's client for control calls, pooled for the rollout's concurrency: every episode in
    flight makes its calls (start, end, reward, export) on a kept-alive connection instead of opening
    one (httpx's default pool keeps 20). Closes its pool with itself."""

    def __init__(self, base_url: str, admin_key: str, *, connections: int, policy: str | None = None) -> None:
        self._pool = httpx.AsyncClient(timeout=600.0, limits=httpx.Limits(
            max_connections=connections, max_keepalive_connections=connections))
        super().__init__(base_url, admin_key, http_client=self._pool, policy=policy)

    async def aclose(self) -> None:
        await super().aclose()
        await self._pool.aclose()


def engine_threads(device: str | None, configured: int | None = None) -> int | None:
    """Torch threads of the in-process engine (``gateway.engine_threads``; None: torch's default):
    on the CPU by default one core is left to the gateway's and the agents' Python threads. With
    torch's two threads on a 2-core machine a rollout round of the toy (64 episodes) took 3.5 s,
    with one 0.75 s (benchmarks/rollout_cost.py, docs/training.md)."""
    import torch

    if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda"):
        return None
    return configured or max(1, torch.get_num_threads() - 1)


def control_client(url: str, admin_key: str, plan: GatewayPlan) -> GatewayClient:
    return PooledGatewayClient(url, admin_key, connections=plan.connections, policy=plan.gateway.policy)


async def check_remote(url: str, admin_key: str) -> None:
    """RunError naming the URL unless it is a reachable rlgate gateway that accepts ``admin_key``."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        try:
            r = await http.get(url.rstrip("/") + "/health")
        except httpx.HTTPError as exc:
            raise RunError(f"gateway.url: cannot reach {url} ({type(exc).__name__}: {exc or 'no answer'}); "
                           "is `rlgate serve` running there?") from None
        if r.status_code != 200 or "version" not in _json(r):
            raise RunError(f"gateway.url: {url}/health answered HTTP {r.status_code} without a weight version; "
                           "is this an rlgate gateway?")
        r = await http.get(url.rstrip("/") + "/rl/metrics", headers={"Authorization": f"Bearer {admin_key}"})
        if r.status_code in (401, 403):
            raise RunError(f"gateway.admin_key: {url} rejected the admin key (HTTP {r.status_code}); set the "
                           "gateway's key in $RLGATE_ADMIN_KEY")


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return {}


def port_problem(port: int, host: str = "127.0.0.1") -> str | None:
    """Why a server could not bind ``host:port`` (None: it could). Bound with ``SO_REUSEADDR``, as
    uvicorn binds: connections of a finished run in TIME_WAIT (~60 s) do not make the port busy,
    a listening socket does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    problem = port_problem(port, host)
    if problem is not None:
        raise RunError(f"gateway.port: {host}:{port} is not available ({problem}); "
                       "choose another --port, or leave it unset for a free one")


_ANY = ("0.0.0.0", "::", "")


def advertised_url(url: str, host: str) -> str:
    """The URL episodes and the trainer use for a server bound to ``host``: as bound, or, bound
    to every interface, at this node's IP (Ray's idea of it when Ray runs, so that episodes on
    other nodes of the cluster reach it)."""
    if host not in _ANY:
        return url
    port = url.rsplit(":", 1)[1]
    return f"http://{node_ip()}:{port}"


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:  # the interface a route out leaves from (connect on UDP sends nothing)
            s.connect(("10.255.255.255", 1))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def ray_cluster_config(ray: RaySettings, **more: Any) -> ClusterConfig:
    """The ``ray:`` section as the cluster layer's settings (address, token, opt-out, CPUs)."""
    from rlgate.config import ClusterConfig

    return ClusterConfig(ray_address=ray.address, ray_num_cpus=ray.num_cpus, ray_token_file=ray.token_file,
                         ray_allow_unauthenticated=ray.allow_unauthenticated, **more)


UI_RETAIN_S = 300.0  # gateway.ui: the trainer exports each episode at once; the viewer keeps them this long


def write_key_file(path: Path, key: str) -> None:
    """``key`` to ``path`` with mode 0600 (a new file renamed over the path: never through a link)."""
    import contextlib
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def announce_ui(plan: GatewayPlan, url: str, admin_key: str) -> None:
    """``gateway.ui``: the key to out_dir/admin_key (0600) and one line saying where to look; the key
    itself is never printed or logged."""
    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    write_key_file(out / "admin_key", admin_key)
    print(f"viewer: {url}/ui (log in with the admin key in {out / 'admin_key'}, mode 0600; scripts: "
          "Authorization: Bearer <that key>)", flush=True)


def check_ray() -> None:
    """RunError unless Ray (the ``cluster`` extra) is installed."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise RunError("ray: this config runs on Ray, which is not installed: pip install 'rlgate[cluster]'") from None


async def open_gateway(plan: GatewayPlan, weights: Path, tokenizer_dir: Path, *, version: int = 0) -> OpenGateway:
    """Connect to (or start) the gateway serving ``weights``. ``version``: the weight version
    ``weights`` are (a resumed run's checkpoint); the in-process engine starts there instead of
    at 0. Replicas come back at the version their stores recorded, a running gateway keeps its
    own."""
    from rlgate.train.sync import AdapterSync, ColocatedSync, RemoteSync

    if plan.ray is not None:
        from rlgate.cluster.launch import init_ray

        check_ray()
        try:
            await asyncio.to_thread(init_ray, ray_cluster_config(plan.ray))
        except Exception as exc:  # noqa: BLE001 - name the setting, not Ray's internals
            raise RunError(f"ray: cannot {'join ' + plan.ray.address if plan.ray.address else 'start a local Ray'} "
                           f"({type(exc).__name__}: {exc})") from None
    if plan.replicas:
        cluster, client = await _start_replicas(plan, weights, tokenizer_dir)
        sync_dir = Path(plan.gateway.sync_dir) if plan.gateway.sync_dir else plan.out_dir / "sync"
        return OpenGateway(client, RemoteSync(client, sync_dir, keep=plan.gateway.sync_keep), cluster=cluster)
    if plan.gateway.url:
        admin_key = plan.gateway.admin_key or os.environ.get("RLGATE_ADMIN_KEY")
        if not admin_key:
            raise RunError("gateway.url is set but no admin key: set $RLGATE_ADMIN_KEY (or gateway.admin_key)")
        if plan.gateway.push == "adapter" and not plan.lora:
            raise RunError("gateway.push is 'adapter' but train.lora is not set: there is no adapter to push")
        await check_remote(plan.gateway.url, admin_key)
        client = control_client(plan.gateway.url, admin_key, plan)
        sync_dir = Path(plan.gateway.sync_dir) if plan.gateway.sync_dir else plan.out_dir / "sync"
        if plan.gateway.policy is not None:  # an adapter policy of a shared gateway: the adapter alone
            return OpenGateway(client, AdapterSync(client, sync_dir, keep=plan.gateway.sync_keep), remote=True)
        return OpenGateway(client, RemoteSync(client, sync_dir, keep=plan.gateway.sync_keep,
                                              adapters=plan.gateway.push == "adapter"), remote=True)

    from rlgate.model import load_tokenizer
    from rlgate.server.runner import ServerThread

    if plan.gateway.port:
        check_port_free(plan.gateway.port, plan.gateway.host)
    admin_key = secrets.token_urlsafe(32)
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except Exception as exc:  # noqa: BLE001 - name the directory, not the library's internals
        raise RunError(f"model: cannot load a tokenizer from {tokenizer_dir}: {exc}") from None
    engine: Any
    if plan.gateway.engine == "scripted":  # replies from gateway.script (train/scripted.py)
        from rlgate.model import context_length
        from rlgate.train.scripted import VersionSync, scripted_engine

        engine = scripted_engine(plan.gateway.script, tokenizer,
                                 plan.gateway.context_length or context_length(tokenizer_dir) or 32768)
        sync: Any = VersionSync(engine)
    else:
        try:
            engine = plan.engine(weights, threads=engine_threads(plan.gateway.device, plan.gateway.engine_threads),
                                 seed=plan.seed).build(tokenizer)
        except Exception as exc:  # noqa: BLE001
            raise RunError(f"model: the engine cannot load {weights}: {type(exc).__name__}: {exc}") from None
        sync = ColocatedSync(engine)
    engine.restore_version(version)
    try:
        app = _in_process_app(plan, admin_key, engine, tokenizer, tokenizer_dir)
    except ValueError as exc:  # a setting the model cannot serve with (gateway.tool_prompt, a parser name)
        raise RunError(f"gateway: {exc}") from None
    from rlgate.server.serve import KEEP_ALIVE_S

    # the server keeps idle connections longer than the clients do (65 s vs httpx's 5 s), as `rlgate serve`
    # does: with uvicorn's 5 s a control call sent on a connection the server was closing failed (ReadError)
    server = ServerThread(app, host=plan.gateway.host, port=plan.gateway.port or 0, timeout_keep_alive=KEEP_ALIVE_S)
    try:
        url = advertised_url(server.start(), plan.gateway.host)
    except RuntimeError as exc:
        raise RunError(f"gateway: the in-process gateway did not start ({exc})") from None
    if plan.gateway.ui:
        announce_ui(plan, url, admin_key)
    return OpenGateway(control_client(url, admin_key, plan), sync, server, tokenizer,
                       registries=(app.state.gateway.metrics.registry,))


def served_name(model: str) -> str:
    """The model name the gateway answers with: what the config says (a registry name such as
    smollm2-135m-instruct, a directory's name, a GGUF file's stem), never the conversion cache's hash."""
    return Path(model).stem if model.lower().endswith(".gguf") else Path(model).name


def served_config(plan: GatewayPlan, admin_key: str) -> GatewayConfig:
    """The gateway a run serves from (in process, or each replica): granted capacity, the ``gateway:``
    section's serving settings, the configured model's name."""
    g = plan.gateway
    return GatewayConfig(admin_key=admin_key, capacity_mode="granted", tool_parser=g.tool_parser,
                         reasoning_parser=g.reasoning_parser, trajectory_mode=g.trajectory_mode,
                         context_length=g.context_length, max_tokens_cap=g.max_tokens_cap,
                         model_name=served_name(plan.model), ui=g.ui, tool_prompt=g.tool_prompt,
                         retain_exported=UI_RETAIN_S if g.ui else 0.0)


def _in_process_app(plan: GatewayPlan, admin_key: str, engine: Any, tokenizer: Any, tokenizer_dir: Path) -> Any:
    """The in-process gateway's app (``ValueError``: a setting this model cannot be served with)."""
    from rlgate.model import stop_token_ids
    from rlgate.server.app import create_app
    from rlgate.store.base import MemoryStore

    return create_app(served_config(plan, admin_key), engine, MemoryStore(), tokenizer,
                      stop_token_ids=stop_token_ids(tokenizer, tokenizer_dir))


async def _start_replicas(plan: GatewayPlan, weights: Path, tokenizer_dir: Path) -> tuple[Any, GatewayClient]:
    """``ray.replicas`` gateway replicas (local engines serving ``weights``) and a router on ``gateway.host``."""
    from rlgate.cluster.launch import Cluster
    from rlgate.cluster.replica import ReplicaSpec

    assert plan.ray is not None
    admin_key = secrets.token_urlsafe(32)
    spec = ReplicaSpec(
        model=str(tokenizer_dir.resolve()),
        config=served_config(plan, admin_key),
        engine=plan.engine(weights.resolve()),
        host=plan.ray.replica_host,
        data_dir=str(Path(plan.ray.data_dir or plan.out_dir / "replicas").resolve()))
    cluster = Cluster(spec, ray_cluster_config(plan.ray, replicas=plan.ray.replicas,
                                               replica_num_cpus=plan.ray.replica_num_cpus,
                                               replica_num_gpus=plan.ray.replica_num_gpus,
                                               replica_host=plan.ray.replica_host))
    try:
        await asyncio.to_thread(cluster.start)
        url = advertised_url(cluster.start_router(plan.gateway.host, plan.gateway.port or 0), plan.gateway.host)
    except Exception as exc:  # noqa: BLE001 - one message naming the section
        await asyncio.to_thread(cluster.stop)
        raise RunError(f"ray.replicas: the {plan.ray.replicas} gateway replicas did not start "
                       f"({type(exc).__name__}: {exc})") from None
    if plan.gateway.ui:
        announce_ui(plan, url, admin_key)
    return cluster, control_client(url, admin_key, plan)


def gateway_error(exc: GatewayClientError, url: str) -> RunError:
    return RunError(f"gateway {url}: {exc}")
