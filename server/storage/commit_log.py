"""The commit sequence and the change logs of the store: each commit's number, the records each
changed (for snapshots to bring up to date), and, when search followers or replicas read it, a log of
what each commit changed. ``Store`` (store.py) inherits these methods; they run on its databases."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lmdb
import msgpack
import numpy as np

from tiermem.server.storage.keys import META_SEQ, RID, put_maybe_append, rid_key, rid_of


class CommitLog:
    """The commit sequence and change logs over the store's ``meta``, ``changes`` and ``commits``
    databases (opened by ``Store``)."""

    meta: lmdb._Database
    changes: lmdb._Database
    commits: lmdb._Database
    seq: int
    changed_count: int
    log_commits: bool
    commit_log_seconds: float
    prune_every: int
    retain_from: Callable[[], int | None]
    _log_rids: set[int]
    _log_settings: bool
    _log_graph: set[tuple[str, bool]]
    _log_scopes: set[str]

    def next_seq(self, txn: lmdb.Transaction, now: float) -> None:
        """Number the commit about to happen and log what it changed (writer thread, just before
        it commits)."""
        self.seq += 1
        txn.put(META_SEQ, RID.pack(self.seq), db=self.meta)
        if self.log_commits:
            rids = np.fromiter(self._log_rids, np.uint64, len(self._log_rids))
            graph, scopes = sorted(self._log_graph), sorted(self._log_scopes)
            entry = msgpack.packb(
                [now, self._log_settings, np.sort(rids).tobytes(), graph, scopes], use_bin_type=True
            )
            put_maybe_append(txn, RID.pack(self.seq), entry, self.commits, new=True)
        if self.seq % self.prune_every == 0:
            self._prune_commit_log(txn, now - self.commit_log_seconds)
        self._log_rids.clear()
        self._log_settings = False
        self._log_graph.clear()
        self._log_scopes.clear()

    def _prune_commit_log(self, txn: lmdb.Transaction, before: float, most: int = 4096) -> int:
        """Drop up to ``most`` commit-log entries written before ``before``, oldest first."""
        cur = txn.cursor(db=self.commits)
        floor = self.retain_from()
        dropped = 0
        while dropped < most and cur.first() and msgpack.unpackb(cur.value())[0] < before:
            if floor is not None and rid_of(bytes(cur.key())) > floor:
                break
            cur.delete()
            dropped += 1
        return dropped

    def committed_seq(self, txn: lmdb.Transaction) -> int:
        """The sequence number of the last commit ``txn`` sees."""
        raw = txn.get(META_SEQ, db=self.meta)
        return int(RID.unpack(raw)[0]) if raw else 0

    def commits_after(self, txn: lmdb.Transaction, seq: int) -> tuple[int, bool, np.ndarray] | None:
        """What the commits after ``seq`` changed, as seen by ``txn``: (their first sequence
        number, whether any changed settings or spaces, the rids they wrote or deleted, sorted and
        distinct); None when none is logged (nothing committed, or the log was dropped)."""
        first, settings, parts = None, False, []
        for at, changed, rids in self._entries_after(txn, seq):
            first = at if first is None else first
            settings = settings or changed
            parts.append(rids)
        if first is None:
            return None
        return first, settings, np.unique(np.concatenate(parts)).astype(np.int64)

    def records_after(self, txn: lmdb.Transaction, seq: int, most: int) -> int:
        """The rids the commits after ``seq`` wrote or deleted, repeats counted, counted only up to
        just past ``most`` (0 when none is logged)."""
        n = 0
        for _, _, rids in self._entries_after(txn, seq):
            n += rids.shape[0]
            if n > most:
                break
        return n

    def _entries_after(self, txn: lmdb.Transaction, seq: int) -> Iterator[tuple[int, bool, np.ndarray]]:
        """Each logged commit after ``seq``: (its sequence number, whether it changed settings or
        spaces, the rids it wrote or deleted)."""
        cur = txn.cursor(db=self.commits)
        if cur.set_range(RID.pack(seq + 1)):
            for key, raw in cur:
                _, changed, rids = msgpack.unpackb(raw)[:3]
                yield rid_of(bytes(key)), bool(changed), np.frombuffer(rids, np.uint64)

    def commit_log_entry(
        self, txn: lmdb.Transaction, seq: int
    ) -> tuple[bool, list[int], list[tuple[str, bool]], list[str] | None] | None:
        """What commit ``seq`` changed: (settings or spaces, rids written or deleted, the
        namespaces whose graph changed, each with whether its children's did, the namespaces whose
        reflection and summary progress changed, None if the entry predates that list); None: not
        logged."""
        raw = txn.get(RID.pack(seq), db=self.commits)
        if raw is None:
            return None
        entry = msgpack.unpackb(raw)
        graph = [(str(ns), bool(children)) for ns, children in (entry[3] if len(entry) > 3 else [])]
        scopes = [str(ns) for ns in entry[4]] if len(entry) > 4 else None
        rids = np.frombuffer(entry[2], np.uint64).astype(np.int64).tolist()
        return bool(entry[1]), rids, graph, scopes

    def _changed(self, txn: lmdb.Transaction, rid: int) -> None:
        txn.put(rid_key(rid), RID.pack(self.seq + 1), db=self.changes)
        self.changed_count += 1  # record writes since start (drives periodic snapshots)
        if self.log_commits:
            self._log_rids.add(rid)

    def changed_since(self, txn: lmdb.Transaction, seq: int) -> list[int]:
        """rids of the records changed (written or deleted) by commits after ``seq``."""
        return [rid_of(bytes(k)) for k, v in txn.cursor(db=self.changes) if RID.unpack(bytes(v))[0] > seq]

    def forget_changes(self, txn: lmdb.Transaction, upto: int) -> int:
        """Drop change-log entries of commits up to ``upto`` (a snapshot holding them is on disk)."""
        old = [bytes(k) for k, v in txn.cursor(db=self.changes) if RID.unpack(bytes(v))[0] <= upto]
        for k in old:
            txn.delete(k, db=self.changes)
        return len(old)
