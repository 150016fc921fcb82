"""Ray's own ports: token authentication and loopback binds for the Ray clusters rlgate starts or joins.

**A local cluster** (``init_ray`` without ``ray_address``: ``rlgate serve --replicas N``, ``rlgate train``
with a ``ray:`` section and no ``address``) runs with Ray's token authentication
(``RAY_AUTH_MODE=token``, Ray 2.52 or later). :func:`prepare_local` generates a new token at each
start (Ray's own format: 64 hex digits, 256 bits), writes it to a file created with mode 0600
(``--ray-token-file``; ``rlgate serve`` puts it beside ``--admin-key-file``, else in the data
directory; else a private temporary directory removed at exit) and hands Ray the file's path
(``RAY_AUTH_TOKEN_PATH``), never the token itself: Ray's processes (GCS, raylet, workers, replicas,
episode tasks) inherit the path, read the token, and refuse every gRPC and HTTP request without
it. Nothing is written to ``~/.ray``. The token is never logged or printed; the file's path is.

Ray binds its gRPC servers to 127.0.0.1 only when the node's IP *is* 127.0.0.1, and ``ray.init``
turns a ``_node_ip_address`` of 127.0.0.1 into the machine's address unless Ray's
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` switch is off (its single-machine mode, the default on macOS
and Windows). :func:`prepare_local` turns it off, so every port of a local cluster binds loopback
(the GCS, the raylet's two ports, every worker's, the runtime-env agent's HTTP port, the
autoscaler monitor's Prometheus port). :func:`listening_sockets` measures that
(docs/security.md, "Listening sockets of ``rlgate serve --replicas N``").

**Joining a cluster** (``ray_address``): :func:`prepare_join` asks the cluster's GCS first, over
plain gRPC and without a token, whether it answers. A cluster that answers runs without
authentication: anyone who reaches its ports can run code as its user, and read the admin key out
of the replica actors, so rlgate refuses to join it (``SystemExit``, one line) unless the operator
passes ``--ray-allow-unauthenticated`` (``rlgate train``: ``ray.allow_unauthenticated: true``), and
then prints a warning. A cluster that refuses needs its token (``--ray-token-file``,
``$RAY_AUTH_TOKEN_PATH``, ``$RAY_AUTH_TOKEN`` or ``~/.ray/auth_token``, as Ray looks for it), which
is checked against the cluster before Ray is started.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import ipaddress
import logging
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlgate.secret_files import write_secret_file

log = logging.getLogger("rlgate.cluster")

TOKEN_FILE_NAME = "ray-auth-token"
MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
#: Ray's switch for clusters of several machines: off, ``ray.init`` keeps a node IP of 127.0.0.1,
#: and a node whose IP is 127.0.0.1 binds its gRPC servers to loopback only
MULTI_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROBE_TIMEOUT_S = 10.0

OPT_OUT = "--ray-allow-unauthenticated (rlgate train: ray.allow_unauthenticated: true)"
TOKEN_OPTION = "--ray-token-file PATH (rlgate train: ray.token_file)"

_local_token_file: Path | None = None


# --------------------------------------------------------------------------- the token


def default_token_file(admin_key_file: str | None, data_dir: str | None) -> Path | None:
    """Where ``rlgate serve`` writes a local cluster's token: beside the admin key file, else in the
    data directory; None: a private temporary directory (:func:`write_token_file`)."""
    if admin_key_file:
        return Path(admin_key_file).resolve().parent / TOKEN_FILE_NAME
    if data_dir:
        return Path(data_dir) / TOKEN_FILE_NAME
    return None


def write_token_file(path: Path | None) -> Path:
    """A new token written to ``path`` (created 0600, then renamed over the path, so a symlink planted
    there is replaced, not written through; missing directories are created 0700). None: a file in a
    new private (0700) temporary directory, removed when this process exits."""
    from rlgate.store import make_private_dirs

    if path is None:
        directory = Path(tempfile.mkdtemp(prefix="rlgate-ray-"))  # 0700
        atexit.register(shutil.rmtree, directory, True)
        path = directory / TOKEN_FILE_NAME
    else:
        path = Path(path).expanduser().absolute()
        make_private_dirs(path.parent)
    write_secret_file(path, secrets.token_hex(32))  # what Ray's own generator makes (ray get-auth-token --generate)
    return path


def local_token_file() -> Path | None:
    """The token file of the local cluster this process started (None: it started none)."""
    return _local_token_file


def _raylet() -> Any:
    """``ray._raylet`` (Ray's compiled core; its type stubs lack the authentication classes)."""
    return importlib.import_module("ray._raylet")


def _require_token_auth() -> None:
    if not hasattr(_raylet(), "AuthenticationTokenLoader"):
        import ray

        raise SystemExit(f"rlgate: Ray {ray.__version__} has no token authentication, which rlgate requires "
                         "for its Ray clusters: pip install 'ray>=2.52'") from None


def _set_auth_env(mode: str, token_file: Path | None) -> None:
    """``RAY_AUTH_MODE`` (and the token's file) for this process and every process it starts, and
    Ray's cached configuration and token reloaded from them."""
    raylet = _raylet()
    os.environ[MODE_ENV] = mode
    if token_file is not None:
        os.environ[TOKEN_PATH_ENV] = str(token_file)
        os.environ.pop(TOKEN_ENV, None)  # it would take precedence over the file
    raylet.Config.initialize("")  # Ray reads RAY_AUTH_MODE into its cached RayConfig (as Ray's _enable_token_auth)
    raylet.AuthenticationTokenLoader.instance().reset_cache()


def _bind_loopback() -> None:
    """Keep the node IP 127.0.0.1 (Ray's single-machine mode): Ray's gRPC servers then bind loopback."""
    import ray._private.ray_constants as constants

    os.environ[MULTI_NODE_ENV] = "0"  # the processes Ray starts
    constants.ENABLE_RAY_CLUSTER = False  # this one: read by services.get_node_ip_address at each call


# --------------------------------------------------------------------------- a local cluster


def prepare_local(token_file: str | os.PathLike[str] | None) -> Path:
    """Before ``ray.init`` starts a local cluster: a new token in ``token_file`` (0600), token
    authentication on, every port on loopback. Returns the token file's path."""
    global _local_token_file
    _require_token_auth()
    path = write_token_file(Path(token_file) if token_file else None)
    _set_auth_env("token", path)
    _bind_loopback()
    _local_token_file = path
    return path


# --------------------------------------------------------------------------- joining a cluster


@dataclass(frozen=True)
class Probe:
    """What a cluster's GCS answered: ``status`` is ``ok``, ``unauthenticated`` (token missing or
    wrong) or ``unreachable``; ``node_ips`` the nodes' addresses (when it answered)."""

    status: str
    detail: str = ""
    node_ips: tuple[str, ...] = ()


def gcs_target(address: str) -> str:
    """The GCS ``HOST:PORT`` of a Ray address (``auto``: the cluster ``ray start`` recorded on this
    machine, or ``$RAY_ADDRESS``), without Ray's rewriting of 127.0.0.1 to the machine's address."""
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        found = get_ray_address_from_environment("auto", None)
        if not found:
            raise ConnectionError("--ray-address auto: no running Ray cluster found on this machine "
                                  "(start one with `ray start --head`, or give HOST:PORT)")
        return str(found)
    return address


def probe(target: str, metadata: Iterable[tuple[str, str]] = (), timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """One ``CheckAlive`` call to the GCS at ``target`` with ``metadata`` (none: no token), then
    ``GetAllNodeInfo`` if it answered."""
    import grpc

    pb: Any = importlib.import_module("ray.core.generated.gcs_service_pb2")
    rpc: Any = importlib.import_module("ray.core.generated.gcs_service_pb2_grpc")

    md = list(metadata)
    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            return Probe("unreachable", f"nothing answered at {target} within {timeout:.0f} s")
        stub = rpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.CheckAlive(pb.CheckAliveRequest(), timeout=timeout, metadata=md)
            nodes = stub.GetAllNodeInfo(pb.GetAllNodeInfoRequest(), timeout=timeout, metadata=md)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return Probe("unauthenticated", str(exc.details() or ""))
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return Probe("unreachable", f"{code.name}: {exc.details()}")
            raise ConnectionError(f"{target} did not answer as a Ray GCS ({code.name}: {exc.details()})") from None
    alive = [n.node_manager_address for n in nodes.node_info_list if n.state == 0]  # ALIVE
    return Probe("ok", node_ips=tuple(alive))


def _token_metadata() -> list[tuple[str, str]]:
    """Ray's token (from wherever Ray looks for it) as gRPC metadata; [] if there is none."""
    loader = _raylet().AuthenticationTokenLoader.instance()
    loader.reset_cache()
    return list(loader.get_token_for_http_header(ignore_auth_mode=True).items())


def _token_source(token_file: Path | None) -> str:
    if token_file is not None:
        return str(token_file)
    if os.environ.get(TOKEN_ENV):
        return f"${TOKEN_ENV}"
    if os.environ.get(TOKEN_PATH_ENV):
        return f"${TOKEN_PATH_ENV} ({os.environ[TOKEN_PATH_ENV]})"
    return "~/.ray/auth_token"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def prepare_join(address: str, *, token_file: str | os.PathLike[str] | None = None,
                 allow_unauthenticated: bool = False) -> str:
    """Before ``ray.init(address=...)``: SystemExit (one line) unless the cluster requires a token and
    this process has the right one, or the operator accepted an unauthenticated cluster
    (``allow_unauthenticated``: a warning then). ConnectionError if its GCS does not answer.
    Returns the address to give ``ray.init``: the GCS that was checked (``auto`` resolved)."""
    _require_token_auth()
    if address.startswith("ray://"):
        if not allow_unauthenticated:
            raise SystemExit(f"rlgate: cannot check that the Ray Client address {address} requires authentication; "
                             f"give the cluster's GCS address (HOST:6379) instead, or accept the risk with {OPT_OUT}")
        _warn_unauthenticated(address)
        return address
    target = gcs_target(address)
    first = probe(target)
    if first.status == "unreachable":
        raise ConnectionError(f"cannot reach the Ray cluster at {target}: {first.detail}")
    if first.status == "ok":  # answered a request that carried no token
        if not allow_unauthenticated:
            raise SystemExit(
                f"rlgate: refusing to join the Ray cluster at {target}: it runs without authentication "
                "(anyone who reaches its ports can run code as its user and read the gateway's admin key); "
                f"restart it with RAY_AUTH_MODE=token, or accept the risk with {OPT_OUT}")
        _warn_unauthenticated(target)
        _set_auth_env("disabled", None)  # this driver's own gRPC server must then accept the cluster's calls
        answer = first
    else:
        path = Path(token_file).expanduser() if token_file else None
        if path is not None:
            _check_token_file(path)
        os.environ[MODE_ENV] = "token"
        if path is not None:
            os.environ[TOKEN_PATH_ENV] = str(path)
            os.environ.pop(TOKEN_ENV, None)
        try:
            metadata = _token_metadata()
        except Exception as exc:  # noqa: BLE001 - Ray's AuthenticationError: an unreadable or empty file
            raise SystemExit(f"rlgate: cannot read the Ray token from {_token_source(path)}: {exc}") from None
        if not metadata:
            raise SystemExit(f"rlgate: the Ray cluster at {target} requires its authentication token: pass "
                             f"{TOKEN_OPTION}, or set ${TOKEN_PATH_ENV} (or ${TOKEN_ENV})")
        answer = probe(target, metadata)
        if answer.status == "unauthenticated":
            raise SystemExit(f"rlgate: the Ray cluster at {target} refused the token from {_token_source(path)} "
                             "(not this cluster's token)")
        if answer.status == "unreachable":
            raise ConnectionError(f"cannot reach the Ray cluster at {target}: {answer.detail}")
        _set_auth_env("token", path)
    if answer.node_ips and all(_is_loopback(ip) for ip in answer.node_ips):
        _bind_loopback()  # a single-machine cluster on loopback (one rlgate started): keep 127.0.0.1
    return target


def _check_token_file(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise SystemExit(f"rlgate: cannot read the Ray token file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"rlgate: warning: the Ray token file {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
              f"chmod 600 {path}", file=sys.stderr, flush=True)


def _warn_unauthenticated(address: str) -> None:
    line = "!" * 100
    print(f"rlgate: {line}\nrlgate: WARNING: joining the Ray cluster at {address}, which runs WITHOUT "
          "authentication (--ray-allow-unauthenticated):\nrlgate: WARNING: anyone who can reach its ports can run "
          "code as its user on every node, and read the gateway's admin key from the replica actors.\n"
          f"rlgate: WARNING: restart it with RAY_AUTH_MODE=token.\nrlgate: {line}", file=sys.stderr, flush=True)
    log.warning("joined the Ray cluster at %s without authentication (--ray-allow-unauthenticated)", address)


# --------------------------------------------------------------------------- listening sockets


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: its bind address and port, and the process that holds it."""

    host: str
    port: int
    pid: int
    process: str

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.host).is_loopback

    @property
    def every_interface(self) -> bool:
        return ipaddress.ip_address(self.host).is_unspecified

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _proc_listeners() -> dict[int, tuple[str, int]]:
    """Socket inode -> (bind address, port) of every listening TCP socket in this network namespace
    (``/proc/net/tcp``, ``/proc/net/tcp6``; an IPv4-mapped IPv6 address is given as IPv4)."""
    out: dict[int, tuple[str, int]] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/self/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # the kernel prints each 32-bit word in host (little-endian) order
            packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address
            ip = ipaddress.IPv4Address(packed) if len(packed) == 4 else ipaddress.IPv6Address(packed)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            out[int(fields[9])] = (str(ip), int(hex_port, 16))
    return out


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (Linux ``/proc``)."""
    tree, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def process_name(pid: int) -> str:
    """What a Ray process is, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    first = argv[0].split(" ")[0] if argv else ""
    base = os.path.basename(first)
    if base in ("gcs_server", "raylet"):
        return base
    if first.startswith("ray::"):
        return first  # a worker (ray::IDLE, ray::GatewayReplica...) or an agent (ray::RuntimeEnvAgent)
    for script, name in (("monitor.py", "autoscaler monitor"), ("log_monitor.py", "log monitor"),
                         ("dashboard.py", "dashboard"), ("ray_process_reaper.py", "process reaper")):
        if any(a.endswith("/" + script) or a == script for a in argv[1:3]):
            return name
    return base or "?"


def listening_sockets(root: int | None = None) -> list[Listener]:
    """Listening TCP sockets of ``root`` (default: this process) and all its descendants: for the
    process that started a local Ray cluster, every port of the cluster (the GCS, raylet, monitor
    and dashboard processes are its children, the workers the raylet's). Linux only ([] elsewhere)."""
    if not Path("/proc/self/net/tcp").exists():
        return []
    root = os.getpid() if root is None else root
    sockets = _proc_listeners()
    found: list[Listener] = []
    for pid in process_tree(root):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        name = process_name(pid)
        seen: set[int] = set()
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if not target.startswith("socket:["):
                continue
            inode = int(target[8:-1])
            if inode in sockets and inode not in seen:
                seen.add(inode)
                host, port = sockets[inode]
                found.append(Listener(host, port, pid, name))
    return sorted(found, key=lambda s: (s.pid != root, s.process, s.port))


# --------------------------------------------------------------------------- rlgate serve's report


def _ray_port_roles() -> dict[int, str]:
    """Port -> what it is, for the ports Ray names (its node object in this process, ``ray.nodes()``)."""
    import ray

    roles: dict[int, str] = {}
    node: Any = getattr(ray._private.worker, "_global_node", None)
    if node is None:
        return roles
    with contextlib.suppress(Exception):
        roles[int(node.gcs_address.rsplit(":", 1)[1])] = "GCS server"
    with contextlib.suppress(Exception):
        for n in ray.nodes():
            roles.setdefault(int(n["NodeManagerPort"]), "raylet: node manager")
            roles.setdefault(int(n["ObjectManagerPort"]), "raylet: object manager")
    for attr, role in (("runtime_env_agent_port", "runtime env agent (HTTP)"), ("metrics_agent_port", "metrics agent"),
                       ("metrics_export_port", "metrics export"), ("dashboard_agent_listen_port", "dashboard agent")):
        with contextlib.suppress(Exception):
            port = int(getattr(node, attr))
            if port > 0:
                roles.setdefault(port, role)
    with contextlib.suppress(Exception):
        from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT

        roles.setdefault(int(AUTOSCALER_METRIC_PORT), "autoscaler monitor: Prometheus metrics (read-only, no auth)")
    return roles


def startup_report(replicas: list[dict[str, Any]], router: str) -> list[str]:
    """Lines for ``rlgate serve --replicas N`` to print once the replicas are up: Ray's authentication,
    the token file's path (never the token), and every listening socket of the cluster this process
    started (bind address, port, process), the replicas' HTTP ports and the router's bind."""
    import ray

    lines = []
    mode = os.environ.get(MODE_ENV, "disabled")
    if _local_token_file is not None:
        lines.append(f"Ray token authentication on; token in {_local_token_file} (mode 0600, new at each start)")
    elif mode == "token":
        lines.append("Ray token authentication on (joined cluster)")
    else:
        lines.append("Ray authentication OFF (joined an unauthenticated cluster: --ray-allow-unauthenticated)")
    node: Any = getattr(ray._private.worker, "_global_node", None)
    if node is not None:
        with contextlib.suppress(Exception):
            lines.append(f"Ray logs in {node.get_logs_dir_path()}")
    http = {}
    for info in replicas:
        with contextlib.suppress(Exception):
            http[(int(info["pid"]), int(str(info["url"]).rsplit(":", 1)[1].rstrip("/")))] = int(info["index"])
    roles = _ray_port_roles()
    sockets = listening_sockets()
    lines.append(f"listening sockets of this process and the Ray processes it started ({len(sockets)} + the router):")
    me = os.getpid()
    for s in sockets:
        if (s.pid, s.port) in http:
            what = f"replica {http[(s.pid, s.port)]} HTTP ({s.process}, pid {s.pid})"
        elif s.pid == me:
            what = f"Ray driver (this process): core worker gRPC (pid {s.pid})"
        elif s.port in roles:
            what = f"Ray {roles[s.port]} ({s.process}, pid {s.pid})"
        else:
            what = f"Ray worker {s.process}: core worker gRPC (pid {s.pid})"
        lines.append(f"  {s.address:<22} {what}{'  <- EVERY INTERFACE' if s.every_interface else ''}")
    lines.append(f"  {router:<22} router (this process, opened next)")
    wide = [s for s in sockets if not s.loopback]
    if wide:
        lines.append(f"{len(wide)} of them bind beyond loopback: {', '.join(s.address for s in wide)}")
    else:
        lines.append("every Ray port above binds loopback only")
    return lines
