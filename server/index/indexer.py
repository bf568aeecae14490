"""The ``Indexer``: one background thread that moves the pending vectors of vector indexes into HNSW.

Concurrency: writers call ``notify`` (any thread); the thread takes the indexes with pending entries
in turn, one chunk each, through the index's own ``flush`` (which holds the index's write lock for
the chunk). How big a chunk is depends on whether searches read the index lately (``chunk_for``).
FAISS's OpenMP thread count is set per move through ``set_faiss_threads`` (OpenMP settings are per
thread: this thread's own setting, not the process's).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Protocol

from tiermem.server.config import Tuning
from tiermem.server.cores import usable_cores
from tiermem.server.index.threads import set_faiss_threads

logger = logging.getLogger(__name__)


class BufferedIndex(Protocol):
    """What the indexer needs of an index whose newest entries wait in a pending buffer."""

    indexer: Indexer | None
    add_chunk: int  # vectors per move while no search reads the index
    searched_chunk: int  # vectors per move while searches read it

    @property
    def pending(self) -> int: ...

    def quiet_seconds(self) -> float: ...

    def flush(self, chunk: int = 0, limit: int = 0, yield_to_save: bool = False) -> int: ...


class Indexer:
    """One background thread that moves pending vectors into HNSW, a chunk per index in turn.

    If an add into FAISS fails (out of memory), the thread logs it and tries again a second later;
    the entries stay pending, and searchable, meanwhile.

    A few pending vectors wait up to ``linger_seconds`` for ``min_batch``: each move takes the
    index's write lock (pausing searches), so fewer, fuller moves disturb searches less, and waiting
    costs readers nothing (pending entries are searched exactly). Once no search has read any index
    served here for ``quiet_spell_seconds`` (a bulk load, or a start-up backlog), moves take
    everything pending up to ``bulk_chunk`` on every core, if at least ``bulk_min`` are pending:
    FAISS parallelizes an add over its vectors and pays its per-call cost once. Copies of stored
    vectors (tier moves, in the writer) do not count as searches.
    """

    def __init__(self, bulk_chunk: int = 0, tuning: Tuning | None = None) -> None:
        tuning = tuning or Tuning()
        self.bulk_chunk = bulk_chunk  # 0: no bulk moves
        self.min_batch = tuning.indexer_min_batch
        self.linger_seconds = tuning.indexer_linger_seconds
        self.quiet_spell_seconds = tuning.indexer_quiet_seconds
        self.bulk_min = tuning.indexer_bulk_min  # fewer pending: one thread (a second barely helps)
        self._cores = usable_cores()
        self.last_search = -math.inf  # time.monotonic() when a search last read any index served here
        self._cond = threading.Condition()
        self._work: dict[int, BufferedIndex] = {}  # indexes with pending entries, in turn order
        self._moving = 0  # id() of the index whose move is in progress (0: none)
        self._forgotten = False  # ... and it was forgotten meanwhile: no next turn
        self._stop = False
        self._drain = True
        self.running = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.running = True
        self._thread = threading.Thread(target=self._run, name="tiermem-indexer", daemon=True)
        self._thread.start()

    def attach(self, idx: BufferedIndex) -> None:
        idx.indexer = self
        if idx.pending:
            self.notify(idx)

    def notify(self, idx: BufferedIndex) -> None:
        with self._cond:
            self._work[id(idx)] = idx
            self._cond.notify()

    def forget(self, idx: BufferedIndex) -> None:
        """Give ``idx`` no more turns (it was replaced; its pending entries would be indexed for
        nothing); a move out of it in progress finishes."""
        with self._cond:
            self._work.pop(id(idx), None)
            if self._moving == id(idx):
                self._forgotten = True

    def stop(self, drain: bool = True) -> None:
        """Stop, after indexing everything pending (``drain``) or after the chunk in progress."""
        with self._cond:
            self._stop = True
            self._drain = drain
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
        self.running = False

    def chunk_for(self, idx: BufferedIndex) -> tuple[int, int]:
        """(vectors, OpenMP threads) for the next move out of ``idx``: everything pending up to
        ``bulk_chunk`` on every core once searches have left it alone; else, on one thread, the
        index's ``searched_chunk`` while searches read it (they wait for the move), its
        ``add_chunk`` when they do not."""
        pending = idx.pending
        quiet = idx.quiet_seconds() >= self.quiet_spell_seconds
        if quiet and self.bulk_chunk > idx.add_chunk and pending >= self.bulk_min:
            return min(pending, self.bulk_chunk), self._cores
        return (idx.add_chunk if quiet else idx.searched_chunk), 1

    def _next(self) -> tuple[int, BufferedIndex] | None:
        """The next index in turn, once it has ``min_batch`` pending or lingered; None: stop."""
        with self._cond:
            while not self._work and not self._stop:
                self._cond.wait()
            if not self._work or (self._stop and not self._drain):
                return None
            key, idx = next(iter(self._work.items()))
            self._moving, self._forgotten = key, False
            deadline = time.monotonic() + self.linger_seconds
            while not self._stop and idx.pending < self.min_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return key, idx

    def _move(self, idx: BufferedIndex) -> float:
        """One move out of ``idx``; returns how long to pause before its next turn."""
        size, threads = self.chunk_for(idx)
        # One thread for small moves: a second OpenMP thread would spin beside the gRPC threads.
        set_faiss_threads(threads)
        try:
            if idx.flush(chunk=size, limit=size, yield_to_save=True) == 0 and idx.pending:
                return 0.01  # a snapshot of this index is being written
        except Exception:
            # Out of memory, most likely: the entries stay pending (searched exactly, and writes
            # wait once the index's max_pending are); try again in a second.
            logger.exception("moving pending vectors into HNSW failed; retrying in 1 s")
            return 1.0
        return 0.0

    def _run(self) -> None:
        while True:
            turn = self._next()
            if turn is None:
                return
            key, idx = turn
            with self._cond:
                skip = self._forgotten  # (while it lingered for a fuller batch)
            pause = 0.0 if skip else self._move(idx)
            with self._cond:
                self._work.pop(key, None)
                forgotten, self._moving = self._forgotten, 0
                if idx.pending and not forgotten:
                    self._work[key] = idx  # back of the line: indexes take turns
                    if pause and not self._stop:
                        self._cond.wait(pause)
