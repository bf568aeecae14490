"""The engine's background work: snapshots of the columns and indexes (periodic, and at shutdown),
the flush of recorded accesses, the summaries the server keeps, the maintenance pass (embedding
and summary retries, expiry sweep, scheduled lifecycle pass) and, in a follower, the follow thread.

Concurrency: each loop runs on its own daemon thread until ``EngineState.stop`` is set; snapshots
are taken one at a time (``Snapshots.lock``), the columns copied in the writer thread between two
commit groups."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from tiermem.server.core import access, lifecycle, summarizer, upkeep
from tiermem.server.core.failures import Failures
from tiermem.server.core.follow import follow_loop
from tiermem.server.core.state import EngineState
from tiermem.server.index.spaces import Index, Space
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.storage import snapshots

logger = logging.getLogger(__name__)


class Snapshots:
    """Writes the snapshots that let the next start-up skip decoding and re-indexing every record,
    and remembers when the last one was written (periodic snapshots are due from it)."""

    def __init__(self, st: EngineState) -> None:
        self.st = st
        self.lock = threading.Lock()
        self.changes_at_last = st.store.changed_count
        self.time_of_last = time.monotonic()
        self._index_quiet_until = 0.0  # (take_indexes)

    def take(self, running: bool = True) -> bool:
        """Write the columns and index snapshots; then drop the change-log entries the columns
        snapshot holds. ``running``: the writer is up, so the columns are copied in the writer
        thread between two commit groups (nothing changes while they are copied, and the copy
        matches the last commit).

        Snapshots only save start-up time (LMDB holds the truth): one that cannot be written (a
        full disk) is skipped with a warning and leaves the previous one current, and the next
        start-up reloads from LMDB what that one lacks. Returns whether every one was written."""
        st = self.st
        with self.lock:
            t0 = time.monotonic()
            changes = st.store.changed_count
            if running:
                state, seq = st.writer.barrier(lambda: (self._columns_state(), st.store.seq))
            else:
                state, seq = self._columns_state(), st.store.seq
            # After a committed write failed to apply, the columns lack what LMDB holds: a columns
            # snapshot would carry that into the next start-up (and forget the change log that
            # still names the record). Keep the previous one; start-up replays LMDB since it.
            columns_ok = st.writer.apply_failures == 0
            if columns_ok:
                columns_ok = self._skipped_unless(
                    partial(snapshots.save_columns, st.index_dir, state, seq, st.store.instance),
                    "columns snapshot",
                )
            else:
                logger.error(
                    "columns snapshot skipped: %d committed writes failed to apply; the next "
                    "start-up reloads them from LMDB",
                    st.writer.apply_failures,
                )
            del state
            written = columns_ok
            for sp in list(st.spaces.values()):
                for tier, idx in list(sp.indexes.items()):
                    written &= self._save_index(sp, tier, idx) is not None
            if columns_ok:
                self._skipped_unless(partial(self._forget_changes, seq, running), "dropping the change log")
            # (also after a failure: a full disk is not retried before the next interval)
            self.changes_at_last = changes
            self.time_of_last = time.monotonic()
            if written:
                logger.info("snapshots written in %.2f s (commit %d)", time.monotonic() - t0, seq)
            return written

    def _forget_changes(self, seq: int, running: bool) -> None:
        st = self.st
        if running:
            st.writer.submit(lambda txn: st.store.forget_changes(txn, seq), lambda n: n)
        else:
            with st.store.write() as txn:
                st.store.forget_changes(txn, seq)

    def _save_index(self, sp: Space, tier: int, idx: Index) -> int | None:
        """The index's snapshot: the bytes of its file, None when it could not be written."""
        st, size = self.st, [0]

        def save() -> None:
            size[0] = idx.save(st.snapshot_base(sp, tier), sp.model, st.store.instance)

        return size[0] if self._skipped_unless(save, f"index snapshot {sp.model}/{tier}") else None

    @staticmethod
    def _skipped_unless(write: Callable[[], object], what: str) -> bool:
        """Run ``write``; on failure log a warning (no traceback: a full disk is not a bug) and
        return False."""
        try:
            write()
        except Exception as e:
            logger.warning(
                "%s skipped (%s: %s); the next start-up loads what it lacks from LMDB",
                what,
                type(e).__name__,
                e,
            )
            return False
        return True

    def _columns_state(self) -> dict[str, Any]:
        st = self.st
        return st.columns.state() | {
            "spaces": [sp.model for sp in st.space_list],
            "keywords": st.keywords.state(),
        }

    def take_indexes(self) -> bool:
        """With search followers: snapshot alone the index furthest behind of those that gained
        ``follower_snapshot_entries`` (or a 64th of their entries, whichever is more: each write
        rewrites the whole index) in HNSW since their last snapshot. Followers map it and keep
        fewer entries of their own; a start-up takes any index snapshot with any columns one.
        After writing, wait four times as long as that took (at most a fifth of the time goes to
        them), and at least as long as its bytes take at ``follower_snapshot_bytes_per_second``.
        Returns whether one was written (0 entries: never)."""
        st, least = self.st, self.st.config.tuning.follower_snapshot_entries
        if least <= 0 or time.monotonic() < self._index_quiet_until:
            return False
        behind = [
            (idx.indexed - idx.saved, sp, tier, idx)
            for sp in list(st.spaces.values())
            for tier, idx in list(sp.indexes.items())
            if isinstance(idx, VectorIndex) and not idx.damaged
        ]
        due = [b for b in behind if b[0] >= max(least, b[3].indexed // 64)]
        if not due:
            return False
        _, sp, tier, idx = max(due, key=lambda b: b[0])
        rate = st.config.tuning.follower_snapshot_bytes_per_second
        with self.lock:
            t0 = time.monotonic()
            size = self._save_index(sp, tier, idx)
            took = time.monotonic() - t0
            self._index_quiet_until = t0 + took + max(4 * took, (size or 0) / rate if rate else 0.0)
        return size is not None

    def loop(self) -> None:
        """Periodic snapshots bound what a start-up after kill -9 must redo: records changed since
        the last one are decoded again, vectors added since are indexed again. With search
        followers, indexes are also snapshotted alone as they grow (``take_indexes``)."""
        st, cfg = self.st, self.st.config
        followed = cfg.search_processes > 1
        tick = min(2.0 if followed else 10.0, cfg.snapshot_interval_seconds)
        while not st.stop.wait(tick):
            changed = st.store.changed_count - self.changes_at_last
            due = max(cfg.snapshot_min_changes, int(0.1 * len(st.columns)))
            old = time.monotonic() - self.time_of_last >= cfg.snapshot_interval_seconds
            try:
                if changed >= due or (changed and old):
                    self.take()
                elif followed:
                    self.take_indexes()
            except Exception:
                logger.exception("periodic snapshot failed")


def flush_loop(st: EngineState) -> None:
    failures = Failures("recording search accesses")
    while not st.stop.wait(st.config.access_flush_seconds):
        try:
            access.flush_access(st)
        except Exception as e:
            failures.failed(e)


def maintenance_loop(st: EngineState) -> None:
    failures = Failures("maintenance pass")
    while not st.stop.wait(st.config.maintenance_interval_seconds):
        try:
            if st.config.search_processes > 1:
                st.store.clear_stale_readers()  # a follower killed while reading
            upkeep.retry_embeddings(st)
            summarizer.retry_failed(st)
            lifecycle.sweep(st)
            report = lifecycle.consolidate(st, scheduled=True, max_reported=0)
            if report.moved:
                summary = {k: v for k, v in dataclasses.asdict(report).items() if k != "moves"}
                logger.info("lifecycle pass: %s", summary)
        except Exception as e:
            failures.failed(e)


class BackgroundThreads:
    """The engine's daemon threads, started once loaded and joined at close."""

    def __init__(self, st: EngineState, snaps: Snapshots) -> None:
        self.st = st
        self.snaps = snaps
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        st, cfg = self.st, self.st.config
        if st.following:  # the leader snapshots and maintains; a follower keeps up with its commits
            if cfg.access_flush_seconds > 0:
                self._start(lambda: flush_loop(st), "tiermem-access")
            self._start(lambda: follow_loop(st), "tiermem-follow")
            return
        if cfg.snapshot_interval_seconds > 0:
            self._start(self.snaps.loop, "tiermem-snapshots")
        if not st.replica:  # (a replica writes only what its leader sends, until promoted)
            self.start_writers()

    def start_writers(self) -> None:
        """The loops that write on their own: access flushes, summaries, maintenance."""
        st, cfg = self.st, self.st.config
        if cfg.access_flush_seconds > 0 and cfg.search_records_access:
            self._start(lambda: flush_loop(st), "tiermem-access")
        self._start(lambda: summarizer.loop(st), "tiermem-summarizer")
        if cfg.maintenance_interval_seconds > 0:
            self._start(lambda: maintenance_loop(st), "tiermem-maintenance")

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Signal every loop to end and wait for each."""
        self.st.stop.set()
        self.st.summaries_wake.set()
        for thread in self._threads:
            thread.join()
