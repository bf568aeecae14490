"""Index snapshots per tier, exact ranking when filtered HNSW comes back short, request-id scope and
expiry, the maintenance sweep, write-group sizing and searches racing deletes and tier moves."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FakeClock, make_record, queued_behind_a_held_write

from tiermem.client import (
    AlreadyExistsError,
    DeadlineExceededError,
    InvalidArgumentError,
    MemoryClient,
    NotFoundError,
    TiermemError,
)
from tiermem.server.agent.graph import GraphMemory
from tiermem.server.config import ServerConfig, Tuning
from tiermem.server.core.engine import Engine
from tiermem.server.core.lifecycle import Move, apply_moves
from tiermem.server.model.reports import SweepReport
from tiermem.server.storage.store import Store
from tiermem.server.storage.writer import Writer
from tiermem.server.transport.app import RunningServer

MODEL = "robust"


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=60)
    c.wait_ready()
    return c


def _lifecycle_totals(eng: Engine, namespace: str, tier: int) -> list[int]:
    """[promotions, demotions, evictions, deletions] ever of a namespace's tier, from stats."""
    return next(t.totals for t in eng.stats(namespace).tiers if t.tier == tier)


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_every_tier_snapshot_is_reused_after_clean_restart(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    rng = np.random.default_rng(1)
    vecs = _unit(rng, 40, 8)
    running = server_factory(data_dir=data)
    with _client(running) as c:
        tiers = ["fast", "medium", "slow", "glacial"]
        for i, v in enumerate(vecs):
            c.create("ns", f"m{i}", id=f"m{i}", embedding=v, embedding_model=MODEL, tier=tiers[i % 4])
        for i in range(4):  # one dead entry per tier: well under the 25% compaction threshold
            c.delete("ns", f"m{i}")
        # A stop leaves what the indexer has not moved yet out of the snapshots (start-up adds it
        # from LMDB): wait until it has, so every tier's snapshot holds its 10 entries.
        deadline = time.monotonic() + 30
        while any(s.pending_vectors for s in c.stats().spaces) and time.monotonic() < deadline:
            time.sleep(0.05)
    running.stop(0)
    manifests = sorted((data / "indexes").glob("*-t[0-9].json"))  # index manifests (not columns.json)
    assert len(manifests) == 4, manifests
    assert {json.loads(m.read_text())["n"] for m in manifests} == {10}

    running = server_factory(data_dir=data)
    with _client(running) as c:
        [space] = [s for s in c.stats().spaces if s.embedding_model == MODEL]
        # Snapshots were used, not rebuilt: the dead entries are still in the graphs.
        assert (space.live_vectors, space.indexed_vectors + space.pending_vectors) == (36, 40)
        for i in range(4, 40):
            hits = c.search("ns", vecs[i], embedding_model=MODEL, alpha=1, beta=0, gamma=0, limit=1)
            assert hits[0].memory.id == f"m{i}"
            assert hits[0].relevance == pytest.approx(1.0, abs=1e-5)


def test_snapshot_of_another_database_is_ignored(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    rng = np.random.default_rng(2)
    a, b = _unit(rng, 30, 8), _unit(rng, 30, 8)
    for name, vecs in (("a", a), ("b", b)):
        running = server_factory(data_dir=tmp_path / name)
        with _client(running) as c:
            c.create_batch(
                [
                    {
                        "namespace": "ns",
                        "content": f"{name}{i}",
                        "id": f"m{i}",
                        "embedding": v,
                        "embedding_model": MODEL,
                    }
                    for i, v in enumerate(vecs)
                ]
            )
        running.stop(0)
    # Put database a's snapshots next to database b (same model, same sizes, same vks).
    shutil.rmtree(tmp_path / "b" / "indexes")
    shutil.copytree(tmp_path / "a" / "indexes", tmp_path / "b" / "indexes")
    running = server_factory(data_dir=tmp_path / "b")
    with _client(running) as c:
        for i in (0, 7, 29):
            hit = c.search("ns", b[i], embedding_model=MODEL, alpha=1, beta=0, gamma=0, limit=1)[0]
            assert hit.memory.id == f"m{i}"
            assert hit.relevance == pytest.approx(1.0, abs=1e-5)


def test_short_filtered_hnsw_answers_do_not_cut_the_ranking(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A small namespace inside a big index: filtered HNSW often returns fewer than k results."""
    graph_only = Tuning(exact_entries=0, exact_per_k=0)  # the graph, not an exact scan of the 120
    running = server_factory(exact_search_max_rows=8, hnsw_m=8, tuning=graph_only)
    rng = np.random.default_rng(3)
    dim = 16
    big, small = _unit(rng, 3000, dim), _unit(rng, 120, dim)
    with _client(running) as c:
        for lo in range(0, 3000, 500):
            c.create_batch(
                [
                    {"namespace": "big", "content": f"b{lo + j}", "embedding": v, "embedding_model": MODEL}
                    for j, v in enumerate(big[lo : lo + 500])
                ]
            )
        c.create_batch(
            [
                {
                    "namespace": "small",
                    "content": f"s{j}",
                    "id": f"s{j}",
                    "embedding": v,
                    "embedding_model": MODEL,
                }
                for j, v in enumerate(small)
            ]
        )
        overlaps = []
        for q in _unit(rng, 20, dim):
            got = [r.memory.id for r in c.search("small", q, embedding_model=MODEL, alpha=1, beta=0, gamma=0)]
            want = [f"s{j}" for j in np.argsort(-(small @ q), kind="stable")[:10]]
            overlaps.append(len(set(got) & set(want)) / 10)
        print(f"mean overlap with exact ranking: {np.mean(overlaps):.3f}")
        assert np.mean(overlaps) >= 0.98

        # alpha = 0 ranks by recency and importance alone and must not loop or fail.
        hits = c.search("small", small[0], embedding_model=MODEL, alpha=0, beta=0, gamma=1, limit=5)
        assert len(hits) == 5


def test_request_ids_are_scoped_by_namespace_and_bounded(client: MemoryClient) -> None:
    a = client.create("ns-a", "first", request_id="same-request")
    b = client.create("ns-b", "second", request_id="same-request")
    assert a.id != b.id and b.namespace == "ns-b"
    with pytest.raises(InvalidArgumentError) as info:
        client.create("ns-a", "x", request_id="\N{GRINNING FACE}" * 40)  # 40 characters, 160 bytes
    assert info.value.fields == ["request_id"]


def test_sweep_deletes_expired_memories_and_forgets_old_request_ids(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, maintenance_interval_seconds=0, request_id_ttl_seconds=3600)
    with _client(running) as c:
        c.create("ns", "short-lived", id="tmp", expire_time=clock.now + 10)
        c.create("ns", "durable", id="keep", request_id="r1")
        clock.advance(11)
        assert c.stats("ns").memory_count == 1  # expired memories are not counted
        # An expired id is free again, even before the sweep.
        c.create("ns", "reborn", id="tmp")
        assert c.get("ns", "tmp").content == "reborn"
        c.update("ns", "tmp", expire_time=clock.now + 5)
        clock.advance(6)
        assert running.engine.sweep() == SweepReport(expired_deleted=1, request_ids_forgotten=0)
        with pytest.raises(NotFoundError):
            c.get("ns", "tmp")
        assert [(n.name, n.memory_count) for n in c.list_namespaces()] == [("ns", 1)]
        # Within the TTL a retry is deduplicated; after it the request id is forgotten.
        assert c.create("ns", "durable", id="keep", request_id="r1").id == "keep"
        clock.advance(3600)
        # r1 and the request ids the client generated for the two other creates
        assert running.engine.sweep().request_ids_forgotten == 3
        with pytest.raises(AlreadyExistsError):
            c.create("ns", "durable", id="keep", request_id="r1")


def test_write_groups_respect_the_byte_cap(tmp_path: Path) -> None:
    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 27)
    writer = Writer(store, max_group=1000, max_group_bytes=100, before_commit=lambda txn: None)
    gate = threading.Event()
    try:
        # Hold the writer in the first op so the others queue up behind it.
        first = threading.Thread(target=writer.submit, args=(lambda txn: gate.wait(10), lambda r: r, 1))
        first.start()
        time.sleep(0.05)
        threads = [
            threading.Thread(target=writer.submit, args=(lambda txn: None, lambda r: r, 60)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        time.sleep(0.1)
        gate.set()
        for t in [first, *threads]:
            t.join(10)
        assert writer.ops_committed == 7
        assert writer.groups_committed == 7  # 60 + 60 > 100: every weighted op got its own commit
    finally:
        writer.close()
        store.close()


def _queue_group(writer: Writer, prepares: list[Callable[[Any], Any]]) -> dict[int, Any]:
    """Submit ``prepares`` in order while the writer is held in another write, so they form one
    group; returns each one's result or error by position."""
    gate, holding = threading.Event(), threading.Event()

    def hold(txn: Any) -> None:
        holding.set()
        gate.wait(10)

    results: dict[int, Any] = {}

    def submit(i: int) -> None:
        try:
            results[i] = writer.submit(prepares[i], lambda r: r)
        except Exception as e:
            results[i] = e

    first = threading.Thread(target=writer.submit, args=(hold, lambda r: r))
    first.start()
    assert holding.wait(10)
    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(prepares))]
    deadline = time.monotonic() + 10
    for i, t in enumerate(threads):  # one at a time: the group keeps this order
        t.start()
        while writer._queue.qsize() < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    gate.set()
    for t in [first, *threads]:
        t.join(10)
    return results


def test_a_group_that_succeeds_runs_in_one_transaction_and_a_failure_leaves_no_double_write(
    tmp_path: Path,
) -> None:
    """Operations of a group that all succeed share the group's transaction (no nested one each:
    py-lmdb gives up the GIL around every begin and commit). When one fails, the group runs again
    with each operation rolled back alone: the first run leaves nothing behind, so an operation
    that read-modify-writes a counter counts once."""
    from tiermem.server.model.errors import NotFound

    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 27)
    writer = Writer(store, max_group=1000, before_commit=lambda txn: None)
    seen: list[Any] = []

    def bump(txn: Any) -> int:
        seen.append(txn)
        n = int(txn.get(b"t:count", b"0", db=store.meta)) + 1
        txn.put(b"t:count", str(n).encode(), db=store.meta)
        return n

    def fail(txn: Any) -> None:
        txn.put(b"t:failed", b"v", db=store.meta)
        raise NotFound("no such thing")

    try:
        results = _queue_group(writer, [bump, bump, bump])
        assert [results[i] for i in range(3)] == [1, 2, 3]
        assert len(seen) == 3 and seen[0] is seen[1] is seen[2]  # one transaction, no nested ones

        seen.clear()
        results = _queue_group(writer, [bump, fail, bump])
        assert results[0] == 4 and isinstance(results[1], NotFound) and results[2] == 5
        assert len(seen) == 3  # the first bump ran before the failure, then both again, each alone
        with store.env.begin() as txn:
            assert txn.get(b"t:count", db=store.meta) == b"5"
            assert txn.get(b"t:failed", db=store.meta) is None
    finally:
        writer.close()
        store.close()


def test_a_failed_commit_fails_its_group_once_and_leaves_the_counters(tmp_path: Path) -> None:
    """A failure outside the operations (here the last step before the commit) fails the whole
    group at once: no second run, nothing committed, and the store's commit sequence and change
    count are back where they were, so the next commit follows the last one."""
    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 27)
    in_txn: list[int] = []

    def before_commit(txn: Any) -> None:
        store.next_seq(txn, 0.0)
        ops, in_txn[:] = list(in_txn), []
        if 2 in ops:
            raise RuntimeError("disk on fire")

    writer = Writer(store, max_group=1000, before_commit=before_commit)
    runs: list[int] = []

    def put(i: int) -> Callable[[Any], Any]:
        def prepare(txn: Any) -> int:
            runs.append(i)
            in_txn.append(i)
            store.put(txn, make_record(i))
            return i

        return prepare

    try:
        assert writer.submit(put(1), lambda r: r) == 1
        seq, changed = store.seq, store.changed_count
        results = _queue_group(writer, [put(2), put(3)])  # behind a held write, which commits
        assert all(isinstance(results[i], Exception) and "disk on fire" in str(results[i]) for i in (0, 1))
        assert runs == [1, 2, 3]  # each prepare ran once
        assert (store.seq, store.changed_count) == (seq + 1, changed)  # the held write's commit only
        assert writer.submit(put(4), lambda r: r) == 4
        assert (store.seq, store.changed_count) == (seq + 2, changed + 1)
        with store.env.begin() as txn:
            assert store.get(txn, 2) is None and store.get(txn, 3) is None and store.get(txn, 4) is not None
            assert txn.get(b"commit_seq", db=store.meta) == (seq + 2).to_bytes(8, "big")
    finally:
        writer.close()
        store.close()


def test_two_tier_moves_committed_together_both_count(tmp_path: Path) -> None:
    """Lifecycle counters are read from the transaction: two chunks of moves of the same namespace
    and tier committed in one group both count, in LMDB as in memory, and after a restart."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.core.policy import DEMOTE_IDLE
    from tiermem.server.transport import convert
    from tiermem.v1 import memory_pb2 as pb

    cfg = ServerConfig(
        data_dir=tmp_path / "data", maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    eng = Engine(cfg)
    try:
        rng = np.random.default_rng(3)
        mems = []
        for i in range(2):
            v = rng.standard_normal(8).astype(np.float32)
            m = pb.Memory(namespace="ns", content=f"memory {i}", embedding=(v / np.linalg.norm(v)).tolist())
            m.embedding_model, m.tier = "m8", 3
            mems.append(convert.new_memory_from_pb(m, "memory."))
        recs = eng.create(mems, batch=True)
        now = eng.clock()
        moves = [lambda txn, r=r: apply_moves(eng.state, [Move(r.rid, 3, 4, DEMOTE_IDLE)], now) for r in recs]
        gate, holding = threading.Event(), threading.Event()

        def hold(txn: Any) -> None:
            holding.set()
            gate.wait(10)

        first = threading.Thread(target=eng.writer.submit, args=(hold, lambda r: r))
        first.start()
        assert holding.wait(10)
        threads = [threading.Thread(target=move, args=(None,)) for move in moves]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while eng.writer._queue.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        groups = eng.writer.groups_committed
        gate.set()
        for t in [first, *threads]:
            t.join(10)
        assert eng.writer.groups_committed == groups + 2  # the held one, then both moves together
        with eng.store.read() as txn:
            assert eng.store.lifecycle_counter(txn, "ns", 3) == [0, 2, 0, 0]
        assert _lifecycle_totals(eng, "ns", 3) == [0, 2, 0, 0]
    finally:
        eng.close()
    eng = Engine(cfg)
    try:
        assert _lifecycle_totals(eng, "ns", 3) == [0, 2, 0, 0]
    finally:
        eng.close()


def test_a_write_queued_behind_a_protection_is_refused(tmp_path: Path) -> None:
    """Protection is checked again in the write's own transaction: writes that passed the check on
    arrival while the protection was still queued ahead of them fail with NAMESPACE_PROTECTED and
    change nothing; with confirm they go through."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.errors import FailedPrecondition
    from tiermem.server.model.types import Filter
    from tiermem.server.transport import convert
    from tiermem.v1 import memory_pb2 as pb

    vault, other = "user:a/vault", "user:a/scratch"
    cfg = ServerConfig(
        data_dir=tmp_path / "data", maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    eng = Engine(cfg)
    try:
        new = [
            convert.new_memory_from_pb(pb.Memory(namespace=ns, id=mid, content=f"{ns} {mid}"), "memory.")
            for ns, mid in [(vault, "a"), (vault, "b"), (vault, "c"), (vault, "d"), (other, "x")]
        ]
        eng.create(new, batch=True)
        change = convert.new_memory_from_pb(pb.Memory(importance=0.9), "memory.")

        def contents() -> dict[str, list[tuple[str, str, float]]]:
            return {
                ns: sorted(
                    (r.id, r.content, r.importance) for r in eng.list_memories(ns, 100, "", Filter())[0]
                )
                for ns in (vault, other)
            }

        before = contents()
        attempts: list[Callable[[], Any]] = [
            lambda: eng.update(vault, "a", change, ["importance"]),
            lambda: eng.delete(vault, "b"),
            lambda: eng.transfer(vault, "c", target_namespace=other, move=True),
            lambda: eng.transfer(
                other, "x", target_namespace=vault, target_id="d", move=False, overwrite=True
            ),
            lambda: eng.delete_namespace("user:a", include_children=True),
        ]
        protect = lambda: eng.update_namespace_config(vault, True, {}, ["protected"])  # noqa: E731
        got = queued_behind_a_held_write(eng.writer, [protect, *attempts])[0]
        assert got[0][0] == {"protected": True}
        for name, result in zip(
            ["update", "delete", "move out", "overwrite in", "clear"], got[1:], strict=True
        ):
            assert isinstance(result, FailedPrecondition), (name, result)
            assert result.reason == "NAMESPACE_PROTECTED", name
        assert contents() == before
        assert eng.get_namespace_config(vault)[0] == {"protected": True}

        # The same writes with confirm, queued behind the protection, go through.
        eng.update_namespace_config(vault, False, {}, ["protected"], confirm=True)
        confirmed: list[Callable[[], Any]] = [
            protect,
            lambda: eng.update(vault, "a", change, ["importance"], confirm=True),
            lambda: eng.delete(vault, "b", confirm=True),
        ]
        got = queued_behind_a_held_write(eng.writer, confirmed)[0]
        assert got[1].importance == pytest.approx(0.9) and got[2] is None
        assert sorted(r.id for r in eng.list_memories(vault, 100, "", Filter())[0]) == ["a", "c", "d"]

        # A child with no memories, only graph facts, protected just ahead of a clear of its parent.
        empty = "user:a/facts"
        eng.update_namespace_config(vault, False, {}, ["protected"], confirm=True)
        GraphMemory(eng.store, eng.writer, eng.config, eng.clock).upsert_node(
            empty, {"id": "ana", "label": "person"}
        )
        got, _ = queued_behind_a_held_write(
            eng.writer,
            [
                lambda: eng.update_namespace_config(empty, True, {}, ["protected"]),
                lambda: eng.delete_namespace("user:a", include_children=True, confirm=False),
            ],
        )
        assert isinstance(got[1], FailedPrecondition) and got[1].reason == "NAMESPACE_PROTECTED"
        with eng.store.read() as txn:
            assert [item[0] for item in eng.store.graph_items(txn, empty)] == ["node"]
    finally:
        eng.close()


def test_namespace_settings_queued_together_are_merged_not_lost(tmp_path: Path) -> None:
    """Two settings changes committed in one group each change only their fields: the second
    merges with what the first wrote, not with the settings in memory before either."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.errors import FailedPrecondition

    ns = "user:a/vault"
    cfg = ServerConfig(
        data_dir=tmp_path / "data", maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    eng = Engine(cfg)
    try:
        got, _ = queued_behind_a_held_write(
            eng.writer,
            [
                lambda: eng.update_namespace_config(ns, True, {}, ["protected"]),
                # (the policy of a protected namespace changes with confirm only)
                lambda: eng.update_namespace_config(ns, False, {"retention": 4}, ["policy.retention"], True),
                lambda: eng.update_namespace_config(ns, False, {}, ["protected"]),  # unprotect, no confirm
            ],
        )
        assert got[0][0] == {"protected": True}
        assert got[1][0] == {"protected": True, "policy": {"retention": 4}}
        assert got[1][1].retention == 4
        assert isinstance(got[2], FailedPrecondition) and got[2].reason == "NAMESPACE_PROTECTED"
        assert eng.get_namespace_config(ns)[0] == {"protected": True, "policy": {"retention": 4}}
    finally:
        eng.close()
    eng = Engine(cfg)
    try:
        assert eng.get_namespace_config(ns)[0] == {"protected": True, "policy": {"retention": 4}}
    finally:
        eng.close()


def test_a_failed_write_in_a_group_fails_alone(tmp_path: Path) -> None:
    """Writes queued together share one commit; one that fails half-way (after a put) leaves no
    trace and fails alone, the others of its group commit."""
    from tiermem.server.model.errors import NotFound
    from tiermem.server.model.errors import TiermemError as ServerError

    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 27)
    writer = Writer(store, max_group=1000, before_commit=lambda txn: None)
    gate, holding = threading.Event(), threading.Event()

    def hold(txn: Any) -> None:
        holding.set()
        gate.wait(10)

    def put(key: bytes, then_fail: BaseException | None = None) -> Callable[[Any], Any]:
        def prepare(txn: Any) -> bytes:
            txn.put(key, b"v", db=store.meta)
            if then_fail is not None:
                raise then_fail
            return key

        return prepare

    results: dict[bytes, Any] = {}

    def submit(key: bytes, then_fail: BaseException | None = None) -> None:
        try:
            results[key] = writer.submit(put(key, then_fail), lambda r: r)
        except Exception as e:
            results[key] = e

    try:
        first = threading.Thread(target=writer.submit, args=(hold, lambda r: r))
        first.start()
        assert holding.wait(10)  # the writer is inside the first write
        deadline = time.monotonic() + 10
        ops = [
            (b"t:a", None),
            (b"t:b", NotFound("no such thing")),
            (b"t:c", RuntimeError("a bug")),
            (b"t:d", None),
        ]
        threads = [threading.Thread(target=submit, args=op) for op in ops]
        for t in threads:
            t.start()
        while writer._queue.qsize() < len(ops) and time.monotonic() < deadline:
            time.sleep(0.01)
        groups = writer.groups_committed
        gate.set()  # the four queued writes now form one group
        for t in [first, *threads]:
            t.join(10)
        assert results[b"t:a"] == b"t:a" and results[b"t:d"] == b"t:d"
        assert isinstance(results[b"t:b"], NotFound)
        assert isinstance(results[b"t:c"], ServerError) and "a bug" in str(results[b"t:c"])
        assert writer.groups_committed == groups + 2  # the held one, then the group of four
        with store.env.begin() as txn:
            assert [txn.get(k, db=store.meta) for k, _ in ops] == [b"v", None, None, b"v"]

        # Alone: the failed write leaves no trace either.
        submit(b"t:e", NotFound("no such thing"))
        assert isinstance(results[b"t:e"], NotFound)
        with store.env.begin() as txn:
            assert txn.get(b"t:e", db=store.meta) is None
    finally:
        gate.set()
        writer.close()
        store.close()


def test_searches_race_deletes_and_tier_moves_without_errors(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory(exact_search_max_rows=16)
    rng = np.random.default_rng(5)
    vecs = _unit(rng, 600, 16)
    errors: list[BaseException] = []
    with _client(running) as c:
        c.create_batch(
            [
                {
                    "namespace": "ns",
                    "content": f"m{i}",
                    "id": f"m{i}",
                    "embedding": v,
                    "embedding_model": MODEL,
                }
                for i, v in enumerate(vecs)
            ]
        )
        stop = time.monotonic() + 2.0

        def searcher() -> None:
            while time.monotonic() < stop:
                try:
                    for r in c.search("ns", rng.normal(size=16), embedding_model=MODEL, limit=20):
                        assert r.memory.namespace == "ns"
                except BaseException as e:
                    errors.append(e)
                    return

        def mutator() -> None:
            i = 0
            while time.monotonic() < stop and i < 600:
                try:
                    if i % 3 == 0:
                        c.delete("ns", f"m{i}")
                    else:
                        c.update("ns", f"m{i}", tier=["fast", "medium", "glacial"][i % 3])
                except TiermemError as e:
                    errors.append(e)
                    return
                i += 1

        threads = [threading.Thread(target=searcher) for _ in range(4)] + [threading.Thread(target=mutator)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors[:3]


def test_a_second_engine_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """Two servers on one data directory would each keep their own columns and indexes over the same
    LMDB: the second is refused until the first closes."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.errors import StorageError

    cfg = ServerConfig(
        data_dir=tmp_path / "data", maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    first = Engine(cfg)
    try:
        with pytest.raises(StorageError) as err:
            Engine(cfg)
        assert err.value.reason == "DATA_DIR_IN_USE"
    finally:
        first.close()
    second = Engine(cfg)  # released by close()
    second.close()


def _kernel_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tiermem-kernels")]


def test_kernels_load_beside_the_data_and_a_failed_load_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels load on a thread of their own while the columns and indexes load: an engine that
    opened has them ready and that thread gone; a load that fails waits for it before the error
    comes back, and leaves the data directory free for the next start."""
    from tiermem import kernels
    from tiermem.server.core import startup
    from tiermem.server.model.errors import StorageError

    cfg = ServerConfig(
        data_dir=tmp_path / "data", maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    Engine(cfg).close()
    seen: list[str] = []
    real_warm_up, real_load = kernels.warm_up, startup.load

    def slow_warm_up() -> None:
        time.sleep(0.3)  # (still running when the load fails)
        seen.append(threading.current_thread().name)
        real_warm_up()
        seen.append("done")

    def failing_load(st: Any) -> None:
        real_load(st)
        raise StorageError("the load failed after reading everything", "STORAGE_DAMAGED")

    monkeypatch.setattr(kernels, "warm_up", slow_warm_up)
    monkeypatch.setattr(startup, "load", failing_load)
    with pytest.raises(StorageError, match="the load failed"):
        Engine(cfg)
    # It ran on its own thread and had finished before the error came back.
    assert len(seen) == 2 and seen[0].startswith("tiermem-kernels") and seen[1] == "done", seen
    deadline = time.monotonic() + 10
    while _kernel_threads() and time.monotonic() < deadline:  # (its thread ends after its one job)
        time.sleep(0.01)
    assert not _kernel_threads()
    monkeypatch.setattr(startup, "load", real_load)
    engine = Engine(cfg)  # the failed start let the directory go
    try:
        assert len(seen) == 4 and seen[3] == "done", seen  # (its kernels ready when it opened)
    finally:
        engine.close()


def test_streams_never_take_every_handler_thread(tmp_path: Path) -> None:
    """An export or import stream holds a handler thread while it runs: at most half of them may be
    streams (RESOURCE_EXHAUSTED TOO_MANY_STREAMS beyond), so unary calls always find one."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.errors import ResourceExhausted
    from tiermem.server.transport.servicer import MemoryServicer

    cfg = ServerConfig(
        data_dir=tmp_path / "data", max_workers=5, maintenance_interval_seconds=0, snapshot_interval_seconds=0
    )
    engine = Engine(cfg)
    try:
        servicer = MemoryServicer(engine)
        with servicer._stream_slot(), servicer._stream_slot():  # 5 // 2 = 2 slots
            with pytest.raises(ResourceExhausted) as err, servicer._stream_slot():
                pass
            assert err.value.reason == "TOO_MANY_STREAMS"
        with servicer._stream_slot():  # released on exit
            pass
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TIERMEM_IMPORTANCE_FLOOR": "1.5"}, "importance_floor"),
        ({"TIERMEM_ALPHA": "-0.5"}, "alpha"),
        ({"TIERMEM_GAMMA": "nan"}, "gamma"),
        ({"TIERMEM_MAX_WORKERS": "0"}, "max_workers"),
        ({"TIERMEM_HNSW_M": "1"}, "hnsw_m"),
        ({"TIERMEM_RECENCY_TAU_SECONDS": "0"}, "recency_tau_seconds"),
        ({"TIERMEM_SNAPSHOT_INTERVAL_SECONDS": "-1"}, "snapshot_interval_seconds"),
        ({"TIERMEM_MALLOC_MMAP_THRESHOLD": "-1"}, "malloc_mmap_threshold"),
        ({"TIERMEM_SEARCH_PROCESSES": "-1"}, "search_processes"),
        # (an endless wait overflowed the thread timers on every synchronous write, after storing it)
        (
            {"TIERMEM_REPLICATION": "1", "TIERMEM_REPLICA_ACK_TIMEOUT_SECONDS": "inf"},
            "replica_ack_timeout_seconds",
        ),
        (
            {"TIERMEM_REPLICATION": "1", "TIERMEM_REPLICA_ACK_TIMEOUT_SECONDS": "1e12"},
            "replica_ack_timeout_seconds",
        ),
        # (per-tier server defaults are held to a namespace policy's bounds: a huge capacity started,
        # then every search failed with INTERNAL; a half-life of 0 turned decay off)
        ({"TIERMEM_TIER_MAX_ITEMS": "1e30,500,200,100"}, "tier_max_items"),
        ({"TIERMEM_TIER_MAX_ITEMS": "1.5,500,200,100"}, "tier_max_items"),
        ({"TIERMEM_HALF_LIFE_HOURS": "0,24,168,720"}, "half_life_hours"),
        ({"TIERMEM_TIER_TTL_SECONDS": "0,3600,86400,604800"}, "tier_ttl_seconds"),
        ({"TIERMEM_TIER_IMPORTANCE_THRESHOLD": "2,0.1,0.1,0"}, "tier_importance_threshold"),
        # (past what gRPC keeps in a C int, LMDB maps, or thread timers wait: started, then a
        # traceback at start, or a background thread dead while the server ran on)
        ({"TIERMEM_MAX_MESSAGE_BYTES": "2147483648"}, "max_message_bytes"),
        ({"TIERMEM_MAP_SIZE": str(2**70)}, "map_size"),
        ({"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "inf"}, "maintenance_interval_seconds"),
        ({"TIERMEM_ACCESS_FLUSH_SECONDS": "inf"}, "access_flush_seconds"),
        ({"TIERMEM_SHUTDOWN_GRACE_SECONDS": "1e12"}, "shutdown_grace_seconds"),
        # (a missing CA file made a replica log a traceback every second, while reporting SERVING)
        (
            {"TIERMEM_REPLICA_OF": "127.0.0.1:1", "TIERMEM_REPLICA_TLS_CA": "/nonexistent/ca.pem"},
            "replica_tls_ca",
        ),
    ],
)
def test_invalid_settings_are_refused_with_their_name(
    env: dict[str, str], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=f"setting {named}="):
        ServerConfig.from_env(env)
    # The command line refuses to start (exit status 2) and names the setting, before touching data.
    proc = subprocess.run(
        [sys.executable, "-m", "tiermem.server", "--port", "0", "--data-dir", str(tmp_path / "d")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and named in proc.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("eviction_summary_tokens", 0),
        ("beside_min_rows", -1),
        ("follower_snapshot_bytes_per_second", -1),
        ("compact_dead_share", float("nan")),
        ("indexer_linger_seconds", float("inf")),
    ],
)
def test_invalid_tunings_are_refused_with_their_name(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"setting tuning.{field}="):
        ServerConfig(tuning=Tuning(**{field: value}))
    ServerConfig(tuning=Tuning())  # (the defaults pass)


@pytest.mark.parametrize("turns", [1, 2])
def test_searches_take_turns_search_concurrency_at_a_time(tmp_path: Path, turns: int) -> None:
    """More searches ranking at once than there are cores only contend for them (and the GIL):
    ``search_concurrency`` of them rank at a time, the others wait their turn and then run."""
    from contextlib import contextmanager

    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory
    from tiermem.server.search.searcher import SearchQuery, Turns

    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        search_concurrency=turns,
    )
    engine = Engine(cfg)
    inside, release = threading.Semaphore(0), threading.Event()

    class HeldTurns(Turns):  # turns of the same size; a search holding one stops until released
        @contextmanager
        def take(self, wanted: Callable[[], bool] | None = None) -> Iterator[None]:
            with super().take(wanted):
                inside.release()
                release.wait(30)
                yield

    assert isinstance(engine.searcher.turns, Turns)
    engine.searcher.turns = HeldTurns(turns)
    try:
        vecs = _unit(np.random.default_rng(3), 20, 8)
        engine.create(
            [NewMemory("ns", f"m{i}", embedding=vecs[i], embedding_model=MODEL) for i in range(20)],
            batch=True,
        )
        results: list[int] = []

        def search() -> None:
            q = SearchQuery(
                namespaces=["ns"], embedding=vecs[0], embedding_model=MODEL, limit=5, read_only=True
            )
            results.append(len(engine.search(q)))

        threads = [threading.Thread(target=search) for _ in range(turns + 1)]
        for t in threads:
            t.start()
        for _ in range(turns):
            assert inside.acquire(timeout=30), "a search did not start ranking"
        assert not inside.acquire(timeout=0.3), f"more than {turns} searches ranked at once"
        release.set()  # the waiting search gets its turn once one finishes
        assert inside.acquire(timeout=30)
        for t in threads:
            t.join(30)
        assert results == [5] * (turns + 1)
    finally:
        release.set()
        engine.close()


def test_a_search_past_its_deadline_while_waiting_for_its_turn_frees_its_handler(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A search still waiting for a ranking turn when its deadline passes gives up then
    (DEADLINE_EXCEEDED), not when a turn comes: its handler thread serves the next call while the
    turns stay taken."""
    import grpc

    from tiermem.v1 import memory_pb2 as pb

    srv = server_factory(max_workers=2, search_concurrency=1)
    with _client(srv) as c:
        vec = _unit(np.random.default_rng(4), 1, 8)[0]
        c.create("ns", "a memory", embedding=vec.tolist(), embedding_model=MODEL, id="m0")
        req = pb.SearchMemoriesRequest(
            namespaces=["ns"], query_embedding=vec.tolist(), embedding_model=MODEL, read_only=True
        )
        with srv.engine.searcher.turns.take():  # (the one turn, held: searches wait for it)
            waiting = [c.stub.SearchMemories.future(req, timeout=0.5) for _ in range(2)]  # (both handlers)
            for call in waiting:
                with pytest.raises(grpc.RpcError) as late:
                    call.result()
                assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            got = c.stub.GetMemory(pb.GetMemoryRequest(namespace="ns", id="m0"), timeout=10)
            assert got.memory.id == "m0"
        assert [r.memory.id for r in c.stub.SearchMemories(req, timeout=10).results] == ["m0"]


def test_a_search_that_waited_for_its_turn_ranks_at_the_time_it_runs(tmp_path: Path) -> None:
    """Recency is computed at the moment the search ranks, not when it queued for its turn."""
    from contextlib import contextmanager

    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory
    from tiermem.server.search.searcher import SearchHit, SearchQuery, Turns

    clock = FakeClock()
    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        search_concurrency=1,
    )
    engine = Engine(cfg, clock=clock)
    inside, release, arrived = threading.Semaphore(0), threading.Event(), threading.Semaphore(0)

    class WatchedTurns(Turns):  # turns of the same size, telling the test when a search reaches them
        @contextmanager
        def take(self, wanted: Callable[[], bool] | None = None) -> Iterator[None]:
            arrived.release()
            with super().take(wanted):
                inside.release()
                release.wait(30)  # the first holds its turn until released
                yield

    engine.searcher.turns = WatchedTurns(1)
    try:
        vecs = _unit(np.random.default_rng(5), 4, 8)
        engine.create(
            [NewMemory("ns", f"m{i}", embedding=vecs[i], embedding_model=MODEL) for i in range(4)],
            batch=True,
        )
        q = SearchQuery(namespaces=["ns"], embedding=vecs[0], embedding_model=MODEL, read_only=True)
        found: dict[int, list[SearchHit]] = {}
        threads = [
            threading.Thread(target=lambda i=i: found.__setitem__(i, engine.search(q))) for i in range(2)
        ]
        threads[0].start()
        assert arrived.acquire(timeout=30) and inside.acquire(timeout=30)  # the first has its turn
        threads[1].start()
        assert arrived.acquire(timeout=30)  # the second waits for the turn
        clock.advance(3600)  # before either ranks: the first holds its turn, the second waits
        release.set()
        for t in threads:
            t.join(30)
        # Every memory was last accessed when created, an hour before both searches ranked.
        hour = float(np.exp(-3600 / cfg.recency_tau_seconds))
        assert sorted(found) == [0, 1]
        for hits in found.values():
            assert len(hits) == 4 and all(h.recency == pytest.approx(hour, rel=1e-5) for h in hits)
    finally:
        release.set()
        engine.close()


def test_a_search_waiting_for_its_embedder_does_not_hold_a_turn(tmp_path: Path) -> None:
    """A query text is embedded (maybe a remote call) before the search takes its turn: a slow
    embedder holds up only the searches that need it."""
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory
    from tiermem.server.search.searcher import SearchQuery

    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        search_concurrency=1,
    )
    engine = Engine(cfg)
    real = engine.embedder
    embedding, release = threading.Event(), threading.Event()

    class SlowEmbedder:  # stands in for a remote embedding service that is slow to answer
        model = real.model

        def embed(self, text: str) -> np.ndarray:
            embedding.set()
            release.wait(30)
            return real.embed(text)

    try:
        engine.create([NewMemory("ns", f"note {i} about apples") for i in range(5)], batch=True)
        vec = real.embed("note about apples")
        engine.state.embedder = SlowEmbedder()  # type: ignore[assignment]
        by_text: list[int] = []
        t = threading.Thread(
            target=lambda: by_text.append(len(engine.search(SearchQuery(namespaces=["ns"], text="apples"))))
        )
        t.start()
        assert embedding.wait(30)
        # The text search waits for its embedder; a search by vector still ranks at once.
        q = SearchQuery(namespaces=["ns"], embedding=vec, embedding_model=real.model, limit=3, read_only=True)
        done: list[int] = []
        v = threading.Thread(target=lambda: done.append(len(engine.search(q))), daemon=True)
        v.start()
        v.join(10)
        assert done == [3], "the vector search waited behind the text search's embedder"
        release.set()
        t.join(30)
        assert by_text == [5]
    finally:
        release.set()
        engine.close()


def test_search_concurrency_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="search_concurrency"):
        ServerConfig(data_dir=tmp_path, search_concurrency=-1)


def test_a_search_whose_deadline_passed_while_it_waited_is_not_ranked(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Under load searches queue for their turn; one whose client gave up meanwhile (deadline
    passed) is dropped when its turn comes instead of ranked for nobody."""
    from contextlib import contextmanager

    import grpc

    from tiermem.server.search.searcher import Turns
    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    running = server_factory(search_concurrency=1)
    engine = running.engine
    vecs = _unit(np.random.default_rng(4), 10, 8)
    with _client(running) as c:
        for i in range(10):
            c.create("ns", f"m{i}", embedding=vecs[i].tolist(), embedding_model=MODEL)
    ranked: list[int] = []  # searches still wanted when their turn came: ranked
    finished: list[int] = []  # searches that left their turn, ranked or not
    inside, release = threading.Event(), threading.Event()

    class CountedTurns(Turns):  # turns of the same size, counting what the searches did with them
        @contextmanager
        def take(self, wanted: Callable[[], bool] | None = None) -> Iterator[None]:
            try:
                with super().take(wanted):
                    ranked.append(1)
                    if len(ranked) == 1:  # the first search holds the only turn until released
                        inside.set()
                        release.wait(30)
                    yield
            finally:
                finished.append(1)

    engine.searcher.turns = CountedTurns(1)

    def wait_finished(n: int) -> None:
        deadline = time.monotonic() + 30
        while len(finished) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(finished) == n

    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    stub = pb_grpc.MemoryServiceStub(channel)

    def request() -> pb.SearchMemoriesRequest:
        r = pb.SearchMemoriesRequest(namespaces=["ns"], embedding_model=MODEL, limit=3, read_only=True)
        r.query_embedding.extend(vecs[0].tolist())
        return r

    try:
        first = stub.SearchMemories.future(request(), timeout=30)
        assert inside.wait(30)
        with pytest.raises(grpc.RpcError) as err:
            stub.SearchMemories(request(), timeout=0.3)  # waits behind the first, then gives up
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        impatient = MemoryClient(f"127.0.0.1:{running.port}", timeout=0.3)  # the client's error class
        with impatient, pytest.raises(DeadlineExceededError):
            impatient.search("ns", vecs[0].tolist(), embedding_model=MODEL, limit=3)
        batch = pb.BatchSearchMemoriesRequest(searches=[request(), request()])
        with pytest.raises(grpc.RpcError) as err:
            stub.BatchSearchMemories(batch, timeout=0.3)  # a batch's queries wait for turns too
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        release.set()
        assert len(first.result(30).results) == 3
        # The first and the abandoned ones: the batch's second search, started or cancelled after
        # the first failed, may or may not have run (and been dropped at its turn).
        deadline = time.monotonic() + 30
        while len(finished) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert len(finished) in (4, 5)
        assert len(ranked) == 1, "a search whose caller gave up was ranked anyway"
        assert len(stub.SearchMemories(request(), timeout=30).results) == 3  # later ones run
        assert len(ranked) == 2
        got = stub.BatchSearchMemories(batch, timeout=30).responses
        assert [len(r.results) for r in got] == [3, 3] and len(ranked) == 4
    finally:
        release.set()
        channel.close()


_MALLOC_PROBE = """
import ctypes, sys
from tiermem.server.transport.process import tune_malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2"); sys.exit(0)
libc.mallinfo2.restype = MallInfo2
tuned = tune_malloc(int(sys.argv[1]))
big = libc.malloc(8 << 20)  # mapped on its own (above either threshold) ...
libc.free(big)  # ... and freed: glibc's default threshold now rises to 8 MiB
before = libc.mallinfo2().hblks
block = libc.malloc(2 << 20)
mapped = libc.mallinfo2().hblks - before  # 1: the 2 MiB block got its own mapping
libc.free(block)
print(tuned, mapped)
"""


@pytest.mark.parametrize(("threshold", "expected"), [(1 << 20, "True 1"), (0, "False 0")])
def test_the_malloc_threshold_keeps_large_blocks_mapped_on_their_own(threshold: int, expected: str) -> None:
    """With the threshold fixed (the server's default), a 2 MiB block freed later is its own mapping,
    returned to the system, even after a larger block was freed; with glibc's default (0) the
    threshold has risen and the block comes from the heap."""
    out = subprocess.run(
        [sys.executable, "-c", _MALLOC_PROBE, str(threshold)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "no-mallinfo2":
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    assert out.stdout.strip() == expected


_FREEZE_PROBE = """
import gc, weakref
import tiermem.server.core.engine  # the imports a server makes (numba, FAISS, grpc wrappers)
from tiermem.server.transport.process import freeze_startup_objects

tracked = len(gc.get_objects())
frozen = freeze_startup_objects()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
probe = weakref.ref(a)
del a, b
gc.collect()
print(tracked, frozen, len(gc.get_objects()), probe() is None)
"""


def test_start_up_objects_are_frozen_out_of_full_collections_and_new_garbage_is_still_collected() -> None:
    """`serve` freezes what start-up left alive: a full collection no longer scans the imports'
    objects (tens of thousands), and cyclic garbage made afterwards is still freed."""
    out = subprocess.run([sys.executable, "-c", _FREEZE_PROBE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tracked, frozen, left, freed = out.stdout.split()
    assert int(tracked) > 10_000 and int(frozen) > int(tracked) * 0.9
    assert int(left) < int(frozen) // 20
    assert freed == "True"


def test_a_mostly_dead_index_is_compacted_and_searches_stay_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a namespace clear leaves an index mostly tombstones, its live vectors move into an
    empty index (the dead ones' memory is freed at once, not at the next start-up). Searches
    running meanwhile over both namespaces (their masks may still hold cleared rows) never fail;
    after it, and after a restart, they return the exact top k of what is left."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.search.searcher import SIMILARITY, SearchQuery
    from tiermem.server.transport import convert
    from tiermem.v1 import memory_pb2 as pb

    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        exact_search_max_rows=0,
        # the graph, not a scan; indexes compacted from 64 entries on
        tuning=Tuning(exact_entries=0, exact_per_k=0, compact_min_entries=64),
    )
    rng = np.random.default_rng(21)
    vecs = _unit(rng, 400, 16)
    keep = list(range(0, 400, 10))  # 40 kept, 360 cleared (and created again, and cleared: 4 times)

    def new(i: int, rnd: int) -> Any:
        ns = "keep" if i in keep else "gone"
        m = pb.Memory(
            namespace=ns, id=f"m{i}", content=f"memory {i} {rnd}", embedding=vecs[i].tolist(), tier=3
        )
        m.embedding_model = "m16"
        return convert.new_memory_from_pb(m, "memory.")

    def top(engine: Engine, q: np.ndarray, namespaces: list[str]) -> list[str]:
        hits = engine.search(
            SearchQuery(
                namespaces, embedding=q, embedding_model="m16", limit=5, strategy=SIMILARITY, read_only=True
            )
        )
        return [h.record.id for h in hits]

    def exact(q: np.ndarray) -> list[str]:
        sims = vecs[keep] @ q
        return [f"m{keep[j]}" for j in np.argsort(-sims, kind="stable")[:5]]

    queries = _unit(rng, 20, 16)
    eng = Engine(cfg)
    try:
        eng.create([new(i, 0) for i in keep], batch=True)
        idx = eng.spaces["m16"].indexes[3]

        # A search that built its mask before the clear and ranks after the compaction.
        eng.create([new(i, 0) for i in range(400) if i not in keep], batch=True)
        paused, resume, orig_mask = _pause_after_masks(eng, monkeypatch)
        # Scored exactly: every row of the (stale) mask has its vector location read.
        monkeypatch.setattr(eng.state, "config", dataclasses.replace(cfg, exact_search_max_rows=1000))
        late: list[Any] = []
        t = threading.Thread(
            target=lambda: late.append(_call(lambda: top(eng, queries[0], ["keep", "gone"])))
        )
        t.start()
        assert paused.wait(10)
        assert eng.delete_namespace("gone") == 360 and idx.n == 40
        resume.set()
        t.join(10)
        monkeypatch.setattr(eng.state, "shared_allowed_rows", orig_mask)
        monkeypatch.setattr(eng.state, "config", cfg)
        assert late == [exact(queries[0])], late  # the cleared rows dropped, not misread
        errors: list[BaseException] = []
        searched = [0]
        stop = threading.Event()

        def search_loop() -> None:
            while not stop.is_set():
                for q in queries:
                    try:
                        got = top(eng, q, ["keep", "gone"])
                        assert len(got) == len(set(got)) <= 5, got  # (fewer: hits deleted while it ran)
                        searched[0] += 1
                    except BaseException as e:  # reported below
                        errors.append(e)
                        return

        t = threading.Thread(target=search_loop)
        t.start()
        try:
            for rnd in range(1, 5):
                eng.create([new(i, rnd) for i in range(400) if i not in keep], batch=True)
                assert idx.n == 400
                assert eng.delete_namespace("gone") == 360
                assert idx.n == 40 and idx.dead == 0 and idx.counts()[2] == 40  # compacted
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors[0]
        assert searched[0] > 0
        # Deleted one at a time: the next lifecycle pass compacts (with or without moves to make).
        eng.create([new(i, 5) for i in range(400) if i not in keep], batch=True)
        for i in range(400):
            if i not in keep:
                eng.delete("gone", f"m{i}")
        assert idx.n == 400 and idx.counts()[2] == 40
        eng.consolidate("keep")
        assert idx.n == 40
        deadline = time.monotonic() + 30
        while idx.pending and time.monotonic() < deadline:  # the indexer moves them into HNSW
            time.sleep(0.01)
        assert idx.pending == 0 and idx.indexed == 40
        for q in queries:
            assert top(eng, q, ["keep", "gone"]) == exact(q)
    finally:
        eng.close()
    eng = Engine(cfg)
    try:
        for q in queries:
            assert top(eng, q, ["keep"]) == exact(q)
    finally:
        eng.close()


def test_a_search_whose_view_the_columns_outgrew_reads_compacted_locations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search builds its masks from a view; then the columns grow (new arrays: the view is left
    behind) and a compaction relocates the index's rows in the new arrays only. The search, which
    holds the index only after that, must read the new locations: it answers the exact top k."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.search.searcher import SIMILARITY, SearchQuery
    from tiermem.server.transport import convert
    from tiermem.v1 import memory_pb2 as pb

    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        exact_search_max_rows=1000,  # scored exactly: every allowed row's vector location is read
        tuning=Tuning(exact_entries=0, exact_per_k=0, compact_min_entries=64),
    )
    rng = np.random.default_rng(22)
    vecs = _unit(rng, 4400, 16)
    keep = list(range(0, 400, 10))

    def new(i: int, ns: str, tier: int) -> Any:
        m = pb.Memory(namespace=ns, id=f"m{i}", content=f"memory {i}", embedding=vecs[i].tolist(), tier=tier)
        m.embedding_model = "m16"
        return convert.new_memory_from_pb(m, "memory.")

    q = _unit(rng, 1, 16)[0]
    eng = Engine(cfg)
    try:
        eng.create([new(i, "keep" if i in keep else "gone", 3) for i in range(400)], batch=True)
        idx = eng.spaces["m16"].indexes[3]
        paused, resume, _ = _pause_after_masks(eng, monkeypatch)
        late: list[Any] = []
        query = SearchQuery(
            ["keep"], embedding=q, embedding_model="m16", limit=5, strategy=SIMILARITY, read_only=True
        )
        t = threading.Thread(
            target=lambda: late.append(_call(lambda: [h.record.id for h in eng.search(query)]))
        )
        t.start()
        assert paused.wait(10)
        view = eng.state.columns.view()
        for start in range(400, 4400, 1000):  # another tier's index: the columns grow
            eng.create([new(i, "more", 4) for i in range(start, start + 1000)], batch=True)
        assert not eng.state.columns.is_live(view)
        assert eng.delete_namespace("gone") == 360 and idx.n == 40  # compacted: rows relocated
        resume.set()
        t.join(10)
        sims = vecs[keep] @ q
        assert late == [[f"m{keep[j]}" for j in np.argsort(-sims, kind="stable")[:5]]], late
    finally:
        eng.close()


def _pause_after_masks(
    eng: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event, Any]:
    """Make the next search pause once it has built its masks (``paused`` set) until ``resume``
    is set. Returns both events and the original mask function (to put back)."""
    paused, resume = threading.Event(), threading.Event()
    orig_mask = eng.state.shared_allowed_rows

    def mask_then_wait(*a: Any, **kw: Any) -> Any:
        out = orig_mask(*a, **kw)
        paused.set()
        assert resume.wait(10)
        return out

    monkeypatch.setattr(eng.state, "shared_allowed_rows", mask_then_wait)
    return paused, resume, orig_mask


def _call(fn: Callable[[], Any]) -> Any:
    """fn's result, or the exception it raised."""
    try:
        return fn()
    except Exception as e:
        return e


def _openmp_settings(env: dict[str, str]) -> dict[str, str]:
    """The OpenMP settings FAISS's runtime (libgomp) took in a process that imported the server's
    entry point, as the runtime itself prints them at load (OMP_DISPLAY_ENV=verbose)."""
    out = subprocess.run(
        [sys.executable, "-c", "import tiermem.server.__main__"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
        | {"OMP_DISPLAY_ENV": "verbose"}
        | env,
    )
    assert out.returncode == 0, out.stderr
    settings = dict(re.findall(r"^\s+(OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'", out.stderr, re.M))
    if not settings:
        pytest.skip("FAISS's OpenMP runtime does not print its settings (not libgomp)")
    return settings


def test_the_server_keeps_faiss_openmp_threads_from_spinning_unless_told_otherwise() -> None:
    """The server sets OMP_WAIT_POLICY=PASSIVE before FAISS loads: its OpenMP workers sleep between
    the indexer's parallel adds (spin count 0) instead of spinning on the cores the writer and the
    gRPC threads need (libgomp's default spins 300,000 times). A policy in the environment wins."""
    assert _openmp_settings({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0"}
    assert _openmp_settings({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
