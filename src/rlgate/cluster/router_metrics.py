"""``GET /metrics`` through the router: every replica's Prometheus metrics, one ``replica`` label each.

Before (issue 23) the router forwarded ``/metrics`` to one random replica: a scrape counted 3 of
6 chat calls and had no replica label. Now the router scrapes each replica (admin key, as any
``/metrics`` call), parses the text with ``prometheus_client``'s parser, adds
``replica="<index>"`` to every sample, and writes one exposition with ``prometheus_client``'s
writer, so a family's ``# HELP`` / ``# TYPE`` appear once and sums over ``replica`` are the
cluster's totals. It adds ``rlgate_router_replica_up{replica}`` (1 while the replica answered
this scrape) and ``rlgate_router_forwarded_total`` (requests this router forwarded).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from rlgate.cluster.upstream import UpstreamUnavailable

if TYPE_CHECKING:
    from rlgate.cluster.directory import ReplicaInfo, ReplicaTable
    from rlgate.cluster.upstream import Upstream

CONTENT_TYPE = CONTENT_TYPE_LATEST


class _Families:
    """A collector that yields the merged families (``prometheus_client`` writes them)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge(texts: list[tuple[int, str]], forwarded: int, up: dict[int, bool]) -> bytes:
    """One exposition of the replicas' ``(index, text)`` scrapes, each sample labelled with its replica."""
    merged: dict[tuple[str, str], Metric] = {}
    for index, text in texts:
        for fam in text_string_to_metric_families(text):
            into = merged.get((fam.name, fam.type))
            if into is None:
                into = merged[(fam.name, fam.type)] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            label = str(index)
            into.samples += [Sample(s.name, {**s.labels, "replica": label}, s.value, s.timestamp, s.exemplar)
                             for s in fam.samples]
    own = Metric("rlgate_router_replica_up", "1 while the replica answered the router's scrape", "gauge")
    own.samples = [Sample("rlgate_router_replica_up", {"replica": str(i)}, 1.0 if ok else 0.0)
                   for i, ok in sorted(up.items())]
    fwd = Metric("rlgate_router_forwarded", "Requests this router forwarded to a replica", "counter")
    fwd.samples = [Sample("rlgate_router_forwarded_total", {}, float(forwarded))]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*merged.values(), own, fwd]))
    return generate_latest(registry)


async def _scrape(upstream: Upstream, table: ReplicaTable, r: ReplicaInfo, headers: list[tuple[bytes, bytes]]
                  ) -> str | None:
    if not r.url or r.state == "down":
        return None
    try:
        status, _, data = await upstream.call(r.url, "GET", "/metrics", headers, b"")
    except UpstreamUnavailable as exc:
        table.mark_down(r, str(exc))
        return None
    return data.decode("utf-8", "replace") if status == 200 else None


async def cluster_exposition(upstream: Upstream, table: ReplicaTable, forwarded: int,
                             headers: list[tuple[bytes, bytes]]) -> bytes:
    """Scrape every replica at once (the caller's admin key goes along) and merge."""
    replicas = list(table.replicas)
    texts: list[Any] = await asyncio.gather(*(_scrape(upstream, table, r, headers) for r in replicas))
    up = {r.index: t is not None for r, t in zip(replicas, texts, strict=True)}
    return merge([(r.index, t) for r, t in zip(replicas, texts, strict=True) if t is not None], forwarded, up)
