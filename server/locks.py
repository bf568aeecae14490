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

    @contextmanager
    def read(self) -> Iterator[None]:
        depth = getattr(self._held, "depth", 0)
        if depth:  # already reading in this thread
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        with self._cond:
            self._waiting_readers += 1
            while self._writer or (self._waiting_writers and not self._reader_pass):
                self._cond.wait()
            self._waiting_readers -= 1
            if self._reader_pass:
                self._reader_pass -= 1
            self._readers += 1
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

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
