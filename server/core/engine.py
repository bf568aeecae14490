"""The transport-free memory engine: the one object the layers above hold. It opens the state,
loads it, starts the writer and the background threads, and delegates each call to the module
that owns it:

- ``state.py``      the shared state (settings, clock, LMDB and its writer, columns, spaces,
                    embedder, namespace settings, counters) and its small helpers
- ``startup.py``    data-directory lock; columns and indexes loaded from snapshots and LMDB
- ``create.py``     create, deduplication, idempotent retries, reflection/summary progress
- ``memories.py``   get, update, delete, feedback, list, transfer, reflection candidates
- ``namespaces.py`` namespace settings and protection, clearing and listing namespaces
- ``searches.py``   search entry points (ranking itself is ``search/``)
- ``access.py``     access accounting, search hit counts, a follower's hand-over
- ``lifecycle.py``  lifecycle passes, expiry sweep, index compaction
- ``upkeep.py``     columns and indexes kept in line with LMDB after each commit
- ``backup.py``     export and import
- ``follow.py``     a search follower's catch-up with its leader's commits
- ``stats.py``      statistics
- ``background.py`` snapshots, access flushes, maintenance and follow threads

LMDB (``Store``) is the source of truth: every write goes through the ``Writer`` thread and is
durable before the call returns; the columns and the vector indexes mirror it (see upkeep.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import IO, Any

import numpy as np

from tiermem import kernels
from tiermem.server.config import ServerConfig
from tiermem.server.core import (
    access,
    backup,
    create,
    follow,
    lifecycle,
    memories,
    namespaces,
    replication,
    searches,
    startup,
    upkeep,
)
from tiermem.server.core import stats as stats_module
from tiermem.server.core.background import BackgroundThreads, Snapshots
from tiermem.server.core.policy import Policy, Tables
from tiermem.server.core.state import PROMOTED, AccessSink, EngineState
from tiermem.server.cores import usable_cores
from tiermem.server.embedding.providers import Embedder
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.index.spaces import Space
from tiermem.server.index.threads import set_faiss_threads
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.reports import (
    ConsolidationReport,
    CreateOutcome,
    ExportHeader,
    ExportItem,
    FollowerReport,
    ImportResult,
    ScopeProgress,
    StatsReport,
    SweepReport,
)
from tiermem.server.model.types import FeedbackItem, Filter
from tiermem.server.search.query import SearchHit, SearchQuery
from tiermem.server.search.searcher import Searcher
from tiermem.server.storage.store import Store
from tiermem.server.storage.writer import Writer

logger = logging.getLogger(__name__)


class Engine:
    """The memory engine's public API; each method delegates to the module that owns it."""

    def __init__(
        self,
        config: ServerConfig,
        clock: Callable[[], float] = time.time,
        *,
        follower: bool = False,
        access_sink: AccessSink | None = None,
    ) -> None:
        """``follower``: a search follower: LMDB opened read-only while another process (the
        leader, holding the data directory) writes; this engine loads the same snapshots, then
        applies the leader's commits from the commit log (``catch_up``) before every search and
        in the background. It never writes: the accesses its searches record and its hit counts
        go to ``access_sink`` (the leader) instead."""
        set_faiss_threads(1)  # per-query search on gRPC threads; OpenMP would oversubscribe
        data = Path(config.data_dir)
        if not follower:
            startup.prepare_data_dir(data)  # created and writable, or a StorageError naming the path
        # The directory lock; LMDB's data file is locked too, for as long as the store is open
        # (storage/datafile.py): a deleted LOCK file lets no second writer in.
        self._dir_lock: IO[str] | None = startup.lock_data_dir(data) if not follower else None
        self._closed = False
        self._promoting = threading.Lock()  # (a retry overlapping a promotion waits for its answer)
        try:
            self._open(config, clock, follower, access_sink)
        except BaseException:
            st = getattr(self, "state", None)
            if st is not None and getattr(st, "writer", None) is None:
                st.store.close()  # a failed load must not keep data.mdb locked either
            if self._dir_lock is not None:
                self._dir_lock.close()  # a failed start must not keep the directory locked
            raise

    def _open(
        self, config: ServerConfig, clock: Callable[[], float], follower: bool, access_sink: AccessSink | None
    ) -> None:
        self.state = st = EngineState(config, clock, following=follower, access_sink=access_sink)
        self.searcher = Searcher(st)
        # The searches of one BatchSearchMemories call run side by side on these threads (each
        # still takes its turn, see Searcher), so a batch uses every core the turns allow.
        self._batch_pool = ThreadPoolExecutor(
            max_workers=config.search_concurrency or usable_cores(), thread_name_prefix="tiermem-batch"
        )
        # The kernels load (or compile) beside the data: LLVM's and FAISS's reads release the GIL.
        logger.info(
            "compiling kernels beside the load (the first start after an install takes up to a minute)"
        )
        began = time.monotonic()
        warming = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tiermem-kernels")
        warmed = warming.submit(kernels.warm_up)
        warming.shutdown(wait=False)
        try:
            self._load(config, st)
        except BaseException:
            wait([warmed])  # (a failed start leaves nothing running)
            raise
        warmed.result()
        logger.info("kernels ready %.1f s after the load began", time.monotonic() - began)
        self._snapshots = Snapshots(st)
        self._background = BackgroundThreads(st, self._snapshots)
        self._background.start()

    def _load(self, config: ServerConfig, st: EngineState) -> None:
        """The columns and indexes from the snapshots and LMDB, the indexer and the writer."""
        startup.load(st)
        if st.replica:
            leader, applied = replication.position(st)
            if leader.startswith(PROMOTED):
                raise FailedPrecondition(
                    "this data directory was promoted from a replica: start it without replica_of",
                    "REPLICA_PROMOTED",
                )
            st.replica_copying = applied == 0  # (no copy yet, or one under way)
        set_faiss_threads(1)
        for sp in st.space_list:
            for idx in sp.indexes.values():
                st.indexer.attach(idx)
        st.indexer.start()
        st.writer = Writer(st.store, max_group=config.max_group_ops, before_commit=st.before_commit)

    # -- replicas on other hosts (replication.py) ------------------------------------------------------
    @property
    def is_replica(self) -> bool:
        return self.state.replica

    @property
    def replica_copying(self) -> bool:
        """A replica that holds no complete copy of its leader yet: it answers no reads."""
        return self.state.replica and self.state.replica_copying

    @property
    def instance_id(self) -> str:
        """The id of this server's data (a replica's copy keeps its leader's in its position)."""
        return self.state.store.instance

    @property
    def committed_seq(self) -> int:
        """The last commit's sequence number (writer thread's view: at least every write answered)."""
        return self.state.store.seq

    def replication_feed(
        self, instance: str, after: int, wanted: Callable[[], bool], done: Callable[[], bool] = lambda: False
    ) -> Iterator[tuple[int, bool, bytes]]:
        return replication.feed(self.state, instance, after, wanted, done)

    def replica_position(self) -> tuple[str, int]:
        return replication.position(self.state)

    def replica_parts(self) -> replication.Parts:
        """Where a replica keeps the parts of a split backlog until its last one (a temporary file
        in the data directory past a few MiB)."""
        return replication.Parts(self.state.config.data_dir)

    def store_replica_batch(self, instance: str, seq: int, start: bool, payloads: Iterable[bytes]) -> None:
        if not self.state.replica:
            raise FailedPrecondition("this server was promoted: it follows no leader", "NOT_A_REPLICA")
        replication.store_batch(self.state, instance, seq, start, payloads)

    def promote(
        self, leader_instance: str = "", stop_following: Callable[[], None] = lambda: None
    ) -> tuple[str, int, int]:
        """Stop being a replica: take writes and run the lifecycle from now on (kept across a
        restart). ``leader_instance``, when given, must be the data this replica copies; once it
        is checked, ``stop_following`` ends the call to the leader (no batch is stored after it).
        Returns (that data's id, its last commit stored here, memories held)."""
        with self._promoting:
            return self._promote(leader_instance, stop_following)

    def _promote(self, leader_instance: str, stop_following: Callable[[], None]) -> tuple[str, int, int]:
        st = self.state
        instance, seq = replication.position(st)
        if not st.replica and instance.startswith(PROMOTED):
            # (promoted already: a retry, as after its answer was lost, gets the same answer)
            instance = instance.removeprefix(PROMOTED)
            if leader_instance and leader_instance != instance:
                raise FailedPrecondition(f"this server was promoted from {instance}", "REPLICA_OF_ANOTHER")
            with st.store.read() as txn:
                return instance, seq, st.store.record_count(txn)
        if not st.replica:
            raise FailedPrecondition("this server is not a replica", "NOT_A_REPLICA")
        if st.replica_copying:  # (it would serve part of its leader's data as the whole)
            raise FailedPrecondition(
                "this replica holds no complete copy of its leader yet (none began, or one is under way)",
                "REPLICA_INCOMPLETE",
            )
        if leader_instance and leader_instance != instance:
            raise FailedPrecondition(
                f"this replica copies data {instance or '(none yet)'}, not {leader_instance}",
                "REPLICA_OF_ANOTHER",
            )
        stop_following()
        instance, seq = replication.position(st)  # (what the last batch stored)
        if st.replica_copying:  # (a batch stored while it stopped began a new copy)
            raise FailedPrecondition(
                "a new copy of the leader began while this replica was promoted: it holds no complete "
                "copy, and follows no more until it is restarted",
                "REPLICA_INCOMPLETE",
            )
        marker = PROMOTED + instance
        st.writer.submit(lambda txn: st.store.put_replica_position(txn, marker, seq), lambda _: None)
        st.replica = False
        self._background.start_writers()
        with st.store.read() as txn:
            return instance, seq, st.store.record_count(txn)

    def close(self) -> None:
        """Stop background work, drain queued writes, snapshot the indexes, close LMDB. Once: a
        second call does nothing (it would snapshot state another server may have moved past)."""
        if self._closed:
            return
        self._closed = True
        st = self.state
        self._background.stop()
        self._batch_pool.shutdown(wait=True)
        self.searcher.close()
        try:
            if not st.replica:  # (a replica writes only what its leader sends)
                self.flush_access()
        except Exception as e:  # soft state (a full disk, say): the shutdown goes on
            logger.warning("search accesses not recorded at shutdown: %s", e)
        st.writer.close()
        # No draining: what is still pending stays out of the index snapshot, and the next start-up
        # adds it again from LMDB, in the background (a shutdown after a start-up with a large
        # backlog would otherwise wait for all of it).
        st.indexer.stop(drain=False)
        if not st.following and st.config.snapshot_on_shutdown:
            # Snapshots only save start-up time; one that fails (a full disk) is skipped with a
            # warning by take(), and LMDB, which holds the truth, is closed cleanly all the same.
            try:
                self._snapshots.take(running=False)
            except Exception as e:
                logger.warning("shutdown snapshot skipped (%s); the next start-up loads from LMDB", e)
        st.store.close()
        close_embedder = getattr(st.embedder, "close", None)  # (a remote embedder's request threads)
        if close_embedder is not None:
            close_embedder()
        if self._dir_lock is not None:
            self._dir_lock.close()  # releases the data directory for the next server

    # -- the state the layers above read -------------------------------------------------------
    @property
    def config(self) -> ServerConfig:
        return self.state.config

    @property
    def clock(self) -> Callable[[], float]:
        return self.state.clock

    @property
    def store(self) -> Store:
        return self.state.store

    @property
    def writer(self) -> Writer:
        return self.state.writer

    @property
    def columns(self) -> Columns:
        return self.state.columns

    @property
    def spaces(self) -> dict[str, Space]:
        return self.state.spaces

    @property
    def embedder(self) -> Embedder:
        return self.state.embedder

    @property
    def following(self) -> bool:
        return self.state.following

    @property
    def follow_error(self) -> BaseException | None:
        """Why a follower stopped following, if it did."""
        return self.state.follow_error

    @property
    def config_version(self) -> int:
        """Moves whenever a namespace's settings change (cached per-namespace tables are rebuilt)."""
        return self.state.config_version

    def expired(self, rec: Record) -> bool:
        return self.state.expired(rec)

    def allowed_rows(
        self, view: ColumnsView, namespaces: list[str], flt: Filter, now: float, space: int = -1
    ) -> tuple[np.ndarray, int]:
        """Rows allowed by namespaces and filter (see ``index.masks.allowed_rows``)."""
        return self.state.allowed_rows(view, namespaces, flt, now, space)

    def check_filter(self, flt: Filter, prefix: str = "filter.") -> Filter:
        return self.state.check_filter(flt, prefix)

    def policy_for(self, namespace: str) -> Policy:
        return self.state.policy_for(namespace)

    def policy_tables(self) -> Tables:
        return self.state.policy_tables()

    # -- create and read -------------------------------------------------------------------------
    def create(self, memories: list[NewMemory], request_id: str = "", *, batch: bool = False) -> list[Record]:
        """Store memories all-or-nothing (see ``create_detailed``); returns the stored records."""
        return self.create_detailed(memories, request_id, batch=batch).records

    def create_detailed(
        self,
        memories: list[NewMemory],
        request_id: str = "",
        *,
        batch: bool = False,
        dedup_similarity: float | None = None,
        allow_duplicates: bool = False,
        confirm: bool = False,
    ) -> CreateOutcome:
        return create.create_detailed(
            self.state,
            memories,
            request_id,
            batch=batch,
            dedup_similarity=dedup_similarity,
            allow_duplicates=allow_duplicates,
            confirm=confirm,
        )

    def scope(self, namespace: str) -> ScopeProgress:
        return create.scope_progress(self.state, namespace)

    def reflection_candidates(self, namespace: str, limit: int) -> tuple[list[Record], ScopeProgress]:
        return memories.reflection_candidates(self.state, namespace, limit)

    def get(
        self, namespace: str, memory_id: str, include_embedding: bool = False
    ) -> tuple[Record, np.ndarray | None]:
        return memories.get(self.state, namespace, memory_id, include_embedding)

    def vectors_of(self, records: list[Record]) -> list[np.ndarray | None]:
        return memories.vectors_of(self.state, records)

    def embedding_pending(self, records: list[Record]) -> list[bool]:
        return memories.embedding_pending(self.state, records)

    def list_memories(
        self,
        namespace: str,
        page_size: int,
        page_token: str,
        flt: Filter,
        newest_first: bool = False,
        with_vectors: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[Record], str]:
        return memories.list_memories(
            self.state, namespace, page_size, page_token, flt, newest_first, with_vectors, max_bytes
        )

    # -- change ------------------------------------------------------------------------------------
    def update(
        self, namespace: str, memory_id: str, changes: NewMemory, mask: list[str], confirm: bool = False
    ) -> Record:
        return memories.update(self.state, namespace, memory_id, changes, mask, confirm)

    def delete(self, namespace: str, memory_id: str, confirm: bool = False) -> None:
        memories.delete(self.state, namespace, memory_id, confirm)

    def feedback(self, namespace: str, items: list[FeedbackItem], as_of: float | None = None) -> list[Record]:
        return memories.feedback(self.state, namespace, items, as_of)

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
        how = memories.Transfer(target_namespace, target_tier, move, target_id, overwrite, confirm)
        return memories.transfer(self.state, namespace, memory_id, how)

    # -- search and access accounting ----------------------------------------------------------------
    def search(
        self,
        q: SearchQuery,
        include_embedding: bool = False,
        wanted: Callable[[], bool] | None = None,
        record: bool = True,
    ) -> list[SearchHit]:
        """See ``Searcher.search``; ``wanted``: is the caller still waiting (checked at its turn);
        ``record`` false: the caller records the hits (``record_hits``) once it sends them."""
        return searches.search(self.state, self.searcher, q, include_embedding, wanted, record)

    def search_many(
        self,
        queries: list[tuple[SearchQuery, bool]],
        wanted: Callable[[], bool] | None = None,
        record: bool = True,
    ) -> list[list[SearchHit]]:
        """Several searches side by side; the batch threads serve every call in turn."""
        return searches.search_many(self.state, self.searcher, self._batch_pool, queries, wanted, record)

    def record_hits(self, q: SearchQuery, hits: list[SearchHit]) -> list[SearchHit]:
        return access.record_hits(self.state, q, hits)

    def record_access(self, rids: list[int], when: float) -> None:
        access.record_access(self.state, rids, when)

    def flush_access(self) -> int:
        return access.flush_access(self.state)

    def merge_follower_report(self, report: FollowerReport) -> int:
        return access.merge_follower_report(self.state, report)

    def catch_up(self) -> int:
        return follow.catch_up(self.state)

    def may_rank(self) -> bool:
        return follow.may_rank(self.state)

    # -- namespaces ----------------------------------------------------------------------------------
    def get_namespace_config(self, namespace: str) -> tuple[dict[str, Any], Policy]:
        return namespaces.get_namespace_config(self.state, namespace)

    def update_namespace_config(
        self, namespace: str, protected: bool, policy: dict[str, Any], mask: list[str], confirm: bool = False
    ) -> tuple[dict[str, Any], Policy]:
        return namespaces.update_namespace_config(self.state, namespace, protected, policy, mask, confirm)

    def delete_namespace(self, namespace: str, include_children: bool = False, confirm: bool = False) -> int:
        return namespaces.delete_namespace(self.state, namespace, include_children, confirm)

    def set_scope_routing(
        self,
        scope: str,
        state: int,
        moved_to: str = "",
        purge: bool = False,
        drain: Callable[[], None] | None = None,
    ) -> tuple[int, int]:
        return namespaces.set_scope_routing(self.state, scope, state, moved_to, purge, drain)

    def get_scope_routing(self, scope: str) -> tuple[int, str]:
        return namespaces.get_scope_routing(self.state, scope)

    def scope_routing(self, scope: str) -> tuple[int, str] | None:
        """The routing state of top-level ``scope`` and where it moved, None when it is served."""
        return self.state.routing.get(scope)

    def list_namespaces(
        self, prefix: str, page_size: int, page_token: str, within: Callable[[str], bool] | None = None
    ) -> tuple[list[tuple[str, int]], str]:
        return namespaces.list_namespaces(self.state, prefix, page_size, page_token, within)

    # -- lifecycle, upkeep, snapshots ------------------------------------------------------------------
    def consolidate(
        self, namespace: str = "", *, dry_run: bool = False, max_reported: int = 1000, scheduled: bool = False
    ) -> ConsolidationReport:
        return lifecycle.consolidate(
            self.state, namespace, dry_run=dry_run, max_reported=max_reported, scheduled=scheduled
        )

    def sweep(self, chunk: int = 1000) -> SweepReport:
        return lifecycle.sweep(self.state, chunk)

    def compact_indexes(self) -> int:
        return lifecycle.compact_indexes(self.state)

    def retry_embeddings(self, limit: int = 256) -> int:
        return upkeep.retry_embeddings(self.state, limit)

    def snapshot(self) -> None:
        """Write the columns and index snapshots now (as the periodic thread does)."""
        self._snapshots.take()

    # -- backup and statistics -----------------------------------------------------------------------
    def export(
        self,
        namespace: str = "",
        include_children: bool = False,
        wanted: Callable[[], bool] | None = None,
        within: list[str] | None = None,
    ) -> Iterator[ExportHeader | ExportItem]:
        return backup.export(self.state, namespace, include_children, wanted, within)

    def restore(
        self,
        header: ExportHeader,
        items: Iterator[ExportItem],
        target_namespace: str = "",
        batch: int = 500,
        confirm: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> ImportResult:
        return backup.restore(self.state, header, items, target_namespace, batch, confirm, wanted)

    def stats(self, namespace: str = "", within: Callable[[str], bool] | None = None) -> StatsReport:
        return stats_module.stats(self.state, namespace, within)
