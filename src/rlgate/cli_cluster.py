"""``rlgate serve --replicas N``: the replicas' engine spec and the cluster (Ray) with this process as the router."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rlgate.config import ClusterConfig, GatewayConfig, from_arguments


def engine_spec(args: argparse.Namespace, replicas: int) -> Any:
    """What each replica builds (``engine/factory.py``'s plan, shipped to it) from ``rlgate serve``'s engine
    flags: the same plan a single gateway builds its engine from, the remote backends shared out."""
    from rlgate.engine.factory import EnginePlan
    from rlgate.engine.options import EngineOptions
    from rlgate.engine.remote.options import REMOTE_ENGINES, RemoteOptions
    from rlgate.model import context_length

    options = from_arguments(EngineOptions, args)
    remote = from_arguments(RemoteOptions, args) if options.engine in REMOTE_ENGINES else RemoteOptions()
    model = str(Path(args.model).resolve())
    plan = EnginePlan(options, model, args.context_length, context_length(model), remote=remote, replicas=replicas)
    if options.engine in REMOTE_ENGINES and not remote.backend_url:
        raise SystemExit(f"rlgate: --engine {options.engine} needs at least one --backend-url")
    return plan


def serve_cluster(args: argparse.Namespace, gateway: GatewayConfig) -> int:
    """``rlgate serve --replicas N``: N replicas on Ray, this process runs the router."""
    from rlgate.cluster.launch import Cluster
    from rlgate.cluster.replica import ReplicaSpec
    from rlgate.server.serve import KEEP_ALIVE_S
    from rlgate.store import default_data_dir

    cfg = from_arguments(ClusterConfig, args)
    if args.store not in (None, ":memory:"):
        raise SystemExit("rlgate: with --replicas each replica keeps its own store under --data-dir "
                         "(DATA_DIR/replica-<i>/rlgate.sqlite); --store accepts only ':memory:' there")
    data_dir = None if args.store == ":memory:" else str(Path(args.data_dir or default_data_dir()).resolve())
    if cfg.ray_token_file is None and not cfg.ray_address:  # a local cluster's new Ray token, mode 0600
        from rlgate.cluster.ray_security import default_token_file

        token_file = default_token_file(args.admin_key_file, data_dir)
        cfg.ray_token_file = None if token_file is None else str(token_file)
    spec = ReplicaSpec(model=str(Path(args.model).resolve()), config=gateway,
                       engine=engine_spec(args, cfg.replicas), data_dir=data_dir, store_sync=args.store_sync,
                       host=cfg.replica_host, log_level="warning" if args.log_level == "info" else args.log_level)
    cluster = Cluster(spec, cfg)
    try:
        cluster.start()
        from rlgate.cluster.ray_security import startup_report

        for line in startup_report(cluster.info(), router=f"{args.host}:{args.port}"):  # Ray's ports, never its token
            print(f"rlgate: {line}", flush=True)
        import uvicorn

        from rlgate.server import logging_filters
        from rlgate.server.connections import gateway_protocol
        from rlgate.server.serve import MAX_HEADER_BYTES, GatewayServer, fit_connections, tune_gc

        print(f"rlgate: {cfg.replicas} replicas up; router on http://{args.host}:{args.port}", flush=True)
        tune_gc()
        # the router faces the clients: the same connection limits as a gateway (server/connections.py)
        http = gateway_protocol(spec.config.header_timeout, fit_connections(spec.config.max_connections),
                                MAX_HEADER_BYTES)
        config = uvicorn.Config(cluster.make_router(), host=args.host, port=args.port, log_level=args.log_level,
                                access_log=args.access_log, timeout_keep_alive=KEEP_ALIVE_S, lifespan="on", http=http)
        # the gateway's log filters too: no floods, no query strings in the access log
        logging_filters.install(logging_filters.RepeatFilter())
        logging_filters.install(logging_filters.RedactQueryFilter(), ("uvicorn.access",))
        GatewayServer(config, None).run()
    finally:
        cluster.stop()
        import ray

        ray.shutdown()
    return 0


# --------------------------------------------------------------------------- models
