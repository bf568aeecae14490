"""Prometheus metrics of a real server, scraped over HTTP: per-RPC counts by status code and
latency histograms, and the engine's figures read at each scrape."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tiermem.client import MemoryClient, NotFoundError
from tiermem.server.transport.app import RunningServer


def scrape(running: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_calls_and_engine_figures_are_exported(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory(metrics_port=0)
    assert running.metrics_port > 0
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        for i in range(3):
            c.create(
                "metrics",
                f"memory {i}",
                tier="fast",
                embedding=[0.1, 0.2, 0.3, float(i)],
                embedding_model="m",
            )
        with pytest.raises(NotFoundError):
            c.get("metrics", "missing")
        c.consolidate("metrics")
    m = scrape(running)
    assert m[("tiermem_rpc_total", (("code", "OK"), ("method", "CreateMemory")))] == 3
    assert m[("tiermem_rpc_total", (("code", "NOT_FOUND"), ("method", "GetMemory")))] == 1
    assert m[("tiermem_rpc_seconds_count", (("method", "CreateMemory"),))] == 3
    assert m[("tiermem_memories", (("tier", "FAST"),))] == 3
    assert m[("tiermem_live_vectors", (("space", "m"),))] == 3
    assert ("tiermem_pending_vectors", (("space", "m"),)) in m
    assert m[("tiermem_writes_committed_total", ())] >= 3 and m[("tiermem_commit_groups_total", ())] >= 1
    assert (
        m[("tiermem_lmdb_used_bytes", ())] > 0
        and m[("tiermem_lmdb_map_bytes", ())] >= m[("tiermem_lmdb_used_bytes", ())]
    )
    assert m[("tiermem_writer_queue_depth", ())] >= 0
    assert ("tiermem_lifecycle_moves_total", (("kind", "promotions"), ("tier", "FAST"))) in m


def test_no_metrics_endpoint_unless_asked(server: RunningServer) -> None:
    assert server.metrics_port == 0 and server.metrics_server is None
