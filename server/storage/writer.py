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

Full storage (see store.py): a group that finds the map full grows it and runs again; once the
map holds max_map_size and its reserve, or the pages in use exceed max_map_size, the group runs
again with every operation in a nested transaction of its own, and each one that stores records,
vectors, request ids or graph items is rolled back and fails with RESOURCE_EXHAUSTED
(STORAGE_FULL): deletes still commit, into the reserve, so space can be freed. A commit that fails
because the disk is full fails its group with RESOURCE_EXHAUSTED (STORAGE_FULL, ErrorInfo metadata
``resource: disk``) and changes nothing: LMDB writes its meta page last, so the failed commit is not
in the file.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
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
REFUSED_LOG_SECONDS = 60.0  # a refusal for want of room that lasts is logged again this often


class _OpFailed(Exception):
    """An operation of the group raised: run the group again, it and those after it alone."""

    def __init__(self, position: int) -> None:
        super().__init__(position)
        self.position = position


class _OverLimit(Exception):
    """The group would leave more pages in use than max_map_size: run it again freeing only."""


def _map_full(message: str) -> ResourceExhausted:
    err = ResourceExhausted(message)
    err.metadata["resource"] = "map"
    return err


def _disk_full(e: lmdb.Error) -> ResourceExhausted:
    err = ResourceExhausted(f"the disk is full ({e})")
    err.metadata["resource"] = "disk"
    return err


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
        self._refusing = False  # storage full: writes that store anything are refused (logged once)
        self._refused_logged: tuple[str, float] | None = None  # (why, when) a refused commit was last logged
        self._thread = threading.Thread(target=self._run, name="tiermem-writer", daemon=True)
        self._thread.start()

    def queue_depth(self) -> int:
        """Operations submitted and not yet taken into a commit group (approximate)."""
        return self._queue.qsize()

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
        except ResourceExhausted as e:  # full storage: nothing of the group was committed
            # (logged once a minute while it lasts: a state, not news; small commits may go through
            # in between, so a success does not end it)
            now = time.monotonic()
            why = e.metadata.get("resource", "")  # (a map full, a disk full: each told when it begins)
            last = self._refused_logged
            if last is None or last[0] != why or now - last[1] >= REFUSED_LOG_SECONDS:
                logger.warning("commit of %d write operations refused: %s", len(group), e)
                self._refused_logged = (why, now)
            for op in group:
                op.future.set_exception(e)
            return
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
        store = self._store
        alone_from = len(group)  # operations from this position on run in nested transactions
        freeing = False  # storage is full: every operation alone, those that store anything refused
        attempt = 0
        while True:
            # The store's in-memory counters move with the writes: an aborted pass puts them back.
            seq, changed = store.seq, store.changed_count
            try:
                self._write_pass(group, alone_from, freeing)
                if not freeing and self._refusing:
                    self._refusing = False
                    logger.warning("storage has room again: writes are accepted")
                return
            except _OpFailed as e:
                store.seq, store.changed_count = seq, changed
                # Again: the ones before it succeeded on the same state and run straight; from it
                # on, each in a nested transaction, rolled back alone if it fails.
                alone_from = e.position
            except _OverLimit:
                store.seq, store.changed_count = seq, changed
                freeing = self._refuse()
            except lmdb.MapFullError:
                store.seq, store.changed_count = seq, changed
                attempt += 1
                if attempt > 8:
                    raise _map_full("storage map is full") from None
                if store.grow() >= 0:
                    logger.info("retrying write group after map growth (attempt %d)", attempt)
                elif freeing:
                    raise _map_full("storage map is full (max_map_size and its reserve reached)") from None
                else:
                    freeing = self._refuse()
            except lmdb.Error as e:  # not an operation's own failure (the commit, say): the group fails
                store.seq, store.changed_count = seq, changed
                if store.disk_full(e):
                    raise _disk_full(e) from None
                raise
            except BaseException:
                store.seq, store.changed_count = seq, changed
                raise

    def _write_pass(self, group: list[_Op], alone_from: int, freeing: bool) -> None:
        """One attempt at committing the group (see ``_write_group``)."""
        store = self._store
        with store.write() as txn:
            for i, op in enumerate(group):
                op.error = None
                if freeing or i >= alone_from:
                    self._prepare_alone(txn, op, freeing)
                    continue
                try:
                    op.prepared = op.prepare(txn)
                except lmdb.MapFullError:
                    raise
                except lmdb.Error as e:
                    if store.disk_full(e):  # (a page spilled to a full disk: the group fails)
                        raise
                    raise _OpFailed(i) from e
                except Exception as e:
                    raise _OpFailed(i) from e
            self._before_commit(txn)
            if not freeing and store.over_limit(txn):
                raise _OverLimit

    def _refuse(self) -> bool:
        if not self._refusing:
            self._refusing = True
            logger.warning(
                "storage full (max_map_size %d bytes in use): only writes that free space are accepted",
                self._store.max_map_size,
            )
        return True

    def _prepare_alone(self, txn: lmdb.Transaction, op: _Op, freeing: bool = False) -> None:
        """Run one operation in a nested transaction: if it fails, its writes are undone and its
        error kept for its caller. ``freeing``: storage is full, so an operation that stores
        anything fails (RESOURCE_EXHAUSTED) and is undone."""
        store = self._store
        grows = store.grows
        try:
            with store.env.begin(write=True, parent=txn) as child:
                op.prepared = op.prepare(child)
                if freeing and store.grows != grows:
                    raise _map_full(
                        "storage is full (max_map_size reached): only deletes are accepted until "
                        "space is freed"
                    )
        except lmdb.MapFullError:
            raise
        except lmdb.Error as e:
            if store.disk_full(e):
                raise
            logger.exception("write operation failed")
            op.error = TiermemError(f"write failed: {e}")
        except TiermemError as e:
            op.error = e
        except Exception as e:
            logger.exception("write operation failed")
            op.error = TiermemError(f"write failed: {e}")
