"""FAISS HNSW index of one (embedding space, tier), derived from LMDB and rebuildable from it.

Why tombstones plus snapshots (HNSW has no real remove; ``IndexIDMap2(HNSW).remove_ids`` raises):

- An entry is never removed from the graph. Each index keeps ``slots`` (FAISS internal id -> row of
  the in-memory columns, -1 once dead). A delete or a tier move marks the old entry dead; searches pass
  an ``IDSelectorBitmap`` of entries that are alive *and* allowed by the request's filter, so a dead
  entry is never returned (the selector costs a search about a tenth more time). The row's
  ``alive`` column is a second guard.
- Every entry carries a ``vk`` (vector key) that the record stores; a record that gets a new vector
  (new embedding or new tier) gets a new vk. On start-up a snapshot (written at clean shutdown)
  is mapped back by vk: entries whose vk is some live record's current vk are live, every other entry
  is dead, and live records whose vk is missing are re-added from LMDB. So a snapshot that is older
  than LMDB (kill -9) is still correct, just less complete; one that is missing or damaged is rebuilt.
  Its files are snapshot_files.py's.
- Rebuilding (compaction) to drop dead entries happens at start-up when dead entries pass a fraction.

Concurrency: FAISS allows concurrent searches but no search during an add, so each index has a
readers-writer lock. The writer thread appends entries (vectors to a pending buffer) and kills
them under a plain lock (``_state``), never waiting for searches; the ``Indexer`` thread (indexer.py)
alone moves pending vectors into HNSW under the write lock, ``searched_chunk`` at a time while
searches come, ``add_chunk`` while none do (or, once none has come for a while, a bulk chunk on every
core). Searches hold the read lock, which keeps the HNSW part fixed, and score the pending part
exactly. An index with few entries, or few allowed live ones, is scanned exactly instead of searched
as a graph (``exact_entries``, ``exact_per_k``).

The thresholds come from ``Tuning`` (config.py), passed to the constructor.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from tiermem import kernels
from tiermem.server.config import Tuning
from tiermem.server.index import hugepages
from tiermem.server.index.indexer import Indexer
from tiermem.server.index.snapshot_files import (
    HashingWriter,
    Manifest,
    commit_snapshot,
    discard,
    new_snapshot_files,
    read_snapshot,
)
from tiermem.server.model.locks import RWLock

logger = logging.getLogger(__name__)


def top_k(sims: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Positions of the ``k`` highest ``sims``, best first (ties in position order), and the
    highest similarity left out (-inf: none). A partition first: no full sort of a long array."""
    if sims.shape[0] <= k:
        return np.argsort(-sims, kind="stable"), -np.inf
    part = np.argpartition(-sims, k)
    top = part[:k]
    return top[np.argsort(-sims[top], kind="stable")], float(sims[part[k:]].max())


SELECTIONS_KEPT = 8  # masks whose selectors an index keeps (a few large namespaces searched in turn)


class VectorIndex:
    """HNSW (inner product over normalized vectors = cosine) with tombstones and vk bookkeeping.

    Entries get their internal id when added; the vectors of the newest ones wait in a small
    pending buffer until an ``Indexer`` thread moves them into HNSW (FAISS numbers entries in add
    order, so the ids agree). Searches score pending entries exactly, so a write is searchable as
    soon as it is acknowledged, while the HNSW add (the costliest part of a write) runs beside the
    writer instead of in front of its acknowledgements, in chunks large enough to amortize FAISS's
    per-call set-up. Without an indexer (start-up, tests), adds go straight into HNSW.
    """

    def __init__(
        self,
        dim: int,
        m: int = 32,
        ef_construction: int = 128,
        index: faiss.Index | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        tuning = tuning or Tuning()
        # Pending entries allowed before ``add`` waits for the indexer: bounds their exact scoring
        # per search and the buffer's memory (pending x dim x 4 bytes).
        self.max_pending = tuning.max_pending
        # At most this many HNSW entries (dead ones included), or at most this many allowed live
        # ones: searched exactly, where one dot product per allowed entry costs less than a graph
        # search (a small FAST tier; the tier most memories just left).
        self.exact_entries = tuning.exact_entries
        # A filtered search for k with at most exact_per_k * k allowed live entries is scanned
        # exactly too: filtered HNSW tends to come back short there (the caller would then score
        # every allowed row exactly on top), and costs more than the scan.
        self.exact_per_k = tuning.exact_per_k
        # Vectors moved into HNSW per write-lock hold, which bounds how long an add pauses searches:
        # ``searched_chunk`` while searches read the index (each waits for at most one move per index
        # it reads), else ``add_chunk`` (or a bulk move, see Indexer). Smaller moves pause searches
        # less and move vectors more slowly.
        self.add_chunk = tuning.add_chunk
        self.searched_chunk = tuning.searched_chunk
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
        self._kills = 0  # changes of entries' slots (kills, compactions): kept selectors go stale
        self._selections: dict[int, tuple[Any, int, int, np.ndarray, int]] = {}  # see _selection
        self._backlog = 0  # pending entries deferred at start-up, still waiting: writes do not wait for them
        self.max_pause_seconds = 0.0  # longest write-lock hold of an add (searches wait that long)
        self.last_search = -math.inf  # time.monotonic() when a search last read (bulk moves wait for quiet)
        hnsw: Any = index
        self._storage: Any = faiss.downcast_index(hnsw.storage)  # its flat storage (~5 us a downcast)
        self._params: dict[int, Any] = {}  # unfiltered search parameters by efSearch (read-only to FAISS)
        # The indexed vectors' view of HNSW storage (cleared under the write lock whenever an add or
        # a compaction may move the storage): every lookup would otherwise cross into FAISS for it.
        self._xb: np.ndarray | None = None
        self._huge: dict[str, tuple[int, int]] = {}  # per FAISS array: (address, bytes) when advised
        self.mapped = False  # HNSW mapped read-only from a snapshot's file (layered.py): no adds
        self.token: str | None = None  # the snapshot this index was loaded from, if any
        self.saved = 0  # entries in HNSW at the last snapshot written or loaded (compaction: 0)

    # -- writes (writer thread only; flush from the indexer) ------------------------------------
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
        background (this waits only while ``max_pending`` are pending); without one, or with ``chunk``
        (start-up: no search can wait, so FAISS adds in big parallel batches), they are moved into
        HNSW before returning. ``defer`` (start-up) leaves them pending for the indexer, as a
        backlog that later writes do not wait for. ``max_pending``: wait beyond this many pending
        instead of the index's ``max_pending`` (a search follower, whose searches wait for its adds).
        """
        if self.mapped:  # (FAISS would abort the process)
            raise RuntimeError("an index mapped from a snapshot's file takes no adds")
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
            most = max_pending or self.max_pending
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
        """Move pending vectors into HNSW, ``chunk`` per write-lock hold (default ``add_chunk``); at
        most ``limit`` of them when given. Returns how many were moved.

        A snapshot holds the read lock while it writes the index out: asking for the
        write lock meanwhile would queue every new search behind the request (writers go first),
        so this waits for it to finish, or returns at once with ``yield_to_save`` (the indexer
        then serves other indexes)."""
        with self._flush_lock:
            moved = self._move(chunk, limit, yield_to_save)
            if moved:
                self.advise_huge_pages()  # (an add may have moved the arrays, or grown them)
            return moved

    def _move(self, chunk: int, limit: int, yield_to_save: bool) -> int:
        """``flush``'s moves, under its lock."""
        moved = 0
        while True:
            with self._state:
                lo, n = self.indexed, self.n
                size = min(n - lo, chunk or self.add_chunk)
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
                        self._xb = None  # (the storage may have moved)
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

    def advise_huge_pages(self) -> None:
        """Huge pages under HNSW's vectors and links (``hugepages``): advised again when an add
        moved an array or grew it past what was advised (under the flush lock, or before serving).
        Advice: a failure is logged, never raised."""
        try:
            self._advise_huge_pages()
        except (OSError, RuntimeError, ValueError) as e:
            logger.warning("huge pages not advised: %s", e)

    def _advise_huge_pages(self) -> None:
        n = int(self.index.ntotal)
        if n == 0 or self.mapped:  # (a mapping's pages are the file's, in the page cache)
            return
        links = self.index.hnsw.neighbors
        for name, ptr, nbytes in (
            ("vectors", self._storage.get_xb(), n * self.dim * 4),
            ("links", links.data(), int(links.size()) * 4),  # (int32 ids)
        ):
            if nbytes < hugepages.MIN_BYTES:
                continue
            address = int(faiss.rev_swig_ptr(ptr, 1).ctypes.data)
            was, size = self._huge.get(name, (0, 0))
            since = size if was == address else 0
            if since and nbytes <= since + since // 8:  # (advised again once grown by an eighth)
                continue
            if hugepages.advise(address, nbytes, since):
                self._huge[name] = (address, nbytes)

    def kill(self, internal_ids: np.ndarray | list[int]) -> None:
        ids = np.asarray(internal_ids, dtype=np.int64)
        with self._state:
            live = ids[self.slots[ids] >= 0]
            self.slots[live] = -1
            self._set_bits(live, False)
            self.dead += int(live.shape[0])
            self._kills += 1

    def _set_bits(self, ids: np.ndarray, on: bool) -> None:
        if ids.shape[0] <= 4:  # single creates and deletes: a loop costs far less than ufunc.at
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

    def lent(self) -> AbstractContextManager[None]:
        """``reading`` on a helper thread, under a hold the caller's thread has (``RWLock.lent``)."""
        return self._lock.lent()

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
                bitmap, n_allowed = self._selection(slots, lo, allowed)
            else:
                bitmap, n_allowed = None, 0
            if n_allowed <= 0:
                h_rows, h_sims, bound = empty
            elif lo <= self.exact_entries or n_allowed <= max(self.exact_entries, self.exact_per_k * k):
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
        top, cut = top_k(sims, k)
        # Entries left out: those HNSW did not return (at most ``bound``) and those cut here.
        if not math.isnan(bound):
            bound = max(bound, cut)
        return rows[top], sims[top], bound

    def _selection(self, slots: np.ndarray, lo: int, allowed: np.ndarray) -> tuple[np.ndarray, int]:
        """The selector of the first ``lo`` entries that ``allowed`` allows, and their count; kept
        for the next searches with the same mask while no entry's slot changed. MaskCache hands a
        namespace's searches one shared mask (never changed) while none of its rows changes, so a
        large namespace beside others in one index skips the pass over every entry."""
        kills = self._kills  # (read first: a kill meanwhile leaves what is kept stale, not wrong)
        kept = self._selections.get(id(allowed))
        if kept is not None and kept[0]() is allowed and kept[1] == lo and kept[2] == kills:
            return kept[3], kept[4]
        bitmap, count = kernels.selection_bitmap(slots[:lo], allowed)
        if len(self._selections) >= SELECTIONS_KEPT:
            self._selections.clear()  # (one step that cannot fail while other searches add theirs)
        self._selections[id(allowed)] = (weakref.ref(allowed), lo, kills, bitmap, count)
        return bitmap, count

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
        top, bound = top_k(sims, k)
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
        xb = self._xb
        if xb is not None and xb.shape[0] == lo:
            return xb
        if lo:
            xb = faiss.rev_swig_ptr(self._storage.get_xb(), lo * self.dim).reshape(lo, self.dim)
        else:
            xb = np.empty((0, self.dim), np.float32)  # nothing in HNSW yet (storage may have no buffer)
        if lo == self.indexed:  # (kept while the read lock holds the index still)
            self._xb = xb
        return xb

    def _gather(self, internal_ids: np.ndarray, query: np.ndarray | None) -> np.ndarray:
        """Similarities with ``query`` (or copies of the vectors, query None) of the given entries,
        read from HNSW storage or the pending buffer, under the read lock."""
        with self._lock.read():
            top = int(internal_ids.max()) if internal_ids.shape[0] else -1
            lo = self.indexed  # (the read lock keeps it fixed)
            if query is not None and top < lo:  # every entry in HNSW
                return kernels.dot_rows(self._stored(lo), internal_ids, query)
            lo, n, _, pvecs, _, _ = self._pending_view()
            xb = self._stored(lo)
            if top >= n:
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

    def held_here(self) -> bool:
        """Whether this thread holds ``reading()`` (what ``lent`` may lend to a helper)."""
        return self._lock.held_here()

    def held_storage(self) -> np.ndarray | None:
        """The vectors in HNSW as an (indexed, dim) view without a copy, for a caller that holds
        ``reading()`` on this thread, until that hold ends (None without the hold). Marks the index
        searched, as ``similarities`` does."""
        if not self.held_here():
            return None
        self._searched()
        return self._stored(self.indexed)

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        """Stored vectors of the given entries (a copy)."""
        if internal_ids.shape[0] == 0:
            return np.empty((0, self.dim), np.float32)
        return self._gather(internal_ids, None)

    # -- snapshots (their files: snapshot_files.py) ----------------------------------------------
    def save(self, base: Path, model: str, instance: str) -> int:
        """Snapshot the entries in HNSW (pending ones are left out: start-up adds them from LMDB);
        returns the bytes of the index file written (0: none)."""
        if self.damaged:  # the previous snapshot stays; start-up adds what it lacks from LMDB
            logger.error("index %s not snapshotted: a failed add may have left entries unlinked", base.name)
            return 0
        files = new_snapshot_files(base)
        with self._state:
            self._saving += 1
        try:
            # Adds wait while FAISS writes the index into the page cache; the fsync comes after.
            # Written straight to the file, not through serialize_index's in-memory copy, which
            # would hold the whole index a second time and the lock longer. Through a Python file:
            # a failed write or flush raises (FAISS's own file writer ignores a failure of its last
            # flush at close, which would leave a short file); it checksums what it writes.
            with self._lock.read(), open(files.index, "wb") as f:
                out = HashingWriter(f)
                n, written = self.indexed, self.index
                faiss.write_index(self.index, faiss.PyCallbackIOWriter(out.write))  # type: ignore[attr-defined]
                vks = self.vks[:n].copy()
        except BaseException:
            discard(files)  # (a full disk: the previous snapshot stays current)
            raise
        finally:
            with self._state:
                self._saving -= 1
                self._state.notify_all()
        manifest = Manifest(model, self.dim, n, files.token, instance, out.checksum(), out.hash_name)
        commit_snapshot(base, files, vks, manifest)
        with self._state:  # (a compaction meanwhile started the count again: it stays at 0)
            if self.index is written:
                self.saved = n
        return out.size

    @classmethod
    def load(
        cls,
        base: Path,
        model: str,
        dim: int,
        ef_construction: int,
        instance: str,
        tuning: Tuning | None = None,
        mapped: bool = False,
    ) -> tuple[VectorIndex, np.ndarray] | None:
        """Read a snapshot; returns (index with every entry dead, vks by internal id) or None.
        ``mapped``: HNSW's vectors and links stay in the file, mapped read-only (no adds)."""
        read = read_snapshot(base, model, dim, instance, mapped)
        if read is None:
            return None
        index, vks, token = read
        hnsw: Any = faiss.downcast_index(index)
        hnsw.hnsw.efConstruction = ef_construction
        idx = cls(dim, index=index, tuning=tuning)
        idx.mapped, idx.token, idx.saved = mapped, token, index.ntotal
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
                    self.index, self._storage, self._params, self._xb = fresh, storage, {}, None
                    self._huge, self.mapped, self.saved = {}, False, 0
                    self.slots, self.vks, self.live_bits = slots, new_vks, bits
                    self._pbuf, self._pbase = vectors, 0
                    self.n, self.indexed, self.dead = count, 0, 0
                    self._kills += 1
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
        self._kills += 1
