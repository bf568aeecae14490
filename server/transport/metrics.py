"""Prometheus metrics on ``metrics_port`` (``/metrics``): per-RPC counts by status code and latency
histograms (recorded by the interceptor), and, read from the engine at each scrape, the writer's
queue depth and commit groups, pending vectors per embedding space, LMDB map use, memories per tier
and the lifecycle's moves; with replication, the replicas connected and how far behind the
furthest is, or on a replica whether it follows its leader and the commit it stored. One registry per server (several may run in one process: tests).
Search followers are other processes: their own calls are not counted here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tiermem.server.config import TIER_NAMES, TIERS
from tiermem.server.core.engine import Engine
from tiermem.server.transport.replication import ReplicaAcks, ReplicaFollower

# Latency buckets, seconds: searches take about a millisecond, exports seconds.
_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_KINDS = ("promotions", "demotions", "evictions", "deletions")


class Metrics:
    """The metrics of one server; ``observe`` is called by the interceptor once a call ends."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter(
            "tiermem_rpc_total",
            "Calls answered, by method and status code",
            ("method", "code"),
            registry=self.registry,
        )
        self.seconds = Histogram(
            "tiermem_rpc_seconds",
            "Time to answer a call, by method",
            ("method",),
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._engine: Callable[[], Engine | None] = lambda: None
        self._replication: Callable[[], Replication] = lambda: (None, None)
        self.registry.register(_EngineCollector(lambda: self._engine()))
        self.registry.register(_ReplicationCollector(lambda: self._engine(), lambda: self._replication()))

    def attach(
        self, engine: Callable[[], Engine | None], replication: Callable[[], Replication] | None = None
    ) -> None:
        """Read ``engine()`` and ``replication()`` (the leader's acks, a replica's follower) at scrapes."""
        self._engine = engine
        if replication is not None:
            self._replication = replication

    def observe(self, method: str, code: str, seconds: float) -> None:
        name = method.rsplit("/", 1)[-1]
        self.calls.labels(name, code).inc()
        self.seconds.labels(name).observe(seconds)

    def serve(self, host: str, port: int) -> Any:
        """Start the HTTP endpoint; returns its server (``.server_port``, ``.shutdown()``)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server


Replication = tuple[ReplicaAcks | None, ReplicaFollower | None]


class _ReplicationCollector(Collector):
    def __init__(self, engine: Callable[[], Engine | None], replication: Callable[[], Replication]) -> None:
        self._engine, self._replication = engine, replication

    def collect(self) -> Iterator[Any]:
        eng = self._engine()
        acks, follower = self._replication()
        if eng is None:
            return
        if acks is not None:
            yield GaugeMetricFamily(
                "tiermem_commit_seq", "The last commit's sequence number", value=eng.committed_seq
            )
            count, furthest = acks.figures()
            yield GaugeMetricFamily(
                "tiermem_replicas_connected", "Replicas following this server", value=count
            )
            if count:  # (commits no replica has stored yet: what a failover now would lose)
                yield GaugeMetricFamily(
                    "tiermem_replica_commits_behind",
                    "Commits the furthest replica has not confirmed",
                    value=max(eng.committed_seq - furthest, 0),
                )
        if follower is not None and eng.is_replica:  # (a promoted replica follows no one)
            yield GaugeMetricFamily(
                "tiermem_replica_connected",
                "1 while this replica receives its leader's changes, else 0",
                value=int(follower.connected.is_set()),
            )
            yield GaugeMetricFamily(
                "tiermem_replica_applied_seq",
                "The leader's last commit this replica stored (the leader's tiermem_commit_seq)",
                value=follower.applied,
            )
            yield CounterMetricFamily(
                "tiermem_replica_full_copies",
                "Full copies received from the leader",
                value=follower.full_copies,
            )


class _EngineCollector(Collector):
    def __init__(self, engine: Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Any]:
        eng = self._engine()
        if eng is None:  # (starting)
            return
        st = eng.state
        yield GaugeMetricFamily(
            "tiermem_writer_queue_depth", "Writes waiting for the writer", value=st.writer.queue_depth()
        )
        yield CounterMetricFamily(
            "tiermem_writes_committed", "Write operations committed", value=st.writer.ops_committed
        )
        yield CounterMetricFamily(
            "tiermem_commit_groups", "LMDB commits (one fsync each; writes per group = writes / groups)",
            value=st.writer.groups_committed,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "tiermem_lmdb_used_bytes", "LMDB pages in use, bytes", value=st.store.used_bytes()
        )
        yield GaugeMetricFamily("tiermem_lmdb_map_bytes", "LMDB map size, bytes", value=st.store.map_size)
        pending = GaugeMetricFamily(
            "tiermem_pending_vectors", "Vectors waiting for HNSW, by space", labels=("space",)
        )
        live = GaugeMetricFamily("tiermem_live_vectors", "Live vectors, by space", labels=("space",))
        for sp in list(st.spaces.values()):
            figures = [idx.counts() for idx in list(sp.indexes.values())]
            pending.add_metric([sp.model], sum(f[1] for f in figures))
            live.add_metric([sp.model], sum(f[2] for f in figures))
        yield pending
        yield live
        report = eng.stats()
        tiers = GaugeMetricFamily("tiermem_memories", "Live memories, by tier", labels=("tier",))
        moves = CounterMetricFamily(
            "tiermem_lifecycle_moves", "Lifecycle moves out of a tier, by kind", labels=("tier", "kind")
        )
        for t in report.tiers:
            tiers.add_metric([TIER_NAMES[t.tier]], t.count)
        totals = st.lifecycle.by_tier()
        for tier in TIERS:
            for k, kind in enumerate(_KINDS):
                moves.add_metric([TIER_NAMES[tier], kind], int(totals[tier, k]))
        yield tiers
        yield moves
