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
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tiermem import kernels

from .locks import RWLock

logger = logging.getLogger(__name__)


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
        # Bit i set = entry i is live: the selector of a search that allows every live entry.
        self.live_bits = np.zeros((self.slots.shape[0] + 7) // 8, np.uint8)
        self.n = n
        self.dead = n
        self._lock = RWLock()
        self.max_pause_seconds = 0.0  # longest write-lock hold of an add (searches wait that long)

    # -- writes (writer thread only) ------------------------------------------------------------
    # Vectors added per write-lock hold, which bounds how long an add pauses searches. Each FAISS add
    # call also costs O(entries) (it sets up one lock per entry of the graph), ~15% of a 64-vector add
    # at 100k entries and more beyond: the chunk grows with the index to keep that share small, so a
    # pause stays near ADD_CHUNK x ~0.25 ms below 25k entries and reaches 256 x that from 100k on.
    ADD_CHUNK = 64
    MAX_ADD_CHUNK = 256

    def _chunk(self) -> int:
        return max(self.ADD_CHUNK, min(self.MAX_ADD_CHUNK, self.n // 400))

    def add(self, vectors: np.ndarray, slots: np.ndarray, vks: np.ndarray, chunk: int = 0) -> np.ndarray:
        """Add rows of ``vectors`` for the given column rows; returns their internal ids.

        Adds take the write lock (FAISS allows no search during an add) in chunks, so searches wait
        at most one chunk's add (64-256 x 0.2-0.3 ms, see _chunk), not a whole batch. ``chunk``
        overrides that when no search can wait (start-up), so FAISS adds in big parallel batches.
        """
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        count = vectors.shape[0]
        first = self.n
        lo = 0
        while lo < count:
            hi = min(count, lo + (chunk or self._chunk()))
            with self._lock.write():
                t0 = time.perf_counter()
                start = self.n
                need = start + (hi - lo)
                if need > self.slots.shape[0]:
                    cap = max(need, self.slots.shape[0] * 2)
                    grown = np.full(cap, -1, np.int64)
                    grown[:start] = self.slots[:start]
                    vk_grown = np.zeros(cap, np.int64)
                    vk_grown[:start] = self.vks[:start]
                    bits_grown = np.zeros((cap + 7) // 8, np.uint8)
                    bits_grown[: self.live_bits.shape[0]] = self.live_bits
                    self.slots, self.vks, self.live_bits = grown, vk_grown, bits_grown
                self.index.add(vectors[lo:hi])
                self.slots[start:need] = slots[lo:hi]
                self.vks[start:need] = vks[lo:hi]
                self._set_bits(np.arange(start, need), True)
                self.n = need
                self.max_pause_seconds = max(self.max_pause_seconds, time.perf_counter() - t0)
            lo = hi
        return np.arange(first, first + count, dtype=np.int64)

    def kill(self, internal_ids: np.ndarray | list[int]) -> None:
        ids = np.asarray(internal_ids, dtype=np.int64)
        with self._lock.write():
            live = ids[self.slots[ids] >= 0]
            self.slots[live] = -1
            self._set_bits(live, False)
            self.dead += int(live.shape[0])

    def _set_bits(self, ids: np.ndarray, on: bool) -> None:
        bits = (1 << (ids & 7)).astype(np.uint8)
        if on:
            np.bitwise_or.at(self.live_bits, ids >> 3, bits)
        else:
            np.bitwise_and.at(self.live_bits, ids >> 3, ~bits)

    # -- reads ----------------------------------------------------------------------------------
    def live_count(self) -> int:
        return self.n - self.dead

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray, ef_search: int, allowed_count: int = -1
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Top-k by inner product among live entries whose column row is True in ``allowed``.

        Returns (rows, similarities, bound), best first. Every allowed live entry not returned is at
        most ``bound`` similar (up to HNSW recall); ``bound`` is -inf when every allowed entry was
        returned, and NaN when a filtered search came back short (fewer than min(k, allowed)
        results: the caller must not read that as exhaustion).

        ``allowed_count``, when the caller knows it, is the number of rows allowed in this index. If
        it equals the live entries, the search needs no per-request selector (no pass over the
        entries): it runs unfiltered, or with the maintained bitmap of live entries when some are
        dead, and drops results ``allowed`` rejects (rows added or removed since the caller's view).
        """
        empty = np.empty(0, np.int64), np.empty(0, np.float32), -np.inf
        with self._lock.read():
            n = self.n
            if n == 0:
                return empty
            slots = self.slots[:n]  # stable while the read lock is held: kill and add take the write lock
            live = n - self.dead
            if allowed_count == live:
                bitmap, n_allowed = (self.live_bits if self.dead else None), live
            else:
                bitmap, n_allowed = kernels.selection_bitmap(slots, allowed)
            if n_allowed == 0:
                return empty
            # A selective filter leaves fewer allowed nodes on each graph path: widen the beam with
            # 1/sqrt(selectivity) so recall holds (filtered HNSW collapses at low selectivity otherwise).
            widen = max(1.0, math.sqrt(n / n_allowed))
            ef = min(int(max(ef_search, k) * widen), max(2048, k))
            if bitmap is None or n_allowed == n:  # nothing dead, nothing filtered out
                params = faiss.SearchParametersHNSW(efSearch=ef)  # type: ignore[attr-defined]
            else:
                sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(bitmap))
                params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef)  # type: ignore[attr-defined]
            sims, ids = self.index.search(query.reshape(1, -1), k, params=params)
            ids = ids[0]
            found = ids >= 0
            ids, sims = ids[found], sims[0][found]
            rows = slots[ids]
        if ids.shape[0] == k:
            bound = float(sims[-1])
        elif ids.shape[0] < n_allowed:
            bound = math.nan
        else:
            bound = -np.inf
        keep = (rows >= 0) & (rows < allowed.shape[0])
        keep[keep] = allowed[rows[keep]]
        return rows[keep], sims[keep].astype(np.float32, copy=False), bound

    def allowed_rows(self, allowed: np.ndarray) -> np.ndarray:
        """Column rows of the live entries allowed by ``allowed`` (for exact scoring)."""
        with self._lock.read():
            slots = self.slots[: self.n]
            live = slots[slots >= 0]
        live = live[live < allowed.shape[0]]
        return live[allowed[live]]

    def similarities(self, internal_ids: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Inner products of the given entries' stored vectors with ``query`` (no copy of the vectors)."""
        with self._lock.read():
            if internal_ids.shape[0] == 0:
                return np.empty(0, np.float32)
            storage: Any = faiss.downcast_index(self.index.storage)
            xb = faiss.rev_swig_ptr(storage.get_xb(), self.n * self.dim).reshape(self.n, self.dim)
            return kernels.dot_rows(xb, internal_ids, query)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        """Stored vectors of the given entries (a copy)."""
        with self._lock.read():
            if internal_ids.shape[0] == 0:
                return np.empty((0, self.dim), np.float32)
            storage: Any = faiss.downcast_index(self.index.storage)
            xb = faiss.rev_swig_ptr(storage.get_xb(), self.n * self.dim).reshape(self.n, self.dim)
            return xb[internal_ids].copy()

    # -- snapshots ------------------------------------------------------------------------------
    # A snapshot is <base>.<token>.faiss + <base>.<token>.vks.npy, named by <base>.json (written
    # last, atomically). The token ties the three together: a crash mid-save leaves the previous
    # manifest pointing at the previous, complete files. ``instance`` is the LMDB environment's id,
    # so a snapshot is never applied to another database (e.g. a restored LMDB backup).
    def save(self, base: Path, model: str, instance: str) -> None:
        token = uuid.uuid4().hex[:16]
        index_path = base.with_name(f"{base.name}.{token}.faiss")
        vks_path = base.with_name(f"{base.name}.{token}.vks.npy")
        with self._lock.read():  # adds wait only for an in-memory copy, not for the disk
            n = self.n
            data = faiss.serialize_index(self.index)
            vks = self.vks[:n].copy()
        with open(index_path, "wb") as f:
            f.write(data.data)  # serialize_index returns one contiguous uint8 array
            f.flush()
            os.fsync(f.fileno())
        del data
        with open(vks_path, "wb") as f:
            np.save(f, vks)
            f.flush()
            os.fsync(f.fileno())
        manifest = {
            "model": model,
            "dim": self.dim,
            "n": n,
            "token": token,
            "instance": instance,
            "version": 2,
        }
        tmp_manifest = base.with_name(f"{base.name}.json.tmp")
        tmp_manifest.write_text(json.dumps(manifest))
        _fsync(tmp_manifest)
        os.replace(tmp_manifest, base.with_name(f"{base.name}.json"))
        _fsync(base.parent)
        for old in base.parent.glob(f"{base.name}.*"):
            if old.suffix in (".faiss", ".npy") and f".{token}." not in old.name:
                old.unlink(missing_ok=True)

    @classmethod
    def load(
        cls, base: Path, model: str, dim: int, ef_construction: int, instance: str
    ) -> tuple[VectorIndex, np.ndarray] | None:
        """Read a snapshot; returns (index with every entry dead, vks by internal id) or None."""
        try:
            manifest = json.loads(base.with_name(f"{base.name}.json").read_text())
            if (
                manifest.get("version") != 2
                or manifest.get("model") != model
                or manifest.get("dim") != dim
                or manifest.get("instance") != instance
            ):
                return None
            token = manifest["token"]
            index: Any = faiss.read_index(str(base.with_name(f"{base.name}.{token}.faiss")))
            vks = np.load(base.with_name(f"{base.name}.{token}.vks.npy"))
            if index.ntotal != manifest["n"] or vks.shape != (index.ntotal,) or index.d != dim:
                return None
        except (OSError, ValueError, KeyError, RuntimeError) as e:
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
        self._set_bits(internal_ids, True)
        self.dead -= int(internal_ids.shape[0])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
