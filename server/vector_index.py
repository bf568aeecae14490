"""FAISS HNSW index of one (embedding space, tier), derived from LMDB and rebuildable from it.

Why tombstones plus snapshots (HNSW has no real remove; ``IndexIDMap2(HNSW).remove_ids`` raises):

- An entry is never removed from the graph. Each index keeps ``slots`` (FAISS internal id -> row of
  the in-memory columns, -1 once dead). A delete or a tier move marks the old entry dead; searches pass
  an ``IDSelectorBitmap`` of entries that are alive *and* allowed by the request's filter, so a dead
  entry is never returned (cost ~10% latency at 1-30% dead, PERF-FACTS). The row's ``alive`` column is
  a second guard.
- Every entry carries a ``vk`` (vector key) that the record stores; a record that gets a new vector
  (new embedding or new tier) gets a new vk. On start-up a snapshot (written at clean shutdown)
  is mapped back by vk: entries whose vk is some live record's current vk are live, every other entry
  is dead, and live records whose vk is missing are re-added from LMDB. So a snapshot that is older
  than LMDB (kill -9) is still correct, just less complete; one that is missing or damaged is rebuilt.
- Rebuilding (compaction) to drop dead entries happens at start-up when dead entries pass a fraction.

Concurrency: FAISS allows concurrent searches but no search during an add, so each index has a
readers-writer lock; adds come only from the writer thread, in batches.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import faiss
import numpy as np

logger = logging.getLogger(__name__)


class RWLock:
    """Many readers or one writer; a waiting writer blocks new readers (no writer starvation)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()


class _Read:
    def __init__(self, lock: RWLock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        self.lock.acquire_read()

    def __exit__(self, *exc: object) -> None:
        self.lock.release_read()


class _Write(_Read):
    def __enter__(self) -> None:
        self.lock.acquire_write()

    def __exit__(self, *exc: object) -> None:
        self.lock.release_write()


class VectorIndex:
    """HNSW (inner product over normalized vectors = cosine) with tombstones and vk bookkeeping."""

    def __init__(
        self, dim: int, m: int = 32, ef_construction: int = 128, index: faiss.Index | None = None
    ) -> None:
        self.dim = dim
        if index is None:
            index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = ef_construction
        self.index: Any = index
        n = index.ntotal
        self.slots = np.full(max(16, n), -1, np.int64)
        self.vks = np.zeros(max(16, n), np.int64)
        self.n = n
        self.dead = n
        self._lock = RWLock()

    # -- writes (writer thread only) ------------------------------------------------------------
    def add(self, vectors: np.ndarray, slots: np.ndarray, vks: np.ndarray) -> np.ndarray:
        """Add rows of ``vectors`` for the given column rows; returns their internal ids."""
        count = vectors.shape[0]
        start = self.n
        with _Write(self._lock):
            self.index.add(np.ascontiguousarray(vectors, dtype=np.float32))
            need = start + count
            if need > self.slots.shape[0]:
                cap = max(need, self.slots.shape[0] * 2)
                grown = np.full(cap, -1, np.int64)
                grown[:start] = self.slots[:start]
                vk_grown = np.zeros(cap, np.int64)
                vk_grown[:start] = self.vks[:start]
                self.slots, self.vks = grown, vk_grown
            self.slots[start:need] = slots
            self.vks[start:need] = vks
            self.n = need
        return np.arange(start, start + count, dtype=np.int64)

    def kill(self, internal_ids: np.ndarray | list[int]) -> None:
        ids = np.asarray(internal_ids, dtype=np.int64)
        live = ids[self.slots[ids] >= 0]
        self.slots[live] = -1
        self.dead += int(live.shape[0])

    # -- reads ----------------------------------------------------------------------------------
    def live_count(self) -> int:
        return self.n - self.dead

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray, ef_search: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product among live entries whose column row is True in ``allowed``.

        Returns (rows, similarities), best first.
        """
        with _Read(self._lock):
            n = self.n
            if n == 0:
                return np.empty(0, np.int64), np.empty(0, np.float32)
            slots = self.slots[:n]
            ok = slots >= 0
            in_range = ok & (slots < allowed.shape[0])
            ok[in_range] = allowed[slots[in_range]]
            ok &= in_range
            if not ok.any():
                return np.empty(0, np.int64), np.empty(0, np.float32)
            bitmap = np.packbits(ok, bitorder="little")
            sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=max(ef_search, k))  # type: ignore[attr-defined]
            sims, ids = self.index.search(query.reshape(1, -1), k, params=params)
            ids = ids[0]
            keep = ids >= 0
            ids = ids[keep]
            return slots[ids].copy(), sims[0][keep].astype(np.float32, copy=False)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        """Stored vectors of the given entries (a copy)."""
        with _Read(self._lock):
            if internal_ids.shape[0] == 0:
                return np.empty((0, self.dim), np.float32)
            storage: Any = faiss.downcast_index(self.index.storage)
            xb = faiss.rev_swig_ptr(storage.get_xb(), self.n * self.dim).reshape(self.n, self.dim)
            return xb[internal_ids].copy()

    # -- snapshots ------------------------------------------------------------------------------
    def save(self, base: Path, model: str) -> None:
        """Write index, vks and a manifest atomically (manifest last: no manifest, no snapshot)."""
        with _Read(self._lock):
            n = self.n
            tmp_index = base.with_suffix(".faiss.tmp")
            faiss.write_index(self.index, str(tmp_index))
            tmp_vks = base.with_suffix(".vks.tmp")
            with open(tmp_vks, "wb") as f:
                np.save(f, self.vks[:n])
                f.flush()
                os.fsync(f.fileno())
        _fsync(tmp_index)
        os.replace(tmp_index, base.with_suffix(".faiss"))
        os.replace(tmp_vks, base.with_suffix(".vks.npy"))
        manifest = {"model": model, "dim": self.dim, "n": n, "version": 1}
        tmp_manifest = base.with_suffix(".json.tmp")
        tmp_manifest.write_text(json.dumps(manifest))
        _fsync(tmp_manifest)
        os.replace(tmp_manifest, base.with_suffix(".json"))
        _fsync(base.parent)

    @classmethod
    def load(
        cls, base: Path, model: str, dim: int, ef_construction: int
    ) -> tuple[VectorIndex, np.ndarray] | None:
        """Read a snapshot; returns (index with every entry dead, vks by internal id) or None."""
        try:
            manifest = json.loads(base.with_suffix(".json").read_text())
            if manifest.get("model") != model or manifest.get("dim") != dim or manifest.get("version") != 1:
                return None
            index: Any = faiss.read_index(str(base.with_suffix(".faiss")))
            vks = np.load(base.with_suffix(".vks.npy"))
            if index.ntotal != manifest["n"] or vks.shape != (index.ntotal,) or index.d != dim:
                return None
        except (OSError, ValueError, RuntimeError) as e:
            logger.warning("ignoring index snapshot %s: %s", base, e)
            return None
        hnsw: Any = faiss.downcast_index(index)
        hnsw.hnsw.efConstruction = ef_construction
        idx = cls(dim, index=index)
        idx.vks[: index.ntotal] = vks
        return idx, vks

    def revive(self, internal_ids: np.ndarray, slots: np.ndarray) -> None:
        """Mark snapshot entries live again for the given column rows (start-up only)."""
        self.slots[internal_ids] = slots
        self.dead -= int(internal_ids.shape[0])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
