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
readers-writer lock. The writer thread appends entries (vectors to a pending buffer) and kills
them under a plain lock (``_state``), never waiting for searches; the ``Indexer`` thread alone
moves pending vectors into HNSW under the write lock, 16 at a time while searches come, 32 while
none do (or, once none has come for a while, a bulk chunk on every core). Searches hold the read
lock, which keeps the HNSW part fixed, and score the pending part exactly. An index with few entries,
or few allowed live ones, is scanned exactly instead of searched as a graph (``EXACT_ENTRIES``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tiermem import kernels
from tiermem.server.config import usable_cores
from tiermem.server.model.locks import RWLock

logger = logging.getLogger(__name__)


def _top_k(sims: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Positions of the ``k`` highest ``sims``, best first (ties in position order), and the
    highest similarity left out (-inf: none). A partition first: no full sort of a long array."""
    if sims.shape[0] <= k:
        return np.argsort(-sims, kind="stable"), -np.inf
    part = np.argpartition(-sims, k)
    top = part[:k]
    return top[np.argsort(-sims[top], kind="stable")], float(sims[part[k:]].max())


class VectorIndex:
    """HNSW (inner product over normalized vectors = cosine) with tombstones and vk bookkeeping.

    Entries get their internal id when added; the vectors of the newest ones wait in a small
    pending buffer until an ``Indexer`` thread moves them into HNSW (FAISS numbers entries in add
    order, so the ids agree). Searches score pending entries exactly, so a write is searchable as
    soon as it is acknowledged, while the HNSW add (the costliest part of a write) runs beside the
    writer instead of in front of its acknowledgements, in chunks large enough to amortize FAISS's
    per-call set-up. Without an indexer (start-up, tests), adds go straight into HNSW.
    """

    # Pending entries allowed before ``add`` waits for the indexer: bounds their exact scoring per
    # search (~0.1 ms at 384 dims) and the buffer's memory (pending x dim x 4 bytes).
    MAX_PENDING = 4096
    # An index with at most this many HNSW entries (dead ones included), or with at most this many
    # allowed live ones, is searched exactly: one dot product per allowed entry costs less than a
    # graph search there (a small FAST tier; the tier most memories just left).
    EXACT_ENTRIES = 2048
    # A filtered search for k with at most EXACT_PER_K * k allowed live entries is scanned exactly
    # too. Measured at 100k x 384 with k = 128 (the default score's K then; 80 now): filtered HNSW came back
    # short (fewer than k, so the caller scored every allowed row exactly on top) for 98-100 of 100
    # queries with 3-6% of the entries allowed, 80 with 7%, 25 with 8%, and cost 0.9-1.0 ms, while
    # the scan cost 0.5-0.8 ms up to 6%. With k = 32 the graph was not short and cheaper from ~5%.
    EXACT_PER_K = 48

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
        self.n = n  # entries, pending included
        self.indexed = n  # entries in HNSW (== index.ntotal); changes only under the write lock
        self.dead = n
        # Vectors of entries indexed..n-1: entry i at _pbuf[i - _pbase]. Appends write past n;
        # a full buffer is replaced (never rewritten), so a reader's snapshot of it stays valid.
        self._pbuf = np.empty((0, dim), np.float32)
        self._pbase = n
        self._lock = RWLock()  # FAISS: searches share it, an add into HNSW holds it alone
        self._state = threading.Condition()  # guards n, slots, vks, live_bits, dead, the buffer
        self._flush_lock = threading.Lock()  # one mover of pending vectors at a time
        self.indexer: Indexer | None = None
        self._saving = 0  # snapshots serializing: moves into HNSW wait rather than stall searches
        self.damaged = False  # a failed FAISS add left linked-or-not entries: no more snapshots
        self._backlog = 0  # pending entries deferred at start-up, still waiting: writes do not wait for them
        self.max_pause_seconds = 0.0  # longest write-lock hold of an add (searches wait that long)
        self.last_search = -math.inf  # time.monotonic() when a search last read (bulk moves wait for quiet)
        hnsw: Any = index
        self._storage: Any = faiss.downcast_index(hnsw.storage)  # its flat storage (~5 us a downcast)
        self._params: dict[int, Any] = {}  # unfiltered search parameters by efSearch (read-only to FAISS)

    # -- writes (writer thread only; flush from the indexer) ------------------------------------
    # Vectors moved into HNSW per write-lock hold, which bounds how long an add pauses searches
    # (~0.4 ms per vector into 100k with one OpenMP thread). With one thread FAISS's per-call cost
    # is invisible from 8 vectors up (measured at 100k entries, and again at 4-64 vectors: the
    # same time per vector). While searches read the index (see Indexer.chunk_for) moves take
    # SEARCHED_CHUNK: a search waits for at most one per index it reads (~6 ms at 100k x 384).
    # Otherwise ADD_CHUNK, or a bulk move: chunks of 8 had cost a fifth of the ingest rate with two
    # batches in flight before bulk moves existed (0.88 -> 0.71 of FAISS). A consolidation pass over 131k memories
    # re-adding 97k vectors while one client searched (searches waited on the lock for 41% of
    # their time with 32): 32 per hold, searches meanwhile p50 21-23 ms, p99 38-44 ms, pass 67-71 s;
    # 16: p50 16.2-16.7 ms, p99 32-33 ms, pass 90-95 s; 8: 13.2 / 26 ms, 107 s.
    ADD_CHUNK = 32
    SEARCHED_CHUNK = 16

    @property
    def pending(self) -> int:
        return self.n - self.indexed

    def counts(self) -> tuple[int, int, int]:
        """(entries in HNSW, entries pending, live entries), read together."""
        with self._state:
            return self.indexed, self.n - self.indexed, self.n - self.dead

    def add(
        self,
        vectors: np.ndarray,
        slots: np.ndarray,
        vks: np.ndarray,
        chunk: int = 0,
        defer: bool = False,
        max_pending: int = 0,
    ) -> np.ndarray:
        """Add rows of ``vectors`` for the given column rows; returns their internal ids.

        The entries are searchable on return. With an indexer attached they enter HNSW in the
        background (this waits only while MAX_PENDING are pending); without one, or with ``chunk``
        (start-up: no search can wait, so FAISS adds in big parallel batches), they are moved into
        HNSW before returning. ``defer`` (start-up) leaves them pending for the indexer, as a
        backlog that later writes do not wait for. ``max_pending``: wait beyond this many pending
        instead of MAX_PENDING (a search follower, whose searches wait for its adds).
        """
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        count = vectors.shape[0]
        with self._state:
            first = self.n
            need = first + count
            if need > self.slots.shape[0]:
                cap = max(need, self.slots.shape[0] * 2)
                grown = np.full(cap, -1, np.int64)
                grown[:first] = self.slots[:first]
                vk_grown = np.zeros(cap, np.int64)
                vk_grown[:first] = self.vks[:first]
                bits_grown = np.zeros((cap + 7) // 8, np.uint8)
                bits_grown[: self.live_bits.shape[0]] = self.live_bits
                self.slots, self.vks, self.live_bits = grown, vk_grown, bits_grown
            if need - self._pbase > self._pbuf.shape[0]:
                # Twice what writes left pending, plus the start-up backlog once (it only shrinks).
                self._new_buffer(
                    max(1024, 2 * (first - self.indexed - self._backlog + count) + self._backlog)
                )
            self._pbuf[first - self._pbase : need - self._pbase] = vectors
            self.slots[first:need] = slots
            self.vks[first:need] = vks
            self._set_bits(np.arange(first, need), True)
            self.n = need
            if defer:
                self._backlog += count
                return np.arange(first, first + count, dtype=np.int64)
        indexer = self.indexer
        if chunk or indexer is None or not indexer.running:
            self.flush(chunk)
        else:
            indexer.notify(self)
            most = max_pending or self.MAX_PENDING
            with self._state:
                while self.n - self.indexed > self._backlog + most and indexer.running:
                    self._state.wait(0.5)
            if self.n - self.indexed > self._backlog + most:  # the indexer stopped meanwhile
                self.flush()
        return np.arange(first, first + count, dtype=np.int64)

    def reserve(self, count: int) -> None:
        """Room in the pending buffer for ``count`` more entries, allocated once, exactly (start-up
        defers that many: growing by doubling would briefly hold three times their size)."""
        with self._state:
            if self.n + count - self._pbase > self._pbuf.shape[0]:
                self._new_buffer(self.n - self.indexed + count)

    def _new_buffer(self, rows: int) -> None:
        """Under ``_state``: a new pending buffer of ``rows`` rows holding the pending vectors. The
        old one is left as it is (readers may hold a view of it)."""
        keep = self._pbuf[self.indexed - self._pbase : self.n - self._pbase]
        buf = np.empty((rows, self.dim), np.float32)
        buf[: keep.shape[0]] = keep
        self._pbuf, self._pbase = buf, self.indexed

    def flush(self, chunk: int = 0, limit: int = 0, yield_to_save: bool = False) -> int:
        """Move pending vectors into HNSW, ``chunk`` per write-lock hold (default ADD_CHUNK); at
        most ``limit`` of them when given. Returns how many were moved.

        A snapshot holds the read lock while it writes the index out (~0.1 s at 100k x 384): asking for the
        write lock meanwhile would queue every new search behind the request (writers go first),
        so this waits for it to finish, or returns at once with ``yield_to_save`` (the indexer
        then serves other indexes)."""
        with self._flush_lock:
            moved = 0
            while True:
                with self._state:
                    lo, n = self.indexed, self.n
                    size = min(n - lo, chunk or self.ADD_CHUNK)
                    if limit:
                        size = min(size, limit - moved)
                    if size > 0 and self._saving and yield_to_save:
                        return moved
                    while size > 0 and self._saving:
                        self._state.wait()
                    if size <= 0:
                        self._shrink()
                        return moved
                    batch = self._pbuf[lo - self._pbase : lo + size - self._pbase]
                with self._lock.write():
                    t0 = time.perf_counter()
                    ok = False
                    try:
                        self.index.add(batch)
                        ok = True
                    finally:
                        # FAISS appends the vectors to its storage before it links them: after a
                        # failure (out of memory) some may be in, and their ids are taken. Count
                        # them as moved (never add them twice: ids would drift), and keep this
                        # index out of snapshots, so a restart adds them again from LMDB.
                        with self._state:
                            added = int(self.index.ntotal) - lo
                            if not ok and added > 0:
                                self.damaged = True
                            self.indexed = lo + added
                            # Deferred entries are the oldest pending ones: they move first.
                            self._backlog = max(0, self._backlog - added)
                            self._state.notify_all()
                    self.max_pause_seconds = max(self.max_pause_seconds, time.perf_counter() - t0)
                moved += size

    def _shrink(self) -> None:
        """Under ``_state`` with nothing pending: let go of a large buffer (a start-up or a burst
        sized it; an index written to rarely would keep it for good)."""
        if self.n == self.indexed and self._pbuf.shape[0] > 1024:
            self._new_buffer(0)

    def kill(self, internal_ids: np.ndarray | list[int]) -> None:
        ids = np.asarray(internal_ids, dtype=np.int64)
        with self._state:
            live = ids[self.slots[ids] >= 0]
            self.slots[live] = -1
            self._set_bits(live, False)
            self.dead += int(live.shape[0])

    def _set_bits(self, ids: np.ndarray, on: bool) -> None:
        if ids.shape[0] <= 4:  # single creates and deletes: 0.3 us a bit here, 3 us through ufunc.at
            b = self.live_bits
            for i in ids.tolist():
                if on:
                    b[i >> 3] |= 1 << (i & 7)
                else:
                    b[i >> 3] &= ~(1 << (i & 7)) & 0xFF
            return
        bits = (1 << (ids & 7)).astype(np.uint8)
        if on:
            np.bitwise_or.at(self.live_bits, ids >> 3, bits)
        else:
            np.bitwise_and.at(self.live_bits, ids >> 3, ~bits)

    # -- reads ----------------------------------------------------------------------------------
    def live_count(self) -> int:
        return self.n - self.dead

    def _pending_view(self) -> tuple[int, int, np.ndarray, np.ndarray, int, np.ndarray]:
        """(indexed, n, slots, pending vectors, dead, live bits): a snapshot. Call under the read
        lock, which keeps ``indexed`` fixed. ``slots`` and the bits are live arrays that kills
        still change (an entry never comes back to life, and a killed row fails the caller's
        ``allowed``): read each slot once, or copy."""
        with self._state:
            lo, n = self.indexed, self.n
            pvecs = self._pbuf[lo - self._pbase : n - self._pbase]
            return lo, n, self.slots[:n], pvecs, self.dead, self.live_bits

    def quiet_seconds(self) -> float:
        """Seconds since a search last read this index or, with an indexer attached, any index
        it serves (snapshots and copies of stored vectors do not count)."""
        ix = self.indexer
        return time.monotonic() - max(self.last_search, ix.last_search if ix is not None else -math.inf)

    def _searched(self) -> None:
        """A search reads this index: the indexer's moves stay small (on every index it serves,
        so a search that holds several indexes in turn waits for at most one bulk move)."""
        now = time.monotonic()
        self.last_search = now
        ix = self.indexer
        if ix is not None:
            ix.last_search = now

    def reading(self) -> AbstractContextManager[None]:
        """Hold the index for reading across several searches and similarity lookups: the caller
        waits for the indexer (one chunk of adds) at most once, not at each lookup."""
        self._searched()
        return self._lock.read()

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
        Pending entries (not in HNSW yet) are scored exactly and merged.
        """
        empty = np.empty(0, np.int64), np.empty(0, np.float32), -np.inf
        self._searched()
        with self._lock.read():
            lo, n, slots, pvecs, dead, live_bits = self._pending_view()
            if n == 0:
                return empty
            # Pending entries: exact similarities of the allowed ones. A copy: kills do not take
            # the read lock, and a slot read twice could turn -1 (a row number!) in between.
            p_rows = slots[lo:n].copy()
            ok = (p_rows >= 0) & (p_rows < allowed.shape[0])
            ok[ok] = allowed[p_rows[ok]]
            p_ids = np.flatnonzero(ok)
            p_rows = p_rows[p_ids]
            p_sims = kernels.dot_rows(pvecs, p_ids, query)
            live = n - dead
            if allowed_count == live:
                bitmap = live_bits if dead else None
                n_allowed = live - int(np.count_nonzero(slots[lo:n] >= 0))
            elif lo:
                bitmap, n_allowed = kernels.selection_bitmap(slots[:lo], allowed)
            else:
                bitmap, n_allowed = None, 0
            if n_allowed <= 0:
                h_rows, h_sims, bound = empty
            elif lo <= self.EXACT_ENTRIES or n_allowed <= max(self.EXACT_ENTRIES, self.EXACT_PER_K * k):
                # (few allowed live entries in a large graph: mostly dead, say, after a consolidation
                # pass moved most of them away; a graph search would wade through the dead ones)
                h_rows, h_sims, bound = self._exact(query, k, lo, slots, allowed)
            else:
                h_rows, h_sims, bound = self._hnsw(query, k, ef_search, lo, slots, bitmap, n_allowed)
        keep = (h_rows >= 0) & (h_rows < allowed.shape[0])
        keep[keep] = allowed[h_rows[keep]]
        h_rows, h_sims = h_rows[keep], h_sims[keep]
        if p_ids.shape[0] == 0:
            return h_rows, h_sims, bound
        rows = np.concatenate([h_rows, p_rows])
        sims = np.concatenate([h_sims, p_sims.astype(np.float32, copy=False)])
        # (a start-up backlog can leave many pending: no full sort)
        top, cut = _top_k(sims, k)
        # Entries left out: those HNSW did not return (at most ``bound``) and those cut here.
        if not math.isnan(bound):
            bound = max(bound, cut)
        return rows[top], sims[top], bound

    def _hnsw(
        self,
        query: np.ndarray,
        k: int,
        ef_search: int,
        lo: int,
        slots: np.ndarray,
        bitmap: np.ndarray | None,
        n_allowed: int,
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """The HNSW part of ``search`` over the ``lo`` indexed entries (under the read lock)."""
        # A selective filter leaves fewer allowed nodes on each graph path: widen the beam with
        # 1/sqrt(selectivity) so recall holds (filtered HNSW collapses at low selectivity otherwise).
        widen = max(1.0, math.sqrt(lo / n_allowed))
        ef = min(int(max(ef_search, k) * widen), max(2048, k))
        if bitmap is None or n_allowed == lo:  # nothing dead, nothing filtered out
            params = self._params.get(ef)
            if params is None:  # FAISS only reads them: one object per efSearch serves every search
                params = faiss.SearchParametersHNSW(efSearch=ef)  # type: ignore[attr-defined]
                self._params[ef] = params
        else:
            sel = faiss.IDSelectorBitmap(lo, faiss.swig_ptr(bitmap))
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef)  # type: ignore[attr-defined]
        sims, ids = self.index.search(query.reshape(1, -1), k, params=params)
        ids = ids[0]
        found = ids >= 0
        ids = ids[found]
        if ids.shape[0] == k:
            bound = float(sims[0][k - 1])
        elif ids.shape[0] < n_allowed:
            bound = math.nan
        else:
            bound = -np.inf
        # The similarities returned are those of our own kernel, not FAISS's (which may differ in
        # the last bit): a similarity must be the same whichever path computed it (this one, the
        # exact scan, the pending buffer or ``similarities``), so callers can use it as it is.
        return slots[ids], kernels.dot_rows(self._stored(lo), ids, query), bound

    def _exact(
        self, query: np.ndarray, k: int, lo: int, slots: np.ndarray, allowed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """``_hnsw``'s answer computed exactly over the ``lo`` indexed entries (under the read lock):
        the top-k allowed live entries, and as bound the best similarity left out (-inf: none)."""
        # (kills do not take the read lock: the kernel reads each slot once)
        ids, rows = kernels.allowed_entries(slots[:lo], allowed)
        if ids.shape[0] == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32), -np.inf
        sims = kernels.dot_rows(self._stored(lo), ids, query)
        top, bound = _top_k(sims, k)
        return rows[top], sims[top], bound

    def allowed_rows(self, allowed: np.ndarray) -> np.ndarray:
        """Column rows of the live entries allowed by ``allowed`` (for exact scoring)."""
        with self._state:
            slots = self.slots[: self.n].copy()  # (kills may run meanwhile: read each slot once)
        live = slots[slots >= 0]
        live = live[live < allowed.shape[0]]
        return live[allowed[live]]

    def _stored(self, lo: int) -> np.ndarray:
        """The first ``lo`` vectors of HNSW storage as a (lo, dim) view (call under the read lock)."""
        if lo:
            return faiss.rev_swig_ptr(self._storage.get_xb(), lo * self.dim).reshape(lo, self.dim)
        return np.empty((0, self.dim), np.float32)  # nothing in HNSW yet (storage may have no buffer)

    def _gather(self, internal_ids: np.ndarray, query: np.ndarray | None) -> np.ndarray:
        """Similarities with ``query`` (or copies of the vectors, query None) of the given entries,
        read from HNSW storage or the pending buffer, under the read lock."""
        with self._lock.read():
            lo, n, _, pvecs, _, _ = self._pending_view()
            xb = self._stored(lo)
            if internal_ids.shape[0] and int(internal_ids.max()) >= n:
                raise ValueError("internal id out of range")
            in_hnsw = internal_ids < lo
            if query is None:
                out: np.ndarray = np.empty((internal_ids.shape[0], self.dim), np.float32)
                out[in_hnsw] = xb[internal_ids[in_hnsw]]
                out[~in_hnsw] = pvecs[internal_ids[~in_hnsw] - lo]
                return out
            if in_hnsw.all():
                return kernels.dot_rows(xb, internal_ids, query)
            # The same kernel for both parts: a similarity must not change in its last bit when
            # its entry moves into HNSW between two searches.
            out = np.empty(internal_ids.shape[0], np.float32)
            out[in_hnsw] = kernels.dot_rows(xb, np.ascontiguousarray(internal_ids[in_hnsw]), query)
            out[~in_hnsw] = kernels.dot_rows(pvecs, internal_ids[~in_hnsw] - lo, query)
            return out

    def similarities(self, internal_ids: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Inner products of the given entries' stored vectors with ``query`` (no copy of the vectors)."""
        if internal_ids.shape[0] == 0:
            return np.empty(0, np.float32)
        self._searched()
        return self._gather(internal_ids, query)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        """Stored vectors of the given entries (a copy)."""
        if internal_ids.shape[0] == 0:
            return np.empty((0, self.dim), np.float32)
        return self._gather(internal_ids, None)

    # -- snapshots ------------------------------------------------------------------------------
    # A snapshot is <base>.<token>.faiss + <base>.<token>.vks.npy, named by <base>.json (written
    # last, atomically). The token ties the three together: a crash mid-save leaves the previous
    # manifest pointing at the previous, complete files. ``instance`` is the LMDB environment's id,
    # so a snapshot is never applied to another database (e.g. a restored LMDB backup).
    def save(self, base: Path, model: str, instance: str) -> None:
        if self.damaged:  # the previous snapshot stays; start-up adds what it lacks from LMDB
            logger.error("index %s not snapshotted: a failed add may have left entries unlinked", base.name)
            return
        token = uuid.uuid4().hex[:16]
        index_path = base.with_name(f"{base.name}.{token}.faiss")
        vks_path = base.with_name(f"{base.name}.{token}.vks.npy")
        with self._state:
            self._saving += 1
        try:
            # Adds wait while FAISS writes the index into the page cache; the fsync comes after.
            # Written straight to the file, not through serialize_index's in-memory copy, which
            # held the whole index a second time (172 MiB at 100k x 384) and the lock longer.
            # Through a Python file: a failed write or flush raises (FAISS's own file writer
            # ignores a failure of its last flush at close, which would leave a short file).
            with self._lock.read(), open(index_path, "wb") as f:
                n = self.indexed  # pending entries are left out: start-up adds them again from LMDB
                faiss.write_index(self.index, faiss.PyCallbackIOWriter(f.write))  # type: ignore[attr-defined]
                vks = self.vks[:n].copy()
        finally:
            with self._state:
                self._saving -= 1
                self._state.notify_all()
        _fsync(index_path)
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
        """Read a snapshot; returns (index with every entry dead, vks by internal id) or None.
        A snapshot replaced while it is read (a search follower loading while its leader writes
        the next one) is read again from the new manifest."""
        manifest_path = base.with_name(f"{base.name}.json")
        token = None
        for _ in range(3):
            try:
                manifest = json.loads(manifest_path.read_text())
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
                break
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                if token is not None and _manifest_token(manifest_path) not in (token, None):
                    continue  # replaced meanwhile: read the new one
                logger.warning("ignoring index snapshot %s: %s", base, e)
                return None
        else:
            return None
        hnsw: Any = faiss.downcast_index(index)
        hnsw.hnsw.efConstruction = ef_construction
        idx = cls(dim, index=index)
        idx.vks[: index.ntotal] = vks
        return idx, vks

    def compact(self, relocate: Callable[[np.ndarray, np.ndarray], None]) -> int:
        """Drop the dead entries (writer thread: nothing else adds or kills meanwhile). The live
        ones become entries 0..L-1 of an empty HNSW index, pending (searched exactly; the indexer
        moves them in as a backlog later writes do not wait for). ``relocate(rows, ids)`` is
        called under the write lock, so the caller can point those column rows at their new ids
        before any search reads either. Returns how many entries were dropped.

        Tombstones free nothing in FAISS: without this, an index most of whose memories moved to
        another tier holds all their vectors and links until a restart rebuilds it."""
        with self._flush_lock:  # no move into HNSW meanwhile: the numbering stays put
            with self._state:
                n = self.n
                live = np.flatnonzero(self.slots[:n] >= 0)
            rows, vks = self.slots[live].copy(), self.vks[live].copy()
            vectors = self.vectors(live)
            m = int(self.index.hnsw.nb_neighbors(1))  # (level 0 has twice as many)
            fresh: Any = faiss.IndexHNSWFlat(self.dim, m, faiss.METRIC_INNER_PRODUCT)
            fresh.hnsw.efConstruction = self.index.hnsw.efConstruction
            count = live.shape[0]
            cap = max(16, count)
            # Everything allocated before the lock: under it, only assignments (no half-swapped
            # index if memory runs out).
            storage = faiss.downcast_index(fresh.storage)
            slots = np.full(cap, -1, np.int64)
            slots[:count] = rows
            new_vks = np.zeros(cap, np.int64)
            new_vks[:count] = vks
            bits = np.zeros((cap + 7) // 8, np.uint8)
            packed = np.packbits(np.ones(count, np.bool_), bitorder="little")  # entries 0..count-1 live
            bits[: packed.shape[0]] = packed
            with self._lock.write():
                with self._state:
                    self.index, self._storage, self._params = fresh, storage, {}
                    self.slots, self.vks, self.live_bits = slots, new_vks, bits
                    self._pbuf, self._pbase = vectors, 0
                    self.n, self.indexed, self.dead = count, 0, 0
                    self._backlog = count
                    self.damaged = False
                    self._state.notify_all()
                relocate(rows, np.arange(count, dtype=np.int64))
        if count:
            if self.indexer is not None and self.indexer.running:
                self.indexer.notify(self)
            else:
                self.flush()
        return n - count

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


class Indexer:
    """One background thread that moves pending vectors into HNSW, a chunk per index in turn.

    If an add into FAISS fails (out of memory), the thread logs it and tries again a second later;
    the entries stay pending, and searchable, meanwhile.
    """

    def __init__(self, bulk_chunk: int = 0) -> None:
        self.bulk_chunk = bulk_chunk  # 0: no bulk moves
        self._cores = usable_cores()
        self.last_search = -math.inf  # time.monotonic() when a search last read any index served here
        self._cond = threading.Condition()
        self._work: dict[int, VectorIndex] = {}  # indexes with pending entries, in turn order
        self._stop = False
        self._drain = True
        self.running = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.running = True
        self._thread = threading.Thread(target=self._run, name="tiermem-indexer", daemon=True)
        self._thread.start()

    def attach(self, idx: VectorIndex) -> None:
        idx.indexer = self
        if idx.pending:
            self.notify(idx)

    def notify(self, idx: VectorIndex) -> None:
        with self._cond:
            self._work[id(idx)] = idx
            self._cond.notify()

    def stop(self, drain: bool = True) -> None:
        """Stop, after indexing everything pending (``drain``) or after the chunk in progress."""
        with self._cond:
            self._stop = True
            self._drain = drain
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        self.running = False

    # A few pending vectors wait up to LINGER_SECONDS for company: each move takes the write lock
    # (waiting for running searches to finish, pausing new ones), so fewer, fuller moves disturb
    # searches less; waiting is free for readers (pending entries are searched exactly).
    MIN_BATCH = 8
    LINGER_SECONDS = 0.005
    # Bulk moves (everything pending, up to ``bulk_chunk`` vectors, on every core) once no search
    # has read any index served here for QUIET_SECONDS: a bulk load, or the backlog of a start-up
    # after kill -9. FAISS parallelizes an add over its vectors, and pays its per-call cost (one
    # lock per entry of the index) once. Measured at 60k, batches of 256 one call at a time on 2
    # cores: 2,090-2,360 memories/s with moves of 32 on one thread, 2,220-2,540/s with bulk moves
    # of 512. A search that arrives waits for the move in progress (512 into 100k at 384 dims:
    # ~0.1-0.2 s; longer for bigger indexes and vectors), then moves are small again. Copies of
    # stored vectors (tier moves, in the writer) do not count as searches: they wait for one move.
    QUIET_SECONDS = 1.0
    BULK_MIN = 256  # fewer pending: one thread (FAISS's second one barely helps small adds)

    def chunk_for(self, idx: VectorIndex) -> tuple[int, int]:
        """(vectors, OpenMP threads) for the next move out of ``idx``: everything pending up to
        ``bulk_chunk`` on every core once searches have left it alone; else, on one thread,
        SEARCHED_CHUNK while searches read it (they wait for the move), ADD_CHUNK when they do not."""
        pending = idx.pending
        quiet = idx.quiet_seconds() >= self.QUIET_SECONDS
        if quiet and self.bulk_chunk > idx.ADD_CHUNK and pending >= self.BULK_MIN:
            return min(pending, self.bulk_chunk), self._cores
        return (idx.ADD_CHUNK if quiet else idx.SEARCHED_CHUNK), 1

    def _run(self) -> None:
        # OpenMP settings are per thread, and threads Python starts use the process default (every
        # core). One thread for small moves: a second OpenMP thread spins beside the gRPC threads
        # on a small machine and doubled the CPU of an add (16-64 vectors into 100k) for no gain.
        while True:
            with self._cond:
                while not self._work and not self._stop:
                    self._cond.wait()
                if not self._work or (self._stop and not self._drain):
                    return
                key, idx = next(iter(self._work.items()))
                deadline = time.monotonic() + self.LINGER_SECONDS
                while not self._stop and idx.pending < self.MIN_BATCH:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            pause = 0.0
            size, threads = self.chunk_for(idx)
            faiss.omp_set_num_threads(threads)
            try:
                if idx.flush(chunk=size, limit=size, yield_to_save=True) == 0 and idx.pending:
                    pause = 0.01  # a snapshot of this index is being written
            except Exception:
                # Out of memory, most likely: the entries stay pending (searched exactly, and
                # writes wait once MAX_PENDING are); try again in a second.
                logger.exception("moving pending vectors into HNSW failed; retrying in 1 s")
                pause = 1.0
            with self._cond:
                self._work.pop(key, None)
                if idx.pending:
                    self._work[key] = idx  # back of the line: indexes take turns
                    if pause and not self._stop:
                        self._cond.wait(pause)


def _manifest_token(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text())["token"])
    except (OSError, ValueError, KeyError):
        return None
