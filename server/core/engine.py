"""The transport-free memory engine: create, read, update, delete, list, search, feedback, stats.

State and who owns it:
- LMDB (``Store``) is the source of truth. Every write goes through the ``Writer`` thread and is
  durable before the call returns.
- ``Columns`` mirror the per-record fields the kernels read, one row per record.
- ``VectorIndex`` (HNSW) per (embedding space, tier) holds the vectors; see vector_index.py for why
  entries are tombstoned and how snapshots are reconciled with LMDB at start-up.

Search ranks by score = alpha*relevance + beta*recency + gamma*importance. Rows allowed by the
request (namespaces, filter, space, alive, unexpired) are found by a kernel over the columns. Few
rows: every one is scored exactly. Many rows: see ``_candidates``: the HNSW top-K by similarity
(searched with the allowed rows as an ID selector) plus every row whose exactly computed
beta*recency + gamma*importance could still lift it above the limit-th score. So a memory with
modest similarity but high recency and importance is not lost because the ANN stage missed it.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import faiss
import lmdb
import msgpack
import numpy as np

from tiermem import __version__, kernels
from tiermem.server.agent.context import Assembler
from tiermem.server.agent.graph import GraphMemory
from tiermem.server.config import TIERS, ServerConfig, usable_cores
from tiermem.server.core.policy import (
    DELETE_CAPACITY,
    DEMOTIONS,
    EVICT_CAPACITY,
    EXPIRED,
    POLICY_FIELDS,
    PROMOTIONS,
    Policy,
    Tables,
    check_overrides,
    plan_pass,
)
from tiermem.server.embedding import providers as embedders
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.index.filters import compile_where
from tiermem.server.index.spaces import Space
from tiermem.server.index.vector_index import Indexer, VectorIndex
from tiermem.server.model import validation as check
from tiermem.server.model.errors import (
    AlreadyExists,
    FailedPrecondition,
    FollowerBehind,
    InvalidArgument,
    NotFound,
    StorageError,
    Unavailable,
)
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.text import words as text_words
from tiermem.server.model.types import (
    INTERNAL_MASK,
    NO_VECTOR,
    SPACE_SHIFT,
    TIER_SHIFT,
    FeedbackItem,
    Filter,
    location,
)
from tiermem.server.search.searcher import Searcher, SearchHit, SearchQuery
from tiermem.server.storage import snapshots
from tiermem.server.storage.store import Store
from tiermem.server.storage.writer import Writer

logger = logging.getLogger(__name__)


class _SnapshotReplaced(Exception):
    pass


class Engine:
    def __init__(
        self,
        config: ServerConfig,
        clock: Callable[[], float] = time.time,
        *,
        follower: bool = False,
        access_sink: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``follower``: a search follower (see ``follower.py``): LMDB opened read-only while
        another process (the leader, holding the data directory) writes; this engine loads the
        same snapshots, then applies the leader's commits from the commit log (``catch_up``)
        before every search and in the background. It never writes: the accesses its searches
        record and its hit counts go to ``access_sink`` (the leader) instead."""
        self.config = config
        self.clock = clock
        self.started = time.monotonic()
        self.following = follower
        self._access_sink = access_sink
        faiss.omp_set_num_threads(1)  # per-query search on gRPC threads; OpenMP would oversubscribe
        data = Path(config.data_dir)
        self.index_dir = data / "indexes"
        if not follower:
            self.index_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = _lock_data_dir(data) if not follower else None
        try:
            self._open(config, data)
        except BaseException:
            if self._dir_lock is not None:
                self._dir_lock.close()  # a failed start must not keep the directory locked
            raise

    def _open(self, config: ServerConfig, data: Path) -> None:
        self.store = Store(
            data / "lmdb",
            map_size=config.map_size,
            max_map_size=config.max_map_size,
            sync=config.sync,
            readonly=self.following,
            log_commits=config.search_processes > 1,
        )
        self._applied = 0  # the last commit the columns and indexes hold (set by _load)
        # A follower's searches wait for its catch-up, so its adds let more vectors wait for the
        # indexer than a leader's writes do (0: VectorIndex.MAX_PENDING).
        self._max_pending = self.FOLLOWER_MAX_PENDING if self.following else 0
        self._follow_lock = threading.Lock()
        self.embedder = embedders.build(
            config.embedder,
            model=config.embedder_model,
            url=config.embedder_url,
            api_key_env=config.embedder_api_key_env,
            timeout=config.embedder_timeout_seconds,
            dimension=config.builtin_dimension,
            builtin_model=config.builtin_model,
            cache_size=config.embedding_cache_size,
        )
        self.columns = Columns()
        self.spaces: dict[str, Space] = {}
        self._space_by_id: list[Space] = []
        self.base_policy = Policy.from_config(config)
        self.ns_config: dict[str, dict[str, Any]] = {}  # namespace -> {"protected", "policy" overrides}
        self._config_version = 0
        self._tables_cache: tuple[tuple[int, int], Tables] | None = None
        self._lcounts: dict[tuple[str, int], list[int]] = {}  # lifecycle totals, persisted
        self._events: deque[tuple[float, str, int, int, int]] = deque()  # (time, ns, tier, kind, n)
        self._pass_lock = threading.Lock()  # one lifecycle pass at a time
        self._last_run = np.full((0, 5), -np.inf)  # last scheduled pass per (namespace id, tier)
        self._search_lock = threading.Lock()
        self._search_counts: dict[str, list[int]] = {}  # namespace -> [hits, misses]
        self._search_total = [0, 0]
        self._access_lock = threading.Lock()
        self._access_pending: dict[int, tuple[int, float]] = {}  # rid -> (accesses, last access)
        self.searcher = Searcher(self)
        # The searches of one BatchSearchMemories call run side by side on these threads (each
        # still takes its turn, see Searcher), so a batch uses every core the turns allow.
        self._batch_pool = ThreadPoolExecutor(
            max_workers=config.search_concurrency or usable_cores(), thread_name_prefix="tiermem-batch"
        )
        self.assembler = Assembler(self)  # context packages (context.py); its count_tokens is pluggable
        self.graph = GraphMemory(self)  # nodes and edges per namespace (graph.py)
        # moves acknowledged vectors into HNSW beside the writer
        self.indexer = Indexer(bulk_chunk=config.index_bulk_chunk)
        self._load()
        faiss.omp_set_num_threads(1)
        for sp in self._space_by_id:
            for idx in sp.indexes.values():
                self.indexer.attach(idx)
        self.indexer.start()
        # Vectors created in the commit group being written, by (namespace, model): similarity
        # deduplication sees them before they reach the indexes (writer thread only).
        self._group_vectors: dict[tuple[str, str], _GroupVectors] = {}
        self.writer = Writer(self.store, max_group=config.max_group_ops, before_commit=self._persist_counters)
        kernels.warm_up()
        self._stop = threading.Event()
        self._maintenance: threading.Thread | None = None
        self._flusher: threading.Thread | None = None
        if config.access_flush_seconds > 0 and (config.search_records_access or self.following):
            self._flusher = threading.Thread(target=self._flush_loop, name="tiermem-access", daemon=True)
            self._flusher.start()
        self._snapshot_lock = threading.Lock()
        self._snapshot_changes = self.store.changed_count
        self._snapshot_time = time.monotonic()
        self._snapshotter: threading.Thread | None = None
        self.follow_error: BaseException | None = None  # why a follower stopped following, if it did
        if self.following:  # the leader snapshots and maintains; a follower keeps up with its commits
            self._maintenance = threading.Thread(target=self._follow_loop, name="tiermem-follow", daemon=True)
            self._maintenance.start()
            return
        if config.snapshot_interval_seconds > 0:
            self._snapshotter = threading.Thread(
                target=self._snapshot_loop, name="tiermem-snapshots", daemon=True
            )
            self._snapshotter.start()
        if config.maintenance_interval_seconds > 0:
            self._maintenance = threading.Thread(
                target=self._maintain, name="tiermem-maintenance", daemon=True
            )
            self._maintenance.start()

    # -- start-up and shutdown ------------------------------------------------------------------
    def _space(self, model: str, dim: int) -> Space:
        sp = self.spaces.get(model)
        if sp is None:
            sp = Space(len(self._space_by_id), model, dim)
            self._space_by_id.append(sp)
            self.spaces[model] = sp
        return sp

    def _index(self, sp: Space, tier: int) -> VectorIndex:
        idx = sp.indexes.get(tier)
        if idx is None:
            idx = VectorIndex(sp.dim, self.config.hnsw_m, self.config.hnsw_ef_construction)
            self.indexer.attach(idx)
            sp.indexes[tier] = idx
        return idx

    def _snapshot_base(self, sp: Space, tier: int) -> Path:
        # Model names may be long or hold any character: name files by a digest (the manifest keeps the name).
        return self.index_dir / f"{hashlib.sha256(sp.model.encode()).hexdigest()[:32]}-t{tier}"

    def _load(self) -> None:
        for _ in range(8):
            try:
                return self._load_once()
            except _SnapshotReplaced:  # a follower: the leader wrote a newer snapshot meanwhile
                continue
        raise StorageError("the columns snapshot kept changing while this follower loaded")

    def _load_once(self) -> None:
        t0 = time.monotonic()
        faiss.omp_set_num_threads(os.cpu_count() or 1)  # rebuilds use every core; no searches yet
        snap = snapshots.load_columns(self.index_dir, self.store.instance)
        with self.store.read() as txn:
            if self.following and snap is not None and snapshots.current_seq(self.index_dir) != snap[1]:
                # The leader wrote the next snapshot after this one was read, and may have dropped
                # the change-log entries this load would replay (they go once a snapshot holds
                # them): read it again. (Written after the check, a new one cannot have dropped
                # them before this transaction began.)
                raise _SnapshotReplaced
            self._applied = self.store.committed_seq(txn)
            if self.following:
                self.store.seq = self._applied  # the commits this read sees, not those at open
            self._next_rid, self._next_vk = self.store.counters(txn)
            self.ns_config = self.store.namespace_configs(txn)
            self._lcounts = self.store.lifecycle_counters(txn)
            for model, dim in self.store.spaces(txn).items():
                self._space(model, dim)
            unembedded = set(self.store.pending_rids(txn))
            if snap is not None and snap[1] > self.store.seq:
                # Newer than LMDB (LMDB rolled back, e.g. sync off and power lost, or restored from
                # a copy): it would hold memories LMDB no longer has.
                logger.warning(
                    "ignoring a columns snapshot of commit %d: LMDB is at %d", snap[1], self.store.seq
                )
                snap = None
            if snap is not None:
                # The snapshot, then every record changed by a later commit (storage.py "changes").
                try:
                    self.columns = self._restore_columns(snap[0])
                    changed = self.store.changed_since(txn, snap[1])
                    for rid in changed:
                        self._load_row(txn, rid, self.store.get(txn, rid), unembedded)
                    how = f"from a snapshot and {len(changed)} changed records"
                except Exception as e:  # a damaged snapshot: decode every record instead
                    logger.warning("ignoring a columns snapshot that cannot be restored: %r", e)
                    self.columns = Columns()
                    snap = None
            if snap is None:
                for rec in self.store.iter_records(txn):
                    self._load_row(txn, rec.rid, rec, unembedded)
                how = "by decoding every record"
            for name in self.ns_config:
                self.columns.namespaces.id(name)
            cols = self.columns
            live = np.sort(np.fromiter(cols.rows.values(), np.int64, len(cols.rows)))
            space, tier = cols.column("space")[live], cols.column("tier")[live]
            vks, rids = cols.column("vk")[live], cols.column("rid")[live]
            waiting = space < 0  # stored while the embedder failed: keyword-searchable only
            cols.activate(live[waiting], np.full(int(waiting.sum()), -1, np.int64))
            # A search scans the pending vectors of every index of its space: they share one budget.
            budget = {sp.id: self.config.startup_pending_max for sp in self._space_by_id}
            for sid, t in sorted(
                {(int(a), int(b)) for a, b in zip(space[~waiting], tier[~waiting], strict=True)}
            ):
                sel = (space == sid) & (tier == t)
                budget[sid] -= self._load_index(
                    txn, self._space_by_id[sid], t, live[sel], vks[sel], rids[sel], budget[sid]
                )
        logger.info(
            "loaded %d memories in %d spaces in %.2f s (%s)",
            len(self.columns),
            len(self.spaces),
            time.monotonic() - t0,
            how,
        )

    def _restore_columns(self, state: dict[str, Any]) -> Columns:
        """Columns from a snapshot, with embedding-space ids renumbered: ids follow the order spaces
        were first used while serving, but start-up numbers them in LMDB's (model name) order."""
        cols = Columns.restore(state)
        space = cols.column("space")
        models = state["spaces"]
        remap = np.array([self.spaces[m].id for m in models] or [-1], np.int32)  # KeyError: unusable
        used = space >= 0
        if used.any() and int(space[used].max()) >= len(models):
            raise ValueError("space id beyond the snapshot's spaces")
        space[used] = remap[space[used]]
        return cols

    def _load_row(self, txn: lmdb.Transaction, rid: int, rec: Record | None, unembedded: set[int]) -> None:
        """Bring the row of ``rid`` in line with its record (None: deleted). Start-up only."""
        row = self.columns.rows.get(rid)
        if rec is None:
            if row is not None:
                self.columns.remove(rid, self.columns.namespace_of(row))
            return
        space = -1 if rid in unembedded else self.spaces[rec.embedding_model].id
        if row is None:
            self.columns.add(rec, space)
        else:
            self.columns.set(row, rec, space, -1)

    def _load_index(
        self,
        txn: lmdb.Transaction,
        sp: Space,
        tier: int,
        rows: np.ndarray,
        vks: np.ndarray,
        rids: np.ndarray,
        pending_max: int,
    ) -> int:
        """Restore or rebuild one index; returns how many of its vectors were left pending (at
        most ``pending_max``)."""
        internal = np.full(rows.shape[0], -1, np.int64)
        loaded = VectorIndex.load(
            self._snapshot_base(sp, tier),
            sp.model,
            sp.dim,
            self.config.hnsw_ef_construction,
            self.store.instance,
        )
        idx = self._new_index(sp)
        if loaded is not None and loaded[0].n:
            snap, snap_vks = loaded
            # Map each record's current vk to its entry in the snapshot; unmatched entries stay dead.
            order = np.argsort(snap_vks)
            pos = np.minimum(np.searchsorted(snap_vks, vks, sorter=order), snap.n - 1)
            hit = snap_vks[order[pos]] == vks
            dead_after = snap.n - int(hit.sum())
            if dead_after / snap.n <= 0.25:
                idx = snap
                internal[hit] = order[pos[hit]]
                idx.revive(internal[hit], rows[hit])
            else:  # compaction: too many tombstones, rebuild from LMDB
                logger.info(
                    "rebuilding index %s/%d: %d of %d entries dead", sp.model, tier, dead_after, snap.n
                )
        sp.indexes[tier] = idx
        missing = np.flatnonzero(internal < 0)
        # Vectors a stale snapshot lacks (written after it: kill -9), or all of them when there is
        # no snapshot to start from (none, or compaction), are searchable at once as pending
        # entries and enter HNSW in the background after SERVING: up to startup_pending_max of
        # them in each embedding space, all its indexes together (every search of the space scans
        # them exactly meanwhile: ~7 ms for 131,072 at 384 dimensions); any beyond that are indexed
        # before SERVING, first. However many the snapshot holds: with "at most half the snapshot
        # again", a kill -9 after a 25k bulk load into 100k that the last periodic snapshot missed
        # (47k) kept the server from SERVING for 13.7 s.
        later = min(int(missing.shape[0]), pending_max)
        first = int(missing.shape[0]) - later
        for part, defer in ((missing[:first], False), (missing[first:], True)):
            if defer and later:
                # Room for the writes that may arrive while these drain, too (a write waits once
                # MAX_PENDING beyond the backlog are pending): the first must not copy them all.
                idx.reserve(later + VectorIndex.MAX_PENDING + self.config.max_batch_size)
            for start in range(0, part.shape[0], 4096):
                chunk = part[start : start + 4096]
                vecs = np.empty((chunk.shape[0], sp.dim), np.float32)
                for j, i in enumerate(chunk.tolist()):
                    v = self.store.get_vector(txn, int(rids[i]))
                    if v is None or v.shape[0] != sp.dim:
                        raise RuntimeError(f"record {int(rids[i])} has no valid vector in LMDB")
                    vecs[j] = v
                if defer:
                    internal[chunk] = idx.add(vecs, rows[chunk], vks[chunk], defer=True)
                else:  # no searches yet: FAISS adds in big batches on every core
                    internal[chunk] = idx.add(vecs, rows[chunk], vks[chunk], chunk=4096)
        self.columns.activate(rows, location(sp.id, tier, internal))
        if missing.shape[0]:
            logger.info(
                "index %s/%d: %d vectors from snapshot, %d from LMDB (%d indexed before serving, "
                "%d pending, indexed in the background)",
                sp.model,
                tier,
                rows.shape[0] - missing.shape[0],
                missing.shape[0],
                first,
                later,
            )
        return later

    def _new_index(self, sp: Space) -> VectorIndex:
        return VectorIndex(sp.dim, self.config.hnsw_m, self.config.hnsw_ef_construction)

    def close(self) -> None:
        """Stop maintenance, drain queued writes, snapshot the indexes, close LMDB."""
        self._stop.set()
        if self._maintenance is not None:
            self._maintenance.join()
        if self._flusher is not None:
            self._flusher.join()
        if self._snapshotter is not None:
            self._snapshotter.join()
        self._batch_pool.shutdown(wait=True)
        self.flush_access()
        self.writer.close()
        if self.following:
            self.indexer.stop(drain=False)
            self.store.close()
            return
        # No draining: what is still pending stays out of the index snapshot, and the next start-up
        # adds it again from LMDB, in the background (a shutdown after a start-up with a large
        # backlog would otherwise wait for all of it).
        self.indexer.stop(drain=False)
        if self.config.snapshot_on_shutdown:
            self.snapshot(running=False)
        self.store.close()
        if self._dir_lock is not None:
            self._dir_lock.close()  # releases the data directory for the next server

    def snapshot(self, running: bool = True) -> None:
        """Write the columns and index snapshots that let the next start-up skip decoding and
        re-indexing every record; then drop the change-log entries the columns snapshot holds.

        ``running``: the writer is up, so the columns are copied in the writer thread between two
        commit groups (nothing changes while they are copied, and the copy matches the last commit).
        """
        with self._snapshot_lock:
            t0 = time.monotonic()
            changes = self.store.changed_count
            if running:
                state, seq = self.writer.barrier(lambda: (self._columns_state(), self.store.seq))
            else:
                state, seq = self._columns_state(), self.store.seq
            # After a committed write failed to apply, the columns lack what LMDB holds: a columns
            # snapshot would carry that into the next start-up (and forget the change log that
            # still names the record). Keep the previous one; start-up replays LMDB since it.
            columns_ok = self.writer.apply_failures == 0
            if columns_ok:
                snapshots.save_columns(self.index_dir, state, seq, self.store.instance)
            else:
                logger.error(
                    "columns snapshot skipped: %d committed writes failed to apply; the next "
                    "start-up reloads them from LMDB",
                    self.writer.apply_failures,
                )
            del state
            for sp in list(self.spaces.values()):
                for tier, idx in list(sp.indexes.items()):
                    idx.save(self._snapshot_base(sp, tier), sp.model, self.store.instance)
            if columns_ok and running:
                self.writer.submit(lambda txn: self.store.forget_changes(txn, seq), lambda n: n)
            elif columns_ok:
                with self.store.write() as txn:
                    self.store.forget_changes(txn, seq)
            self._snapshot_changes = changes
            self._snapshot_time = time.monotonic()
            logger.info("snapshots written in %.2f s (commit %d)", time.monotonic() - t0, seq)

    def _columns_state(self) -> dict[str, Any]:
        return self.columns.state() | {"spaces": [sp.model for sp in self._space_by_id]}

    def _snapshot_loop(self) -> None:
        """Periodic snapshots bound what a start-up after kill -9 must redo: records changed since
        the last one are decoded again, vectors added since are indexed again."""
        cfg = self.config
        while not self._stop.wait(min(10.0, cfg.snapshot_interval_seconds)):
            changed = self.store.changed_count - self._snapshot_changes
            due = max(cfg.snapshot_min_changes, int(0.1 * len(self.columns)))
            old = time.monotonic() - self._snapshot_time >= cfg.snapshot_interval_seconds
            if changed >= due or (changed and old):
                try:
                    self.snapshot()
                except Exception:
                    logger.exception("periodic snapshot failed")

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.config.access_flush_seconds):
            try:
                self.flush_access()
            except Exception:
                logger.exception("recording search accesses failed")

    def _maintain(self) -> None:
        while not self._stop.wait(self.config.maintenance_interval_seconds):
            try:
                if self.config.search_processes > 1:
                    self.store.clear_stale_readers()  # a follower killed while reading
                self.retry_embeddings()
                self.sweep()
                report = self.consolidate(scheduled=True, max_reported=0)
                moved = sum(report[k] for k in ("promoted", "demoted", "evicted", "deleted"))
                if moved:
                    logger.info("lifecycle pass: %s", {k: v for k, v in report.items() if k != "moves"})
            except Exception:
                logger.exception("maintenance pass failed")

    def retry_embeddings(self, limit: int = 256) -> int:
        """Embed memories stored while the embedder failed; returns how many got their vector."""
        with self.store.read() as txn:
            recs = [r for r in (self.store.get(txn, rid) for rid in self.store.pending_rids(txn, limit)) if r]
        done = 0
        for rec in recs:
            try:
                vec = check.vector("embedding", self.embedder.embed(rec.content), self.config)
            except (EmbedderError, InvalidArgument) as e:
                logger.warning("embedding still failing (%d waiting): %s", len(recs) - done, e)
                break
            done += self._attach_vector(rec.rid, vec)
        return done

    def _attach_vector(self, rid: int, vec: np.ndarray) -> int:
        def prepare(txn: lmdb.Transaction) -> Record | None:
            rec = self.store.get(txn, rid)
            if rec is None or not self.store.is_pending(txn, rid):
                return None  # deleted, or done meanwhile
            dim = self.store.spaces(txn).get(rec.embedding_model)
            if dim is None:
                self.store.put_space(txn, rec.embedding_model, int(vec.shape[0]))
            elif dim != vec.shape[0]:
                raise InvalidArgument(
                    "embedding",
                    f"the embedder returned dimension {vec.shape[0]}, but space "
                    f"{rec.embedding_model!r} has {dim}",
                    reason="EMBEDDING_DIMENSION_MISMATCH",
                )
            _, rec.vk = self._alloc()
            self.store.put(txn, rec)
            self.store.put_vector(txn, rid, vec)
            self.store.mark_pending(txn, rid, False)
            return rec

        def apply(rec: Record | None) -> int:
            if rec is None or rec.rid not in self.columns.rows:
                return 0
            sp = self._space(rec.embedding_model, int(vec.shape[0]))
            row = self.columns.rows[rec.rid]
            internal = self._index(sp, rec.tier).add(
                vec[None, :], np.array([row], np.int64), np.array([rec.vk], np.int64)
            )
            self.columns.set(row, rec, sp.id, location(sp.id, rec.tier, int(internal[0])))
            return 1

        return int(self.writer.submit(prepare, apply))

    def sweep(self, chunk: int = 1000) -> dict[str, int]:
        """Delete expired memories and forget request ids older than request_id_ttl_seconds."""
        now = self.clock()
        view = self.columns.view()
        rows = np.flatnonzero(view.alive & (view.expire <= now))
        items = [
            (rid, tier, 0, EXPIRED)
            for rid, tier in zip(view.rid[rows].tolist(), view.tier[rows].tolist(), strict=True)
        ]
        skipped = 0
        for lo in range(0, len(items), chunk):  # the same path as a pass's expiry: counted in the stats
            skipped += self._apply_moves(items[lo : lo + chunk], now)
        deleted = len(items) - skipped
        forgotten = 0
        before = now - self.config.request_id_ttl_seconds
        while True:
            n = int(
                self.writer.submit(lambda txn: self.store.expire_requests(txn, before, chunk), lambda n: n)
            )
            forgotten += n
            if n < chunk:
                break
        if deleted or forgotten:
            logger.info(
                "maintenance: %d expired memories deleted, %d request ids forgotten", deleted, forgotten
            )
        return {"expired_deleted": deleted, "request_ids_forgotten": forgotten}

    def _persist_counters(self, txn: lmdb.Transaction) -> None:
        self.store.put_counters(txn, self._next_rid, self._next_vk)
        self.store.next_seq(txn, time.time())
        self._group_vectors.clear()  # committed now: the indexes will hold them once applied

    def _alloc(self) -> tuple[int, int]:
        rid, vk = self._next_rid, self._next_vk
        self._next_rid += 1
        self._next_vk += 1
        return rid, vk

    # -- create ---------------------------------------------------------------------------------
    def create(self, memories: list[NewMemory], request_id: str = "", *, batch: bool = False) -> list[Record]:
        """Store memories all-or-nothing (see ``create_ex``); returns the stored records."""
        return self.create_ex(memories, request_id, batch=batch)[0]

    def reflection_candidates(self, namespace: str, limit: int) -> tuple[list[Record], dict[str, Any]]:
        """The most recent observations (default 100, at most 1000) and the scope's accumulators."""
        if limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        flt = self.check_filter(Filter(kinds=["observation"]))
        recs, _ = self.list_memories(namespace, min(limit or 100, 1000), "", flt, newest_first=True)
        return recs, self.scope(namespace)

    def scope(self, namespace: str) -> dict[str, Any]:
        """A namespace's reflection and summary accumulators."""
        with self.store.read() as txn:
            refl, tokens, summary_rid = self.store.scope_state(txn, namespace)
        return {
            "reflection_importance": refl,
            "reflection_due": refl >= self.config.reflection_threshold,
            "summary_tokens": tokens,
            "summary_due": tokens >= self.config.summary_token_threshold,
            "summary_rid": summary_rid,
        }

    def create_ex(
        self,
        memories: list[NewMemory],
        request_id: str = "",
        *,
        batch: bool = False,
        dedup_similarity: float | None = None,
        allow_duplicates: bool = False,
    ) -> tuple[list[Record], list[bool], dict[str, tuple[bool, bool]]]:
        """Store memories all-or-nothing; returns the records, per memory whether it was a duplicate
        that reinforced an existing memory instead of adding one, and per namespace whether a
        reflection and a summary are due.

        Deduplication (unless ``allow_duplicates``, and only for memories without a client id): a
        memory whose normalized content equals one already in its namespace, or, with
        ``dedup_similarity``, whose vector is at least that similar to one there, reinforces it
        (importance raised to the larger, one more access, tags merged) and is not stored again.
        ``batch`` only changes field names in errors.
        """
        check.batch("memories", memories, self.config.max_batch_size)
        check.request_id("request_id", request_id)
        if dedup_similarity is not None and not -1.0 <= dedup_similarity <= 1.0:
            raise InvalidArgument("dedup_similarity", "must be in [-1, 1]")
        seen: dict[tuple[str, str], int] = {}
        for i, m in enumerate(memories):
            prefix = f"memories[{i}]." if batch else "memory."
            check.new_memory(prefix, m, self.config)
            if m.id:
                j = seen.setdefault((m.namespace, m.id), i)
                if j != i:
                    raise InvalidArgument(f"{prefix}id", f"repeats memories[{j}].id in the same batch")
            if m.embedding is None:
                m.embedding_model = self.embedder.model
                try:
                    m.embedding = self.embedder.embed(m.content)
                except EmbedderError as e:  # store it anyway; the maintenance pass embeds it later
                    logger.warning("storing a memory without its embedding for now: %s", e)
                    m.embedding = NO_VECTOR
        fingerprint = hashlib.blake2b(
            msgpack.packb([m.fingerprint_parts() for m in memories], use_bin_type=True), digest_size=16
        ).digest()
        now = self.clock()

        def prepare(txn: lmdb.Transaction) -> tuple[str, Any]:
            if request_id:
                prior = self.store.get_request(txn, memories[0].namespace, request_id)
                if prior is not None:
                    if prior["fp"] != fingerprint:
                        raise AlreadyExists(
                            f"request_id {request_id!r} was used for a different request",
                            reason="REQUEST_ID_REUSED",
                        )
                    replayed = [self.store.get(txn, rid) for rid in prior["rids"]]
                    if any(r is None for r in replayed):
                        raise NotFound(
                            f"memories created by request_id {request_id!r} were deleted since",
                            reason="REQUEST_RESULT_DELETED",
                        )
                    dues = {ns: self._dues(txn, ns) for ns in {m.namespace for m in memories}}
                    return "replay", (replayed, prior.get("dups") or [False] * len(replayed), dues)
            spaces: dict[str, int | None] = {}  # dimension by model, as this transaction sees it
            out: list[tuple[Record, np.ndarray | None]] = []  # vector None: a reinforced duplicate
            freed: list[Record] = []
            scopes: dict[str, list[Any]] = {}  # namespace -> reflection/summary state (Store.scope_state)
            for i, m in enumerate(memories):
                prefix = f"memories[{i}]." if batch else "memory."
                dim = int(m.embedding.shape[0])
                if m.embedding_model not in spaces:
                    # Spaces in memory are committed (added once indexed) and never change.
                    sp = self.spaces.get(m.embedding_model)
                    spaces[m.embedding_model] = sp.dim if sp else self.store.space(txn, m.embedding_model)
                known = spaces[m.embedding_model]
                if dim == 0:
                    pass  # no vector yet (embedder failed): the space is checked when it is embedded
                elif known is None:
                    self.store.put_space(txn, m.embedding_model, dim)
                    spaces[m.embedding_model] = dim
                elif known != dim:
                    raise InvalidArgument(
                        f"{prefix}embedding",
                        f"has dimension {dim}, but embedding space {m.embedding_model!r} has dimension {known}",
                        reason="EMBEDDING_DIMENSION_MISMATCH",
                    )
                if not m.id and not allow_duplicates:
                    dup = self._find_duplicate(txn, m, dedup_similarity)
                    if dup is not None:
                        _reinforce(dup, m, now, self.config.max_tags)
                        self.store.put(txn, dup)
                        # An earlier item of this batch that was the same memory answers with its
                        # state now too (its vector, if new, is still indexed from that item).
                        out = [(dup if r.rid == dup.rid else r, v) for r, v in out]
                        out.append((dup, None))
                        continue
                if m.id:
                    old_rid = self.store.lookup(txn, m.namespace, m.id)
                    old = None if old_rid is None else self.store.get(txn, old_rid)
                    if old is not None:
                        if not old.expired(now):
                            raise AlreadyExists(
                                f"memory {m.id!r} already exists in namespace {m.namespace!r}"
                            )
                        self.store.delete(txn, old)  # an expired memory frees its id
                        freed.append(old)
                    mid = m.id
                else:
                    mid = uuid.uuid4().hex
                rid, vk = self._alloc()
                created = now if m.created_at is None else m.created_at
                rec = Record(
                    rid=rid,
                    id=mid,
                    namespace=m.namespace,
                    content=m.content,
                    kind=m.kind,
                    tier=m.tier,
                    importance=float(m.importance or 0.0),
                    source=m.source,
                    topic=m.topic,
                    tags=m.tags,
                    metadata=m.metadata,
                    embedding_model=m.embedding_model,
                    created_at=created,
                    updated_at=created,
                    accessed_at=created,
                    tier_since=created,
                    token_cost=m.token_cost or math.ceil(len(m.content.encode()) / 4),
                    source_ids=list(m.source_ids),
                    expire_at=m.expire_at,
                    vk=vk,
                    words=len(text_words(m.content)),
                    questions=list(m.questions),
                )
                self.store.insert(txn, rec)
                if m.embedding.shape[0]:
                    self.store.put_vector(txn, rid, m.embedding, new=True)
                    key = (m.namespace, m.embedding_model)
                    self._group_vectors.setdefault(key, _GroupVectors()).add(rid, vk, m.embedding)
                else:
                    self.store.mark_pending(txn, rid, True)
                out.append((rec, m.embedding))
                freed += self._track_scope(txn, scopes, rec)
            for ns, state in scopes.items():
                self.store.put_scope_state(txn, ns, state)
            dues = {
                ns: self._due(scopes[ns]) if ns in scopes else self._dues(txn, ns)
                for ns in {m.namespace for m in memories}
            }
            dups = [v is None for _, v in out]
            if request_id:
                self.store.put_request(
                    txn, memories[0].namespace, request_id, fingerprint, [r.rid for r, _ in out], now, dups
                )
            return "new", (out, freed, dues)

        def apply(prepared: tuple[str, Any]) -> tuple[list[Record], list[bool], dict[str, tuple[bool, bool]]]:
            what, payload = prepared
            if what == "replay":
                return list(payload[0]), list(payload[1]), payload[2]
            items, freed, dues = payload
            self._index_new([(rec, vec) for rec, vec in items if vec is not None])
            view = self.columns.view()
            for rec, vec in items:  # after indexing: the reinforced memory may be new in this batch
                if vec is None and rec.rid in self.columns.rows:  # reinforced: refresh its row
                    row = self.columns.rows[rec.rid]
                    self.columns.set(row, rec, int(view.space[row]), int(view.vpos[row]))
            # After indexing: a summary replaced by a later one of the same batch is in both lists.
            self._unindex(freed)
            return [rec for rec, _ in items], [vec is None for _, vec in items], dues

        weight = sum(len(m.content) + 4 * m.embedding.shape[0] + 512 for m in memories)
        result: tuple[list[Record], list[bool], dict[str, tuple[bool, bool]]] = self.writer.submit(
            prepare, apply, weight
        )
        return result

    def _track_scope(self, txn: lmdb.Transaction, scopes: dict[str, list[Any]], rec: Record) -> list[Record]:
        """Count a new memory toward its namespace's reflection and summary thresholds. A reflection
        resets the importance; a summary resets the tokens and replaces the previous summary, which
        is returned to be unindexed."""
        state = scopes.get(rec.namespace)
        if state is None:
            state = scopes[rec.namespace] = self.store.scope_state(txn, rec.namespace)
        replaced: list[Record] = []
        if rec.kind == "reflection":
            state[0] = 0.0
        elif rec.kind == "observation":
            state[0] += rec.importance
        if rec.kind == "summary":
            prev = self.store.get(txn, state[2]) if state[2] else None
            if prev is not None and prev.namespace == rec.namespace and prev.kind == "summary":
                self.store.delete(txn, prev)
                replaced.append(prev)
            state[1], state[2] = 0, rec.rid
        else:
            state[1] += rec.token_cost
        return replaced

    def _dues(self, txn: lmdb.Transaction, namespace: str) -> tuple[bool, bool]:
        return self._due(self.store.scope_state(txn, namespace))

    def _due(self, state: list[Any]) -> tuple[bool, bool]:
        """Whether a reflection and a summary are due, from a scope state (Store.scope_state)."""
        return state[0] >= self.config.reflection_threshold, state[1] >= self.config.summary_token_threshold

    def _find_duplicate(
        self, txn: lmdb.Transaction, m: NewMemory, min_similarity: float | None
    ) -> Record | None:
        """An existing memory of m's namespace with the same normalized content or, with
        ``min_similarity``, a vector in m's space at least that similar (writer thread)."""
        rec = self.store.find_content(txn, m.namespace, m.content)
        if rec is not None and not self.expired(rec):
            return rec
        if min_similarity is None or m.embedding.shape[0] == 0:
            return None
        best_rid, best_vk, best = -1, -1, -np.inf
        sp = self.spaces.get(m.embedding_model)
        nid = self.columns.namespaces.get(m.namespace)
        if sp is not None and nid >= 0:  # committed memories, through the indexes
            view = self.columns.view()
            allowed = view.alive & (view.ns == nid) & (view.space == sp.id) & (view.expire > self.clock())
            for index in list(sp.indexes.values()):
                rows, sims, _ = index.search(m.embedding, 1, allowed, self.config.hnsw_ef_search)
                # A short filtered answer may miss a duplicate; that memory is then simply stored.
                if rows.shape[0] and sims[0] > best:
                    best_rid, best_vk, best = (
                        int(view.rid[int(rows[0])]),
                        int(view.vk[int(rows[0])]),
                        float(sims[0]),
                    )
        found = None if best_rid < 0 or best < min_similarity else self.store.get(txn, best_rid)
        if found is not None and (found.vk != best_vk or self.expired(found)):
            found = None  # (its vector, model or tier changed earlier in this group: not compared)
        # Memories created earlier in this commit group (this batch or another write queued with
        # it): not in the indexes yet. Those a failed write rolled back are gone from the txn.
        group = self._group_vectors.get((m.namespace, m.embedding_model))
        for rid, vk in (
            group.similar(m.embedding, best if found is not None else min_similarity) if group else []
        ):
            rec = self.store.get(txn, rid)
            # (vk moves when a later write of the group changed its vector or model)
            if rec is not None and rec.vk == vk and not self.expired(rec):
                return rec
        return found

    def _index_new(self, items: list[tuple[Record, np.ndarray]]) -> None:
        """Writer thread: add committed records to HNSW first, then make their rows visible."""
        groups: dict[tuple[int, int], list[tuple[int, Record, np.ndarray]]] = {}
        for rec, vec in items:
            if vec.shape[0] == 0:  # waiting for its embedding: visible to keyword search only
                self.columns.activate(
                    np.array([self.columns.add(rec, -1)], np.int64), np.array([-1], np.int64)
                )
                continue
            sp = self._space(rec.embedding_model, int(vec.shape[0]))
            row = self.columns.add(rec, sp.id)
            groups.setdefault((sp.id, rec.tier), []).append((row, rec, vec))
        for (sid, tier), group in groups.items():
            sp = self._space_by_id[sid]
            rows = np.array([g[0] for g in group], np.int64)
            internal = self._index(sp, tier).add(
                np.stack([g[2] for g in group]),
                rows,
                np.array([g[1].vk for g in group], np.int64),
                max_pending=self._max_pending,
            )
            self.columns.activate(rows, location(sid, tier, internal))

    # -- read -----------------------------------------------------------------------------------
    def get(
        self, namespace: str, memory_id: str, include_embedding: bool = False
    ) -> tuple[Record, np.ndarray | None]:
        check.namespace("namespace", namespace)
        check.memory_id("id", memory_id)
        with self.store.read() as txn:
            rid = self.store.lookup(txn, namespace, memory_id)
            rec = None if rid is None else self.store.get(txn, rid)
            if rec is None or self.expired(rec):
                raise NotFound(f"memory {memory_id!r} not found in namespace {namespace!r}")
            vec = self.store.get_vector(txn, rid) if include_embedding and rid is not None else None
        return rec, vec

    def vectors_of(self, records: list[Record]) -> list[np.ndarray | None]:
        with self.store.read() as txn:
            return [self.store.get_vector(txn, r.rid) for r in records]

    def expired(self, rec: Record) -> bool:
        return rec.expired(self.clock())

    # -- update ---------------------------------------------------------------------------------
    UPDATABLE = frozenset(
        {
            "content",
            "kind",
            "tier",
            "importance",
            "source",
            "topic",
            "tags",
            "metadata",
            "embedding",
            "embedding_model",
            "token_cost",
            "source_memory_ids",
            "expire_time",
        }
    )

    def update(
        self, namespace: str, memory_id: str, changes: NewMemory, mask: list[str], confirm: bool = False
    ) -> Record:
        """Apply the fields named in ``mask`` from ``changes`` (a NewMemory holding new values)."""
        check.namespace("memory.namespace", namespace)
        check.memory_id("memory.id", memory_id)
        self._check_protected(namespace, confirm, "changing a memory")
        if not mask:
            raise InvalidArgument("update_mask", "must name at least one field")
        for path in mask:
            if path not in self.UPDATABLE:
                raise InvalidArgument(
                    "update_mask",
                    f"field {path!r} cannot be updated; updatable: {', '.join(sorted(self.UPDATABLE))}",
                )
        fields_ = set(mask)
        c = changes
        if "content" in fields_:
            if not c.content:
                raise InvalidArgument("memory.content", "is required")
            check.text("memory.content", c.content, self.config.max_content_bytes)
        if "kind" in fields_:
            c.kind = check.kind("memory.kind", c.kind) if c.kind else self.config.default_kind
        if "tier" in fields_:
            check.tier("memory.tier", c.tier)
        if "importance" in fields_:
            if c.importance is None:
                raise InvalidArgument("memory.importance", "must be set when named in update_mask")
            check.unit_interval("memory.importance", c.importance)
        if "source" in fields_:
            check.text("memory.source", c.source)
        if "topic" in fields_:
            check.text("memory.topic", c.topic)
        if "tags" in fields_:
            c.tags = check.tags("memory.tags", c.tags, self.config)
        if "metadata" in fields_:
            check.metadata("memory.metadata", c.metadata, self.config)
        if "token_cost" in fields_ and c.token_cost < 0:
            raise InvalidArgument("memory.token_cost", "must be >= 0")
        if "source_memory_ids" in fields_:
            for i, sid in enumerate(c.source_ids):
                check.memory_id(f"memory.source_memory_ids[{i}]", sid)
        if "expire_time" in fields_ and c.expire_at is not None:
            check.finite_time("memory.expire_time", c.expire_at)
        new_vec: np.ndarray | None = None
        if "embedding" in fields_ or "embedding_model" in fields_:
            if "embedding" not in fields_ or c.embedding is None:
                raise InvalidArgument("memory.embedding", "must be set (with embedding_model) to change it")
            new_vec = check.vector("memory.embedding", c.embedding, self.config)
            check.model("memory.embedding_model", c.embedding_model)
        content_vec = None
        if "content" in fields_ and new_vec is None:
            try:
                content_vec = self.embedder.embed(c.content)
            except EmbedderError as e:
                raise Unavailable(
                    f"the embedder failed, retry later: {e}", reason="EMBEDDER_UNAVAILABLE"
                ) from e
        now = self.clock()

        def prepare(txn: lmdb.Transaction) -> tuple[Record, Record, np.ndarray | None]:
            self._check_protected(namespace, confirm, "changing a memory", txn)
            rid = self.store.lookup(txn, namespace, memory_id)
            old = None if rid is None else self.store.get(txn, rid)
            if old is None or old.expired(now):
                raise NotFound(f"memory {memory_id!r} not found in namespace {namespace!r}")
            rec = Record.unpack(old.pack())
            vec = new_vec
            if "content" in fields_:
                rec.content = c.content
                if vec is None and old.embedding_model == self.embedder.model:
                    vec = content_vec  # built-in vectors follow their content
                if "token_cost" not in fields_:
                    rec.token_cost = math.ceil(len(c.content.encode()) / 4)
            for name in ("kind", "tier", "importance", "source", "topic", "tags", "metadata", "token_cost"):
                if name in fields_:
                    setattr(rec, name, getattr(c, name))
            if "source_memory_ids" in fields_:
                rec.source_ids = list(c.source_ids)
            if "expire_time" in fields_:
                rec.expire_at = c.expire_at
            if vec is not None:
                model = c.embedding_model if new_vec is not None else rec.embedding_model
                dim = self.store.spaces(txn).get(model)
                if dim is None:
                    self.store.put_space(txn, model, int(vec.shape[0]))
                elif dim != vec.shape[0]:
                    raise InvalidArgument(
                        "memory.embedding",
                        f"has dimension {vec.shape[0]}, but embedding space {model!r} has dimension {dim}",
                        reason="EMBEDDING_DIMENSION_MISMATCH",
                    )
                rec.embedding_model = model
                self.store.put_vector(txn, rec.rid, vec)
                self.store.mark_pending(txn, rec.rid, False)
            if rec.tier != old.tier:
                _enter_tier(rec, rec.tier, now)
            if vec is not None or rec.tier != old.tier:
                _, rec.vk = self._alloc()
            rec.updated_at = now
            if rec.content != old.content:
                rec.words = len(text_words(rec.content))
                self.store.replace_content(txn, old, rec)
            else:
                self.store.put(txn, rec)
            return old, rec, vec

        def apply(prepared: tuple[Record, Record, np.ndarray | None]) -> Record:
            old, rec, vec = prepared
            self._reindex(old.vk, rec, vec)
            return rec

        result: Record = self.writer.submit(prepare, apply)
        return result

    def _reindex(self, old_vk: int, rec: Record, vec: np.ndarray | None) -> None:
        """Writer thread (a follower: its catch-up): refresh a row whose vector key was ``old_vk``;
        when its vector moved, add the new entry, then kill the old."""
        row = self.columns.rows[rec.rid]
        view = self.columns.view()
        loc = int(view.vpos[row])
        if rec.vk == old_vk or (loc < 0 and vec is None):  # same vector (or still none)
            self.columns.set(row, rec, int(view.space[row]), loc)
            return
        old = self._entry(loc)
        if vec is None:  # tier move: same vector, new index
            assert old is not None
            vec = old[0].vectors(old[1])[0]
        sp = self._space(rec.embedding_model, int(vec.shape[0]))
        internal = self._index(sp, rec.tier).add(
            vec[None, :],
            np.array([row], np.int64),
            np.array([rec.vk], np.int64),
            max_pending=self._max_pending,
        )
        self.columns.set(row, rec, sp.id, location(sp.id, rec.tier, int(internal[0])))
        if old is not None:
            old[0].kill(old[1])

    def _entry(self, loc: int) -> tuple[VectorIndex, np.ndarray] | None:
        """The index and internal id of a ``vpos`` location (None: no entry)."""
        if loc < 0:
            return None
        sp = self._space_by_id[loc >> SPACE_SHIFT]
        return sp.indexes[(loc >> TIER_SHIFT) & 0xF], np.array([loc & INTERNAL_MASK], np.int64)

    # -- delete ---------------------------------------------------------------------------------
    def delete(self, namespace: str, memory_id: str, confirm: bool = False) -> None:
        check.namespace("namespace", namespace)
        check.memory_id("id", memory_id)
        self._check_protected(namespace, confirm, "deleting a memory")

        def prepare(txn: lmdb.Transaction) -> list[Record]:
            self._check_protected(namespace, confirm, "deleting a memory", txn)
            rid = self.store.lookup(txn, namespace, memory_id)
            rec = None if rid is None else self.store.get(txn, rid)
            if rec is None:
                raise NotFound(f"memory {memory_id!r} not found in namespace {namespace!r}")
            self.store.delete(txn, rec)
            return [rec]

        self.writer.submit(prepare, self._unindex)

    def delete_namespace(self, namespace: str, include_children: bool = False, confirm: bool = False) -> int:
        """Delete every memory of ``namespace`` (and of ``namespace/...`` with include_children)."""
        check.namespace("namespace", namespace)
        for name in [
            namespace,
            *(n for n in list(self.ns_config) if include_children and n.startswith(namespace + "/")),
        ]:
            self._check_protected(name, confirm, "clearing the namespace")
        prefixes = [namespace.encode() + b"\x00"] + ([namespace.encode() + b"/"] if include_children else [])

        def prepare(txn: lmdb.Transaction) -> list[Record]:
            # Read the ids from LMDB, not the columns: this sees writes of the same commit group.
            rids = []
            cur = txn.cursor(db=self.store.ids)
            for prefix in prefixes:
                if cur.set_range(prefix):
                    for k, v in cur:
                        if not bytes(k).startswith(prefix):
                            break
                        rids.append(v)
            recs = [r for r in (self.store.get(txn, int.from_bytes(v, "big")) for v in rids) if r is not None]
            # Every namespace it clears, including children with no memories (their graph facts go).
            children = [
                n
                for n in self.store.namespace_configs(txn)
                if include_children and n.startswith(namespace + "/")
            ]
            for ns in sorted({namespace, *children, *(r.namespace for r in recs)}):
                self._check_protected(ns, confirm, "clearing the namespace", txn)
            for rec in recs:
                self.store.delete(txn, rec)
            self.store.delete_graph(txn, namespace, include_children)
            for ns in {namespace, *(r.namespace for r in recs)}:
                self.store.put_scope_state(txn, ns, None)
            return recs

        deleted: int = self.writer.submit(prepare, self._unindex)
        if deleted:
            self.compact_indexes()
        return deleted

    def _unindex(self, recs: list[Record] | list[tuple[int, str]]) -> int:
        """Writer thread: hide rows first, then tombstone their HNSW entries. ``recs``: records, or
        (rid, namespace) pairs."""
        gone = []
        for rec in recs:
            rid, ns = rec if isinstance(rec, tuple) else (rec.rid, rec.namespace)
            row = self.columns.remove(rid, ns)
            entry = self._entry(int(self.columns.view().vpos[row]))
            if entry is not None:  # (a memory still waiting for its embedding has no index entry)
                entry[0].kill(entry[1])
                gone.append(row)
        if gone:
            # A search whose mask still holds such a row then drops it (``_in_space``) instead of
            # reading an internal id a later compaction may have given to another entry.
            self.columns.relocate(np.array(gone, np.int64), np.full(len(gone), -1, np.int64))
        return len(recs)

    # -- feedback -------------------------------------------------------------------------------
    def feedback(self, namespace: str, items: list[FeedbackItem], as_of: float | None = None) -> list[Record]:
        check.namespace("namespace", namespace)
        check.batch("items", items, self.config.max_batch_size)
        for i, it in enumerate(items):
            check.memory_id(f"items[{i}].id", it.id)
            if it.predicted_relevance is not None:
                check.unit_interval(f"items[{i}].predicted_relevance", it.predicted_relevance)
            if it.actual_usefulness is not None:
                check.unit_interval(f"items[{i}].actual_usefulness", it.actual_usefulness)
        when = self.clock() if as_of is None else check.finite_time("as_of", as_of)
        distinct = list(dict.fromkeys(it.id for it in items))
        position = {mid: j for j, mid in enumerate(distinct)}
        rated = [it for it in items if it.actual_usefulness is not None]
        index = np.array([position[it.id] for it in rated], np.int64)
        default_pred = self.config.default_predicted_relevance
        predicted = np.array(
            [default_pred if it.predicted_relevance is None else it.predicted_relevance for it in rated],
            np.float32,
        )
        actual = np.array([it.actual_usefulness for it in rated], np.float32)

        def prepare(txn: lmdb.Transaction) -> list[Record]:
            recs: list[Record] = []
            for mid in distinct:
                rid = self.store.lookup(txn, namespace, mid)
                rec = None if rid is None else self.store.get(txn, rid)
                if rec is None or self.expired(rec):
                    i = next(i for i, it in enumerate(items) if it.id == mid)
                    raise NotFound(f"items[{i}].id: memory {mid!r} not found in namespace {namespace!r}")
                recs.append(rec)
            state = np.array([r.surprise for r in recs], np.float32)
            kernels.surprise_ema(state, index, predicted, actual, self.config.surprise_alpha)
            for it in items:
                rec = recs[position[it.id]]
                rec.access_count += 1
                rec.success_count += int(it.success)
                rec.accessed_at = max(rec.accessed_at, when)
            for rec, s in zip(recs, state.tolist(), strict=True):
                rec.surprise = float(s)
                self.store.put(txn, rec)
            return recs

        def apply(recs: list[Record]) -> list[Record]:
            view = self.columns.view()
            for rec in recs:
                row = self.columns.rows[rec.rid]
                self.columns.set(row, rec, int(view.space[row]), int(view.vpos[row]))
            return [recs[position[it.id]] for it in items]

        result: list[Record] = self.writer.submit(prepare, apply)
        return result

    # -- list -----------------------------------------------------------------------------------
    def list_memories(
        self, namespace: str, page_size: int, page_token: str, flt: Filter, newest_first: bool = False
    ) -> tuple[list[Record], str]:
        """A page of a namespace in storage order, or newest first (an agent's timeline)."""
        check.namespace("namespace", namespace)
        size = check.page_size("page_size", page_size, self.config)
        after = _decode_token("page_token", page_token, int) if page_token else None
        view = self.columns.view()
        mask, _ = self.mask(view, [namespace], flt, self.clock())
        rows = np.flatnonzero(mask)
        rids = view.rid[rows]  # rows are in creation (rid) order
        if newest_first:
            rids = rids[::-1]
            if after is not None:
                rids = rids[rids < after]
        elif after is not None:
            rids = rids[rids > after]
        out: list[Record] = []
        pos = 0
        with self.store.read() as txn:
            while len(out) < size and pos < rids.shape[0]:
                rec = self.store.get(txn, int(rids[pos]))
                pos += 1
                if rec is not None and rec.namespace == namespace:
                    out.append(rec)
        token = _encode_token(out[-1].rid) if out and pos < rids.shape[0] else ""
        return out, token

    def mask(
        self, view: ColumnsView, namespaces: list[str], flt: Filter, now: float, space: int = -1
    ) -> tuple[np.ndarray, int]:
        """Rows allowed by namespaces and filter (and in embedding space ``space`` when >= 0),
        alive and unexpired at ``now``: (bool mask over the view's rows, count)."""
        cols = self.columns
        ns_ok = np.zeros(len(cols.namespaces), np.bool_)
        for name in namespaces:
            i = cols.namespaces.get(name)
            if i >= 0:
                ns_ok[i] = True
        if not ns_ok.any():  # none of them holds a memory yet: no pass over the rows
            return np.zeros(view.n, np.bool_), 0
        tier_ok = np.zeros(5, np.bool_)
        for t in flt.tiers or TIERS:
            tier_ok[t] = True
        kind_ok = np.zeros(0, np.bool_)
        if flt.kinds:
            kind_ok = np.zeros(max(1, len(cols.kinds)), np.bool_)
            ids = [cols.kinds.get(k) for k in flt.kinds]
            kind_ok[[i for i in ids if i >= 0]] = True
            if not kind_ok.any():
                return np.zeros(view.n, np.bool_), 0
        lo = -np.inf if flt.created_after is None else flt.created_after
        hi = np.inf if flt.created_before is None else flt.created_before
        mask, count = kernels.filter_mask(
            alive=view.alive,
            ns_id=view.ns,
            ns_ok=ns_ok,
            tier=view.tier,
            tier_ok=tier_ok,
            kind_id=view.kind,
            kind_ok=kind_ok,
            created_at=view.created,
            created_lo=lo,
            created_hi=hi,
            expire_at=view.expire if cols.earliest_expire <= now else None,
            now=now,
            space_id=view.space,
            space=space,
        )
        extra = False
        if flt.source:
            mask &= view.source == cols.sources.get(flt.source)
            extra = True
        if flt.topic:
            mask &= view.topic == cols.topics.get(flt.topic)
            extra = True
        if flt.tags_any:
            mask &= cols.tag_mask(flt.tags_any, view.n, require_all=False)
            extra = True
        if flt.tags_all:
            mask &= cols.tag_mask(flt.tags_all, view.n, require_all=True)
            extra = True
        if flt.compiled is not None:
            mask &= flt.compiled(view, cols)
            extra = True
        return mask, (int(mask.sum()) if extra else count)

    def check_filter(self, flt: Filter, prefix: str = "filter.") -> Filter:
        for i, t in enumerate(flt.tiers):
            check.tier(f"{prefix}tiers[{i}]", t)
        for i, k in enumerate(flt.kinds):
            check.kind(f"{prefix}kinds[{i}]", k)
        if flt.where and flt.compiled is None:
            check.text(f"{prefix}where", flt.where, self.config.max_content_bytes)
            flt.compiled = compile_where(flt.where)
        return flt

    # -- search (see search.py) ---------------------------------------------------------------
    def search(
        self, q: SearchQuery, include_embedding: bool = False, wanted: Callable[[], bool] | None = None
    ) -> list[SearchHit]:
        """See ``Searcher.search``; ``wanted``: is the caller still waiting (checked at its turn)."""
        if self.following:
            self.catch_up()
        return self.account(q, self.searcher.search(q, include_embedding, wanted))

    def search_many(
        self, queries: list[tuple[SearchQuery, bool]], wanted: Callable[[], bool] | None = None
    ) -> list[list[SearchHit]]:
        """Several searches, side by side on the batch threads; their side effects (accesses, hit
        counts) happen only if all succeed. A failure fails the call: the first by position (the
        searches after it that have not started are cancelled). The batch threads serve every
        call in turn: a batch queues behind the searches of batches submitted before it."""
        if self.following:
            self.catch_up()
        outcomes: list[list[SearchHit] | BaseException] = []
        if len(queries) == 1:
            try:
                outcomes.append(self.searcher.search(queries[0][0], queries[0][1], wanted))
            except Exception as e:
                outcomes.append(e)
        else:
            futures = [self._batch_pool.submit(self.searcher.search, q, inc, wanted) for q, inc in queries]
            for i, f in enumerate(futures):
                err = f.exception()
                outcomes.append(err if err is not None else f.result())
                if err is not None:  # the call fails: the searches not started yet need not run
                    for later in futures[i + 1 :]:
                        later.cancel()
                    break
        results: list[list[SearchHit]] = []
        for i, out in enumerate(outcomes):
            if isinstance(out, InvalidArgument):
                raise out.within(f"searches[{i}].") from None
            if isinstance(out, BaseException):
                raise out
            results.append(out)
        return [self.account(q, hits) for (q, _), hits in zip(queries, results, strict=True)]

    def account(self, q: SearchQuery, hits: list[SearchHit]) -> list[SearchHit]:
        """A search's side effects: its results count as accessed (unless read_only) and as hits."""
        if hits and not q.read_only and self.config.search_records_access:
            self.record_access([h.record.rid for h in hits], self.clock() if q.as_of is None else q.as_of)
        found = {h.record.namespace for h in hits}
        with self._search_lock:  # hit rate: a search "hits" a namespace when it returns some of it
            self._search_total[0 if hits else 1] += 1
            for ns in set(q.namespaces):
                counts = self._search_counts.setdefault(ns, [0, 0])
                counts[0 if ns in found else 1] += 1
        return hits

    def record_access(self, rids: list[int], when: float) -> None:
        """Count an access of each memory (searches returning them); committed in the background."""
        self._merge_access((rid, 1, when) for rid in rids)

    def _merge_access(self, accesses: Iterable[tuple[int, int, float]]) -> None:
        """Add (rid, accesses, last access time) to the accesses waiting for the next flush."""
        with self._access_lock:
            for rid, count, when in accesses:
                n, last = self._access_pending.get(rid, (0, when))
                self._access_pending[rid] = (n + count, max(last, when))

    def flush_access(self) -> int:
        """Commit the accesses recorded by searches so far (soft state: a crash may lose the last
        second of them, never a memory). Returns how many memories were updated.

        A follower hands them, with its search hit counts, to its access sink (the leader) instead;
        returns how many memories it handed over."""
        with self._access_lock:
            pending, self._access_pending = self._access_pending, {}
        if self.following:
            return self._hand_over(pending)
        if not pending:
            return 0

        def prepare(txn: lmdb.Transaction) -> list[Record]:
            recs = []
            for rid, (n, last) in pending.items():
                rec = self.store.get(txn, rid)
                if rec is None:
                    continue
                rec.access_count += n
                rec.accessed_at = max(rec.accessed_at, last)
                self.store.put(txn, rec)
                recs.append(rec)
            return recs

        def apply(recs: list[Record]) -> int:
            view = self.columns.view()
            for rec in recs:
                row = self.columns.rows.get(rec.rid)
                if row is not None:
                    self.columns.set(row, rec, int(view.space[row]), int(view.vpos[row]))
            return len(recs)

        return int(self.writer.submit(prepare, apply))

    def _hand_over(self, pending: dict[int, tuple[int, float]]) -> int:
        with self._search_lock:
            counts, self._search_counts = self._search_counts, {}
            total, self._search_total = self._search_total, [0, 0]
        if not pending and not any(total):
            return 0
        if self._access_sink is not None:
            try:
                self._access_sink(
                    {
                        "access": [[r, n, t] for r, (n, t) in pending.items()],
                        "searches": counts,
                        "total": total,
                    }
                )
            except Exception as e:  # soft state, as a crash loses the last second of them
                logger.warning("%d accesses not handed to the leader: %s", len(pending), e)
                return 0
        return len(pending)

    def merge_follower_report(self, report: dict[str, Any]) -> int:
        """The leader's side of ``_hand_over``: a follower's recorded accesses join this engine's
        (committed by the next flush) and its hit counts these. Returns how many accesses."""
        access = report.get("access", [])
        self._merge_access((int(rid), int(n), float(last)) for rid, n, last in access)
        with self._search_lock:
            for ns, (hits, misses) in report.get("searches", {}).items():
                counts = self._search_counts.setdefault(str(ns), [0, 0])
                counts[0] += int(hits)
                counts[1] += int(misses)
            total = report.get("total", [0, 0])
            self._search_total[0] += int(total[0])
            self._search_total[1] += int(total[1])
        return len(access)

    # -- following (search follower processes) ------------------------------------------------------
    FOLLOW_INTERVAL = 0.05  # a follower looks for new commits this often when no search asks
    # A follower's adds wait for its indexer only beyond this many pending vectors in an index
    # (memory: dim x 4 bytes each, up to twice while the buffer grows; every search scans them
    # exactly, ~1.7 ms for 32k at 384 dimensions).
    FOLLOWER_MAX_PENDING = 8 * VectorIndex.MAX_PENDING

    def catch_up(self) -> int:
        """A follower: apply the commits since the last one applied (every record they wrote or
        deleted, read back from LMDB; settings and spaces when they changed). A search calls it
        first, so it sees every write acknowledged before it began. Returns the commits applied.
        Raises FollowerBehind when the commit log no longer holds them (the follower reloads)."""
        if self.follow_error is not None:
            raise FollowerBehind(f"this follower stopped following: {self.follow_error!r}")
        with self._follow_lock, self.store.read() as txn:
            seq = self.store.committed_seq(txn)
            if seq == self._applied:
                return 0
            try:
                log = self.store.commits_after(txn, self._applied)
                if log is None or log[0] != self._applied + 1:
                    raise FollowerBehind(
                        f"commits {self._applied + 1}..{seq} are no longer in the commit log"
                    )
                _, settings, rids = log
                if settings:
                    self._follow_settings(txn)
                self._follow_records(txn, rids)
            except Exception as e:
                # Applied in part, maybe: this process can no longer be trusted to match LMDB. It
                # stops serving searches and exits; its leader starts another, which loads afresh.
                self.follow_error = e
                raise FollowerBehind(f"this follower stopped following: {e!r}") from e
            done, self._applied = seq - self._applied, seq
            self.store.seq = seq
            return done

    def _follow_settings(self, txn: lmdb.Transaction) -> None:
        for model, dim in self.store.spaces(txn).items():
            self._space(model, dim)
        self.ns_config = self.store.namespace_configs(txn)
        for name in self.ns_config:
            self.columns.namespaces.id(name)
        self._config_version += 1

    def _follow_records(self, txn: lmdb.Transaction, rids: np.ndarray) -> None:
        """Bring the rows of ``rids`` in line with their records, as the leader's writes did:
        new rows indexed then shown, changed vectors added before the old entry dies, deleted rows
        hidden before their entries die."""
        cols = self.columns
        fresh: list[tuple[Record, np.ndarray]] = []
        gone: list[tuple[int, str]] = []
        for rid, rec in zip(rids.tolist(), self.store.get_many(txn, rids.tolist()), strict=True):
            row = cols.rows.get(rid)
            if row is not None and (rec is None or cols.namespace_of(row) != rec.namespace):
                gone.append((rid, cols.namespace_of(row)))
                row = None
            if rec is None:
                continue
            vec = None if self.store.is_pending(txn, rid) else self.store.get_vector(txn, rid)
            if row is None:
                fresh.append((rec, np.empty(0, np.float32) if vec is None else vec))
                continue
            # As the leader's update or tier move did (a memory never waits for an embedding again
            # once it has one: every new vector gets a new vk).
            self._reindex(int(cols.view().vk[row]), rec, vec)
        self._unindex(gone)
        self._index_new(fresh)

    def _follow_loop(self) -> None:
        compacted = time.monotonic()
        while not self._stop.wait(self.FOLLOW_INTERVAL):
            try:
                self.catch_up()
                if time.monotonic() - compacted >= 5.0:  # the leader's passes kill entries here too
                    compacted = time.monotonic()
                    self.compact_indexes()
            except Exception as e:  # searches now fail (UNAVAILABLE) until the follower reloads
                logger.exception("following the leader's commits failed")
                self.follow_error = self.follow_error or e
                return

    # -- transfer -------------------------------------------------------------------------------
    def transfer(
        self,
        namespace: str,
        memory_id: str,
        *,
        target_namespace: str = "",
        target_tier: int = 0,
        move: bool,
        target_id: str = "",
        overwrite: bool = False,
        confirm: bool = False,
    ) -> Record:
        """Copy or move a memory to another tier and/or namespace (task -> project -> global),
        recording its origin. A move deletes the source in the same commit."""
        check.namespace("namespace", namespace)
        check.memory_id("id", memory_id)
        dest_ns = check.namespace("target_namespace", target_namespace) if target_namespace else namespace
        if target_tier:
            check.tier("target_tier", target_tier)
        if target_id:
            check.memory_id("target_id", target_id)
        if move:
            self._check_protected(namespace, confirm, "moving a memory out")
        same_place = dest_ns == namespace and (not target_id or target_id == memory_id)
        if same_place and target_id:
            raise InvalidArgument("target_id", "names the source memory itself")
        if move and same_place:
            raise InvalidArgument(
                "target_namespace",
                "a move needs another namespace or target_id; use UpdateMemory to change only the tier",
            )
        now = self.clock()

        def prepare(txn: lmdb.Transaction) -> tuple[list[Record], Record, np.ndarray]:
            if move:
                self._check_protected(namespace, confirm, "moving a memory out", txn)
            rid = self.store.lookup(txn, namespace, memory_id)
            src = None if rid is None else self.store.get(txn, rid)
            if src is None or src.expired(now):
                raise NotFound(f"memory {memory_id!r} not found in namespace {namespace!r}")
            vec = self.store.get_vector(txn, src.rid)
            dest_id = target_id or (memory_id if dest_ns != namespace or move else uuid.uuid4().hex)
            freed: list[Record] = []
            old_rid = self.store.lookup(txn, dest_ns, dest_id)
            existing = None if old_rid is None else self.store.get(txn, old_rid)
            if existing is not None:
                if not overwrite and not existing.expired(now):
                    raise AlreadyExists(f"memory {dest_id!r} already exists in namespace {dest_ns!r}")
                self._check_protected(dest_ns, confirm, "overwriting a memory", txn)
                self.store.delete(txn, existing)
                freed.append(existing)
            new = Record.unpack(src.pack())
            new.rid, new.vk = self._alloc()
            new.namespace, new.id = dest_ns, dest_id
            new.updated_at = now
            new.origin = [namespace, memory_id, src.tier, now]
            _enter_tier(new, target_tier or src.tier, now)
            self.store.insert(txn, new)
            if vec is None:  # the source still waits for its embedding; so does the copy
                vec = NO_VECTOR
                self.store.mark_pending(txn, new.rid, True)
            else:
                self.store.put_vector(txn, new.rid, vec, new=True)
            if move:
                self.store.delete(txn, src)
                freed.append(src)
            return freed, new, vec

        def apply(prepared: tuple[list[Record], Record, np.ndarray]) -> Record:
            freed, new, vec = prepared
            self._unindex(freed)
            self._index_new([(new, vec)])
            return new

        result: Record = self.writer.submit(prepare, apply)
        return result

    # -- summaries ------------------------------------------------------------------------------
    def build_summary(self, namespace: str, max_tokens: int) -> tuple[str, list[str], int]:
        """An extractive summary (no LLM) of the namespace's memories since its last summary: the
        first sentence of each, best first by 0.7 * importance + 0.3 * rank in time, kept within
        max_tokens, then put back in time order. Returns (text, covered ids, tokens)."""
        check.namespace("namespace", namespace)
        since = self.scope(namespace)["summary_rid"]
        view = self.columns.view()
        mask, _ = self.mask(view, [namespace], Filter(), self.clock())
        rows = np.flatnonzero(mask & (view.rid > since))
        with self.store.read() as txn:
            recs = [
                r
                for r in (self.store.get(txn, int(view.rid[row])) for row in rows)
                if r and r.kind != "summary"
            ]
        if not recs:
            return "", [], 0
        n = len(recs)
        order = sorted(range(n), key=lambda i: -(0.7 * recs[i].importance + 0.3 * (i + 1) / n))
        chosen, used = [], 0
        for i in order:
            sentence = _first_sentence(recs[i].content)
            cost = math.ceil(len(sentence.encode()) / 4) + 1
            if used + cost > max_tokens:
                continue
            chosen.append(i)
            used += cost
        text = " ".join(_first_sentence(recs[i].content) for i in sorted(chosen))
        return text, [r.id for r in recs][:1000], math.ceil(len(text.encode()) / 4)

    # -- backup and restore ---------------------------------------------------------------------
    def export(self, namespace: str = "", include_children: bool = False) -> Iterator[Any]:
        """Yield a header dict, then ("memory", Record, vector or None) for every memory of the
        namespace (or all), then ("scope", namespace, (reflection importance, summary tokens)) for
        each namespace with progress toward a reflection or summary, then ("node" | "edge",
        namespace, item) for its graph, all from one LMDB read transaction: a consistent snapshot
        while writes go on."""
        if namespace:
            check.namespace("namespace", namespace)
        prefixes = (
            [namespace.encode() + b"\x00"] + ([namespace.encode() + b"/"] if include_children else [])
            if namespace
            else [b""]
        )
        yield {
            "format_version": 1,
            "server_version": __version__,
            "export_time": self.clock(),
            "embedder_model": self.embedder.model,
            "namespace": namespace,
        }
        now = self.clock()
        with self.store.read() as txn:
            cur = txn.cursor(db=self.store.ids)
            for prefix in prefixes:
                if not cur.set_range(prefix):
                    continue
                for key, value in cur:
                    if not bytes(key).startswith(prefix):
                        break
                    rec = self.store.get(txn, int.from_bytes(value, "big"))
                    if rec is not None and not rec.expired(now):
                        yield "memory", rec, self.store.get_vector(txn, rec.rid)
            if namespace:
                scopes = [(namespace, self.store.scope_state(txn, namespace))]
                if include_children:
                    scopes += self.store.scope_states(txn, [namespace.encode() + b"/"])
            else:
                scopes = self.store.scope_states(txn, [b""])
            for ns, (refl, tokens, _) in scopes:
                if refl or tokens:
                    yield "scope", ns, (float(refl), int(tokens))
            graph = self.store.graph_items(txn, prefixes)
            yield from sorted(graph, key=lambda item: item[0] == "edge")  # nodes before the edges using them

    def restore(
        self,
        header: dict[str, Any],
        items: Iterator[tuple[Any, Any, Any]],
        target_namespace: str = "",
        batch: int = 500,
    ) -> tuple[int, int, int]:
        """Store exported memories (ids, times, counters and tiers kept), in commits of ``batch``,
        then the exported graph ("node" / "edge", namespace, item), then the namespaces' progress
        toward a reflection and a summary ("scope", namespace, (importance, tokens)), added to what
        the namespaces here have accumulated already. Memories the exporting server
        embedded are re-embedded when this server's embedder differs. Returns (memories imported,
        re-embedded, graph items). An id that exists already is ALREADY_EXISTS; the batches committed
        before it stay."""
        source_ns = header.get("namespace", "")
        if target_namespace:
            check.namespace("target_namespace", target_namespace)
        reembed_model = header.get("embedder_model", "")
        imported = reembedded = 0
        pending: list[tuple[Record, np.ndarray | None]] = []
        graph: list[tuple[str, str, dict[str, Any]]] = []
        scopes: dict[str, list[Any]] = {}  # namespace -> [reflection importance, summary tokens]

        def rename(ns: str) -> str:
            if target_namespace:
                if source_ns and (ns == source_ns or ns.startswith(source_ns + "/")):
                    return target_namespace + ns[len(source_ns) :]
                if not source_ns:
                    return f"{target_namespace}/{ns}"
            return ns

        def flush() -> None:
            nonlocal imported
            if pending:
                imported += self._restore_batch(list(pending))
                pending.clear()

        for i, (what, rec, vec) in enumerate(items):
            if what in ("node", "edge"):
                graph.append((what, check.namespace(f"chunks[{i + 1}].graph_namespace", rename(rec)), vec))
                continue
            if what == "scope":
                field = f"chunks[{i + 1}].scope."  # (chunk 0 is the header)
                refl, tokens = vec
                if not (math.isfinite(refl) and refl >= 0):
                    raise InvalidArgument(field + "reflection_importance", "must be a finite number >= 0")
                if tokens < 0:
                    raise InvalidArgument(field + "summary_tokens", "must not be negative")
                ns = check.namespace(field + "namespace", rename(rec))
                got = scopes.setdefault(ns, [0.0, 0])
                got[0], got[1] = got[0] + refl, got[1] + tokens
                continue
            field = f"memories[{i}]."
            rec.namespace = rename(rec.namespace)
            check.namespace(field + "namespace", rec.namespace)
            check.memory_id(field + "id", rec.id)
            if (rec.embedding_model == reembed_model and reembed_model != self.embedder.model) or vec is None:
                try:
                    vec = self.embedder.embed(rec.content)
                    rec.embedding_model = self.embedder.model
                    reembedded += 1
                except EmbedderError:
                    vec = None  # stored now, embedded by the maintenance pass
                    rec.embedding_model = self.embedder.model
            else:
                vec = check.vector(field + "embedding", vec, self.config)
            pending.append((rec, vec))
            if len(pending) >= batch:
                flush()
        flush()
        for lo in range(0, len(graph), batch):
            chunk = graph[lo : lo + batch]

            def prepare(txn: lmdb.Transaction, chunk: list[tuple[str, str, dict[str, Any]]] = chunk) -> int:
                for what, ns, item in chunk:
                    if what == "node":
                        self.store.put_node(txn, ns, item)
                    else:
                        self.store.put_edge(txn, ns, item)
                return len(chunk)

            self.writer.submit(prepare, lambda n: n)
        if scopes:

            def add_progress(txn: lmdb.Transaction) -> None:
                for ns, (refl, tokens) in scopes.items():
                    state = self.store.scope_state(txn, ns)
                    state[0], state[1] = state[0] + refl, state[1] + tokens
                    self.store.put_scope_state(txn, ns, state)

            self.writer.submit(add_progress, lambda _: None)
        return imported, reembedded, len(graph)

    def _restore_batch(self, items: list[tuple[Record, np.ndarray | None]]) -> int:
        def prepare(txn: lmdb.Transaction) -> list[tuple[Record, np.ndarray]]:
            spaces = self.store.spaces(txn)
            out = []
            for rec, vec in items:
                if self.store.lookup(txn, rec.namespace, rec.id) is not None:
                    raise AlreadyExists(f"memory {rec.id!r} already exists in namespace {rec.namespace!r}")
                if vec is not None:
                    known = spaces.get(rec.embedding_model)
                    if known is None:
                        self.store.put_space(txn, rec.embedding_model, int(vec.shape[0]))
                        spaces[rec.embedding_model] = int(vec.shape[0])
                    elif known != vec.shape[0]:
                        raise InvalidArgument(
                            "embedding",
                            f"has dimension {vec.shape[0]}, but embedding space "
                            f"{rec.embedding_model!r} has dimension {known}",
                            reason="EMBEDDING_DIMENSION_MISMATCH",
                        )
                rec.rid, rec.vk = self._alloc()
                rec.words = len(text_words(rec.content))
                self.store.insert(txn, rec)
                if rec.kind == "summary":  # the latest restored summary is the scope's current one
                    state = self.store.scope_state(txn, rec.namespace)
                    current = self.store.get(txn, state[2]) if state[2] else None
                    if current is None or current.created_at <= rec.created_at:
                        state[1], state[2] = 0, rec.rid
                        self.store.put_scope_state(txn, rec.namespace, state)
                if vec is None:
                    self.store.mark_pending(txn, rec.rid, True)
                    vec = NO_VECTOR
                else:
                    self.store.put_vector(txn, rec.rid, vec, new=True)
                out.append((rec, vec))
            return out

        def apply(out: list[tuple[Record, np.ndarray]]) -> int:
            self._index_new(out)
            return len(out)

        weight = sum(len(r.content) + 4 * (0 if v is None else v.shape[0]) + 512 for r, v in items)
        return int(self.writer.submit(prepare, apply, weight))

    # -- namespace settings -------------------------------------------------------------------
    def _check_protected(
        self, namespace: str, confirm: bool, action: str, txn: lmdb.Transaction | None = None
    ) -> None:
        """FAILED_PRECONDITION unless ``confirm`` when ``namespace`` is protected. Checked once on
        arrival (fails fast, before queueing) and again inside the write's transaction (``txn``),
        which sees every protection committed or queued ahead of it: a write that was checked just
        before a protection landed cannot slip past it."""
        if confirm:
            return
        config = (
            self.ns_config.get(namespace, {}) if txn is None else self.store.namespace_config(txn, namespace)
        )
        if config.get("protected"):
            raise FailedPrecondition(
                f"namespace {namespace!r} is protected: {action} needs confirm=true",
                reason="NAMESPACE_PROTECTED",
            )

    def policy_for(self, namespace: str) -> Policy:
        return self._policy_of(self.ns_config.get(namespace, {}))

    def _policy_of(self, config: dict[str, Any]) -> Policy:
        """The policy in effect under a namespace's stored settings."""
        overrides = config.get("policy")
        return self.base_policy.with_overrides(overrides) if overrides else self.base_policy

    @property
    def config_version(self) -> int:
        """Moves whenever a namespace's settings change (cached per-namespace tables are rebuilt)."""
        return self._config_version

    def tables(self) -> Tables:
        """Lifecycle tables for every interned namespace, rebuilt when namespaces or settings change."""
        key = (len(self.columns.namespaces), self._config_version)
        cached = self._tables_cache
        if cached is None or cached[0] != key:
            ids = self.columns.namespaces
            overrides = {
                ids.get(ns): self.policy_for(ns) for ns, c in list(self.ns_config.items()) if c.get("policy")
            }
            cached = (
                key,
                Tables.build(key[0], self.base_policy, {i: p for i, p in overrides.items() if i >= 0}),
            )
            self._tables_cache = cached
        return cached[1]

    def get_namespace_config(self, namespace: str) -> tuple[dict[str, Any], Policy]:
        check.namespace("namespace", namespace)
        return dict(self.ns_config.get(namespace, {})), self.policy_for(namespace)

    def update_namespace_config(
        self, namespace: str, protected: bool, policy: dict[str, Any], mask: list[str], confirm: bool = False
    ) -> tuple[dict[str, Any], Policy]:
        """Change ``protected`` and/or policy overrides (stored form, see lifecycle.check_overrides)."""
        check.namespace("config.namespace", namespace)
        fields_ = set(mask or ["protected", "policy"])
        allowed = {"protected", "policy", "policy.tiers", *(f"policy.{f}" for f in POLICY_FIELDS)}
        for f in fields_:
            if f not in allowed:
                raise InvalidArgument(
                    "update_mask", f"{f!r} cannot be updated; updatable: {', '.join(sorted(allowed))}"
                )
        policy = check_overrides(policy)

        def merged(current: dict[str, Any]) -> dict[str, Any]:
            """The settings to store: ``current`` with the masked fields replaced."""
            if "protected" in fields_ and current.get("protected") and not protected and not confirm:
                raise FailedPrecondition(
                    f"namespace {namespace!r} is protected: unprotecting it needs confirm=true",
                    reason="NAMESPACE_PROTECTED",
                )
            new_protected = protected if "protected" in fields_ else bool(current.get("protected"))
            new_policy = dict(policy) if "policy" in fields_ else dict(current.get("policy") or {})
            for f in fields_:
                if f.startswith("policy."):
                    name = f.split(".", 1)[1]
                    if name in policy:
                        new_policy[name] = policy[name]
                    else:
                        new_policy.pop(name, None)
            stored: dict[str, Any] = {}
            if new_protected:
                stored["protected"] = True
            if new_policy:
                stored["policy"] = new_policy
            return stored

        merged(self.ns_config.get(namespace, {}))  # fail fast, before queueing

        def prepare(txn: lmdb.Transaction) -> dict[str, Any]:
            # Merged with what the transaction sees, not the settings in memory: those lag the
            # writes queued ahead in the same commit group, whose changes would otherwise be lost.
            stored = merged(self.store.namespace_config(txn, namespace))
            self.store.put_namespace_config(txn, namespace, stored)
            return stored

        def apply(cfg: dict[str, Any]) -> dict[str, Any]:
            self.columns.namespaces.id(namespace)  # tables get a row for it
            if cfg:
                self.ns_config[namespace] = cfg
            else:
                self.ns_config.pop(namespace, None)
            self._config_version += 1
            return cfg

        result = self.writer.submit(prepare, apply)
        return dict(result), self._policy_of(result)

    # -- lifecycle ------------------------------------------------------------------------------
    def consolidate(
        self, namespace: str = "", *, dry_run: bool = False, max_reported: int = 1000, scheduled: bool = False
    ) -> dict[str, Any]:
        """Run a lifecycle pass (see lifecycle.py) over one namespace or all; returns its report.

        Planning reads the columns only (kernels over whole arrays, no locks). Moves are applied
        through the writer in chunks, each re-checking that the memory is still where the plan saw
        it; searches are paused only while a moved vector is added to or tombstoned in an index.
        """
        if namespace:
            check.namespace("namespace", namespace)
        if max_reported < 0:
            raise InvalidArgument("max_reported_moves", "must not be negative")
        with self._pass_lock:
            t0 = time.perf_counter()
            now = self.clock()
            view = self.columns.view()
            tables = self.tables()
            if namespace:
                in_scope = view.alive & (view.ns == self.columns.namespaces.get(namespace))
            else:
                in_scope = view.alive.copy()
            n_ns = tables.ttl.shape[0]
            if scheduled:
                if self._last_run.shape[0] < n_ns:
                    grown = np.full((n_ns, 5), -np.inf)
                    grown[: self._last_run.shape[0]] = self._last_run
                    self._last_run = grown
                due = (now - self._last_run[:n_ns]) >= tables.cadence
            else:
                due = np.ones((n_ns, 5), np.bool_)
            plan = plan_pass(
                view,
                tables,
                now=now,
                floor=self.config.importance_floor,
                tau_seconds=self.config.recency_tau_seconds,
                in_scope=in_scope,
                due=due,
            )
            if scheduled:
                self._last_run[:n_ns][due] = now
            plan_seconds = time.perf_counter() - t0
            rids = view.rid[plan.rows]
            report: dict[str, Any] = dict(
                plan.counts,
                over_capacity=plan.over_capacity,
                skipped=0,
                plan_seconds=plan_seconds,
                apply_seconds=0.0,
                max_pause_seconds=0.0,
            )
            with self.store.read() as txn:
                listed = [self.store.get(txn, int(r)) for r in rids[:max_reported]]
            report["moves"] = [
                {
                    "namespace": rec.namespace,
                    "id": rec.id,
                    "from": int(plan.from_tier[i]),
                    "to": int(plan.to_tier[i]),
                    "reason": int(plan.reason[i]),
                }
                for i, rec in enumerate(listed)
                if rec is not None
            ]
            if dry_run:
                return report
            if plan.rows.shape[0]:
                self._apply_plan(report, rids, plan, now)
            self.compact_indexes()  # after the moves, or single deletes, left an index mostly dead
            return report

    def _apply_plan(self, report: dict[str, Any], rids: np.ndarray, plan: Any, now: float) -> None:
        """Apply a pass's moves through the writer, 256 a commit; fills in the report's timings."""
        indexes = [idx for sp in list(self.spaces.values()) for idx in list(sp.indexes.values())]
        for idx in indexes:
            idx.max_pause_seconds = 0.0
        t1 = time.perf_counter()
        items = list(
            zip(
                rids.tolist(),
                plan.from_tier.tolist(),
                plan.to_tier.tolist(),
                plan.reason.tolist(),
                strict=True,
            )
        )
        for lo in range(0, len(items), 256):
            report["skipped"] += self._apply_moves(items[lo : lo + 256], now)
        report["apply_seconds"] = time.perf_counter() - t1
        indexes = [idx for sp in list(self.spaces.values()) for idx in list(sp.indexes.values())]
        report["max_pause_seconds"] = max([idx.max_pause_seconds for idx in indexes], default=0.0)

    # An index at least COMPACT_MIN_ENTRIES large, with at least COMPACT_DEAD_SHARE of its entries
    # dead and at most COMPACT_MAX_LIVE live, is compacted after a lifecycle pass or a namespace
    # clear (its live vectors re-enter an empty index; start-up rebuilds any with > 25% dead).
    COMPACT_MIN_ENTRIES = 4096
    COMPACT_DEAD_SHARE = 0.75
    COMPACT_MAX_LIVE = VectorIndex.MAX_PENDING

    def compact_indexes(self) -> int:
        """Compact the indexes that are mostly tombstones (see the COMPACT_* settings), in the
        writer thread (a follower: between two catch-ups); returns how many entries were dropped."""

        def run() -> int:
            dropped = 0
            for sp in list(self.spaces.values()):
                for tier, idx in list(sp.indexes.items()):
                    _, _, live = idx.counts()
                    if (
                        idx.n < self.COMPACT_MIN_ENTRIES
                        or idx.n - live < self.COMPACT_DEAD_SHARE * idx.n
                        or live > self.COMPACT_MAX_LIVE
                    ):
                        continue

                    def relocate(rows: np.ndarray, ids: np.ndarray, sp: Space = sp, tier: int = tier) -> None:
                        self.columns.relocate(rows, location(sp.id, tier, ids))

                    n = idx.n
                    gone = idx.compact(relocate)
                    logger.info("compacted index %s/%d: %d of %d entries were dead", sp.model, tier, gone, n)
                    dropped += gone
            return dropped

        try:
            if self.following:
                with self._follow_lock:
                    return run()
            return int(self.writer.barrier(run))
        except Exception:  # optional upkeep: the write that called it has committed already
            logger.exception("compacting indexes failed")
            return 0

    def _apply_moves(self, items: list[tuple[int, int, int, int]], now: float) -> int:
        """Commit one chunk of planned moves; returns how many were skipped (memory changed meanwhile)."""

        def prepare(
            txn: lmdb.Transaction,
        ) -> tuple[list[tuple[Record, Record]], list[Record], int, dict[Any, list[int]]]:
            moved: list[tuple[Record, Record]] = []
            deleted: list[Record] = []
            skipped = 0
            deltas: dict[tuple[str, int], list[int]] = {}
            for rid, frm, to, reason in items:
                rec = self.store.get(txn, rid)
                if rec is None or rec.tier != frm or (reason == EXPIRED and not rec.expired(now)):
                    skipped += 1
                    continue
                kind = (
                    0
                    if reason in PROMOTIONS
                    else 1
                    if reason in DEMOTIONS
                    else 2
                    if reason == EVICT_CAPACITY
                    else 3
                )
                d = deltas.setdefault((rec.namespace, frm), [0, 0, 0, 0])
                d[kind] += 1
                if reason == DELETE_CAPACITY:
                    d[2] += 1  # a capacity deletion is an eviction too
                if to == 0:
                    self.store.delete(txn, rec)
                    deleted.append(rec)
                    continue
                old = Record.unpack(rec.pack())
                _enter_tier(rec, to, now)
                _, rec.vk = self._alloc()
                self.store.put(txn, rec)
                moved.append((old, rec))
            for (ns, tier), d in deltas.items():
                # From the transaction: a move committed in the same group is not applied yet.
                total = self.store.lifecycle_counter(txn, ns, tier)
                self.store.put_lifecycle_counters(
                    txn, ns, tier, [a + b for a, b in zip(total, d, strict=True)]
                )
            return moved, deleted, skipped, deltas

        def apply(
            prepared: tuple[list[tuple[Record, Record]], list[Record], int, dict[Any, list[int]]],
        ) -> int:
            moved, deleted, skipped, deltas = prepared
            for old, rec in moved:
                self._reindex(old.vk, rec, None)
            self._unindex(deleted)
            when = self.clock()
            for (ns, tier), d in deltas.items():
                total = self._lcounts.setdefault((ns, tier), [0, 0, 0, 0])
                for kind in range(4):
                    total[kind] += d[kind]
                    if d[kind] and kind < 3:
                        self._events.append((when, ns, tier, kind, d[kind]))
            while self._events and self._events[0][0] < when - 3600:
                self._events.popleft()
            return skipped

        return int(self.writer.submit(prepare, apply))

    # -- stats and namespaces -------------------------------------------------------------------
    def stats(self, namespace: str = "") -> dict[str, Any]:
        view = self.columns.view()
        mask = view.alive & (view.expire > self.clock())
        if namespace:
            check.namespace("namespace", namespace)
            mask &= view.ns == self.columns.namespaces.get(namespace)
        tiers = view.tier[mask]
        counts = np.bincount(tiers, minlength=5)
        imp = np.bincount(tiers, weights=view.importance[mask], minlength=5)
        sur = np.bincount(tiers, weights=view.surprise[mask], minlength=5)
        spaces = []
        for sp in list(self.spaces.values()):
            figures = [idx.counts() for idx in list(sp.indexes.values())]  # each index's read together
            spaces.append(
                {
                    "model": sp.model,
                    "dim": sp.dim,
                    "live": sum(f[2] for f in figures),
                    "indexed": sum(f[0] for f in figures),
                    "pending": sum(f[1] for f in figures),
                }
            )
        ns_count = len(self.columns.ns_counts) if not namespace else int(namespace in self.columns.ns_counts)
        totals = np.zeros((5, 4), np.int64)  # tier x [promotions, demotions, evictions, deleted]
        for (ns, t), c in list(self._lcounts.items()):
            if not namespace or ns == namespace:
                totals[t] += c
        recent = np.zeros((5, 4), np.int64)
        hour_ago = self.clock() - 3600
        for when, ns, t, kind, n in list(self._events):
            if when >= hour_ago and (not namespace or ns == namespace):
                recent[t, kind] += n
        with self._search_lock:
            hits, misses = self._search_counts.get(namespace, [0, 0]) if namespace else self._search_total
        return {
            "search_hits": hits,
            "search_misses": misses,
            "memory_count": int(mask.sum()),
            "namespace_count": ns_count,
            "tiers": [
                {
                    "tier": t,
                    "count": int(counts[t]),
                    "avg_importance": float(imp[t] / counts[t]) if counts[t] else 0.0,
                    "avg_surprise": float(sur[t] / counts[t]) if counts[t] else 0.0,
                    "totals": totals[t].tolist(),
                    "last_hour": recent[t].tolist(),
                }
                for t in TIERS
            ],
            "spaces": spaces,
            "writes_committed": self.writer.ops_committed,
            "commit_groups": self.writer.groups_committed,
            "uptime_seconds": time.monotonic() - self.started,
            "storage_bytes": self.store.used_bytes(),
            "version": __version__,
        }

    def list_namespaces(
        self, prefix: str, page_size: int, page_token: str
    ) -> tuple[list[tuple[str, int]], str]:
        size = check.page_size("page_size", page_size, self.config)
        after = _decode_token("page_token", page_token, str) if page_token else ""
        page, more = self.columns.namespaces_page(prefix, after, size)
        return page, (_encode_token(page[-1][0]) if page and more else "")


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for i, ch in enumerate(text):
        if ch in ".!?" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def _reinforce(rec: Record, dup: NewMemory, now: float, max_tags: int) -> None:
    """A duplicate of ``rec`` was stored again: it counts as an access and can only gain."""
    rec.importance = max(rec.importance, float(dup.importance or 0.0))
    rec.access_count += 1
    rec.accessed_at = max(rec.accessed_at, now)
    rec.tags = list(dict.fromkeys([*rec.tags, *dup.tags]))[:max_tags]
    rec.updated_at = now


def _enter_tier(rec: Record, tier: int, now: float) -> None:
    """Move a record to ``tier``: promotion evidence (accesses, successes) counts from here on."""
    rec.tier = tier
    rec.tier_since = now
    rec.access_base = rec.access_count
    rec.success_base = rec.success_count


def _encode_token(value: int | str) -> str:
    return base64.urlsafe_b64encode(msgpack.packb(["v1", value])).decode()


def _decode_token(field_name: str, token: str, kind: type) -> Any:
    try:
        tag, value = msgpack.unpackb(base64.urlsafe_b64decode(token.encode()))
        if tag != "v1" or not isinstance(value, kind):
            raise ValueError(token)
        return value
    except Exception:
        raise InvalidArgument(field_name, "is not a token this server issued") from None


def _lock_data_dir(data: Path) -> Any:
    """Hold an exclusive lock on ``data/LOCK`` for the engine's lifetime: two servers on one data
    directory would each keep their own columns and indexes over the same LMDB and snapshot over each
    other. The lock goes with the process, so a server killed with -9 leaves nothing to clean up."""
    import fcntl

    f = open(data / "LOCK", "a+")  # noqa: SIM115 (held open until close)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise StorageError(
            f"data directory {data} is in use by another tiermem server", reason="DATA_DIR_IN_USE"
        ) from None
    return f


class _GroupVectors:
    """Unit vectors (with record ids and vector keys) of memories created in the commit group being
    written, for similarity deduplication before they reach the indexes. At most ``LIMIT`` per
    namespace and model: each lookup compares against all of them (4,096 x 384: ~1 ms)."""

    LIMIT = 4096

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self._vecs = np.empty((8, 0), np.float32)

    def add(self, rid: int, vk: int, vec: np.ndarray) -> None:
        n = len(self.keys)
        if n >= self.LIMIT:
            return
        if n == 0:  # (one model, one dimension: checked before)
            self._vecs = np.empty((8, vec.shape[0]), np.float32)
        elif n == self._vecs.shape[0]:
            self._vecs = np.concatenate([self._vecs, np.empty_like(self._vecs)])
        norm = float(np.linalg.norm(vec))
        self._vecs[n] = vec / norm if norm > 0 else vec
        self.keys.append((rid, vk))

    def similar(self, vec: np.ndarray, at_least: float) -> list[tuple[int, int]]:
        """(rid, vk) of the vectors at least ``at_least`` similar to ``vec`` (cosine), most similar first."""
        n = len(self.keys)
        if n == 0:
            return []
        norm = float(np.linalg.norm(vec))
        sims = self._vecs[:n] @ (vec / norm if norm > 0 else vec).astype(np.float32)
        hits = np.flatnonzero(sims >= at_least)
        order = hits[np.argsort(-sims[hits], kind="stable")]
        return [self.keys[i] for i in order.tolist()]
