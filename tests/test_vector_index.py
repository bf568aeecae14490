"""VectorIndex with pending entries: acknowledged vectors wait in a buffer until the Indexer thread
moves them into HNSW. Searches must see them at once (scored exactly), with the same result and
bound contract as entries in HNSW; similarities, vectors, kills and snapshots must treat both alike.

Real FAISS indexes throughout. The indexer is held back by holding the index's flush lock, which
is what a slow HNSW add looks like to everyone else."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

from tiermem.server.config import Tuning
from tiermem.server.index.indexer import Indexer
from tiermem.server.index.vector_index import VectorIndex

DIM = 32


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.fixture(autouse=True, params=["graph", "exact"])
def search_path(request: pytest.FixtureRequest) -> str:
    """Every test runs twice: with HNSW graph searches, and with the exact scan that indexes of at
    most ``exact_entries`` entries (every index here) get by default (``exact_per_k``: filtered ones
    too). The indexes a test makes take the variant's thresholds from the ``tuning`` fixture."""
    return str(request.param)


@pytest.fixture
def tuning(search_path: str) -> Tuning:
    """The thresholds of the indexes (and engines) a test makes: the graph variant never scans."""
    if search_path == "graph":
        return Tuning(exact_entries=0, exact_per_k=0)
    assert Tuning().exact_entries >= 1500
    return Tuning()


@pytest.fixture
def indexer():
    ix = Indexer()
    ix.start()
    yield ix
    ix.stop()


def wait_indexed(idx: VectorIndex, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while idx.pending and time.monotonic() < end:
        time.sleep(0.01)
    assert idx.pending == 0


def build(indexer: Indexer, base: np.ndarray, held: np.ndarray, tuning: Tuning) -> VectorIndex:
    """An index whose entries 0..len(base)-1 are in HNSW and the next len(held) are pending; rows
    are the entry ids. The caller releases ``idx._flush_lock``."""
    idx = VectorIndex(DIM, m=16, ef_construction=200, tuning=tuning)
    indexer.attach(idx)
    n0 = base.shape[0]
    idx.add(base, np.arange(n0), np.arange(n0) + 1000)
    wait_indexed(idx)
    idx._flush_lock.acquire()
    m = held.shape[0]
    idx.add(held, np.arange(n0, n0 + m), np.arange(n0, n0 + m) + 1000)
    assert (idx.indexed, idx.pending) == (n0, m)
    return idx


def check_search(idx: VectorIndex, vecs: np.ndarray, query: np.ndarray, allowed: np.ndarray, k: int) -> None:
    rows, sims, bound = idx.search(query, k, allowed, ef_search=400)
    live = np.flatnonzero(allowed & (idx.slots[: vecs.shape[0]] >= 0))
    exact = vecs[live] @ query
    top = live[np.argsort(-exact, kind="stable")[:k]]
    assert sorted(rows.tolist()) == sorted(top.tolist())  # small index, wide beam: HNSW is exact here
    assert np.all(np.diff(sims) <= 1e-6)  # best first
    if idx.indexed <= idx.exact_entries:  # scanned exactly: the same order as brute force
        np.testing.assert_allclose(sims, np.sort(exact)[::-1][: rows.shape[0]], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sims, vecs[rows] @ query, rtol=1e-5, atol=1e-5)
    left_out = np.setdiff1d(live, rows)
    if left_out.shape[0] == 0:
        assert bound == -np.inf
    else:
        assert float((vecs[left_out] @ query).max()) <= bound + 1e-5
        assert bound <= float(sims[-1]) + 1e-6


def test_pending_entries_are_searched_exactly_and_merged(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(1)
    vecs = unit(rng, 1500)
    idx = build(indexer, vecs[:1000], vecs[1000:], tuning)
    try:
        for trial in range(20):
            query = vecs[1000 + trial] if trial % 2 else unit(rng, 1)[0]  # half the queries hit a pending one
            allowed = rng.random(1500) < (1.0 if trial < 10 else 0.5)
            check_search(idx, vecs, query, allowed, k=10)
            if trial % 2:
                rows, _, _ = idx.search(query, 10, allowed, ef_search=400)
                assert not allowed[1000 + trial] or rows[0] == 1000 + trial
        # The fast path (allowed_count = the live entries: no per-request selector) gives the same.
        everything = np.ones(1500, np.bool_)
        q = unit(rng, 1)[0]
        assert np.array_equal(
            idx.search(q, 10, everything, 400)[0], idx.search(q, 10, everything, 400, idx.live_count())[0]
        )
        # Fewer allowed entries than k: all of them, bound -inf.
        few = np.zeros(1500, np.bool_)
        few[[3, 1200, 1499]] = True
        rows, _, bound = idx.search(q, 10, few, 400)
        assert sorted(rows.tolist()) == [3, 1200, 1499] and bound == -np.inf
    finally:
        idx._flush_lock.release()
    wait_indexed(idx)
    q = unit(rng, 1)[0]
    check_search(idx, vecs, q, np.ones(1500, np.bool_), k=10)


def test_search_similarities_are_those_of_similarities_bit_for_bit(indexer: Indexer, tuning: Tuning) -> None:
    """The ranking uses search's similarities as they are: they must equal what ``similarities``
    gives for the same entries, to the last bit, wherever the entry is (graph, exact scan, pending),
    and stay so once pending entries move into HNSW."""
    rng = np.random.default_rng(11)
    vecs = unit(rng, 900)
    idx = build(indexer, vecs[:700], vecs[700:], tuning)  # rows are entry ids here
    queries = [unit(rng, 1)[0] for _ in range(6)] + [vecs[5], vecs[800]]
    seen = []
    try:
        for i, q in enumerate(queries):
            allowed = rng.random(900) < (1.0 if i % 2 else 0.4)
            rows, sims, _ = idx.search(q, 32, allowed, ef_search=64)
            assert rows.shape[0] == 32
            np.testing.assert_array_equal(sims, idx.similarities(rows, q))
            seen += rows.tolist()
        assert min(seen) < 700 <= max(seen)  # entries in HNSW and pending ones were returned
        before = [idx.search(q, 32, np.ones(900, np.bool_), ef_search=64) for q in queries]
    finally:
        idx._flush_lock.release()
    wait_indexed(idx)
    for q, (rows0, sims0, _) in zip(queries, before, strict=True):
        rows, sims, _ = idx.search(q, 32, np.ones(900, np.bool_), ef_search=64)
        np.testing.assert_array_equal(sims, idx.similarities(rows, q))
        common, a, b = np.intersect1d(rows0, rows, return_indices=True)
        assert common.shape[0] >= 24  # (HNSW may return a slightly different set)
        np.testing.assert_array_equal(sims0[a], sims[b])


def test_only_pending_entries(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(2)
    vecs = unit(rng, 300)
    idx = build(indexer, vecs[:0], vecs, tuning)
    try:
        for _ in range(5):
            check_search(idx, vecs, unit(rng, 1)[0], rng.random(300) < 0.3, k=10)
    finally:
        idx._flush_lock.release()


def test_kills_similarities_and_vectors_span_hnsw_and_pending(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(3)
    vecs = unit(rng, 700)
    idx = build(indexer, vecs[:500], vecs[500:], tuning)
    try:
        ids = rng.permutation(700)[:120]
        q = unit(rng, 1)[0]
        np.testing.assert_allclose(idx.similarities(ids, q), vecs[ids] @ q, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(idx.vectors(ids), vecs[ids])
        killed = np.array([10, 20, 510, 650])
        idx.kill(killed)
        idx.kill(killed)  # twice: counted once
        assert idx.live_count() == 696
        for row in killed.tolist():
            rows, _, _ = idx.search(vecs[row], 5, np.ones(700, np.bool_), 400)
            assert row not in rows.tolist()
        check_search(idx, vecs, q, np.ones(700, np.bool_), k=10)
        before = idx.similarities(np.arange(700), q)
    finally:
        idx._flush_lock.release()
    wait_indexed(idx)
    # Bit for bit the same once the pending entries are in HNSW (the same search, the same scores).
    np.testing.assert_array_equal(idx.similarities(np.arange(700), q), before)
    # FAISS numbered the moved entries in add order: ids and vectors still agree.
    np.testing.assert_array_equal(idx.vectors(np.arange(700)), vecs)
    assert idx.index.ntotal == 700
    rows, _, _ = idx.search(vecs[650], 5, np.ones(700, np.bool_), 400)
    assert 650 not in rows.tolist()


@pytest.mark.parametrize("limit", ["index", "call"])
def test_add_waits_while_max_pending_are_pending(indexer: Indexer, limit: str, tuning: Tuning) -> None:
    """Adds wait beyond the index's ``max_pending`` pending entries, or beyond the call's
    ``max_pending`` when given (a search follower's, above the index's)."""
    rng = np.random.default_rng(4)
    vecs = unit(rng, 200)
    idx = build(indexer, vecs[:100], vecs[100:150], tuning)
    if limit == "index":
        idx.max_pending, kwargs = 60, {}
    else:
        idx.max_pending, kwargs = 20, {"max_pending": 60}
    released = threading.Event()

    def release() -> None:
        time.sleep(0.3)
        released.set()
        idx._flush_lock.release()

    t = threading.Thread(target=release)
    t.start()
    idx.add(vecs[150:200], np.arange(150, 200), np.arange(150, 200) + 1000, **kwargs)  # 100 > 60: waits
    assert released.is_set()
    assert idx.pending <= 60
    t.join()
    wait_indexed(idx)
    np.testing.assert_array_equal(idx.vectors(np.arange(200)), vecs)


def test_add_with_a_higher_limit_passes_max_pending(indexer: Indexer, tuning: Tuning) -> None:
    """A search follower applies the leader's commits while its searches wait: its adds do not
    wait at the index's ``max_pending``, and the entries beyond it are searchable at once."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 200)
    idx = build(indexer, vecs[:100], vecs[100:150], tuning)  # the indexer is held (flush lock)
    idx.max_pending = 60
    try:
        idx.add(vecs[150:200], np.arange(150, 200), np.arange(150, 200) + 1000, max_pending=100)
        assert (idx.indexed, idx.pending) == (100, 100)  # returned with 100 pending > 60
        rows, _, _ = idx.search(vecs[190], 1, np.ones(200, np.bool_), 64)
        assert rows.tolist() == [190]
    finally:
        idx._flush_lock.release()
    wait_indexed(idx)
    np.testing.assert_array_equal(idx.vectors(np.arange(200)), vecs)


def test_snapshot_leaves_pending_entries_out(indexer: Indexer, tmp_path: Path, tuning: Tuning) -> None:
    rng = np.random.default_rng(5)
    vecs = unit(rng, 400)
    idx = build(indexer, vecs[:300], vecs[300:], tuning)
    assert idx.saved == 0
    try:
        size = idx.save(tmp_path / "snap", "m", "inst")
    finally:
        idx._flush_lock.release()
    assert idx.saved == 300  # (what the leader's snapshots for followers count from)
    [written] = tmp_path.glob("snap*.faiss")
    assert size == written.stat().st_size > 300 * DIM * 4  # (the bytes it wrote, for their cap)
    loaded = VectorIndex.load(tmp_path / "snap", "m", DIM, 200, "inst", tuning=tuning)
    assert loaded is not None
    snap, vks = loaded
    assert snap.saved == 300
    assert snap.exact_entries == tuning.exact_entries  # a loaded index takes the thresholds given
    assert snap.n == snap.indexed == 300 and snap.live_count() == 0  # every entry dead until revived
    np.testing.assert_array_equal(vks, np.arange(300) + 1000)
    snap.revive(np.arange(300), np.arange(300))
    np.testing.assert_array_equal(snap.vectors(np.arange(300)), vecs[:300])


def test_a_compaction_during_a_snapshot_starts_the_count_of_new_entries_again(
    tmp_path: Path, tuning: Tuning, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``saved`` (what the leader's snapshots for followers count from) belongs to the HNSW that
    was written: a compaction between the write and its commit leaves it at the new index's 0."""
    from tiermem.server.index import vector_index

    rng = np.random.default_rng(9)
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    idx.add(unit(rng, 300), np.arange(300), np.arange(300) + 1)
    idx.kill(np.arange(250))
    real = vector_index.commit_snapshot

    def commit_after_a_compaction(*args: Any) -> None:
        assert idx.compact(lambda rows, ids: None) == 250
        real(*args)

    monkeypatch.setattr(vector_index, "commit_snapshot", commit_after_a_compaction)
    idx.save(tmp_path / "s", "m", "i")
    assert idx.n == 50 and idx.saved == 0
    monkeypatch.setattr(vector_index, "commit_snapshot", real)
    idx.flush()
    idx.save(tmp_path / "s", "m", "i")
    assert idx.saved == idx.indexed == 50


def test_stop_indexes_everything_pending(tuning: Tuning) -> None:
    rng = np.random.default_rng(6)
    vecs = unit(rng, 3000)
    ix = Indexer()
    ix.start()
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    ix.attach(idx)
    for lo in range(0, 3000, 100):
        idx.add(vecs[lo : lo + 100], np.arange(lo, lo + 100), np.arange(lo, lo + 100))
    ix.stop()
    assert (idx.indexed, idx.pending, idx.index.ntotal) == (3000, 0, 3000)
    # Once stopped, adds go straight into HNSW.
    idx.add(vecs[:5], np.arange(3000, 3005), np.arange(3000, 3005))
    assert (idx.indexed, idx.pending) == (3005, 0)


def test_a_forgotten_index_gets_no_more_turns(tuning: Tuning) -> None:
    """A replaced index (a follower moved onto a newer snapshot) is left pending: forgotten before
    its turn, or during a move (that move finishes, no next one)."""
    rng = np.random.default_rng(16)
    vecs = unit(rng, 2000)
    ix = Indexer(tuning=tuning)
    idxs = [VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning) for _ in range(3)]
    for idx in idxs:
        idx.add(vecs, np.arange(2000), np.arange(2000), defer=True)  # (pending, no turn asked)
        ix.notify(idx)
    ix.forget(idxs[0])
    moving = threading.Event()
    real_flush = idxs[1].flush

    def flush(chunk: int = 0, limit: int = 0, yield_to_save: bool = False) -> int:
        if not moving.is_set():
            moving.set()
            ix.forget(idxs[1])  # while its first move is in progress
        return real_flush(chunk, limit, yield_to_save)

    idxs[1].flush = flush  # type: ignore[method-assign]
    ix.start()
    try:
        wait_indexed(idxs[2])
        time.sleep(0.3)
    finally:
        ix.stop(drain=False)
    assert moving.is_set()
    assert idxs[0].pending == 2000  # never moved
    assert 0 < idxs[1].pending < 2000  # one move, then no more
    assert idxs[2].pending == 0


def test_without_an_indexer_adds_go_straight_into_hnsw(tuning: Tuning) -> None:
    rng = np.random.default_rng(7)
    vecs = unit(rng, 50)
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    idx.add(vecs, np.arange(50), np.arange(50))
    assert (idx.indexed, idx.pending, idx.index.ntotal) == (50, 0, 50)


def test_moves_into_hnsw_wait_for_a_snapshot_in_progress(indexer: Indexer, tuning: Tuning) -> None:
    """While a snapshot serializes the index (read lock held), the indexer must not queue for the
    write lock (new searches would wait behind it): entries stay pending and searchable."""
    rng = np.random.default_rng(8)
    vecs = unit(rng, 400)
    idx = build(indexer, vecs[:300], vecs[:0], tuning)
    idx._flush_lock.release()
    with idx._state:
        idx._saving += 1  # what save() does before it takes the read lock
    try:
        idx.add(vecs[300:], np.arange(300, 400), np.arange(300, 400) + 1000)
        time.sleep(0.2)
        assert (idx.indexed, idx.pending) == (300, 100)
        with idx._lock.read():  # a search that holds the read lock meanwhile is never in the way
            pass
        check_search(idx, vecs, vecs[350], np.ones(400, np.bool_), k=10)
    finally:
        with idx._state:
            idx._saving -= 1
            idx._state.notify_all()
    wait_indexed(idx)
    np.testing.assert_array_equal(idx.vectors(np.arange(400)), vecs)


def test_save_while_entries_move_keeps_ids_and_vectors_consistent(
    indexer: Indexer, tmp_path: Path, tuning: Tuning
) -> None:
    """Snapshots taken while the indexer moves entries: each is a prefix of the entries, with the
    vks of that prefix."""
    rng = np.random.default_rng(9)
    vecs = unit(rng, 2000)
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    indexer.attach(idx)
    for lo in range(0, 2000, 50):
        idx.add(vecs[lo : lo + 50], np.arange(lo, lo + 50), np.arange(lo, lo + 50) + 7)
        if lo % 400 == 0:
            idx.save(tmp_path / "s", "m", "i")
            loaded = VectorIndex.load(tmp_path / "s", "m", DIM, 64, "i")
            assert loaded is not None
            snap, vks = loaded
            np.testing.assert_array_equal(vks, np.arange(snap.n) + 7)
            snap.revive(np.arange(snap.n), np.arange(snap.n))
            np.testing.assert_array_equal(snap.vectors(np.arange(snap.n)), vecs[: snap.n])
    wait_indexed(idx)


def test_engine_acknowledged_creates_are_searchable_while_pending(tmp_path: Path, tuning: Tuning) -> None:
    """Through the engine: with the indexer held back, acknowledged memories are found (pending,
    scored exactly), stats count them as pending, and a clean restart has them all in HNSW."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory
    from tiermem.server.search.searcher import SearchQuery

    rng = np.random.default_rng(10)
    vecs = unit(rng, 60)
    cfg = ServerConfig(
        data_dir=tmp_path / "d", maintenance_interval_seconds=0, exact_search_max_rows=0, tuning=tuning
    )

    def mem(i: int) -> NewMemory:
        return NewMemory(namespace="ns", content=f"m {i}", id=f"m{i}", embedding=vecs[i], embedding_model="v")

    def top(e: Engine, i: int) -> str:
        q = SearchQuery(
            namespaces=["ns"], embedding=vecs[i], embedding_model="v", limit=3, strategy=4, read_only=True
        )
        return e.search(q)[0].record.id

    e = Engine(cfg)
    try:
        e.create([mem(i) for i in range(40)], batch=True)
        idx = next(iter(e.spaces["v"].indexes.values()))
        wait_indexed(idx)
        idx._flush_lock.acquire()
        try:
            for i in range(40, 60):
                e.create([mem(i)])
            assert idx.pending == 20
            space = e.stats().spaces[0]
            assert (space.indexed, space.pending, space.live) == (40, 20, 60)
            assert [top(e, i) for i in range(60)] == [f"m{i}" for i in range(60)]
        finally:
            idx._flush_lock.release()
    finally:
        e.close()
    e = Engine(cfg)
    try:
        space = e.stats().spaces[0]
        assert space.indexed + space.pending == space.live == 60
        assert [top(e, i) for i in range(60)] == [f"m{i}" for i in range(60)]
        wait_indexed(next(iter(e.spaces["v"].indexes.values())))
        assert e.stats().spaces[0].indexed == 60
    finally:
        e.close()


class _KillOnLookup(np.ndarray):
    """An ``allowed`` mask that kills an entry (as the writer thread would) the first time a
    search looks rows up in it: a kill landing in the middle of a search, deterministically."""

    hook: Any = None

    def __getitem__(self, key: Any) -> Any:
        out = super().__getitem__(key)
        hook, type(self).hook = type(self).hook, None
        if hook is not None and isinstance(key, np.ndarray) and key.dtype == np.int64:
            t = threading.Thread(target=hook)
            t.start()
            t.join()
        return out


def test_a_kill_during_a_search_never_yields_a_dead_slot(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(12)
    vecs = unit(rng, 40)
    idx = build(indexer, vecs[:20], vecs[20:], tuning)
    try:
        for victim in (25, 5):  # a pending entry, an entry in HNSW
            _KillOnLookup.hook = lambda v=victim: idx.kill([v])
            allowed = np.ones(40, np.bool_).view(_KillOnLookup)
            rows, _, _ = idx.search(vecs[victim], 5, allowed, 64)
            rows = np.asarray(rows)
            assert _KillOnLookup.hook is None  # the kill ran mid-search
            assert rows.shape[0] and (rows >= 0).all(), rows
            _KillOnLookup.hook = lambda v=victim + 1: idx.kill([v])
            assert (np.asarray(idx.allowed_rows(np.ones(40, np.bool_).view(_KillOnLookup))) >= 0).all()
    finally:
        idx._flush_lock.release()


class _FailingAdds:
    """FAISS index stand-in for fault injection only: forwards to the real index, failing the next
    ``fail`` adds, before (``partial`` False) or after (True) the vectors reach FAISS's storage."""

    def __init__(self, real: Any, fail: int, partial: bool) -> None:
        self.real, self.fail, self.partial = real, fail, partial

    def add(self, x: np.ndarray) -> None:
        if self.fail:
            self.fail -= 1
            if self.partial:
                self.real.add(x)  # stored, then "linking failed"
            raise MemoryError("injected")
        self.real.add(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_failed_add_keeps_entries_pending_and_is_retried(
    indexer: Indexer, tmp_path: Path, tuning: Tuning
) -> None:
    rng = np.random.default_rng(13)
    vecs = unit(rng, 100)
    idx = build(indexer, vecs[:50], vecs[:0], tuning)
    idx._flush_lock.release()
    idx.index = _FailingAdds(idx.index, fail=1, partial=False)
    idx.add(vecs[50:], np.arange(50, 100), np.arange(50, 100) + 1000)
    check_search(idx, vecs, vecs[70], np.ones(100, np.bool_), k=10)  # pending or not, found
    wait_indexed(idx, timeout=10)  # retried a second later
    assert idx.index.fail == 0 and not idx.damaged
    np.testing.assert_array_equal(idx.vectors(np.arange(100)), vecs)


def test_an_add_failing_after_storing_never_adds_twice_and_stops_snapshots(
    indexer: Indexer, tmp_path: Path, tuning: Tuning
) -> None:
    rng = np.random.default_rng(14)
    vecs = unit(rng, 100)
    idx = build(indexer, vecs[:50], vecs[:0], tuning)
    idx._flush_lock.release()
    idx.save(tmp_path / "s", "m", "i")
    idx.index = _FailingAdds(idx.index, fail=1, partial=True)
    idx.add(vecs[50:], np.arange(50, 100), np.arange(50, 100) + 1000)
    wait_indexed(idx, timeout=10)
    assert idx.damaged and idx.index.ntotal == 100  # ids still agree with entries
    np.testing.assert_array_equal(idx.vectors(np.arange(100)), vecs)
    idx.save(tmp_path / "s", "m", "i")  # refused: the previous snapshot (50 entries) stays
    loaded = VectorIndex.load(tmp_path / "s", "m", DIM, 64, "i")
    assert loaded is not None and loaded[0].n == 50


def test_a_large_pending_buffer_is_let_go(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(15)
    vecs = unit(rng, 5000)
    idx = VectorIndex(DIM, m=8, ef_construction=32, tuning=tuning)
    idx.add(vecs, np.arange(5000), np.arange(5000), chunk=4096)  # the start-up path
    assert (idx.indexed, idx._pbuf.shape[0]) == (5000, 0)
    indexer.attach(idx)
    idx.add(vecs[:3], np.arange(5000, 5003), np.arange(5000, 5003))
    wait_indexed(idx)
    assert idx._pbuf.shape[0] <= 1024


def test_the_indexer_serves_other_indexes_while_one_is_being_saved(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(16)
    vecs = unit(rng, 200)
    a = build(indexer, vecs[:50], vecs[:0], tuning)
    a._flush_lock.release()
    b = build(indexer, vecs[:50], vecs[:0], tuning)
    b._flush_lock.release()
    with a._state:
        a._saving += 1
    try:
        a.add(vecs[50:100], np.arange(50, 100), np.arange(50, 100))
        b.add(vecs[50:100], np.arange(50, 100), np.arange(50, 100))
        wait_indexed(b, timeout=10)
        assert a.pending == 50
    finally:
        with a._state:
            a._saving -= 1
            a._state.notify_all()
    wait_indexed(a)


def test_a_deferred_backlog_does_not_hold_up_later_writes(indexer: Indexer, tuning: Tuning) -> None:
    """Start-up leaves vectors a stale snapshot lacks pending (``defer``); later writes wait only
    for what they add beyond that backlog, and the backlog drains in the background."""
    rng = np.random.default_rng(18)
    vecs = unit(rng, 400)
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    idx.add(vecs[:100], np.arange(100), np.arange(100), chunk=4096)  # the snapshot's part
    idx.add(vecs[100:300], np.arange(100, 300), np.arange(100, 300), defer=True)
    assert (idx.indexed, idx.pending) == (100, 200)
    idx.max_pending = 50
    idx._flush_lock.acquire()  # the indexer is slow
    indexer.attach(idx)
    try:
        writer = threading.Thread(
            target=idx.add, args=(vecs[300:340], np.arange(300, 340), np.arange(300, 340))
        )
        writer.start()
        writer.join(timeout=5)  # 240 pending, 40 beyond the backlog: no wait
        assert not writer.is_alive() and idx.pending == 240
        check_search(idx, vecs[:340], vecs[250], np.ones(340, np.bool_), k=10)
    finally:
        idx._flush_lock.release()
    # Once the deferred entries (the oldest) are in HNSW, the backlog is gone even if writes kept
    # arriving: the usual limit applies again.
    end = time.monotonic() + 30
    while idx.indexed < 300 and time.monotonic() < end:
        time.sleep(0.01)
    assert idx.indexed >= 300 and idx._backlog == 0
    wait_indexed(idx)
    idx.add(vecs[340:], np.arange(340, 400), np.arange(340, 400))  # backlog gone: the usual limit
    wait_indexed(idx)
    np.testing.assert_array_equal(idx.vectors(np.arange(400)), vecs)


def test_engine_start_up_defers_vectors_a_stale_snapshot_lacks(
    tmp_path: Path, caplog: Any, tuning: Tuning
) -> None:
    """A start-up after a crash (here: a close without the shutdown snapshot) finds vectors written
    after the last index snapshot: they are searchable at once and indexed in the background."""
    import logging

    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory
    from tiermem.server.search.searcher import SearchQuery

    rng = np.random.default_rng(19)
    vecs = unit(rng, 300)
    cfg = ServerConfig(
        data_dir=tmp_path / "d",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        snapshot_on_shutdown=False,
        exact_search_max_rows=0,
        tuning=tuning,
    )

    def mem(i: int) -> NewMemory:
        return NewMemory(namespace="ns", content=f"m {i}", id=f"m{i}", embedding=vecs[i], embedding_model="v")

    e = Engine(cfg)
    try:
        e.create([mem(i) for i in range(200)], batch=True)
        wait_indexed(next(iter(e.spaces["v"].indexes.values())))  # (a snapshot leaves pending ones out)
        e.snapshot()
        e.create([mem(i) for i in range(200, 300)], batch=True)
    finally:
        e.close()  # no shutdown snapshot: the index snapshot lacks the last 100
    with caplog.at_level(logging.INFO, logger="tiermem.server.core"):  # (the engine and its start-up)
        e = Engine(cfg)
    try:
        assert any(
            "100 from LMDB (0 indexed before serving, 100 pending, indexed in the background)" in r.message
            for r in caplog.records
        )
        for i in range(300):
            q = SearchQuery(namespaces=["ns"], embedding=vecs[i], embedding_model="v", limit=1, strategy=4)
            assert e.search(q)[0].record.id == f"m{i}"
        idx = next(iter(e.spaces["v"].indexes.values()))
        wait_indexed(idx)
        assert idx.counts() == (300, 0, 300)
    finally:
        e.close()


def test_stop_without_draining_leaves_pending_entries(tuning: Tuning) -> None:
    rng = np.random.default_rng(20)
    vecs = unit(rng, 100)
    ix = Indexer()
    ix.start()
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    ix.attach(idx)
    idx._flush_lock.acquire()  # the indexer cannot move anything
    idx.add(vecs, np.arange(100), np.arange(100))
    stopper = threading.Thread(target=ix.stop, kwargs={"drain": False})
    stopper.start()
    end = time.monotonic() + 10
    while not ix._stop and time.monotonic() < end:
        time.sleep(0.005)
    idx._flush_lock.release()
    stopper.join(timeout=10)
    assert not stopper.is_alive() and not ix.running
    assert (
        idx.indexed + idx.pending == 100 and idx.pending >= 100 - idx.add_chunk
    )  # at most the chunk in progress
    check_search(idx, vecs, vecs[7], np.ones(100, np.bool_), k=5)


def test_reserve_sizes_the_pending_buffer_once(tuning: Tuning) -> None:
    rng = np.random.default_rng(21)
    vecs = unit(rng, 5000)
    idx = VectorIndex(DIM, m=8, ef_construction=32, tuning=tuning)
    idx.add(vecs[:100], np.arange(100), np.arange(100), chunk=4096)
    idx.reserve(4900)
    buf = idx._pbuf
    assert buf.shape[0] == 4900
    for lo in range(100, 5000, 700):
        hi = min(5000, lo + 700)
        idx.add(vecs[lo:hi], np.arange(lo, hi), np.arange(lo, hi), defer=True)
    assert idx._pbuf is buf and idx._backlog == 4900
    np.testing.assert_array_equal(idx.vectors(np.arange(5000)), vecs)
    idx.flush()
    assert idx._backlog == 0 and idx.pending == 0
    np.testing.assert_array_equal(idx.vectors(np.arange(5000)), vecs)


def test_a_reader_holding_the_index_looks_up_while_the_indexer_waits(
    indexer: Indexer, tuning: Tuning
) -> None:
    """A search holds the index (``reading``) across its HNSW search and similarity lookups: those
    go on while the indexer waits to move pending vectors in, and the moves follow once it lets go."""
    rng = np.random.default_rng(8)
    vecs = unit(rng, 600)
    idx = build(indexer, vecs[:500], vecs[500:], tuning)
    everything = np.ones(600, np.bool_)
    done: list[int] = []

    def search() -> None:
        with idx.reading():
            idx._flush_lock.release()  # the indexer may now move the pending vectors ...
            deadline = time.monotonic() + 5
            while idx._lock._waiting_writers == 0 and time.monotonic() < deadline:
                time.sleep(0.001)
            assert idx._lock._waiting_writers == 1  # ... and waits for this reader
            for trial in range(5):
                rows, _, _ = idx.search(vecs[500 + trial], 10, everything, ef_search=400)
                assert rows[0] == 500 + trial
                sims = idx.similarities(np.arange(490, 510), vecs[0])
                np.testing.assert_allclose(sims, vecs[490:510] @ vecs[0], rtol=1e-5, atol=1e-6)
            assert idx.pending == 100  # nothing moved while held
            done.append(1)

    t = threading.Thread(target=search, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and done == [1]
    wait_indexed(idx)
    assert (idx.indexed, idx.pending) == (600, 0)


class _AddSpy:
    """Records the size of every add into a FAISS index, and the OpenMP threads of the thread that
    calls it, and passes everything through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.threads: list[int] = []

    def add(self, x: np.ndarray) -> None:
        self.sizes.append(int(x.shape[0]))
        self.threads.append(faiss.omp_get_max_threads())
        self.inner.add(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_bulk_moves_while_no_search_reads_then_small_ones_once_a_search_does(tuning: Tuning) -> None:
    rng = np.random.default_rng(21)
    vecs = unit(rng, 12000)
    # A quiet spell of a minute: once the search below reads the index, moves stay small.
    ix = Indexer(bulk_chunk=256, tuning=replace(tuning, indexer_quiet_seconds=60.0))
    ix.start()
    try:
        idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
        spy = _AddSpy(idx.index)
        idx.index = spy
        ix.attach(idx)  # nobody has read the index yet: quiet from the start
        with idx._flush_lock:  # hold the moves back until 4,000 are pending (writes wait past 4,096)
            for lo in range(0, 4000, 1000):
                idx.add(vecs[lo : lo + 1000], np.arange(lo, lo + 1000), np.arange(lo, lo + 1000))
        end = time.monotonic() + 30
        while not spy.sizes and time.monotonic() < end:
            time.sleep(0.001)
        with idx.reading():
            pass
        for lo in range(4000, 12000, 1000):
            idx.add(vecs[lo : lo + 1000], np.arange(lo, lo + 1000), np.arange(lo, lo + 1000))
        wait_indexed(idx)
        assert spy.sizes[0] == 256
        first_small = next(i for i, s in enumerate(spy.sizes) if s < 256)
        assert max(spy.sizes[first_small:]) <= idx.searched_chunk
        cores = len(os.sched_getaffinity(0))
        assert set(spy.threads[:first_small]) == {cores} and set(spy.threads[first_small:]) == {1}
        assert sum(spy.sizes[first_small:]) >= 8000  # everything added after the search moved small
        assert sum(spy.sizes) == 12000 and idx.index.ntotal == 12000
        # Moves on every OpenMP thread link the graph as well as small ones: every vector finds itself.
        for i in rng.choice(12000, 50, replace=False):
            rows, sims, _ = idx.search(vecs[i], 1, np.ones(12000, bool), ef_search=200)
            assert rows[0] == i and sims[0] == pytest.approx(1.0, abs=1e-5)
    finally:
        ix.stop()


def test_moves_stay_small_without_a_quiet_spell_a_backlog_or_a_bulk_size(
    indexer: Indexer, tuning: Tuning
) -> None:
    rng = np.random.default_rng(22)
    bulk = Indexer(bulk_chunk=256)
    idx = build(indexer, unit(rng, 10), unit(rng, 300), tuning)  # 300 pending, the indexer held back
    try:
        cores = len(os.sched_getaffinity(0))
        assert bulk.chunk_for(idx) == (256, cores)  # never searched
        assert Indexer(bulk_chunk=0).chunk_for(idx) == (idx.add_chunk, 1)
        assert Indexer(bulk_chunk=32).chunk_for(idx) == (idx.add_chunk, 1)
        assert Indexer(bulk_chunk=400).chunk_for(idx) == (300, cores)  # everything pending
        too_few = Indexer(bulk_chunk=256, tuning=Tuning(indexer_bulk_min=301))  # for a bulk move
        assert too_few.chunk_for(idx) == (idx.add_chunk, 1)
        now = time.monotonic()
        idx.last_search = now - bulk.quiet_spell_seconds / 2  # searched half a quiet spell ago
        assert bulk.chunk_for(idx) == (idx.searched_chunk, 1)  # searches wait for moves
        assert Indexer(bulk_chunk=0).chunk_for(idx) == (idx.searched_chunk, 1)
        idx.last_search = now - bulk.quiet_spell_seconds * 2
        assert bulk.chunk_for(idx) == (256, cores)
        indexer.last_search = now  # a search read another index this indexer serves
        assert bulk.chunk_for(idx) == (idx.searched_chunk, 1)
        assert idx.searched_chunk < idx.add_chunk
    finally:
        idx._flush_lock.release()


def test_searches_mark_the_index_and_its_indexer_snapshots_and_copies_do_not(
    indexer: Indexer, tmp_path: Path, tuning: Tuning
) -> None:
    rng = np.random.default_rng(23)
    idx = build(indexer, unit(rng, 50), unit(rng, 0), tuning)
    idx._flush_lock.release()
    other = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
    indexer.attach(other)
    q = unit(rng, 1)[0]

    def marked(fn: Any) -> tuple[bool, bool, bool]:
        idx.last_search = other.last_search = indexer.last_search = -math.inf
        fn()
        return idx.last_search > -math.inf, indexer.last_search > -math.inf, other.quiet_seconds() < 60

    assert marked(lambda: idx.search(q, 5, np.ones(50, bool), ef_search=64)) == (True, True, True)
    assert marked(lambda: idx.similarities(np.arange(5), q)) == (True, True, True)

    def hold() -> None:
        with idx.reading():
            pass

    assert marked(hold) == (True, True, True)
    assert marked(lambda: idx.vectors(np.arange(5))) == (False, False, False)
    assert marked(lambda: idx.save(tmp_path / "s", "m", "i")) == (False, False, False)


def test_writes_after_a_start_up_backlog_do_not_copy_it_twice(indexer: Indexer, tuning: Tuning) -> None:
    rng = np.random.default_rng(24)
    headroom = tuning.max_pending + 1000
    for room, writes, rows_after in ((3000 + headroom, 4, 3000 + headroom), (3000, 1, 2 * 1000 + 3000)):
        idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)
        indexer.attach(idx)
        idx._flush_lock.acquire()  # the indexer is held back: everything stays pending
        try:
            idx.reserve(room)
            idx.add(unit(rng, 3000), np.arange(3000), np.arange(3000), defer=True)  # the start-up backlog
            buf = idx._pbuf
            for w in range(writes):
                lo = 3000 + 1000 * w
                idx.add(unit(rng, 1000), np.arange(lo, lo + 1000), np.arange(lo, lo + 1000))
            # With room reserved, writes fill it (no copy of the backlog); without, the new buffer
            # holds the backlog once and twice what writes left pending, not twice everything.
            assert (idx._pbuf is buf) == (room > 3000)
            assert idx._pbuf.shape[0] == rows_after
            assert (idx.indexed, idx.pending) == (0, 3000 + 1000 * writes)
        finally:
            idx._flush_lock.release()
        wait_indexed(idx)


def spy_paths(idx: VectorIndex) -> list[str]:
    """The list that names each path (``_exact`` or ``_hnsw``) idx's searches take from now on."""
    calls: list[str] = []
    for name in ("_exact", "_hnsw"):
        real = getattr(idx, name)
        setattr(idx, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    return calls


def test_a_small_index_is_scanned_exactly_with_dead_and_filtered_entries(
    search_path: str, tuning: Tuning
) -> None:
    """Up to ``exact_entries`` entries, a search is a dot product per allowed live entry: brute force's
    top-k in its order, and as bound the best similarity left out; a larger index searches the graph."""
    rng = np.random.default_rng(11)
    n, k = 600, 10
    vecs = unit(rng, n)
    idx = VectorIndex(DIM, m=16, ef_construction=200, tuning=tuning)
    idx.add(vecs, np.arange(n), np.arange(n) + 1)
    idx.kill(np.arange(0, n, 7))  # dead entries: never returned
    calls = spy_paths(idx)
    for trial in range(10):
        query = unit(rng, 1)[0]
        allowed = rng.random(n) < (1.0 if trial < 5 else 0.2)
        rows, sims, bound = idx.search(query, k, allowed, ef_search=64)
        live = np.flatnonzero(allowed & (np.arange(n) % 7 != 0))
        order = live[np.argsort(-(vecs[live] @ query), kind="stable")]
        if search_path == "exact":
            assert rows.tolist() == order[:k].tolist()
            np.testing.assert_allclose(sims, vecs[order[:k]] @ query, rtol=1e-5, atol=1e-5)
            assert bound == pytest.approx(float(vecs[order[k]] @ query), abs=1e-6)
        else:  # the graph: the same entries at this size, up to HNSW's recall
            assert len(set(rows.tolist()) & set(order[:k].tolist())) >= k - 1
            assert bound >= float(vecs[order[k]] @ query) - 1e-5 or math.isnan(bound)
    assert set(calls) == {"_exact" if search_path == "exact" else "_hnsw"}
    # Fewer allowed than k: all of them, bound -inf (either way).
    few = np.zeros(n, np.bool_)
    few[[1, 2, 500]] = True
    rows, _, bound = idx.search(unit(rng, 1)[0], k, few, ef_search=64)
    assert sorted(rows.tolist()) == [1, 2, 500] and bound == -np.inf


def test_an_index_with_few_live_allowed_entries_is_scanned_exactly(tuning: Tuning) -> None:
    """A large graph whose entries are mostly dead (a consolidation pass moved them to another
    tier) or filtered out is scanned exactly once at most ``exact_entries`` are allowed and live."""
    rng = np.random.default_rng(12)
    n, k = 600, 10
    vecs = unit(rng, n)
    idx = VectorIndex(DIM, m=16, ef_construction=200, tuning=replace(tuning, exact_entries=100))
    idx.add(vecs, np.arange(n), np.arange(n) + 1)
    calls = spy_paths(idx)
    everything = np.ones(n, np.bool_)
    query = unit(rng, 1)[0]
    idx.search(query, k, everything, 64, idx.live_count())
    assert calls == ["_hnsw"]  # 600 live: the graph
    idx.kill(np.arange(60, n))  # 60 live are left
    for allowed, count in ((everything, idx.live_count()), (everything, -1), (rng.random(n) < 0.5, -1)):
        calls.clear()
        rows, sims, bound = idx.search(query, k, allowed, 64, count)
        live = np.flatnonzero(allowed[:60])
        order = live[np.argsort(-(vecs[live] @ query), kind="stable")]
        assert calls == ["_exact"]
        assert rows.tolist() == order[:k].tolist()
        np.testing.assert_allclose(sims, vecs[order[:k]] @ query, rtol=1e-5, atol=1e-5)
        assert bound == pytest.approx(float(vecs[order[k]] @ query), abs=1e-6)


def test_a_filtered_search_for_many_scans_exactly_below_its_share_of_allowed_entries() -> None:
    """Filtered HNSW for a large k over few allowed entries tends to come back short (the caller
    then scores every allowed row exactly anyway): at most ``exact_per_k`` * k allowed live entries
    are scanned exactly, with brute force's answer; a small k over the same entries uses the graph."""
    rng = np.random.default_rng(13)
    n = 1000
    vecs = unit(rng, n)
    # (both thresholds set here: the graph variant of every test sets them to 0)
    idx = VectorIndex(DIM, m=16, ef_construction=200, tuning=Tuning(exact_entries=50, exact_per_k=48))
    idx.add(vecs, np.arange(n), np.arange(n) + 1)
    calls = spy_paths(idx)
    allowed = rng.random(n) < 0.4  # ~400 allowed: above exact_entries
    live = np.flatnonzero(allowed)
    assert 50 < live.size <= idx.exact_per_k * 20
    query = unit(rng, 1)[0]
    order = live[np.argsort(-(vecs[live] @ query), kind="stable")]
    rows, sims, bound = idx.search(query, 20, allowed, 64)
    assert calls == ["_exact"]
    assert rows.tolist() == order[:20].tolist()
    np.testing.assert_allclose(sims, vecs[order[:20]] @ query, rtol=1e-5, atol=1e-5)
    assert bound == pytest.approx(float(vecs[order[20]] @ query), abs=1e-6)
    calls.clear()
    assert live.size > idx.exact_per_k * 5
    idx.search(query, 5, allowed, 64)
    assert calls == ["_hnsw"]


_SHORT_WRITE_PROBE = """
import resource, signal, sys
from pathlib import Path
import numpy as np
from tiermem.server.index.vector_index import VectorIndex

base = Path(sys.argv[1]) / "snap"
rng = np.random.default_rng(9)
idx = VectorIndex(32, m=8, ef_construction=32)
first = rng.standard_normal((200, 32)).astype(np.float32)
idx.add(first / np.linalg.norm(first, axis=1, keepdims=True), np.arange(200), np.arange(200) + 1000)
idx.flush(chunk=1000)
idx.save(base, "m", "i")  # the snapshot a failed save must leave in place
more = rng.standard_normal((300, 32)).astype(np.float32)
idx.add(more / np.linalg.norm(more, axis=1, keepdims=True), np.arange(200, 500), np.arange(200, 500) + 1000)
idx.flush(chunk=1000)
import faiss
size = len(faiss.serialize_index(idx.index))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (size - 100, hard))  # only the last bytes fail
try:
    idx.save(base, "m", "i")
    print("saved")
except OSError as e:
    print("failed", e.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
loaded = VectorIndex.load(base, "m", 32, 32, "i")
print("loaded", None if loaded is None else loaded[0].n)
"""


def test_a_snapshot_whose_last_bytes_cannot_be_written_fails_and_keeps_the_previous(tmp_path: Path) -> None:
    """A save whose final bytes fail to reach the file (here: a file-size limit just under the
    index's size) raises, and the previous snapshot stays the one that loads; it never publishes
    a short file (FAISS's own file writer ignores a failed flush at close)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE_PROBE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].startswith("failed"), out.stdout
    assert lines[1] == "loaded 200", out.stdout


def test_lookups_read_the_storage_as_it_stands_after_moves_and_a_compaction(tuning: Tuning) -> None:
    """The view of HNSW storage a lookup reads is kept between lookups, and taken again once an add
    has moved the storage (it grows by reallocating) or a compaction has replaced the index."""
    rng = np.random.default_rng(17)
    vecs = unit(rng, 3000)
    q = unit(rng, 1)[0]
    idx = VectorIndex(DIM, m=16, ef_construction=64, tuning=tuning)  # (no indexer: adds go into HNSW)
    idx.add(vecs[:40], np.arange(40), np.arange(40))
    np.testing.assert_allclose(idx.similarities(np.arange(40), q), vecs[:40] @ q, rtol=1e-5, atol=1e-6)
    with idx.reading():
        assert idx._stored(idx.indexed) is idx._stored(idx.indexed)  # (kept while nothing moved)
    for lo in range(40, 3000, 740):  # the storage outgrows its buffer several times
        idx.add(vecs[lo : lo + 740], np.arange(lo, min(lo + 740, 3000)), np.arange(lo, min(lo + 740, 3000)))
        n = idx.indexed
        ids = rng.permutation(n)[:200]
        np.testing.assert_allclose(idx.similarities(ids, q), vecs[ids] @ q, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(idx.vectors(ids), vecs[ids])
    assert idx.indexed == 3000
    idx.kill(np.arange(0, 3000, 2))
    moved: dict[int, int] = {}
    idx.compact(lambda rows, ids: moved.update(zip(rows.tolist(), ids.tolist(), strict=True)))
    idx.flush()  # (the compacted entries wait as a backlog: into HNSW now)
    assert idx.indexed == 1500
    rows = np.arange(1, 3000, 2)
    new_ids = np.array([moved[r] for r in rows.tolist()])
    np.testing.assert_allclose(idx.similarities(new_ids, q), vecs[rows] @ q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(idx.vectors(new_ids), vecs[rows])


def test_a_masks_selector_is_kept_while_no_entry_changes_and_never_serves_a_kill(
    indexer: Indexer, tuning: Tuning
) -> None:
    """A mask allowing part of the entries (a namespace beside others in one index): its selector
    is built once and reused by the searches with the same mask; a kill makes it stale, and no
    search returns the killed entry or misses an allowed one."""
    rng = np.random.default_rng(11)
    vecs = unit(rng, 600)
    idx = VectorIndex(DIM, m=16, ef_construction=200, tuning=tuning)
    indexer.attach(idx)
    idx.add(vecs, np.arange(600), np.arange(600) + 1000)
    wait_indexed(idx)
    allowed = np.zeros(600, np.bool_)
    allowed[::3] = True  # a third of the entries
    query = vecs[9]
    check_search(idx, vecs, query, allowed, 10)
    kept = dict(idx._selections)
    check_search(idx, vecs, query, allowed, 10)
    if idx.indexed > idx.exact_entries:  # (the graph searched: a selector built, and kept)
        assert len(kept) == 1 and idx._selections[id(allowed)][3] is kept[id(allowed)][3]
    rows, _, _ = idx.search(query, 1, allowed, ef_search=400)
    idx.kill([int(rows[0])])  # (rows are entry ids here)
    for _ in range(2):
        check_search(idx, vecs, query, allowed, 10)
        assert int(rows[0]) not in idx.search(query, 10, allowed, ef_search=400)[0].tolist()
    other = allowed.copy()  # the same rows, another mask: a selector of its own, the same answer
    check_search(idx, vecs, query, other, 10)
