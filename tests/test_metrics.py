"""Prometheus metrics of a real server, scraped over HTTP: per-RPC counts by status code and
latency histograms, and the engine's figures read at each scrape."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tiermem.client import MemoryClient, NotFoundError, TiermemError
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb


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


def test_calls_refused_before_their_handler_are_counted(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A missing or unknown key and a server at its limit of calls: what operators alert on."""
    keys_file = tmp_path / "keys.json"
    token = add_key(keys_file, [""], "admin")
    running = server_factory(
        metrics_port=0, api_keys=str(keys_file), max_concurrent_rpcs=2, monitoring_reserved_rpcs=1
    )
    for key in (None, "tm_nope_nope"):
        with MemoryClient(f"127.0.0.1:{running.port}", timeout=10, api_key=key) as c:
            with pytest.raises(TiermemError) as err:
                c.get("metrics", "m1")
            assert err.value.code.name == "UNAUTHENTICATED"
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=10, api_key=token) as c:
        gate = threading.Event()

        def chunks() -> Iterator[pb.ImportMemoriesRequest]:
            yield pb.ImportMemoriesRequest(header=pb.ExportHeader(format_version=1))
            gate.wait(20)

        for _ in range(100):  # (an import waiting for its next chunk: the one call allowed in flight)
            held = c.stub.ImportMemories.future(chunks())
            time.sleep(0.1)
            if not held.done():  # (else it was refused itself: a call of ours still held the place)
                break
        with pytest.raises(TiermemError) as err:
            c.get("metrics", "m1")
        assert err.value.reason == "SERVER_BUSY"
        gate.set()
        held.result(timeout=20)
    m = scrape(running)
    assert m[("tiermem_rpc_total", (("code", "UNAUTHENTICATED"), ("method", "GetMemory")))] == 2
    assert m[("tiermem_rpc_total", (("code", "RESOURCE_EXHAUSTED"), ("method", "GetMemory")))] >= 1


def test_a_metrics_port_in_use_fails_the_start_in_one_line(
    server_factory: Callable[..., RunningServer],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(FailedPrecondition) as err:
            server_factory(metrics_port=port, metrics_host="127.0.0.1")
    assert err.value.reason == "CANNOT_LISTEN" and f"127.0.0.1:{port}" in str(err.value)
    assert "metrics" in str(err.value)
