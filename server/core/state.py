"""What the engine's parts share: the settings, the clock, LMDB and its writer, the columns, the
embedding spaces and their indexes, the embedder, namespace settings and the soft counters; with
the small helpers every part uses (space and index lookup, id allocation, filter masks, the policy
tables). The search layer ranks over this object (it satisfies ``search.source.SearchSource``).

Concurrency: LMDB is written only by the writer thread; the columns and the indexes change only in
the writer thread (a follower: in its catch-up, under ``follow_lock``) and are read lock-free by
searches through column views. ``spaces`` and ``space_list`` only grow; ``ns_config`` is replaced
per namespace by the writer thread and read anywhere.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tiermem.server.config import ServerConfig
from tiermem.server.core import pages
from tiermem.server.core.counters import LifecycleTotals, PendingAccesses, SearchCounts, SummaryCounts
from tiermem.server.core.group_vectors import GroupVectors
from tiermem.server.core.policy import Policy, Tables
from tiermem.server.core.policy_cache import PolicyCache
from tiermem.server.embedding import providers
from tiermem.server.index import masks
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.index.indexer import Indexer
from tiermem.server.index.keyword_index import KeywordIndex
from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.spaces import Index, Space
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.model import validation as check
from tiermem.server.model.records import Record
from tiermem.server.model.reports import FollowerReport
from tiermem.server.model.types import Filter
from tiermem.server.storage.store import Store, Txn
from tiermem.server.storage.writer import Writer

AccessSink = Callable[[FollowerReport], None]
PROMOTED = "promoted:"  # the replica position of a promoted replica: "promoted:<leader instance>"


class EngineState:
    """The engine's shared state (see the module docstring for who changes what)."""

    writer: Writer  # started by the engine once loaded

    def __init__(
        self,
        config: ServerConfig,
        clock: Callable[[], float],
        *,
        following: bool,
        access_sink: AccessSink | None,
    ) -> None:
        """``following``: a search follower (LMDB read-only; see ``follow.py``); its recorded
        accesses and hit counts go to ``access_sink`` (the leader)."""
        self.config = config
        self.clock = clock
        self.following = following
        self.access_sink = access_sink
        self.started = time.monotonic()
        data = Path(config.data_dir)
        self.index_dir = data / "indexes"
        # (first: an embedder that cannot be set up stops the start before any data is opened)
        self.embedder = providers.build(
            config.embedder,
            model=config.embedder_model,
            url=config.embedder_url,
            api_key_env=config.embedder_api_key_env,
            timeout=config.embedder_timeout_seconds,
            dimension=config.builtin_dimension,
            builtin_model=config.builtin_model,
            cache_size=config.embedding_cache_size,
            batch_size=config.embedder_batch_size or None,
            concurrency=config.embedder_concurrency,
            breaker_failures=config.embedder_breaker_failures,
            breaker_cooldown_seconds=config.embedder_breaker_cooldown_seconds,
        )
        self.store = Store(
            data / "lmdb",
            map_size=config.map_size,
            max_map_size=config.max_map_size,
            sync=config.sync,
            readonly=following,
            log_commits=config.search_processes > 1 or config.replication,
            commit_log_seconds=config.tuning.commit_log_seconds,
            prune_every=config.tuning.commit_log_prune_every,
        )
        self.applied = 0  # the last commit the columns and indexes hold (set by the load)
        # A follower's searches wait for its catch-up, so its adds let more vectors wait for the
        # indexer than a leader's writes do (0: the index's own limit).
        self.max_pending = config.tuning.follower_max_pending if following else 0
        self.follow_lock = threading.Lock()
        self.follow_error: BaseException | None = None  # why a follower stopped following, if it did
        self.searched_at = 0.0  # a follower: when a search last came (monotonic; follow.py's pace)
        self.columns = Columns(change_log=config.tuning.columns_change_log)
        self.keywords = KeywordIndex()  # postings of the rows' content, by namespace (keyword search)
        self.spaces: dict[str, Space] = {}
        self.space_list: list[Space] = []  # by space id
        # Spaces whose dimension is set before any vector: the declared ones and the built-in embedder's.
        self.fixed_spaces = dict(config.declared_spaces)
        if config.embedder == "builtin":
            self.fixed_spaces[config.builtin_model] = config.builtin_dimension
        self.embedder.dimension = self._embedder_dimension
        self.base_policy = Policy.from_config(config)
        self.ns_config: dict[str, dict[str, Any]] = {}  # namespace -> {"protected", "policy" overrides}
        # Top-level scope -> (routing state, moved_to) for scopes fenced or moved to another shard
        # (replaced whole, read without a lock).
        self.routing: dict[str, tuple[int, str]] = {}
        self.config_version = 0  # moves whenever a namespace's settings change
        self._policies = PolicyCache(self.base_policy)
        self._masks = masks.MaskCache()
        self.next_rid = self.next_vk = 1
        # A replica of another host's server (replication.py): it stores the leader's batches and
        # runs no lifecycle, summaries or access writes of its own until promoted.
        self.replica = bool(config.replica_of)
        self.replica_copying = False  # a replica without a complete copy yet (set at load)
        # Replicas' feeds: the last commit each has sent; the commit log keeps every later one.
        self.feed_floors: dict[object, int] = {}
        self.store.retain_from = lambda: min(list(self.feed_floors.values()), default=None)
        self.lifecycle = LifecycleTotals()
        self.pass_lock = threading.Lock()  # one lifecycle pass at a time
        self.last_run = np.full((0, 5), -np.inf)  # last scheduled pass per (namespace id, tier)
        self.searches = SearchCounts(holds=lambda ns: ns in self.columns.ns_counts)
        self.accesses = PendingAccesses()
        self.summaries = SummaryCounts()
        # Namespaces whose kept summary is due, and those whose last one failed (summarizer.py).
        self.summaries_lock = threading.Lock()
        self.summaries_due: set[str] = set()
        self.summaries_failed: set[str] = set()
        self.summaries_wake = threading.Event()
        # moves acknowledged vectors into HNSW beside the writer
        self.indexer = Indexer(bulk_chunk=config.index_bulk_chunk, tuning=config.tuning)
        # Vectors created in the commit group being written, by (namespace, model): similarity
        # deduplication sees them before they reach the indexes (writer thread only).
        self.group_vectors: dict[tuple[str, str], GroupVectors] = {}
        self.stop = threading.Event()  # set by close: background threads end

    def request_summary(self, namespace: str) -> None:
        """Ask the summarizer thread to keep the namespace's summary (it checks it is due)."""
        with self.summaries_lock:
            self.summaries_due.add(namespace)
        self.summaries_wake.set()

    # -- embedding spaces and their indexes ----------------------------------------------------
    def space(self, model: str, dim: int) -> Space:
        """The space of ``model``, created (with the next id) on first use."""
        sp = self.spaces.get(model)
        if sp is None:
            sp = Space(len(self.space_list), model, dim)
            self.space_list.append(sp)
            self.spaces[model] = sp
        return sp

    def _embedder_dimension(self) -> int | None:
        """The dimension of the server embedder's space (None: it has none yet)."""
        sp = self.spaces.get(self.embedder.model)
        return sp.dim if sp is not None else self.fixed_spaces.get(self.embedder.model)

    def claim_space(self, txn: Txn, field: str, model: str, dim: int, stored: int | None) -> None:
        """INVALID_ARGUMENT (naming ``field``) unless a vector of ``dim`` fits space ``model``
        (``stored``: its dimension, None when new, which then stores it). A declared space and the
        built-in embedder's have their dimension from the start, so that no caller's first vector,
        sent with that model's name, fixes another one (spaces are server-wide: every other use
        of the name would then fail)."""
        fixed = self.fixed_spaces.get(model) if stored is None else stored
        check.same_dimension(field, model, dim, fixed)
        if stored is None:
            self.store.put_space(txn, model, dim)

    def index(self, sp: Space, tier: int) -> Index:
        """The index of a space's tier, created (and handed to the indexer) on first use."""
        idx = sp.indexes.get(tier)
        if idx is None:
            idx = self.empty_index(sp)
            self.indexer.attach(idx)
            sp.indexes[tier] = idx
        return idx

    def new_index(self, sp: Space) -> VectorIndex:
        return VectorIndex(
            sp.dim, self.config.hnsw_m, self.config.hnsw_ef_construction, tuning=self.config.tuning
        )

    def empty_index(self, sp: Space) -> Index:
        """A new index for one of a space's tiers. A follower's is layered over an empty base, so
        that a snapshot of the leader's can be mapped under it later (core/remap.py)."""
        idx = self.new_index(sp)
        return LayeredIndex(VectorIndex(sp.dim, tuning=self.config.tuning), idx) if self.following else idx

    def load_snapshot(self, sp: Space, tier: int, mapped: bool) -> tuple[VectorIndex, np.ndarray] | None:
        """The index snapshot of a space's tier (``VectorIndex.load``), or None."""
        return VectorIndex.load(
            self.snapshot_base(sp, tier),
            sp.model,
            sp.dim,
            self.config.hnsw_ef_construction,
            self.store.instance,
            tuning=self.config.tuning,
            mapped=mapped,
        )

    def all_indexes(self) -> list[Index]:
        return [idx for sp in list(self.spaces.values()) for idx in list(sp.indexes.values())]

    def snapshot_base(self, sp: Space, tier: int) -> Path:
        # Model names may be long or hold any character: name files by a digest (the manifest keeps the name).
        return self.index_dir / f"{hashlib.sha256(sp.model.encode()).hexdigest()[:32]}-t{tier}"

    # -- ids -----------------------------------------------------------------------------------
    def alloc_ids(self) -> tuple[int, int]:
        """A new record id and vector key (writer thread; persisted with each commit)."""
        rid, vk = self.next_rid, self.next_vk
        self.next_rid += 1
        self.next_vk += 1
        return rid, vk

    def before_commit(self, txn: Txn) -> None:
        """The writer's last step of every commit group."""
        self.store.put_counters(txn, self.next_rid, self.next_vk)
        self.store.next_seq(txn, time.time())
        self.group_vectors.clear()  # committed now: the indexes will hold them once applied

    # -- reading rules ---------------------------------------------------------------------------
    @property
    def page_secret(self) -> bytes:
        """The key of this data's page tokens (``pages``): its leader's data's on a replica, promoted
        or not, so that tokens go on working across replicas and a failover."""
        with self.store.read() as txn:
            leader, _ = self.store.replica_position(txn)
        return pages.page_secret(leader.removeprefix(PROMOTED) or self.store.instance)

    def expired(self, rec: Record) -> bool:
        return rec.expired(self.clock())

    def allowed_rows(
        self, view: ColumnsView, namespaces: list[str], flt: Filter, now: float, space: int = -1
    ) -> tuple[np.ndarray, int]:
        """See ``index.masks.allowed_rows``."""
        return masks.allowed_rows(self.columns, view, namespaces, flt, now, space)

    def shared_allowed_rows(
        self,
        view: ColumnsView,
        namespaces: list[str],
        flt: Filter,
        now: float,
        space: int = -1,
        within: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """``allowed_rows`` from a cache of recent masks (``index.masks.MaskCache``): the caller must
        not change the mask."""
        return self._masks.allowed_rows(self.columns, view, namespaces, flt, now, space, within)

    def shared_mask_bits(self, mask: np.ndarray) -> np.ndarray | None:
        return self._masks.bits(mask)

    def check_filter(self, flt: Filter, prefix: str = "filter.") -> Filter:
        return masks.check_filter(flt, self.config.max_content_bytes, prefix)

    # -- lifecycle policy --------------------------------------------------------------------------
    def policy_for(self, namespace: str) -> Policy:
        return self._policies.policy_of(self.ns_config.get(namespace, {}), namespace)

    def policy_of(self, settings: dict[str, Any]) -> Policy:
        """The policy in effect under a namespace's stored settings."""
        return self._policies.policy_of(settings)

    def policy_tables(self) -> Tables:
        """Lifecycle tables for every interned namespace (policy_cache.py: rebuilt when settings
        change, not when a namespace appears)."""
        return self._policies.tables(self.columns.namespaces, lambda: self.ns_config, self.config_version)
