"""rlgate.cluster: gateway replicas on Ray behind a stateless router (``rlgate serve --replicas N``).

* ``keys.py``       session keys / ids that name their replica (HMAC-tagged)
* ``replica.py``    the replica actor: the ordinary gateway app on its own port + control calls
* ``engines.py``    picklable engine specs built inside each replica
* ``directory.py``  the router's table of replicas (state, load), refreshed through Ray
* ``router.py``     the ASGI router (same HTTP API; SSE passed through unparsed)
* ``upstream.py``   the router's pooled HTTP client to the replicas
* ``controller.py`` weight updates behind one barrier across replicas
* ``collector.py``  finished, rewarded trajectories from every replica, with backpressure
* ``launch.py``     the Python API (:class:`Cluster`)

``import rlgate.cluster`` does not import Ray; the ``cluster`` extra installs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgate.cluster.engines import FakeEngineSpec as FakeEngineSpec
    from rlgate.cluster.engines import LocalEngineSpec as LocalEngineSpec
    from rlgate.cluster.engines import RemoteEngineSpec as RemoteEngineSpec
    from rlgate.cluster.launch import Cluster as Cluster
    from rlgate.cluster.replica import ReplicaSpec as ReplicaSpec

_EXPORTS = {
    "Cluster": "rlgate.cluster.launch",
    "ReplicaSpec": "rlgate.cluster.replica",
    "FakeEngineSpec": "rlgate.cluster.engines",
    "LocalEngineSpec": "rlgate.cluster.engines",
    "RemoteEngineSpec": "rlgate.cluster.engines",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Cluster", "FakeEngineSpec", "LocalEngineSpec", "RemoteEngineSpec", "ReplicaSpec"]
