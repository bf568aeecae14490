"""Tier lifecycle: per-namespace policies and the planning of a consolidation pass.

Planning is pure computation over a ``ColumnsView`` (no LMDB, no gRPC): Numba kernels decide, over
whole arrays, each memory's promotion or demotion and its retention score, then capacity is enforced
tier by tier from FAST to GLACIAL (evictions move one tier slower, so they can cascade). The engine
applies the resulting ``Plan`` through the writer.

A pass runs in this order: expired memories are deleted; promotion bottom to top and demotion
(one tier per pass, so a memory never ping-pongs within a pass, unless the namespace promotes
through the tiers; promotion evidence counts from the memory's entry into its tier); then the
namespace and kind caps (deletions); then capacity per namespace and tier by the retention policy.
Decay (half-life and floor, or none), the heuristic rating, the caps, the named presets
(presets.py) and the searches' recency basis (creation or last access) are per namespace too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from tiermem import kernels
from tiermem.server.config import (
    IMPORTANCE_DECAYS,
    IMPORTANCE_HEURISTICS,
    RECENCY_BASES,
    RETENTION_POLICIES,
    SUMMARY_STRATEGIES,
    TIERS,
    ServerConfig,
)
from tiermem.server.core.presets import PRESETS
from tiermem.server.index.columns import ColumnsView, Interner

# Move reasons (values of tiermem.v1.MoveReason); 1-5 are the kernel's actions.
PROMOTE_ACCESS, PROMOTE_SURPRISE, PROMOTE_SUCCESS, DEMOTE_IDLE, DEMOTE_DECAY = 1, 2, 3, 4, 5
EVICT_CAPACITY, DELETE_CAPACITY, EXPIRED, FLUSH_WORKING = 6, 7, 8, 9
STAY = 0
EVICTION_SUMMARY_KIND = "eviction_summary"  # the kind of the summaries a tier's evictions store
PROMOTIONS = (PROMOTE_ACCESS, PROMOTE_SURPRISE, PROMOTE_SUCCESS)
DEMOTIONS = (DEMOTE_IDLE, DEMOTE_DECAY)

TIER_FIELDS = ("ttl_seconds", "max_items", "importance_threshold", "half_life_hours", "cadence_seconds")
POLICY_FIELDS = (
    "retention",
    "delete_from_glacial",
    "promote_access_count",
    "promote_surprise",
    "promote_success_count",
    "reflection_threshold",
    "summary_token_threshold",
    "default_importance",
    "importance_decay",
    "importance_floor",
    "importance_heuristic",
    "promote_through_tiers",
    "decay_grace",
    "summarize_evictions",
    "max_items",
    "kind_capacities",
    "evict_share",
    "evict_on_create",
    "preset",
    "recency_basis",
    "auto_summarize",
    "summary_max_tokens",
    "summary_strategy",
    "working_token_limit",
)
DECAY_HALF_LIFE, DECAY_NONE = IMPORTANCE_DECAYS["half_life"], IMPORTANCE_DECAYS["none"]


NO_CAP = np.iinfo(np.int64).max  # (a cap array's entry for a namespace without one)


@dataclass(frozen=True)
class TierSettings:
    ttl_seconds: float
    max_items: int
    importance_threshold: float
    half_life_hours: float
    cadence_seconds: float


@dataclass(frozen=True)
class Policy:
    """A complete lifecycle policy (server settings with a namespace's overrides applied)."""

    tiers: dict[int, TierSettings]
    retention: int
    delete_from_glacial: bool
    promote_access_count: int
    promote_surprise: float
    promote_success_count: int
    reflection_threshold: float  # 0: reflections are never due
    summary_token_threshold: int  # 0: summaries are never due
    default_importance: float | None = None  # None: estimated from content and kind
    importance_decay: int = DECAY_HALF_LIFE  # DECAY_NONE: the stored importance, whatever its age
    importance_floor: float = 0.1  # decayed importance never below this share of the stored one
    importance_heuristic: int = IMPORTANCE_HEURISTICS["cues"]  # rates memories stored without one
    promote_through_tiers: bool = False  # a pass promotes through every faster tier, not one
    decay_grace: bool = True  # below the threshold: demoted after one TTL in the tier (False: at once)
    summarize_evictions: bool = False  # a tier's capacity eviction stores a summary of what it evicted
    max_items: int = 0  # the namespace's memories across tiers and kinds (0: no cap)
    kind_capacities: dict[str, int] = field(default_factory=dict)  # memories by kind across tiers
    evict_share: float = 0.0  # over a namespace or kind cap: this share goes (at least the surplus)
    evict_on_create: bool = False  # namespace and kind caps enforced when a create crosses them
    preset: str = ""  # the preset applied under the namespace's own overrides
    recency_basis: int = RECENCY_BASES["creation"]  # searches' recency decays from creation or last access
    auto_summarize: bool = False  # a due summary is built and stored by the server
    summary_max_tokens: int = 2000  # the most tokens of a summary the server stores
    summary_strategy: int = SUMMARY_STRATEGIES["rolling"]
    working_token_limit: int = 0  # FAST memories past this many tokens move to MEDIUM (0: never)

    @classmethod
    def from_config(cls, c: ServerConfig) -> Policy:
        # (the settings were checked by ServerConfig: retention and the per-tier values)
        return cls(
            tiers={
                t: TierSettings(
                    float(c.tier_ttl_seconds[t]),
                    int(c.tier_max_items[t]),
                    float(c.tier_importance_threshold[t]),
                    float(c.half_life_hours[t]),
                    float(c.tier_cadence_seconds[t]),
                )
                for t in TIERS
            },
            retention=RETENTION_POLICIES[c.retention],
            delete_from_glacial=c.delete_from_glacial,
            promote_access_count=c.promote_access_count,
            promote_surprise=c.promote_surprise,
            promote_success_count=c.promote_success_count,
            reflection_threshold=c.reflection_threshold,
            summary_token_threshold=c.summary_token_threshold,
            importance_decay=IMPORTANCE_DECAYS[c.importance_decay],
            importance_floor=c.importance_floor,
            importance_heuristic=IMPORTANCE_HEURISTICS[c.importance_heuristic],
            recency_basis=RECENCY_BASES[c.recency_basis],
            auto_summarize=c.auto_summarize,
            summary_max_tokens=c.summary_max_tokens,
            summary_strategy=SUMMARY_STRATEGIES[c.summary_strategy],
            working_token_limit=c.working_token_limit,
        )

    def with_overrides(self, overrides: dict[str, Any]) -> Policy:
        """Apply stored overrides: {"tiers": {tier: {field: value}}, field: value, ...}; a preset's
        overrides first, the namespace's own over them."""
        if overrides.get("preset"):  # (one no longer known, stored by another version: none)
            return self._apply(PRESETS.get(overrides["preset"], {}))._apply(overrides)
        return self._apply(overrides)

    def _apply(self, overrides: dict[str, Any]) -> Policy:
        tiers = dict(self.tiers)
        for t, fields_ in (overrides.get("tiers") or {}).items():
            tiers[int(t)] = replace(tiers[int(t)], **fields_)
        top = {k: v for k, v in overrides.items() if k in POLICY_FIELDS and v is not None}
        return replace(self, tiers=tiers, **top)


@dataclass
class Tables:
    """Per-namespace lookup tables the kernels read, indexed by namespace id (then tier)."""

    half_life: np.ndarray  # (n, 5) float64
    ttl: np.ndarray  # (n, 5) float64
    threshold: np.ndarray  # (n, 5) float32
    capacity: np.ndarray  # (n, 5) int64
    cadence: np.ndarray  # (n, 5) float64
    promote_access: np.ndarray  # (n,) int64
    promote_surprise: np.ndarray  # (n,) float32
    promote_success: np.ndarray  # (n,) int64
    retention: np.ndarray  # (n,) int8
    delete_glacial: np.ndarray  # (n,) bool
    floor: np.ndarray  # (n,) float64: decayed importance never below floor * stored importance
    decay_grace: np.ndarray  # (n,) bool: demotion below the threshold waits one TTL in the tier
    through: np.ndarray  # (n,) bool: promotion goes through every faster tier in one pass
    summarize: np.ndarray  # (n,) bool: tier capacity evictions are summarized
    max_items: np.ndarray  # (n,) int64: the namespace's cap across tiers (int64 max: none)
    evict_share: np.ndarray  # (n,) float64: the share a namespace or kind cap evicts when passed
    recency_basis: np.ndarray  # (n,) int8: searches' recency from creation (1) or last access (2)
    kind_caps: dict[int, dict[str, int]] = field(default_factory=dict)  # namespace id: {kind: cap}

    @cached_property
    def score(self) -> kernels.ScoreTables:
        """half_life and floor checked for the scoring kernels, once (the tables are not changed after
        ``build``): a search passes these rather than having them checked again."""
        return kernels.score_tables(self.half_life, self.floor)

    @cached_property
    def caps_by_kind(self) -> dict[str, np.ndarray]:
        """Each capped kind's cap per namespace id (NO_CAP where none), once: passes read it whole."""
        out: dict[str, np.ndarray] = {}
        for nid, caps in self.kind_caps.items():
            for kind, cap in caps.items():
                out.setdefault(kind, np.full(self.max_items.shape[0], NO_CAP, np.int64))[nid] = cap
        return out

    @classmethod
    def build(cls, n: int, base: Policy, groups: Iterable[tuple[Policy, np.ndarray]] = ()) -> Tables:
        """Tables for namespace ids 0..n-1: ``base`` everywhere but at each group's ids (below n), its policy."""
        n = max(1, n)
        t = cls(
            half_life=np.zeros((n, 5), np.float64),
            ttl=np.full((n, 5), np.inf, np.float64),
            threshold=np.zeros((n, 5), np.float32),
            capacity=np.full((n, 5), np.iinfo(np.int64).max, np.int64),
            cadence=np.zeros((n, 5), np.float64),
            promote_access=np.ones(n, np.int64),
            promote_surprise=np.ones(n, np.float32),
            promote_success=np.ones(n, np.int64),
            retention=np.ones(n, np.int8),
            delete_glacial=np.zeros(n, np.bool_),
            floor=np.zeros(n, np.float64),
            decay_grace=np.ones(n, np.bool_),
            through=np.zeros(n, np.bool_),
            summarize=np.zeros(n, np.bool_),
            max_items=np.full(n, np.iinfo(np.int64).max, np.int64),
            evict_share=np.zeros(n, np.float64),
            recency_basis=np.ones(n, np.int8),
        )
        t._fill(slice(None), base)
        for p, ids in groups:
            t._fill(ids[ids < n], p)
        return t

    def _fill(self, i: np.ndarray | slice, p: Policy) -> None:
        for tier, s in p.tiers.items():
            self.half_life[i, tier] = s.half_life_hours
            self.ttl[i, tier] = s.ttl_seconds
            self.threshold[i, tier] = s.importance_threshold
            self.capacity[i, tier] = s.max_items
            self.cadence[i, tier] = s.cadence_seconds
        self.promote_access[i] = p.promote_access_count
        self.promote_surprise[i] = p.promote_surprise
        self.promote_success[i] = p.promote_success_count
        if p.importance_decay == DECAY_NONE:
            self.half_life[i, :] = np.inf  # (no decay)
        self.retention[i] = p.retention
        self.delete_glacial[i] = p.delete_from_glacial
        self.floor[i] = p.importance_floor
        self.decay_grace[i] = p.decay_grace
        self.through[i] = p.promote_through_tiers
        self.summarize[i] = p.summarize_evictions
        self.max_items[i] = p.max_items or np.iinfo(np.int64).max
        self.evict_share[i] = p.evict_share
        self.recency_basis[i] = p.recency_basis
        caps = {k: n for k, n in p.kind_capacities.items() if n > 0}  # (0: no cap, as max_items)
        if isinstance(i, np.ndarray) and caps:  # (the server's policy has no kind caps)
            self.kind_caps.update(dict.fromkeys(i.tolist(), caps))


@dataclass
class Steps:
    """Every step of a plan's moves, a row's in order: most rows take one, a row evicted on from a
    tier it entered in the same pass (demoted or evicted into a full tier) two or more."""

    at: np.ndarray  # index into the plan's rows
    from_tier: np.ndarray  # int8: the tier the step leaves
    to_tier: np.ndarray  # int8; 0 = delete
    reason: np.ndarray  # int8 MoveReason

    @classmethod
    def none(cls) -> Steps:
        no = np.empty(0, np.int8)
        return cls(np.empty(0, np.int64), no, no, no)


@dataclass
class Plan:
    """What a pass decided: parallel arrays over the rows that change."""

    rows: np.ndarray  # column rows
    from_tier: np.ndarray  # int8
    to_tier: np.ndarray  # int8; 0 = delete
    reason: np.ndarray  # int8 MoveReason
    over_capacity: int = 0  # rows left above capacity in GLACIAL (deleting not allowed)
    counts: dict[str, int] = field(default_factory=dict)  # steps by kind
    steps: Steps = field(default_factory=Steps.none)
    # The rows a tier's capacity evicted, by (namespace id, tier), where the namespace summarizes them.
    summaries: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


def plan_pass(
    view: ColumnsView,
    tables: Tables,
    *,
    now: float,
    tau_seconds: float,
    in_scope: np.ndarray,
    due: np.ndarray,
    floor: float | None = None,
    kinds: Interner | None = None,
    only_caps: bool = False,
    keep: np.ndarray | None = None,
) -> Plan:
    """Decide a pass over the rows ``in_scope`` (alive rows of the namespaces concerned), for the
    (namespace, tier) pairs that ``due`` ((namespaces, 5) bool) marks. ``floor``: one decay floor
    for every namespace instead of each one's; ``kinds``: the kind names of the columns' kind ids
    (for kind caps); ``only_caps``: only the namespace and kind caps (a create that crossed one);
    ``keep``: rows that stay whatever their retention (counted against the caps all the same)."""
    ns = view.ns  # every row's namespace id is < due.shape[0]: tables cover all interned namespaces
    tier = view.tier
    expired = in_scope & (view.expire <= now)
    live = in_scope & ~expired
    eligible = live & due[ns, tier] & (not only_caps)
    fl = tables.floor if floor is None else floor
    action, decayed = _decide_moves(view, tables, eligible, now=now, floor=fl)
    target = tier.copy()
    promote = (action >= PROMOTE_ACCESS) & (action <= PROMOTE_SUCCESS)
    demote = (action == DEMOTE_IDLE) | (action == DEMOTE_DECAY)
    target[promote] -= 1
    # The promotion rules and their evidence are the same in every tier of a namespace: one that
    # holds in a tier holds in each faster one, so promoting through the tiers ends in FAST.
    target[promote & tables.through[ns]] = 1
    target[demote] += 1
    reason = action.copy()
    reason[expired] = EXPIRED
    target[expired] = 0
    retention = kernels.retention_scores(
        ns=ns,
        policy=tables.retention,
        decayed=decayed,
        accessed_at=view.accessed,
        created_at=view.created,
        tier_since=view.tier_since,
        now=now,
        tau_seconds=tau_seconds,
    )
    if keep is not None:
        retention[keep] = np.inf  # (higher stays: the others are chosen first)
    state = _PassState(view, tables, now, fl, tau_seconds, target, reason, retention)
    state.enter(np.flatnonzero(live & (target != tier)))
    _enforce_caps(state, live, due, kinds)
    plan = Plan(rows=np.empty(0, np.int64), from_tier=tier[:0], to_tier=target[:0], reason=reason[:0])
    if not only_caps:
        _enforce_capacity(state, live, due, plan.summaries)
        _room_for_summaries(state, live, plan.summaries, kinds)
        plan.over_capacity = _over_glacial(state, live, due)
    changed = np.flatnonzero(in_scope & ((target != tier) | expired))
    plan.rows, plan.from_tier = changed, tier[changed].copy()
    plan.to_tier, plan.reason = target[changed], reason[changed]
    plan.steps = state.steps(changed)
    by_reason = np.bincount(plan.steps.reason, minlength=EXPIRED + 1)
    plan.counts = {
        "promoted": int(by_reason[list(PROMOTIONS)].sum()),
        "demoted": int(by_reason[list(DEMOTIONS)].sum()),
        "evicted": int(by_reason[EVICT_CAPACITY]),
        "deleted": int(by_reason[DELETE_CAPACITY] + by_reason[EXPIRED]),
    }
    return plan


def _decide_moves(
    view: ColumnsView, tables: Tables, eligible: np.ndarray, *, now: float, floor: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(action, decayed importance) of every row: the kernel's promotion or demotion of the
    ``eligible`` rows (0: stays), and every row's importance decayed to ``now``."""
    return kernels.plan_moves(
        eligible=eligible,
        ns=view.ns,
        tier=view.tier,
        importance=view.importance,
        created_at=view.created,
        accessed_at=view.accessed,
        tier_since=view.tier_since,
        access_count=view.access_count,
        access_base=view.access_base,
        surprise=view.surprise,
        success_count=view.success,
        success_base=view.success_base,
        now=now,
        floor=floor,
        half_life_hours=tables.half_life,
        ttl_seconds=tables.ttl,
        threshold=tables.threshold,
        promote_access=tables.promote_access,
        promote_surprise=tables.promote_surprise,
        promote_success=tables.promote_success,
        decay_grace=tables.decay_grace,
    )


@dataclass
class _PassState:
    """What the steps of a pass share: every row's target tier and reason (decided step by step,
    in place), its retention score as ranked in its target tier, and the steps a row took before
    its last one (into a tier that then evicted it)."""

    view: ColumnsView
    tables: Tables
    now: float
    floor: float | np.ndarray
    tau_seconds: float
    target: np.ndarray  # int8 per row; 0 = delete
    reason: np.ndarray  # int8 MoveReason per row
    retention: np.ndarray  # per row
    source: np.ndarray = field(init=False)  # int8 per row: the tier its last step leaves
    home_retention: np.ndarray = field(init=False)  # per row: as ranked where it is
    earlier: list[tuple[np.ndarray, np.ndarray, int, np.ndarray]] = field(default_factory=list)
    stepped: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # row: where ``earlier`` has it
    indexed: int = 0  # the entries of ``earlier`` that ``stepped`` covers (filled when keep needs it)

    def __post_init__(self) -> None:
        self.source = self.view.tier.copy()
        self.home_retention = self.retention.copy()

    def evict(self, rows: np.ndarray, t: int, to: int, reason: int) -> None:
        """``rows`` leave tier ``t`` (their target) for ``to``; the step into ``t`` of those that
        entered it this pass (demoted, evicted or promoted into it) is kept."""
        came = rows[self.view.tier[rows] != t]
        if came.shape[0]:
            self.earlier.append((came, self.source[came].copy(), t, self.reason[came].copy()))
        self.source[rows] = t
        self.target[rows] = to
        self.reason[rows] = reason
        if to:
            self.enter(rows)

    def keep(self, row: int, t: int) -> None:
        """``row``, whose last step leaves tier ``t``, stays in ``t``: that step is undone."""
        self.target[row] = t
        for k in range(self.indexed, len(self.earlier)):
            for j, r in enumerate(self.earlier[k][0].tolist()):
                self.stepped.setdefault(r, []).append((k, j))
        self.indexed = len(self.earlier)
        for k, j in self.stepped.get(row, ()):
            rows, source, tier, why = self.earlier[k]
            if tier != t or rows[j] != row:
                continue
            # (it came into t this pass: that step is its last again, and leaves the earlier ones)
            self.source[row], self.reason[row] = source[j], why[j]
            rows[j] = -1
            self.enter(np.array([row]))
            return
        self.reason[row] = STAY
        self.retention[row] = self.home_retention[row]

    def turn_back(self, rows: np.ndarray, t: int) -> None:
        """``rows``, promoted into tier ``t`` this pass, are not kept there: they are promoted one tier
        less, which for most is no move (they stay, ranked as before)."""
        self.target[rows] = t + 1
        home = self.view.tier[rows] == t + 1
        self.reason[rows[home]] = STAY
        self.retention[rows[home]] = self.home_retention[rows[home]]
        self.enter(rows[~home])

    def steps(self, changed: np.ndarray) -> Steps:
        """The steps of the rows ``changed`` (sorted), each row's in order."""
        earlier = [(r[r >= 0], f[r >= 0], t, w[r >= 0]) for r, f, t, w in self.earlier]  # (-1: undone)
        at = [np.searchsorted(changed, rows) for rows, _, _, _ in earlier]
        at.append(np.arange(changed.shape[0]))
        order = np.lexsort((np.repeat(np.arange(len(at)), [a.shape[0] for a in at]), np.concatenate(at)))
        return Steps(
            at=np.concatenate(at)[order],
            from_tier=np.concatenate([f for _, f, _, _ in earlier] + [self.source[changed]])[order],
            to_tier=np.concatenate(
                [np.full(r.shape[0], t, np.int8) for r, _, t, _ in earlier] + [self.target[changed]]
            )[order],
            reason=np.concatenate([why for _, _, _, why in earlier] + [self.reason[changed]])[order],
        )

    def enter(self, rows: np.ndarray) -> None:
        """Rows moving into ``target`` this pass rank there as just entered, decaying at its half-life."""
        self.retention[rows] = self.entering(rows, self.target)

    def entering(self, rows: np.ndarray, tier: np.ndarray) -> np.ndarray:
        """How ``rows`` rank as just entered into ``tier`` (per row of the view)."""
        view, tables = self.view, self.tables
        _, _, imp = kernels.score_rows(
            rows,
            np.zeros(rows.shape[0], np.float32),
            importance=view.importance,
            created_at=view.created,
            last_access=view.accessed,
            tier=tier,
            ns=view.ns,
            now=self.now,
            tau_seconds=self.tau_seconds,
            half_life_hours=tables.half_life,
            floor=self.floor,
            alpha=0.0,
            beta=0.0,
            gamma=1.0,
        )
        return kernels.retention_scores(
            ns=view.ns[rows],
            policy=tables.retention,
            decayed=imp,
            accessed_at=view.accessed[rows],
            created_at=view.created[rows],
            tier_since=np.full(rows.shape[0], self.now),
            now=self.now,
            tau_seconds=self.tau_seconds,
        )


def _enforce_caps(state: _PassState, live: np.ndarray, due: np.ndarray, kinds: Interner | None) -> None:
    """Delete the lowest-retention rows of each namespace over its max_items, then of each kind over
    its cap in its namespace, across tiers; a cap passed loses at least its namespace's evict_share
    of the rows it counts. Only namespaces with a tier due this pass."""
    ns, tables = state.view.ns, state.tables
    visited: np.ndarray = np.asarray(due.any(axis=1))
    if (tables.max_items < NO_CAP).any():
        candidates = live & (state.target != 0) & visited[ns]
        _delete_over(state, ns.astype(np.int64), candidates, tables.max_items, tables.evict_share)
    if kinds is None:
        return
    for kind, cap_of in tables.caps_by_kind.items():  # (one pass a kind, every namespace at once)
        kid = kinds.get(kind)
        if kid >= 0:
            candidates = live & (state.target != 0) & (state.view.kind == kid) & visited[ns]
            _delete_over(state, ns.astype(np.int64), candidates, cap_of, tables.evict_share)


def _delete_over(
    state: _PassState, group: np.ndarray, candidates: np.ndarray, cap: np.ndarray, share: np.ndarray
) -> None:
    """Delete, per group over its ``cap``, its lowest-retention candidates: the surplus, or the
    group's ``share`` of its count if more."""
    count = np.bincount(group[candidates], minlength=cap.shape[0])
    over = count > cap
    if not over.any():
        return
    gone = np.maximum(count - cap, np.floor(count * share).astype(np.int64))
    keep = np.where(over, np.maximum(count - gone, 0), cap)
    evict = kernels.select_evictions(group, state.retention, candidates, keep)
    state.target[evict] = 0
    state.reason[evict] = DELETE_CAPACITY


def _enforce_capacity(
    state: _PassState, live: np.ndarray, due: np.ndarray, summaries: dict[tuple[int, int], np.ndarray]
) -> None:
    """Evict the lowest-retention rows over each (namespace, tier) capacity, fastest tier first:
    into the next tier (where they count against its capacity), or out of GLACIAL by deletion
    where the namespace allows it. A namespace that summarizes evictions evicts one more, to make
    room for the summary (``summaries`` gets the rows)."""
    ns, target, tables = state.view.ns, state.target, state.tables
    group = ns.astype(np.int64)
    for t in TIERS:  # fastest first: evictions land in the next tier and count against its capacity
        candidates = live & (target == t) & due[ns, t]
        if not candidates.any():
            continue
        cap = np.ascontiguousarray(tables.capacity[:, t])
        evict, room = _select_evictions(state, group, candidates, cap, t)
        if not evict.any():
            continue
        if t < TIERS[-1]:
            state.evict(np.flatnonzero(evict), t, t + 1, EVICT_CAPACITY)
        else:
            evict &= tables.delete_glacial[ns]  # (the rest stays over capacity: reported)
            state.evict(np.flatnonzero(evict), t, 0, DELETE_CAPACITY)
        if room.any():  # (the evicted rows grouped by namespace once, not a whole pass each)
            rows = np.flatnonzero(evict & room[ns].astype(bool))
            rows = rows[np.argsort(ns[rows], kind="stable")]
            nids, starts = np.unique(ns[rows], return_index=True)
            for nid, part in zip(nids.tolist(), np.split(rows, starts[1:]), strict=True):
                summaries[(nid, t)] = part


def _over_glacial(state: _PassState, live: np.ndarray, due: np.ndarray) -> int:
    """The rows left over GLACIAL's capacity (where the namespace may not delete from it)."""
    ns, t = state.view.ns, TIERS[-1]
    held = np.bincount(ns[live & (state.target == t) & due[ns, t]], minlength=state.tables.capacity.shape[0])
    return int(np.maximum(held - state.tables.capacity[:, t], 0).sum())


def _room_for_summaries(
    state: _PassState, live: np.ndarray, summaries: dict[tuple[int, int], np.ndarray], kinds: Interner | None
) -> None:
    """A summary is a memory of its namespace: where the pass's summaries would put a namespace over
    its max_items, or over its cap on the summaries' kind, its lowest-retention memories make room
    for them now, exactly the surplus (not ``evict_share``)."""
    if not summaries:
        return
    view, tables = state.view, state.tables
    added = np.bincount([nid for nid, _ in summaries], minlength=tables.max_items.shape[0])
    kid = kinds.get(EVICTION_SUMMARY_KIND) if kinds is not None else -1
    cap_of = tables.caps_by_kind.get(EVICTION_SUMMARY_KIND)  # (first: what the kind's cap deletes counts)
    if kid >= 0 and cap_of is not None:  # (in the namespaces that store a summary this pass)
        capped = np.where(added > 0, cap_of, NO_CAP)
        _delete_surplus(state, live & (view.kind == kid), view.ns.astype(np.int64), capped, added)
    _delete_surplus(state, live, view.ns.astype(np.int64), tables.max_items, added)
    _refill(state, live, summaries, kinds)


def _refill(
    state: _PassState, live: np.ndarray, summaries: dict[tuple[int, int], np.ndarray], kinds: Interner | None
) -> None:
    """A tier that evicted memories to summarize them ends the pass full where it can: while it
    holds fewer than its max_items (its new summary counted), the best memory it evicted comes back
    (its last step undone), as a later step freed room there (an older summary deleted for its
    kind's cap, memories deleted for the namespace's max_items, a memory the tier before kept). One
    back from the next tier leaves room there, refilled the same way; one GLACIAL deleted comes
    back only where its namespace and its kind have room for it."""
    view, tables, n = state.view, state.tables, state.tables.capacity.shape[0]
    mine = live & (state.target != 0)
    ns = view.ns[mine].astype(np.int64)
    held = np.bincount(ns * 5 + state.target[mine], minlength=n * 5).reshape(n, 5)
    in_ns = np.bincount(ns, minlength=n)
    nk, kinds_held = int(view.kind.max(initial=0)) + 1, Counter[int]()  # (namespace * nk + kind: rows)
    if tables.kind_caps:
        pairs, counts = np.unique(ns * nk + view.kind[mine], return_counts=True)
        kinds_held.update(dict(zip(pairs.tolist(), counts.tolist(), strict=True)))
    new = Counter(nid for (nid, _), rows in summaries.items() if rows.shape[0])  # (summaries to store)
    kid = kinds.get(EVICTION_SUMMARY_KIND) if kinds is not None else -1

    def room_for(row: int, nid: int) -> bool:  # a deleted row counted again: its namespace and kind
        k, caps = int(view.kind[row]), tables.kind_caps.get(nid, {})
        name = next((c for c in caps if kinds is not None and kinds.get(c) == k), None)
        extra = new[nid] if k == kid else 0
        kind_ok = name is None or kinds_held[nid * nk + k] + extra < caps[name]
        return kind_ok and in_ns[nid] + new[nid] < tables.max_items[nid]

    into = {t: np.full(view.tier.shape[0], t, np.int8) for t in {t for _, t in summaries}}  # (entering's)
    changed = True
    while changed:  # (a row brought back into a tier can make a faster tier's evictee eligible again)
        changed = False
        for (nid, t), rows in sorted(summaries.items()):
            free = int(tables.capacity[nid, t] - held[nid, t] - 1)  # (-1: the tier's new summary)
            left = rows[state.source[rows] == t] if free > 0 else rows[:0]  # (last step leaves t)
            if not left.shape[0]:
                continue
            # how each ranks in t: as there before the pass, or as entered into t
            entered = state.entering(left, into[t])
            ranked = left[np.argsort(-np.where(view.tier[left] == t, state.home_retention[left], entered))]
            back = []
            for row in ranked.tolist():
                went = int(state.target[row])
                if free == 0 or (not went and not room_for(row, nid)):
                    continue
                state.keep(row, t)
                back.append(row)
                free -= 1
                held[nid, t] += 1
                if went:
                    held[nid, went] -= 1
                else:
                    in_ns[nid] += 1
                    kinds_held[nid * nk + int(view.kind[row])] += 1
            if back:
                summaries[(nid, t)] = rows[~np.isin(rows, back)]
                new[nid] -= int(summaries[(nid, t)].shape[0] == 0)  # (nothing left to summarize)
                changed = True


def _delete_surplus(
    state: _PassState, rows: np.ndarray, group: np.ndarray, cap: np.ndarray, added: np.ndarray
) -> None:
    """Delete, per group whose ``rows`` that stay in the namespace and ``added`` new ones pass its
    ``cap``, that many of its lowest-retention rows, from the tier each is headed for (its step into
    it kept)."""
    counted = rows & (state.target != 0)
    count = np.bincount(group[counted], minlength=cap.shape[0])
    keep = np.clip(cap - added, 0, count)  # (cap is at most int64 max)
    if (keep >= count).all():
        return
    gone = kernels.select_evictions(group, state.retention, counted, keep.astype(np.int64))
    for t in TIERS:
        leaving = np.flatnonzero(gone & (state.target == t))
        if leaving.shape[0]:
            state.evict(leaving, t, 0, DELETE_CAPACITY)


def _select_evictions(
    state: _PassState, group: np.ndarray, candidates: np.ndarray, cap: np.ndarray, t: int
) -> tuple[np.ndarray, np.ndarray]:
    """The rows tier ``t`` evicts, lowest retention first, and per namespace 1 where it summarizes
    them (room for the summary). A memory promoted into the tier that would be among them was never
    there: it is turned back instead, and the others are chosen again without it (so a promotion
    that cannot stay evicts nothing, not even room for a summary)."""
    tier = state.view.tier
    while True:
        evict = kernels.select_evictions(group, state.retention, candidates, cap)
        room = _summary_room(state.tables, group, evict & (tier <= t), cap, t)
        if room.any():
            evict = kernels.select_evictions(group, state.retention, candidates, cap - room)
        back = evict & (tier > t)
        if not back.any():
            return evict, room
        state.turn_back(np.flatnonzero(back), t)
        candidates = candidates & ~back


def _summary_room(
    tables: Tables, group: np.ndarray, evicted: np.ndarray, cap: np.ndarray, t: int
) -> np.ndarray:
    """1 per namespace whose tier ``t`` evicts ``evicted`` rows and summarizes them (room for the
    summary), else 0."""
    if not tables.summarize.any():
        return np.zeros(cap.shape[0], np.int64)
    room = tables.summarize & (np.bincount(group[evicted], minlength=cap.shape[0]) > 0) & (cap > 0)
    if t == TIERS[-1]:
        room &= tables.delete_glacial  # (GLACIAL evicts only by deleting)
    return room.astype(np.int64)
