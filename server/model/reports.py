"""Typed results that cross from the engine to the transport: what a create did, a namespace's
progress toward a reflection or summary, server and namespace statistics, a lifecycle pass's
report, and the items of an export stream. Plain data: no I/O, no imports from the server's layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tiermem.server.model.records import Record


@dataclass
class Due:
    """Whether a namespace has accumulated enough for a reflection and for a summary."""

    reflection: bool = False
    summary: bool = False  # due, and the agent is expected to store one
    summary_kept: bool = False  # due, and the server stores one itself (auto_summarize)


@dataclass
class CreateOutcome:
    """What a create stored: the records (in request order), which of them reinforced an existing
    memory instead of adding one, and what each namespace written to is now due for."""

    records: list[Record]
    reinforced: list[bool]
    due: dict[str, Due]


@dataclass
class ScopeState:
    """A namespace's progress: observation importance since its last reflection, tokens since its
    last summary, the record id of its current summary (0: none) and the last record id that
    summary covers (an agent's covers every earlier one; one the server built, those it read)."""

    reflection_importance: float = 0.0
    summary_tokens: int = 0
    summary_rid: int = 0
    covered_rid: int = 0


@dataclass
class ScopeProgress:
    """A namespace's ScopeState with the thresholds applied (GetReflectionCandidates, stats)."""

    reflection_importance: float
    reflection_due: bool
    summary_tokens: int
    summary_due: bool
    summary_rid: int
    covered_rid: int = 0


@dataclass
class TierStats:
    tier: int
    count: int
    avg_importance: float
    avg_surprise: float
    totals: list[int]  # [promotions, demotions, evictions, deletions] since the data directory began
    last_hour: list[int]  # [promotions, demotions, evictions, deletions] in the last hour


@dataclass
class SpaceStats:
    model: str
    dim: int
    live: int  # vectors of live memories
    indexed: int  # entries in HNSW (live or dead)
    pending: int  # vectors waiting to enter HNSW (searched exactly meanwhile)


@dataclass
class StatsReport:
    search_hits: int
    search_misses: int
    memory_count: int
    namespace_count: int
    tiers: list[TierStats]
    spaces: list[SpaceStats]
    writes_committed: int
    commit_groups: int
    uptime_seconds: float
    storage_bytes: int
    version: str
    summaries_stored: int = 0  # summaries the server stored itself (kept and of evictions)
    summary_tokens_saved: int = 0
    summary_failures: int = 0


@dataclass
class PlannedMove:
    namespace: str
    id: str
    from_tier: int
    to_tier: int  # 0: deleted
    reason: int  # a lifecycle reason code (core.policy)


@dataclass
class ConsolidationReport:
    promoted: int = 0
    demoted: int = 0
    evicted: int = 0
    deleted: int = 0
    over_capacity: int = 0
    skipped: int = 0  # planned moves not applied: the memory changed meanwhile
    plan_seconds: float = 0.0
    apply_seconds: float = 0.0
    max_pause_seconds: float = 0.0  # longest time searches waited on an index during the pass
    moves: list[PlannedMove] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return self.promoted + self.demoted + self.evicted + self.deleted


@dataclass
class ExportHeader:
    format_version: int
    server_version: str
    export_time: float
    embedder_model: str
    namespace: str


@dataclass
class ExportedMemory:
    record: Record
    vector: np.ndarray | None  # None: stored while the embedder failed; embedded on import


@dataclass
class ExportedScope:
    namespace: str
    reflection_importance: float
    summary_tokens: int


@dataclass
class ExportedGraphItem:
    kind: str  # "node" or "edge"
    namespace: str
    item: dict[str, Any]


@dataclass
class ExportedSettings:
    namespace: str
    settings: dict[str, Any]  # stored form: "protected" (True) and/or "policy" (overrides)


ExportItem = ExportedMemory | ExportedScope | ExportedGraphItem | ExportedSettings


@dataclass
class ImportResult:
    imported: int  # memories stored
    reembedded: int  # of them, embedded again by this server's embedder
    graph_items: int  # nodes and edges stored
    settings: int = 0  # namespaces whose settings were set


@dataclass
class SweepReport:
    """What a maintenance sweep removed."""

    expired_deleted: int  # expired memories deleted
    request_ids_forgotten: int  # request ids older than request_id_ttl_seconds forgotten


@dataclass
class FollowerReport:
    """What a search follower hands its leader: the accesses its searches recorded (record id, how
    many, the last one's time) and its search hit counts (per namespace [hits, misses], and in all)."""

    accesses: list[tuple[int, int, float]] = field(default_factory=list)
    searches: dict[str, list[int]] = field(default_factory=dict)
    total: list[int] = field(default_factory=lambda: [0, 0])

    def to_wire(self) -> dict[str, Any]:
        """The plain form sent between processes (msgpack)."""
        return {"access": [list(a) for a in self.accesses], "searches": self.searches, "total": self.total}

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> FollowerReport:
        return cls(
            [(int(rid), int(n), float(last)) for rid, n, last in wire.get("access", [])],
            {str(ns): [int(h), int(m)] for ns, (h, m) in wire.get("searches", {}).items()},
            [int(x) for x in wire.get("total", [0, 0])],
        )
