"""A search follower's index of one (embedding space, tier): the snapshot's HNSW mapped read-only
from its file, under a private index for everything after the snapshot.

Why: a follower that read its snapshot into memory would hold a second copy of the leader's
vectors and links (most of a memory's bytes). Mapped, the file's pages sit once in the page cache
for every follower that maps the same snapshot, and load in no time. FAISS cannot add to a mapped
index (an add aborts the process), so the mapped ``base`` only ever loses entries (kills, as
tombstones) and every entry added later goes to ``tail``, a ``VectorIndex`` of its own whose
internal ids are shifted past the base's: ids below ``offset`` are the base's, the rest the tail's
(minus ``offset``). A search asks both and merges their answers. A follower's index with no
snapshot under it has an empty base (offset 0).

The leader never rewrites a snapshot's files (each save gets new names; the old ones are unlinked),
so a mapping stays valid as long as it is held. ``rebase`` puts a newer snapshot under the same
object (core/remap.py); compacting a mostly dead base replaces it with a private copy of its live
entries (``VectorIndex.compact``), as it would any index.

Concurrency: each part has its own locks, and ``_swap`` keeps the parts fixed for whoever uses
them: every method reads the parts under it (reentrant for reads), a hold for reading (``reading``)
keeps it for the whole hold, and ``rebase`` takes it alone. Locks are taken in one order: ``_swap``,
then the base's, then the tail's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from tiermem.server.index.indexer import Indexer
from tiermem.server.index.vector_index import VectorIndex, top_k
from tiermem.server.model.locks import RWLock


class LayeredIndex:
    """A mapped snapshot index (``base``, no adds) with a private ``tail`` for later entries."""

    def __init__(self, base: VectorIndex, tail: VectorIndex) -> None:
        if base.pending:
            raise ValueError("a layered index's base takes no adds")
        self._swap = RWLock()
        self.base = base
        self.tail = tail  # its entries' ids are ``offset`` + theirs
        self.offset = base.n
        self.seen = base.token  # the last snapshot considered for this index (core/remap.py)
        self.dim = base.dim
        self.add_chunk = tail.add_chunk
        self.searched_chunk = tail.searched_chunk
        self.max_pending = tail.max_pending

    def rebase(self, base: VectorIndex, tail: VectorIndex, relocate: Callable[[], None]) -> list[VectorIndex]:
        """Replace both parts (``tail``'s ids past ``base``'s) while nothing uses them; ``relocate``
        (the rows' new locations) runs in between. Returns the parts replaced."""
        with self._swap.write():
            old = [self.base, self.tail]
            base.indexer = tail.indexer = self.tail.indexer
            self.base, self.tail, self.offset = base, tail, base.n
            relocate()
        return old

    def own_entries(self) -> int:
        """Entries this process holds a copy of (those of a base mapped from a file excepted)."""
        with self._swap.read():
            return self.tail.n + (0 if self.base.mapped else self.base.n)

    # -- what the indexer and the lifecycle read -------------------------------------------------
    @property
    def indexer(self) -> Indexer | None:
        return self.tail.indexer

    @indexer.setter
    def indexer(self, ix: Indexer | None) -> None:
        with self._swap.read():
            self.base.indexer = ix  # (a compacted base has entries to move in too)
            self.tail.indexer = ix

    @property
    def n(self) -> int:
        with self._swap.read():
            return self.base.n + self.tail.n

    @property
    def pending(self) -> int:
        with self._swap.read():
            return self.base.pending + self.tail.pending

    @property
    def max_pause_seconds(self) -> float:
        with self._swap.read():
            return max(self.base.max_pause_seconds, self.tail.max_pause_seconds)

    @max_pause_seconds.setter
    def max_pause_seconds(self, value: float) -> None:
        with self._swap.read():
            self.base.max_pause_seconds = self.tail.max_pause_seconds = value

    def counts(self) -> tuple[int, int, int]:
        """(entries in HNSW, entries pending, live entries), each part's read together."""
        with self._swap.read():
            b, t = self.base.counts(), self.tail.counts()
        return b[0] + t[0], b[1] + t[1], b[2] + t[2]

    def live_count(self) -> int:
        with self._swap.read():
            return self.base.live_count() + self.tail.live_count()

    def quiet_seconds(self) -> float:
        with self._swap.read():
            return min(self.base.quiet_seconds(), self.tail.quiet_seconds())

    # -- writes ------------------------------------------------------------------------------------
    def add(
        self,
        vectors: np.ndarray,
        slots: np.ndarray,
        vks: np.ndarray,
        chunk: int = 0,
        defer: bool = False,
        max_pending: int = 0,
    ) -> np.ndarray:
        """``VectorIndex.add``, into the tail; returns the entries' internal ids."""
        with self._swap.read():
            return self.tail.add(vectors, slots, vks, chunk, defer, max_pending) + self.offset

    def reserve(self, count: int) -> None:
        with self._swap.read():
            self.tail.reserve(count)

    def flush(self, chunk: int = 0, limit: int = 0, yield_to_save: bool = False) -> int:
        with self._swap.read():
            moved = self.base.flush(chunk, limit, yield_to_save) if self.base.pending else 0
            if limit and moved >= limit:
                return moved
            return moved + self.tail.flush(chunk, limit - moved if limit else 0, yield_to_save)

    def advise_huge_pages(self) -> None:
        with self._swap.read():
            self.tail.advise_huge_pages()  # (a mapped base's pages are the file's)

    def kill(self, internal_ids: np.ndarray | list[int]) -> None:
        ids = np.asarray(internal_ids, dtype=np.int64)
        with self._swap.read():
            below = ids < self.offset
            if below.any():
                self.base.kill(ids[below])
            if not below.all():
                self.tail.kill(ids[~below] - self.offset)

    def compact(self, relocate: Callable[[np.ndarray, np.ndarray], None]) -> int:
        """Drop the dead entries of each part that has any (``VectorIndex.compact``); the tail's
        ids stay past ``offset``. Returns how many entries were dropped."""
        with self._swap.read():
            base, tail, offset = self.base, self.tail, self.offset
            gone = base.compact(relocate) if base.live_count() < base.n else 0
            if tail.live_count() < tail.n:
                gone += tail.compact(lambda rows, ids: relocate(rows, ids + offset))
            return gone

    def save(self, base: Path, model: str, instance: str) -> int:
        raise RuntimeError("a follower's index is never snapshotted: its leader writes the snapshots")

    # -- reads -------------------------------------------------------------------------------------
    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._swap.read(), self.base.reading(), self.tail.reading():
            yield

    def held_here(self) -> bool:
        return self._swap.held_here()

    @contextmanager
    def lent(self) -> Iterator[None]:
        with self._swap.lent(), self.base.lent(), self.tail.lent():
            yield

    def search(
        self, query: np.ndarray, k: int, allowed: np.ndarray, ef_search: int, allowed_count: int = -1
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """``VectorIndex.search`` over both parts, merged: the top ``k``, and as bound the best
        similarity either part left out (NaN when either came back short)."""
        with self._swap.read():
            base, tail = self.base, self.tail
            b_count = t_count = -1
            if allowed_count >= 0:
                b_live, t_live = base.live_count(), tail.live_count()
                if allowed_count == b_live + t_live:  # every live entry allowed, in each part too
                    b_count, t_count = b_live, t_live
            b_rows, b_sims, b_bound = base.search(query, k, allowed, ef_search, b_count)
            if tail.n == 0:
                return b_rows, b_sims, b_bound
            t_rows, t_sims, t_bound = tail.search(query, k, allowed, ef_search, t_count)
        rows = np.concatenate([b_rows, t_rows])
        sims = np.concatenate([b_sims, t_sims])
        top, cut = top_k(sims, k)
        if math.isnan(b_bound) or math.isnan(t_bound):
            return rows[top], sims[top], math.nan
        return rows[top], sims[top], max(b_bound, t_bound, cut)

    def allowed_rows(self, allowed: np.ndarray) -> np.ndarray:
        with self._swap.read():
            return np.concatenate([self.base.allowed_rows(allowed), self.tail.allowed_rows(allowed)])

    def _split(
        self, internal_ids: np.ndarray, read: Callable[[VectorIndex, np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """``read`` of each part for its entries among ``internal_ids``, in their order."""
        with self._swap.read():
            below = internal_ids < self.offset
            if below.all():
                return read(self.base, internal_ids)
            if not below.any():
                return read(self.tail, internal_ids - self.offset)
            first = read(self.base, internal_ids[below])
            out = np.empty((internal_ids.shape[0], *first.shape[1:]), first.dtype)
            out[below] = first
            out[~below] = read(self.tail, internal_ids[~below] - self.offset)
            return out

    def similarities(self, internal_ids: np.ndarray, query: np.ndarray) -> np.ndarray:
        if internal_ids.shape[0] == 0:
            return np.empty(0, np.float32)
        return self._split(internal_ids, lambda part, ids: part.similarities(ids, query))

    def vectors(self, internal_ids: np.ndarray) -> np.ndarray:
        if internal_ids.shape[0] == 0:
            return np.empty((0, self.dim), np.float32)
        return self._split(internal_ids, lambda part, ids: part.vectors(ids))

    def held_storage(self) -> np.ndarray | None:
        """None: the parts' vectors are not one array (callers look similarities up per index)."""
        return None
