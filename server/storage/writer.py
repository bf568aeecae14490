"""The single LMDB writer: queued write operations committed in groups, one fsync per group.

LMDB allows one write transaction at a time and it belongs to the thread that opened it, so all
writes go through this thread. Callers block until their operation is durable (committed) and
applied to the in-memory state (columns, HNSW), then get its result or its error. Operations that
arrive while a commit is in flight are committed together in the next group: under load many writes
share one fsync (a synced commit costs far more than a put: see docs/perf-log.md).

If an operation's ``prepare(txn)`` raises, only that operation is rolled back and fails; the others
of the group still commit. A group first runs every ``prepare`` straight in the group's transaction;
only when one of them raises is the group run again from the start, the ones before it straight
again and each one from it on in a nested transaction of its own, rolled back alone (prepares must
be repeatable: they run again after map growth too). Nested transactions cost a begin and a commit per operation, and py-lmdb gives up the
GIL around each call: under load, each handoff waits for another thread's turn, so writes that
succeed skip them. ``apply(prepared)`` runs after the commit, in this thread, in submission order.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import lmdb

from tiermem.server.model.errors import ResourceExhausted, TiermemError, Unavailable
from tiermem.server.storage.store import Store

logger = logging.getLogger(__name__)


@dataclass
class _Op:
    prepare: Callable[[lmdb.Transaction], Any]
    apply: Callable[[Any], Any]
    weight: int = 0
    future: Future[Any] = field(default_factory=Future)
    prepared: Any = None
    error: BaseException | None = None
    barrier: Callable[[], Any] | None = None  # run alone, between groups (see Writer.barrier)


_STOP = object()


class Writer:
    def __init__(
        self,
        store: Store,
        *,
        max_group: int,
        before_commit: Callable[[lmdb.Transaction], None],
        max_group_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._store = store
        self._max_group = max_group
        self._max_group_bytes = max_group_bytes
        self._before_commit = before_commit
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self.ops_committed = 0
        self.groups_committed = 0
        self.apply_failures = 0  # committed writes whose in-memory apply failed (columns snapshots skip then)
        self._thread = threading.Thread(target=self._run, name="tiermem-writer", daemon=True)
        self._thread.start()

    def submit(
        self, prepare: Callable[[lmdb.Transaction], Any], apply: Callable[[Any], Any], weight: int = 0
    ) -> Any:
        """Run one write operation; returns apply's result once durable, or raises its error.

        ``weight`` estimates the bytes it writes: a group closes past ``max_group_bytes``, which
        keeps one transaction well under LMDB's dirty-page limit.
        """
        return self._run_op(_Op(prepare, apply, weight))

    def barrier(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in the writer thread once every write submitted before it is committed and
        applied, and before any later one starts: it sees in-memory state that matches the last
        commit exactly (e.g. to snapshot it). Returns fn's result."""
        return self._run_op(_Op(lambda txn: None, lambda prepared: prepared, barrier=fn))

    def _run_op(self, op: _Op) -> Any:
        with self._lock:
            if self._closed:
                raise Unavailable("server is shutting down")
            self._queue.put(op)
        return op.future.result()

    def close(self) -> None:
        """Finish every queued operation, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    # -- writer thread --------------------------------------------------------------------------
    def _run(self) -> None:
        carry: Any = None  # an op taken from the queue that did not fit the previous group
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                return
            if first.barrier is not None:
                try:
                    first.future.set_result(first.barrier())
                except BaseException as e:
                    first.future.set_exception(e)
                continue
            group = [first]
            size = first.weight
            while len(group) < self._max_group:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                if op is _STOP or op.barrier is not None or size + op.weight > self._max_group_bytes:
                    carry = op
                    break
                group.append(op)
                size += op.weight
            self._commit_group(group)

    def _commit_group(self, group: list[_Op]) -> None:
        try:
            self._write_group(group)
        except BaseException as e:  # the whole group failed: nothing of it was committed
            logger.exception("commit of %d write operations failed", len(group))
            err = e if isinstance(e, TiermemError) else TiermemError(f"write failed: {e}")
            for op in group:
                op.future.set_exception(err)
            return
        self.groups_committed += 1
        for op in group:
            if op.error is not None:
                op.future.set_exception(op.error)
                continue
            self.ops_committed += 1
            try:
                op.future.set_result(op.apply(op.prepared))
            except BaseException as e:  # a bug: the write is durable but in-memory state may lag
                self.apply_failures += 1
                logger.exception("applying a committed write failed")
                op.future.set_exception(TiermemError(f"write committed but not applied: {e}"))

    def _write_group(self, group: list[_Op]) -> None:
        alone_from = len(group)  # operations from this position on run in nested transactions
        attempt = 0
        while True:
            # The store's in-memory counters move with the writes: an aborted pass puts them back.
            seq, changed = self._store.seq, self._store.changed_count
            failed_at = -1
            try:
                with self._store.write() as txn:
                    for i, op in enumerate(group):
                        op.error = None
                        if i >= alone_from:
                            self._prepare_alone(txn, op)
                            continue
                        try:
                            op.prepared = op.prepare(txn)
                        except lmdb.MapFullError:
                            raise
                        except Exception:
                            failed_at = i
                            raise
                    self._before_commit(txn)
                return
            except lmdb.MapFullError:
                self._store.seq, self._store.changed_count = seq, changed
                attempt += 1
                if attempt > 8:
                    raise ResourceExhausted("storage map is full") from None
                if self._store.grow() < 0:
                    raise ResourceExhausted("storage map is full (max_map_size reached)") from None
                logger.info("retrying write group after map growth (attempt %d)", attempt)
            except Exception:
                self._store.seq, self._store.changed_count = seq, changed
                if failed_at < 0:  # not an operation's own failure (the commit, say): the group fails
                    raise
                # Again: the ones before it succeeded on the same state and run straight; from it
                # on, each in a nested transaction, rolled back alone if it fails.
                alone_from = failed_at

    def _prepare_alone(self, txn: lmdb.Transaction, op: _Op) -> None:
        """Run one operation in a nested transaction: if it fails, its writes are undone and its
        error kept for its caller."""
        try:
            with self._store.env.begin(write=True, parent=txn) as child:
                op.prepared = op.prepare(child)
        except lmdb.MapFullError:
            raise
        except TiermemError as e:
            op.error = e
        except Exception as e:
            logger.exception("write operation failed")
            op.error = TiermemError(f"write failed: {e}")
