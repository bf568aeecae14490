"""Server configuration: every tunable with its default, in one place."""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from tiermem.server.config_rules import AT_LEAST_ONE, AT_LEAST_ZERO, AT_MOST, TIER_RULES, tls_fault

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# Tier values match the proto enum tiermem.v1.Tier.
TIER_FAST, TIER_MEDIUM, TIER_SLOW, TIER_GLACIAL = 1, 2, 3, 4
TIERS = (TIER_FAST, TIER_MEDIUM, TIER_SLOW, TIER_GLACIAL)
TIER_NAMES = {TIER_FAST: "FAST", TIER_MEDIUM: "MEDIUM", TIER_SLOW: "SLOW", TIER_GLACIAL: "GLACIAL"}

# Per-tier settings are tuples indexed by tier value; index 0 (TIER_UNSPECIFIED) is unused.
# Importance half-lives (hours): faster tiers forget faster.
DEFAULT_HALF_LIFE_HOURS = (0.0, 1.0, 24.0, 24.0 * 7, 24.0 * 30)
# Idle TTL / capacity / importance threshold: FAST 60 s / 1000 / 0.8, MEDIUM 1 h / 500 / 0.5,
# SLOW 1 day / 200 / 0.3, GLACIAL 1 week / 100 / 0.0.
DEFAULT_TTL_SECONDS = (0.0, 60.0, 3600.0, 86400.0, 604800.0)
DEFAULT_MAX_ITEMS = (0.0, 1000.0, 500.0, 200.0, 100.0)
DEFAULT_IMPORTANCE_THRESHOLD = (0.0, 0.8, 0.5, 0.3, 0.0)
# How often the background pass visits each tier: per event-ish, per round, per cycle, hourly.
DEFAULT_CADENCE_SECONDS = (0.0, 5.0, 60.0, 600.0, 3600.0)
PER_TIER = (
    "tier_ttl_seconds",
    "tier_max_items",
    "tier_importance_threshold",
    "tier_cadence_seconds",
    "half_life_hours",
)

RETENTION_POLICIES = {
    "importance_weighted": 1,
    "recency": 2,
    "fifo": 3,
    "lru": 4,
    "importance": 5,
    "ten_point_weighted": 6,
}
# Values match the proto enums tiermem.v1.ImportanceDecay, ImportanceHeuristic, RecencyBasis and
# SummaryStrategy.
IMPORTANCE_DECAYS = {"half_life": 1, "none": 2}
IMPORTANCE_HEURISTICS = {"cues": 1, "ten_point": 2, "phrases": 3}
RECENCY_BASES = {"creation": 1, "last_access": 2}
SUMMARY_STRATEGIES = {"rolling": 1, "hierarchical": 2}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` only listens on this machine (a loopback address or name)."""
    name = host.strip("[]").lower()
    if name in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # another name, or "" / "0.0.0.0"-like wildcards: other machines may reach it


class UnusableSetting(ValueError):
    """A setting found unusable only as the server starts (a model directory missing, an optional
    package not installed): the server stops before it serves, naming it in one line."""


@dataclass(frozen=True)
class Tuning:
    """Internal thresholds, grouped by the package that reads them. Not read from the environment:
    the defaults are what the benchmarks chose (docs/perf-log.md); tests and benchmarks set them
    through ``ServerConfig(tuning=Tuning(...))`` to reach a path at small sizes."""

    # index/: vector indexes and columns
    max_pending: int = 4096  # vectors an index holds outside HNSW (scanned exactly) before a write waits
    exact_entries: int = 2048  # an index this small is scanned exactly instead of searched through HNSW
    exact_per_k: int = 48  # ... and one whose allowed entries are at most this many per result wanted
    add_chunk: int = 32  # vectors moved into HNSW per write-lock hold while no search reads the index
    searched_chunk: int = 16  # ... and while searches do
    indexer_min_batch: int = 8  # the indexer waits for this many pending vectors ...
    indexer_linger_seconds: float = 0.005  # ... or this long, before moving them
    indexer_quiet_seconds: float = 1.0  # no search for this long: bulk moves on every core
    indexer_bulk_min: int = 256  # fewer pending than this: moves on one thread
    columns_change_log: int = 65536  # row changes the columns remember for cached search bounds
    columns_rebuild_dead: int = 16384  # a columns snapshot with this many deleted memories' rows ...
    columns_rebuild_dead_share: float = 0.75  # ... and this share of its rows: not restored (startup.py)

    # search/: candidate sets and cached prior bounds
    deeper_search_min_rows: int = (
        32768  # more rows than this still beat the bar: a deeper HNSW search among them first
    )
    prior_k: int = 64  # least HNSW depth of the first search when recency/importance/weights enter
    score_chunk: int = 1024  # rows scored exactly per step after the first
    first_score_chunk: int = 1024  # rows scored exactly in the first step
    deepen_levels: int = 3  # HNSW searches restricted to the rows whose bound still beats the bar
    bounds_max_age_seconds: float = 30.0  # cached prior bounds are recomputed after this long ...
    bounds_min_stale: int = 1024  # ... or after this many changed rows ...
    bounds_stale_share: float = 0.01  # ... or this share of all rows
    bounds_sorted_min: int = 65536  # sorted bounds keep at least this many rows ...
    bounds_sorted_share: float = 0.125  # ... or this share of all rows, best first
    # A ranking searches each tier's HNSW of at least this many entries beside the largest one, on
    # a helper thread, when a core is spare (0: never; search/candidates.py)
    tiers_beside_min_entries: int = 4096
    # A fused search with text, or hybrid on a weighted sum, over this many allowed rows or more
    # (and an HNSW search: over exact_search_max_rows) runs its keyword pass beside its vector
    # (candidate) search when a core is spare (0: never; 1: every such search)
    beside_min_rows: int = 1

    # core/: writes, followers, compaction, deduplication
    follow_interval_seconds: float = 0.05  # a follower looks for new commits this often when idle
    # An idle follower (no search for the first) leaves the commits while its leader commits, until
    # the leader is quiet for the second or for at most the third (core/follow.py Pace)
    follower_idle_seconds: float = 2.0
    follower_quiet_seconds: float = 0.25
    follower_defer_seconds: float = 30.0
    follower_forward_backlog: int = 4096  # more records to apply: its leader answers its searches
    follower_max_pending: int = 8 * 4096  # a follower's adds wait for its indexer beyond this many
    # With followers, the leader snapshots an index alone once this many entries (or a 64th of it)
    # entered its HNSW since the last (at most a fifth of the time spent writing them), so that
    # followers map it instead of searching a growing index of their own (0: never; background.py).
    follower_snapshot_entries: int = 2048
    # ... and after writing one waits as long as its bytes take at this rate (or four times as long
    # as the write took, if more), so rewriting a large index does not keep the disk busy (0: no cap).
    follower_snapshot_bytes_per_second: int = 32 << 20
    # A follower whose own HNSW entries in an index (those after the snapshot it maps) pass this
    # maps its leader's newer snapshot of that index instead (core/remap.py).
    follower_remap_entries: int = 1024
    compact_min_entries: int = 4096  # an index at least this large ...
    compact_dead_share: float = 0.75  # ... with at least this share dead ...
    compact_max_live: int = 4096  # ... and at most this many live entries is compacted
    dedup_group_limit: int = 4096  # vectors of one commit group compared for similarity dedup

    eviction_summary_tokens: int = 400  # most tokens of a summary of a pass's evictions (per namespace, tier)

    # transport/: follower processes
    follower_steady_seconds: float = 60.0  # a follower that served this long resets the restart delay
    follower_start_timeout_seconds: float = 1800.0  # a follower not serving after this long is killed

    # storage/: the commit log followers read
    commit_log_seconds: float = 600.0  # commit-log entries are dropped once this old
    commit_log_prune_every: int = 256  # commits between two looks for old commit-log entries


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one tiermem server. ``from_env`` reads ``TIERMEM_<FIELD>`` overrides."""

    host: str = "127.0.0.1"
    port: int = 50051
    data_dir: Path = Path("./data")

    # gRPC
    max_workers: int = 8  # handler threads: more only contend for the cores and the GIL
    max_concurrent_rpcs: int = 256  # beyond this, calls get RESOURCE_EXHAUSTED at once
    monitoring_reserved_rpcs: int = 16  # of those, kept for health checks and GetStats

    # Security (docs/security.md). API keys: a keys file (`tiermem keys add`), reloaded when it
    # changes; empty: no keys, every caller may do everything (refused off loopback, see insecure).
    api_keys: str = ""
    key_max_concurrent_rpcs: int = 0  # calls running at once per key (0: half of max_workers)
    key_rate_per_second: float = 0.0  # calls a second per key on average (0: no cap)
    key_burst: int = 200  # calls a key may make at once above its rate
    # TLS: the server's certificate chain and key (PEM); with a client CA, clients must present a
    # certificate it signed (mutual TLS).
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # Bind an address other than loopback without TLS or without API keys (else refused at start).
    insecure: bool = False
    # This server is one shard of several behind a proxy (docs/scaling.md): every request that names
    # namespaces must carry their top-level scope as tiermem-route metadata (a request with one is
    # checked against it either way).
    sharded: bool = False
    # Replicas on other hosts (docs/scaling.md). ``replication``: keep the commit log and feed
    # replicas (ReplicateChanges). ``replica_of``: this server is a replica of that address: it
    # copies everything there and serves reads, refusing writes until promoted (PromoteReplica).
    # ``replica_ack`` "sync": a write is answered once a replica has stored it too (waiting up to
    # replica_ack_timeout_seconds, then UNAVAILABLE REPLICA_NOT_CONFIRMED: stored here, not there).
    replication: bool = False
    replica_of: str = ""
    replica_api_key: str = ""  # the key the replica presents to its leader (an admin key there)
    replica_tls_ca: str = ""  # the CA the replica trusts for its leader's certificate (PEM); "": no TLS
    replica_ack: str = "async"
    replica_ack_timeout_seconds: float = 5.0
    # OpenTelemetry spans for every call (the tracing extra; exporters as OpenTelemetry configures them).
    tracing: bool = False
    # Prometheus metrics over HTTP at metrics_host:metrics_port/metrics (-1: none; 0: a free port).
    metrics_port: int = -1
    metrics_host: str = "127.0.0.1"
    # Searches ranking at once (0: the cores it may use, server/cores.py); the others wait their
    # turn: more than the cores only contend for them and for the GIL (docs/perf-log.md).
    search_concurrency: int = 0
    # Processes serving calls on the port: 1 is this one alone. N > 1 starts N - 1 search followers
    # (docs/followers.md) that serve searches from their own columns and the mapped index
    # snapshots, and forward every other call to this process, which alone writes. 0 (default):
    # one per core, at most 4, resolved as the server starts (transport/follower.py processes).
    search_processes: int = 0
    max_message_bytes: int = 64 * 1024 * 1024
    shutdown_grace_seconds: float = 5.0
    # The server process fixes glibc's mmap threshold at this many bytes (0: glibc's default, whose
    # rising threshold keeps freed memory in heaps; docs/perf-log.md).
    malloc_mmap_threshold: int = 4 * 1024 * 1024

    # LMDB. map_size is address space, not disk: reserve it large once (set_mapsize invalidates
    # open transactions); on MapFullError the writer doubles it, up to max_map_size.
    map_size: int = 64 * 1024**3
    max_map_size: int = 1024**4
    # sync=True: every acknowledged write is fsynced (one fsync per commit group) and survives
    # kill -9 and power loss. sync=False trades the power-loss guarantee (not kill -9) for speed.
    sync: bool = True
    max_group_ops: int = 1024  # most write operations committed together with one fsync

    # Limits on input
    max_content_bytes: int = 65536
    max_metadata_bytes: int = 16384
    max_metadata_keys: int = 64
    max_tags: int = 32
    max_batch_size: int = 1000
    max_search_limit: int = 1000
    max_page_size: int = 1000
    default_page_size: int = 100
    max_dimension: int = 4096

    # Records
    default_tier: int = TIER_SLOW
    # Memories stored without importance get importance.estimate() (a heuristic), not a constant.
    # Per namespace, observation importance accumulates until a reflection is due (10 on our 0-1
    # importance scale); raw events' tokens accumulate until a summary is due.
    reflection_threshold: float = 10.0
    summary_token_threshold: int = 8000
    # When a summary is due, the server may store one itself (extractive, no LLM; opt-in, usually
    # per namespace): rolling (the best sentences of the last summary and what followed) or
    # hierarchical (the best of each ten, then of each ten of those, until it fits).
    auto_summarize: bool = False
    summary_max_tokens: int = 2000
    summary_strategy: str = "rolling"
    # A namespace's FAST memories past this many tokens move to MEDIUM at the create that passed
    # it (working memory flushed to episodic); 0: never.
    working_token_limit: int = 0
    default_kind: str = "observation"

    # The weighted-sum strategies (comprehensive, weighted, fast_first):
    # score = alpha*relevance + beta*recency + gamma*importance
    alpha: float = 0.5
    beta: float = 0.3
    gamma: float = 0.2
    # The default (fused) strategy's recency and importance weights beside relevance 1: small, so
    # they decide between memories about equally relevant (docs/search.md).
    fused_beta: float = 0.1
    fused_gamma: float = 0.1
    recency_tau_seconds: float = 86400.0
    # Recency decays from each memory's creation (the designs' timestamp), or from its last access
    # (searches and feedback make it recent again); a namespace's policy may choose its own.
    recency_basis: str = "creation"
    half_life_hours: tuple[float, ...] = DEFAULT_HALF_LIFE_HOURS
    importance_floor: float = 0.1  # decayed importance never falls below floor * base importance
    importance_decay: str = "half_life"  # half_life (by tier, with the floor) or none (as stored)
    importance_heuristic: str = "cues"  # rates memories stored without importance: cues, ten_point, phrases
    # Searches count as accesses of what they return (access_count, last_access_time), committed in
    # the background every access_flush_seconds; a request can opt out with read_only.
    search_records_access: bool = True
    max_keyword_postings: int = 200_000  # hybrid search skips terms found in more memories than this
    access_flush_seconds: float = 1.0
    surprise_alpha: float = 0.3
    default_predicted_relevance: float = 0.5
    default_actual_usefulness: float = 0.5  # feedback with a prediction alone rates the memory this useful

    # Vectors: FAISS HNSW per (embedding space, tier)
    builtin_model: str = "tiermem-hash-v1"
    builtin_dimension: int = 384
    # With API keys, the embedding spaces every key may use ("model=dimension,..."); a key for part of
    # the namespaces may use others only when named under a namespace it covers ("user:ana/minilm").
    embedding_spaces: str = ""
    # The server's embedder for memories and queries sent as text: builtin, openai (any
    # OpenAI-compatible /embeddings endpoint at embedder_url with model embedder_model) or
    # sentence_transformers (a local model directory in embedder_model).
    embedder: str = "builtin"
    embedder_model: str = ""
    embedder_url: str = ""
    embedder_api_key_env: str = "TIERMEM_EMBEDDER_API_KEY"  # the variable holding the API key, if any
    embedder_timeout_seconds: float = 10.0
    embedding_cache_size: int = 10000  # LRU cache of embeddings by text
    embedder_batch_size: int = 0  # texts per request or forward pass (0: 64 openai, 32 sentence_transformers)
    embedder_concurrency: int = 4  # requests in flight to an OpenAI-compatible endpoint
    # After this many failed calls in a row the embedder fails at once for the cool-down, then tries
    # one call: a dead endpoint costs one timeout per cool-down, not one per memory.
    embedder_breaker_failures: int = 3
    embedder_breaker_cooldown_seconds: float = 30.0
    hnsw_m: int = 32
    hnsw_ef_construction: int = 128
    hnsw_ef_search: int = 64
    # When a search's filter keeps at most this many rows, they are scored exactly instead of
    # through HNSW (filtered HNSW loses recall at low selectivity; docs/perf-log.md).
    exact_search_max_rows: int = 6144
    snapshot_on_shutdown: bool = True
    # Periodic snapshots (0 disables): after this long with any change, or once the changed records
    # pass max(snapshot_min_changes, 10% of all); they bound the work of a start-up after kill -9.
    snapshot_interval_seconds: float = 300.0
    snapshot_min_changes: int = 20000
    # At start-up, up to this many vectors per embedding space missing from an index snapshot wait as
    # pending entries (searched exactly) and enter HNSW after SERVING; any beyond are indexed first.
    startup_pending_max: int = 131072  # per embedding space; searches scan them exactly until indexed
    # Bulk loads: once no search has read any index for a second and 256 or more vectors are
    # pending, the indexer moves up to this many per write-lock hold on every core (a search arriving
    # meanwhile waits for that move). 32 or less: always 32.
    index_bulk_chunk: int = 512

    # Lifecycle, overridable per namespace with UpdateNamespaceConfig.
    tier_ttl_seconds: tuple[float, ...] = DEFAULT_TTL_SECONDS  # idle longer than this: demote
    tier_max_items: tuple[float, ...] = DEFAULT_MAX_ITEMS  # capacity per namespace and tier
    tier_importance_threshold: tuple[float, ...] = DEFAULT_IMPORTANCE_THRESHOLD  # decayed below: demote
    tier_cadence_seconds: tuple[float, ...] = DEFAULT_CADENCE_SECONDS  # background visits per tier
    # eviction order: importance_weighted, ten_point_weighted, recency, fifo, lru, importance
    retention: str = "importance_weighted"
    delete_from_glacial: bool = False  # capacity eviction may delete from GLACIAL
    promote_access_count: int = 5  # accesses since entering the tier that promote
    promote_surprise: float = 0.5  # surprise that promotes, with an access since entering the tier
    promote_success_count: int = 3  # successes since entering the tier that promote

    # Maintenance: a background pass deletes expired memories, forgets old request ids and runs the
    # lifecycle for the tiers whose cadence is due.
    maintenance_interval_seconds: float = 5.0  # 0 disables the background pass (tests drive it)
    request_id_ttl_seconds: float = 86400.0  # a create retried within this window is deduplicated

    # Whole-tier maintenance runs elsewhere; the request path uses serial kernels.
    log_level: str = "INFO"
    log_format: str = "text"  # text, or json (one object a line, with the request id where there is one)
    tuning: Tuning = Tuning()  # internal thresholds (see Tuning); not read from the environment

    def __post_init__(self) -> None:
        """Reject settings that would break the server's assumptions, naming the setting."""

        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                value: Any = self
                for part in name.split("."):  # ("tuning.x": a field of the tuning)
                    value = getattr(value, part)
                raise ValueError(f"setting {name}={value!r}: {rule}")

        need(self.replica_ack in ("async", "sync"), "replica_ack", "must be async or sync")
        need(self.replica_ack == "async" or self.replication, "replica_ack", "sync needs replication")
        ack = self.replica_ack_timeout_seconds  # (at most a day: a longer wait overflows thread timers)
        need(0 < ack <= 86400, "replica_ack_timeout_seconds", "must be a number > 0 and at most 86400")
        need(
            not (self.replica_of and self.search_processes > 1),
            "replica_of",
            "a replica serves in one process",
        )
        for name in ("alpha", "beta", "gamma", "fused_beta", "fused_gamma"):
            weight = getattr(self, name)
            need(math.isfinite(weight) and weight >= 0, name, "must be a finite number >= 0")
        # Search bounds assume decayed importance never exceeds the base importance.
        need(0.0 <= self.importance_floor <= 1.0, "importance_floor", "must be in [0, 1]")
        self._check_tuning(need)
        for name, choices in (
            ("importance_decay", IMPORTANCE_DECAYS),
            ("importance_heuristic", IMPORTANCE_HEURISTICS),
            ("recency_basis", RECENCY_BASES),
            ("summary_strategy", SUMMARY_STRATEGIES),
        ):
            need(getattr(self, name) in choices, name, f"must be one of {sorted(choices)}")
        need(self.summary_max_tokens >= 1, "summary_max_tokens", "must be >= 1")
        need(self.working_token_limit >= 0, "working_token_limit", "must be >= 0 (0: never)")
        for name in ("default_predicted_relevance", "default_actual_usefulness"):
            need(0.0 <= getattr(self, name) <= 1.0, name, "must be in [0, 1]")
        need(
            math.isfinite(self.recency_tau_seconds) and self.recency_tau_seconds > 0,
            "recency_tau_seconds",
            "must be > 0",
        )
        for name in (
            "max_workers",
            "max_concurrent_rpcs",
            "key_burst",
            "embedder_concurrency",
            "embedder_breaker_failures",
            "max_group_ops",
            "hnsw_ef_construction",
            "hnsw_ef_search",
        ):
            need(getattr(self, name) >= 1, name, "must be >= 1")
        need(self.hnsw_m >= 2, "hnsw_m", "must be >= 2")
        need(self.search_processes >= 0, "search_processes", "must be >= 0 (0: one per core)")
        levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        need(self.log_level.upper() in levels, "log_level", f"must be one of {', '.join(levels)}")
        need(self.log_format in ("text", "json"), "log_format", "must be text or json")
        kinds = ("builtin", "openai", "sentence_transformers")
        need(self.embedder in kinds, "embedder", f"must be one of {', '.join(kinds)}")
        self._check_security(need)
        self._check_lifecycle(need)
        need(self.startup_pending_max >= 0, "startup_pending_max", "must be >= 0")
        need(
            0 <= self.malloc_mmap_threshold <= 32 * 1024 * 1024,
            "malloc_mmap_threshold",
            "must be in [0, 33554432] (0: glibc's default)",
        )
        need(self.index_bulk_chunk >= 0, "index_bulk_chunk", "must be >= 0 (32 or less: no bulk moves)")
        need(
            self.search_concurrency >= 0,
            "search_concurrency",
            "must be >= 0 (0: the cores the process may run on)",
        )
        for name in ("snapshot_interval_seconds", "maintenance_interval_seconds", "access_flush_seconds"):
            need(getattr(self, name) >= 0, name, "must be >= 0 (0 disables)")
        self._check_limits(need)

    def to_json(self) -> str:
        """Every setting as JSON (``from_json`` reads it back): how a follower gets its leader's."""
        values = {f.name: _jsonable(getattr(self, f.name)) for f in fields(self) if f.name != "tuning"}
        values["tuning"] = {f.name: getattr(self.tuning, f.name) for f in fields(Tuning)}
        return json.dumps(values)

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        defaults = cls()
        values: dict[str, Any] = {
            k: (tuple(v) if isinstance(getattr(defaults, k), tuple) else v)
            for k, v in json.loads(text).items()
        }
        values["data_dir"] = Path(values.get("data_dir", defaults.data_dir))
        values["tuning"] = Tuning(**values.get("tuning", {}))
        return replace(defaults, **values)

    def _check_limits(self, need: Callable[[bool, str, str], None]) -> None:
        need(0 <= self.port <= 65535, "port", "must be in [0, 65535] (0: any free port)")
        need(
            -1 <= self.metrics_port <= 65535,
            "metrics_port",
            "must be in [-1, 65535] (-1: none, 0: any free port)",
        )
        for name, most in AT_MOST.items():  # (larger ones start, then overflow a timer or a C int)
            need(getattr(self, name) <= most, name, f"must be at most {most:g}")
        for name in AT_LEAST_ONE.split():
            need(getattr(self, name) >= 1, name, "must be >= 1")
        for name in AT_LEAST_ZERO.split():
            value = getattr(self, name)
            need(math.isfinite(value) and value >= 0, name, "must be a finite number >= 0")
        need(self.default_page_size <= self.max_page_size, "default_page_size", "must be <= max_page_size")
        need(
            1 <= self.builtin_dimension <= self.max_dimension,
            "builtin_dimension",
            "must be in [1, max_dimension]",
        )
        need(self.embedder_timeout_seconds > 0, "embedder_timeout_seconds", "must be > 0")
        need(0.0 < self.surprise_alpha <= 1.0, "surprise_alpha", "must be in (0, 1]")
        need(0.0 <= self.promote_surprise <= 1.0, "promote_surprise", "must be in [0, 1]")
        need(bool(self.default_kind.strip()), "default_kind", "must not be empty")

    def _check_tuning(self, need: Callable[[bool, str, str], None]) -> None:
        # (every threshold is a count, a share or a time: none has a meaning below 0)
        for f in fields(Tuning):
            value = getattr(self.tuning, f.name)
            need(math.isfinite(value) and value >= 0, f"tuning.{f.name}", "must be a finite number >= 0")
        need(self.tuning.eviction_summary_tokens > 0, "tuning.eviction_summary_tokens", "must be > 0")

    def _check_lifecycle(self, need: Callable[[bool, str, str], None]) -> None:
        for name in PER_TIER:
            values = tuple(float(v) for v in getattr(self, name))
            if len(values) == len(TIERS):  # FAST..GLACIAL alone: the unused index 0 added
                values = (0.0, *values)
            object.__setattr__(self, name, values)  # (frozen: set once, here)
            need(
                len(values) == len(TIERS) + 1
                and values[0] == 0
                and all(math.isfinite(v) and v >= 0 for v in values[1:]),
                name,
                "needs 4 finite values >= 0, for FAST, MEDIUM, SLOW and GLACIAL (or 5, the first 0, unused)",
            )
            ok, rule = TIER_RULES.get(name, (lambda v: True, ""))
            need(all(ok(v) for v in values[1:]), name, f"needs values {rule}, as a namespace's policy")
        need(
            self.retention in RETENTION_POLICIES, "retention", f"must be one of {sorted(RETENTION_POLICIES)}"
        )
        need(
            self.default_tier in TIERS,
            "default_tier",
            "must be 1 (FAST), 2 (MEDIUM), 3 (SLOW) or 4 (GLACIAL)",
        )
        need(
            self.embedder != "openai" or bool(self.embedder_url and self.embedder_model),
            "embedder",
            "openai needs embedder_url and embedder_model",
        )
        need(
            self.embedder != "sentence_transformers" or bool(self.embedder_model),
            "embedder",
            "sentence_transformers needs embedder_model (the model's directory)",
        )

    def _check_security(self, need: Callable[[bool, str, str], None]) -> None:
        need(
            0 <= self.monitoring_reserved_rpcs < self.max_concurrent_rpcs,
            "monitoring_reserved_rpcs",
            "must be >= 0 and below max_concurrent_rpcs",
        )
        need(
            self.key_max_concurrent_rpcs >= 0,
            "key_max_concurrent_rpcs",
            "must be >= 0 (0: half of max_workers)",
        )
        need(self.embedder_batch_size >= 0, "embedder_batch_size", "must be >= 0 (0: the embedder's own)")
        need(
            math.isfinite(self.embedder_breaker_cooldown_seconds)
            and self.embedder_breaker_cooldown_seconds >= 0,
            "embedder_breaker_cooldown_seconds",
            "must be a finite number >= 0",
        )
        need(
            math.isfinite(self.key_rate_per_second) and self.key_rate_per_second >= 0,
            "key_rate_per_second",
            "must be a finite number >= 0 (0: no cap)",
        )
        try:
            spaces = self.declared_spaces
        except ValueError as e:
            need(False, "embedding_spaces", str(e))
        else:
            builtin = spaces.get(self.builtin_model, self.builtin_dimension)
            need(
                builtin == self.builtin_dimension or self.embedder != "builtin",
                "embedding_spaces",
                f"the built-in embedder's model {self.builtin_model} has dimension {self.builtin_dimension}",
            )
        need(bool(self.tls_cert) == bool(self.tls_key), "tls_key", "tls_cert and tls_key go together")
        need(not self.tls_client_ca or bool(self.tls_cert), "tls_client_ca", "needs tls_cert and tls_key")
        for name in ("api_keys", "tls_cert", "tls_key", "tls_client_ca", "replica_tls_ca"):
            path = getattr(self, name)
            need(not path or os.path.isfile(path), name, f"{path!r} is not a readable file")
        # (gRPC would refuse them only at the bind, reported as a port that cannot be listened on)
        for name, files in (
            ("tls_cert", self.tls_cert and (self.tls_cert, self.tls_key)),
            ("tls_client_ca", self.tls_client_ca),
        ):
            fault = tls_fault(files) if files else ""
            need(not fault, name, f"{files!r} do not load: {fault}")
        exposed = not is_loopback(self.host)
        need(
            self.insecure or not exposed or (bool(self.tls_cert) and bool(self.api_keys)),
            "host",
            f"{self.host!r} is reachable from other machines: serve it with TLS (tls_cert, tls_key) and "
            "API keys (api_keys), or say insecure to do without",
        )

    @cached_property
    def declared_spaces(self) -> dict[str, int]:
        """``embedding_spaces`` by model (read once); ValueError saying what is wrong with it."""
        out: dict[str, int] = {}
        for item in filter(None, (x.strip() for x in self.embedding_spaces.split(","))):
            model, eq, dim = (x.strip() for x in item.rpartition("="))
            if not (model and eq and dim.isascii() and dim.isdigit() and 0 < int(dim) <= self.max_dimension):
                raise ValueError(
                    f"{item!r} is not model=dimension (a dimension of 1 to {self.max_dimension})"
                )
            if len(model) > 256 or not model.isprintable():
                raise ValueError(f"{model[:40]!r} is not a model name (printable, at most 256 characters)")
            if model in out:
                raise ValueError(f"model {model} is named twice")
            out[model] = int(dim)
        return out

    @classmethod
    def from_env(
        cls, env: dict[str, str] | None = None, config_file: str | Path | None = None, **overrides: Any
    ) -> ServerConfig:
        """Defaults, then a TOML settings file (``config_file``, or the file ``TIERMEM_CONFIG``
        names), then ``TIERMEM_*`` environment variables, then explicit overrides (the flags). An
        unknown variable or file key is a ValueError naming it."""
        env = dict(os.environ if env is None else env)
        defaults = cls()
        names = {f.name for f in fields(cls) if f.name != "tuning"}
        values: dict[str, Any] = {}
        path = config_file or env.get("TIERMEM_CONFIG")
        if path:
            values.update(_read_file(Path(path), names, defaults))
        known = {f"TIERMEM_{n.upper()}" for n in names} | NOT_SETTINGS
        # The key's variable: the default's, and the one the settings name (an override, else the
        # environment, else the file), wherever a TIERMEM_ name for it was chosen.
        key_env = overrides.get("embedder_api_key_env") or env.get("TIERMEM_EMBEDDER_API_KEY_ENV")
        known |= {defaults.embedder_api_key_env, str(key_env or values.get("embedder_api_key_env", ""))}
        unknown = sorted(k for k in env if k.startswith("TIERMEM_") and k not in known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ValueError(f"unknown setting {', '.join(unknown)} in the environment{hint}")
        for name in names:
            raw = env.get(f"TIERMEM_{name.upper()}")
            if raw is not None:
                values[name] = _parse(name, raw, getattr(defaults, name))
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" in values:
            values["data_dir"] = Path(values["data_dir"])
        return replace(defaults, **values)

    def summary(self) -> str:
        """The settings an operator checks first, in one line (logged at start; no secrets)."""
        security = (
            ("API keys " + self.api_keys if self.api_keys else "no API keys")
            + (", TLS" + (" (mutual)" if self.tls_client_ca else "") if self.tls_cert else ", no TLS")
            + (", insecure allowed" if self.insecure else "")
        )
        model = f" {self.embedder_model}" if self.embedder_model else ""
        return (
            f"data {Path(self.data_dir).resolve()}; embedder {self.embedder}{model}; {security}; "
            f"max {self.max_concurrent_rpcs} calls in flight ({self.monitoring_reserved_rpcs} for monitoring), "
            f"per key {self.key_max_concurrent_rpcs or max(1, self.max_workers // 2)} running, "
            f"{self.key_rate_per_second or 'no cap'} a second; {self.max_workers} handler threads; "
            f"search processes {self.search_processes}; sync {self.sync}"
            + ("; a shard (routing keys required)" if self.sharded else "")
            + (f"; replicating ({self.replica_ack})" if self.replication else "")
            + (f"; a replica of {self.replica_of}" if self.replica_of else "")
        )


# TIERMEM_* variables that are not server settings: the settings file's path, the admin command's
# token, the test suite's switches (which interop tests must run rather than skip).
NOT_SETTINGS = {
    "TIERMEM_CONFIG",
    "TIERMEM_API_KEY",
    "TIERMEM_REQUIRE_NODE",
    "TIERMEM_REQUIRE_GO",
    "TIERMEM_REQUIRE_HAPROXY",
    "TIERMEM_FOLLOWER_CONFIG",  # a search follower's settings and its leader's secret
    "TIERMEM_FOLLOWER_SECRET",
}


def _read_file(path: Path, names: set[str], defaults: ServerConfig) -> dict[str, Any]:
    """The settings of a TOML file: top-level keys named as the settings; unknown keys refused."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ValueError(f"cannot read the settings file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"the settings file {path} is not TOML: {e}") from None
    unknown = sorted(k for k in data if k not in names)
    if unknown:
        raise ValueError(f"unknown setting {', '.join(unknown)} in {path}")
    out: dict[str, Any] = {}
    for k, v in data.items():
        default = getattr(defaults, k)
        if isinstance(default, tuple) and isinstance(v, list):
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
                raise ValueError(f"setting {k} in {path}: {v!r} is not a list of numbers")
            v = tuple(float(x) for x in v)
        elif isinstance(default, Path) and isinstance(v, str):  # (5 or [..] would be a directory's name)
            v = Path(v)
        elif isinstance(default, float) and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if type(v) is not type(default):
            raise ValueError(f"setting {k} in {path}: {v!r} is not a valid {type(default).__name__}")
        out[k] = v
    return out


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, tuple):
            return tuple(float(x) for x in raw.split(","))
        if isinstance(default, Path):
            return Path(raw)
        return raw
    except ValueError as e:
        raise ValueError(f"TIERMEM_{name.upper()}={raw!r} is not a valid {type(default).__name__}") from e
