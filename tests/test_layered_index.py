"""A follower's layered index: a snapshot's HNSW mapped read-only from its file (real FAISS, real
snapshot files in a temp dir) under a private tail index for later entries.

Answers are checked against exact cosine over the live, allowed entries, computed here in NumPy."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tiermem.server.config import Tuning
from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.vector_index import VectorIndex

DIM = 16
BASE = 3000
TAIL = 600
TUNING = Tuning(exact_entries=0, exact_per_k=0)  # every search of the base walks its graph


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def snapshot(folder: Path, vecs: np.ndarray) -> Path:
    """A snapshot of an index holding ``vecs`` for column rows 0..n-1 (vk = row + 1)."""
    idx = VectorIndex(DIM, tuning=TUNING)
    n = vecs.shape[0]
    idx.add(vecs, np.arange(n), np.arange(1, n + 1))
    base = folder / "space-t2"
    idx.save(base, "t", "db")
    return base


def mapped(base: Path, n: int, tuning: Tuning = TUNING) -> VectorIndex:
    loaded = VectorIndex.load(base, "t", DIM, 64, "db", tuning=tuning, mapped=True)
    assert loaded is not None
    snap, vks = loaded
    assert vks.tolist() == list(range(1, n + 1))
    snap.revive(np.arange(n), np.arange(n))
    return snap


def mapped_files() -> set[str]:
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if ".faiss" in line}


@pytest.fixture
def world(tmp_path: Path) -> tuple[LayeredIndex, np.ndarray]:
    """A layered index over BASE snapshot entries plus TAIL later ones (rows BASE..), and every
    row's vector."""
    rng = np.random.default_rng(7)
    vecs = unit(rng, BASE + TAIL)
    base = snapshot(tmp_path, vecs[:BASE])
    idx = LayeredIndex(mapped(base, BASE), VectorIndex(DIM, tuning=TUNING))
    ids = idx.add(vecs[BASE:], np.arange(BASE, BASE + TAIL), np.arange(BASE + 1, BASE + TAIL + 1))
    assert ids.tolist() == list(range(BASE, BASE + TAIL))  # past the base's entries
    return idx, vecs


def test_the_base_is_mapped_from_its_file_and_takes_no_adds(tmp_path: Path) -> None:
    vecs = unit(np.random.default_rng(1), 500)
    base = snapshot(tmp_path, vecs)
    before = mapped_files()
    plain = VectorIndex.load(base, "t", DIM, 64, "db", tuning=TUNING)
    assert plain is not None and not plain[0].mapped
    assert mapped_files() == before  # read into memory: no mapping
    snap = mapped(base, 500)
    files = mapped_files() - before
    assert len(files) == 1 and Path(next(iter(files))).parent == tmp_path
    with pytest.raises(RuntimeError, match="takes no adds"):
        snap.add(vecs[:1], np.array([9]), np.array([9]))
    assert snap.counts() == (500, 0, 500)
    rows, sims, _ = snap.search(vecs[42], 1, np.ones(500, np.bool_), 64)
    assert rows.tolist() == [42] and sims[0] == pytest.approx(1.0, abs=1e-5)
    pending = VectorIndex(DIM, tuning=TUNING)
    pending.add(vecs[:3], np.arange(3), np.arange(3), defer=True)
    with pytest.raises(ValueError, match="takes no adds"):
        LayeredIndex(pending, VectorIndex(DIM, tuning=TUNING))


def exact(vecs: np.ndarray, live: np.ndarray, q: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    rows = np.flatnonzero(live)
    sims = vecs[rows] @ q
    order = np.argsort(-sims, kind="stable")[:k]
    return rows[order].tolist(), sims[order]


def test_searches_merge_both_parts_as_exact_cosine_ranks(world: tuple[LayeredIndex, np.ndarray]) -> None:
    idx, vecs = world
    rng = np.random.default_rng(2)
    total = BASE + TAIL
    alive = np.ones(total, np.bool_)
    dead = np.concatenate([rng.choice(BASE, 300, replace=False), BASE + rng.choice(TAIL, 100, replace=False)])
    idx.kill(dead)  # internal ids are the rows here
    alive[dead] = False
    assert idx.counts() == (BASE + TAIL, 0, total - 400) and idx.n == total
    queries = unit(rng, 40)
    found = wanted = understated = 0
    for i, q in enumerate(queries):
        # Every live row allowed (with its count: no per-request selector), or a random 60% of them.
        allowed = alive.copy() if i % 2 else alive & (rng.random(total) < 0.6)
        count = int(allowed.sum()) if i % 2 else -1
        rows, sims, bound = idx.search(q, 10, allowed, 256, count)
        want, _ = exact(vecs, allowed, q, 10)
        assert allowed[rows].all() and len(set(rows.tolist())) == rows.shape[0] == 10
        np.testing.assert_allclose(sims, vecs[rows] @ q, atol=1e-5)
        assert np.all(np.diff(sims) <= 0)
        assert bound <= sims[-1] + 1e-6
        # The bound: no allowed live row left out is more similar (up to HNSW recall).
        left = np.flatnonzero(allowed)
        left = left[~np.isin(left, rows)]
        understated += int((vecs[left] @ q).max() > bound + 1e-6)
        found += len(set(rows.tolist()) & set(want))
        wanted += len(want)
    assert found / wanted >= 0.98 and understated <= 1
    for row in np.flatnonzero(alive[:BASE])[:5].tolist() + (BASE + np.flatnonzero(alive[BASE:])[:5]).tolist():
        top, sims, _ = idx.search(vecs[row], 1, alive, 256, int(alive.sum()))
        assert top.tolist() == [row] and sims[0] == pytest.approx(1.0, abs=1e-5)


def test_similarities_and_vectors_read_each_part(world: tuple[LayeredIndex, np.ndarray]) -> None:
    idx, vecs = world
    ids = np.array([BASE + 3, 5, BASE + TAIL - 1, 0, BASE - 1, BASE], np.int64)
    q = vecs[11]
    np.testing.assert_allclose(idx.similarities(ids, q), vecs[ids] @ q, atol=1e-6)
    np.testing.assert_array_equal(idx.vectors(ids), vecs[ids])
    np.testing.assert_array_equal(idx.vectors(ids[ids < BASE]), vecs[ids[ids < BASE]])
    np.testing.assert_array_equal(idx.vectors(ids[ids >= BASE]), vecs[ids[ids >= BASE]])
    assert idx.similarities(np.empty(0, np.int64), q).shape == (0,)
    assert idx.held_storage() is None  # (callers then look similarities up per index)
    allowed = np.zeros(BASE + TAIL, np.bool_)
    allowed[[1, 2, BASE + 1]] = True
    assert sorted(idx.allowed_rows(allowed).tolist()) == [1, 2, BASE + 1]


def test_compaction_drops_dead_entries_of_both_parts(world: tuple[LayeredIndex, np.ndarray]) -> None:
    idx, vecs = world
    rng = np.random.default_rng(4)
    keep_base = np.sort(rng.choice(BASE, 400, replace=False))
    keep_tail = BASE + np.sort(rng.choice(TAIL, 200, replace=False))
    alive = np.zeros(BASE + TAIL, np.bool_)
    alive[keep_base] = alive[keep_tail] = True
    idx.kill(np.flatnonzero(~alive))
    moved: dict[int, int] = {}

    def relocate(rows: np.ndarray, ids: np.ndarray) -> None:
        moved.update(zip(rows.tolist(), ids.tolist(), strict=True))

    assert idx.compact(relocate) == BASE + TAIL - 600
    assert sorted(moved) == np.flatnonzero(alive).tolist()
    assert not idx.base.mapped  # a private copy of its live entries now
    assert idx.counts() == (600, 0, 600) and idx.n == 600
    assert all(moved[r] < BASE for r in keep_base.tolist())
    assert all(moved[r] >= BASE for r in keep_tail.tolist())  # the tail's ids stay past the base's
    by_id = {i: r for r, i in moved.items()}
    for q in unit(rng, 10):
        rows, sims, _ = idx.search(q, 5, alive, 256, 600)
        want, _ = exact(vecs, alive, q, 5)
        assert rows.tolist() == want
        ids = np.array([moved[r] for r in rows.tolist()], np.int64)
        np.testing.assert_allclose(idx.similarities(ids, q), sims, atol=1e-6)
        assert [by_id[i] for i in ids.tolist()] == rows.tolist()
    # Adds still go to the tail, past the base's ids.
    new = idx.add(unit(rng, 1), np.array([BASE + TAIL]), np.array([10**6]))
    assert new.tolist() == [BASE + 200]  # (the tail's own numbering: its 200 live entries, then this)


def test_rebase_waits_for_holds_then_swaps_both_parts(
    tmp_path: Path, world: tuple[LayeredIndex, np.ndarray]
) -> None:
    """A newer snapshot (every entry) goes under the same object: a search holding the index
    finishes on the old parts first; afterwards the new parts answer, at the rows' new ids."""
    idx, vecs = world
    total = BASE + TAIL
    (tmp_path / "newer").mkdir()
    newer = mapped(snapshot(tmp_path / "newer", vecs), total)
    alive = np.ones(total, np.bool_)
    held, events = threading.Event(), []

    def search_while_held() -> None:
        with idx.reading():
            held.set()
            time.sleep(0.3)
            rows, _, _ = idx.search(vecs[BASE + 7], 1, alive, 256, total)
            events.append(("searched", rows.tolist()))

    t = threading.Thread(target=search_while_held)
    t.start()
    held.wait(5)
    old = idx.rebase(newer, VectorIndex(DIM, tuning=TUNING), lambda: events.append(("relocated", [])))
    t.join(5)
    assert events == [("searched", [BASE + 7]), ("relocated", [])]
    assert [part.n for part in old] == [BASE, TAIL]
    assert idx.offset == total and idx.counts() == (total, 0, total) and idx.own_entries() == 0
    ids = np.array([3, BASE + 7, total - 1], np.int64)  # (all in the new base: its ids are the rows)
    np.testing.assert_allclose(idx.similarities(ids, vecs[9]), vecs[ids] @ vecs[9], atol=1e-6)
    rows, _, _ = idx.search(vecs[BASE + 7], 1, alive, 256, total)
    assert rows.tolist() == [BASE + 7]
    assert idx.add(vecs[:1], np.array([total]), np.array([10**6])).tolist() == [total]
    assert idx.own_entries() == 1
