"""A readers-writer lock: many readers or one writer.

Phase-fair: a waiting writer blocks readers that arrive after it (a stream of searches cannot
starve the indexer), and when a writer releases, the readers waiting at that moment go before the
next writer (a writer that re-acquires in a loop, like the indexer draining a backlog, cannot
starve searches).

Reads are reentrant per thread: a thread that holds the lock for reading takes it again at once,
even while a writer waits (a search holds an index across its several lookups; waiting behind the
writer there would deadlock, since the writer waits for that search to finish).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._waiting_readers = 0
        self._reader_pass = 0  # readers admitted ahead of waiting writers after the last write
        self._held = threading.local()  # .depth: this thread's nested reads
        self._reading = _Reading(self)

    def read(self) -> _Reading:
        """``with lock.read():`` hold it for reading (a plain context manager, not a generator:
        searches take several of these per call)."""
        return self._reading

    def held_here(self) -> bool:
        """Whether this thread holds the lock for reading."""
        return getattr(self._held, "depth", 0) > 0

    def _acquire_read(self) -> None:
        held = self._held
        depth = getattr(held, "depth", 0)
        if depth:  # already reading in this thread
            held.depth = depth + 1
            return
        with self._cond:
            self._waiting_readers += 1
            while self._writer or (self._waiting_writers and not self._reader_pass):
                self._cond.wait()
            self._waiting_readers -= 1
            if self._reader_pass:
                self._reader_pass -= 1
            self._readers += 1
        held.depth = 1

    def _release_read(self) -> None:
        held = self._held
        held.depth -= 1
        if held.depth:
            return
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    @contextmanager
    def lent(self) -> Iterator[None]:
        """Read on this thread under another thread's read hold, which must outlast it (a helper
        doing part of a search's work while the search waits for it): taken at once, as a nested
        read, even while a writer waits; waiting there would deadlock."""
        held = self._held
        held.depth = getattr(held, "depth", 0) + 1
        try:
            yield
        finally:
            held.depth -= 1

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers or self._reader_pass:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._reader_pass = self._waiting_readers  # their turn before the next writer
                self._cond.notify_all()


class _Reading:
    """The context manager ``RWLock.read`` returns (one per lock: the state is per thread)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire_read()

    def __exit__(self, *exc: object) -> None:
        self._lock._release_read()
