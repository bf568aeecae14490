"""Running the lifecycle: a pass planned over the columns (see policy.py) and applied through the
writer in chunks; the sweep of expired memories and old request ids; and the compaction of
indexes left mostly dead.

Concurrency: one pass at a time (``pass_lock``). Planning reads the columns only (kernels over
whole arrays, no locks); each chunk of moves re-checks, in its transaction, that every memory is
still where the plan saw it. Compaction runs in the writer thread (a follower: between two
catch-ups)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from tiermem.server.config import TIER_FAST, TIER_MEDIUM
from tiermem.server.core import evictions, upkeep
from tiermem.server.core.counters import DELETION, DEMOTION, EVICTION, PROMOTION
from tiermem.server.core.policy import (
    DELETE_CAPACITY,
    DEMOTIONS,
    EVICT_CAPACITY,
    EXPIRED,
    FLUSH_WORKING,
    PROMOTIONS,
    Plan,
    plan_pass,
)
from tiermem.server.core.state import EngineState
from tiermem.server.index.columns import ColumnsView
from tiermem.server.index.spaces import Space
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import Record, enter_tier
from tiermem.server.model.reports import ConsolidationReport, PlannedMove, SweepReport
from tiermem.server.model.types import location
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)

MOVES_PER_COMMIT = 256


class Move(NamedTuple):
    """A planned move of one memory, and the (tier left, reason) of each step it took when several."""

    rid: int
    from_tier: int
    to_tier: int  # 0: delete
    reason: int
    steps: tuple[tuple[int, int], ...] = ()


def consolidate(
    st: EngineState,
    namespace: str = "",
    *,
    dry_run: bool = False,
    max_reported: int = 1000,
    scheduled: bool = False,
) -> ConsolidationReport:
    """Run a lifecycle pass over one namespace or all; returns its report (the first
    ``max_reported`` moves listed). ``scheduled``: only the (namespace, tier) pairs whose cadence
    is due (the maintenance pass). Searches are paused only while a moved vector is added to or
    tombstoned in an index."""
    if namespace:
        check.namespace("namespace", namespace)
    if max_reported < 0:
        raise InvalidArgument("max_reported_moves", "must not be negative")
    with st.pass_lock:
        t0 = time.perf_counter()
        now = st.clock()
        view = _planned_view(st)
        plan = _plan(st, view, namespace, scheduled, now)
        rids = view.rid[plan.rows]
        report = ConsolidationReport(
            promoted=plan.counts["promoted"],
            demoted=plan.counts["demoted"],
            evicted=plan.counts["evicted"],
            deleted=plan.counts["deleted"],
            over_capacity=plan.over_capacity,
            plan_seconds=time.perf_counter() - t0,
            moves=_listed_moves(st, plan, rids, max_reported),
        )
        if dry_run:
            return report
        if plan.summaries:  # stored before the evictions: a crash between leaves both, not neither
            evictions.store(st, evictions.collect(st, view, plan.summaries), now)
        if plan.rows.shape[0]:
            _apply_plan(st, report, rids, plan, now)
        compact_indexes(st)  # after the moves, or single deletes, left an index mostly dead
        return report


def enforce_caps(st: EngineState, namespace: str, keep: frozenset[int] = frozenset()) -> int:
    """Apply a namespace's max_items and kind caps at once (a create crossed one), deleting by its
    retention policy the memories other than ``keep`` (the create's own, just acknowledged, which
    count against the caps but stay); returns how many memories were deleted."""
    policy = st.policy_for(namespace)
    nid = st.columns.namespaces.get(namespace)
    if nid < 0 or not (policy.max_items or policy.kind_capacities):
        return 0
    with st.pass_lock:
        now = st.clock()
        view = _planned_view(st)
        in_scope = view.alive & (view.ns == nid)
        if not _over_caps(st, view, in_scope, policy.max_items, policy.kind_capacities):
            return 0
        tables = st.policy_tables()
        plan = plan_pass(
            view,
            tables,
            now=now,
            tau_seconds=st.config.recency_tau_seconds,
            in_scope=in_scope,
            due=np.ones((tables.ttl.shape[0], 5), np.bool_),
            kinds=st.columns.kinds,
            only_caps=True,
            keep=np.flatnonzero(np.isin(view.rid, np.fromiter(keep, np.int64, len(keep)))) if keep else None,
        )
        items = [item for item in _moves(view.rid[plan.rows], plan) if item.rid not in keep]
        return len(items) - _apply_in_commits(st, items, now)


def flush_working(st: EngineState, namespace: str) -> int:
    """Once the namespace's FAST memories pass its ``working_token_limit`` in tokens, move them all
    to MEDIUM (working memory flushed to episodic memory); returns how many moved."""
    limit = st.policy_for(namespace).working_token_limit
    nid = st.columns.namespaces.get(namespace)
    if nid < 0 or not limit or _working_rows(st, nid, limit) is None:  # (most creates: no lock)
        return 0
    with st.pass_lock:
        rids = _working_rows(st, nid, limit)
        if rids is None:
            return 0
        items = [Move(rid, TIER_FAST, TIER_MEDIUM, FLUSH_WORKING) for rid in rids.tolist()]
        return len(items) - _apply_in_commits(st, items, st.clock())


def _planned_view(st: EngineState) -> ColumnsView:
    """The columns a plan reads, its tiers copied: the writer changes a row's tier in place while
    the plan reads them several times, and a plan mixing two tiers of one memory could move it
    from the tier it entered by a decision about the tier it left (an update lost) or name no
    tier at all. A move from a tier the memory has left since is skipped when applied."""
    view = st.columns.view()
    return replace(view, tier=view.tier.copy())


def _working_rows(st: EngineState, nid: int, limit: int) -> np.ndarray | None:
    """The record ids of namespace ``nid``'s FAST memories if their tokens pass ``limit``, else None."""
    view = st.columns.view()
    rows = np.flatnonzero(
        view.alive & (view.ns == nid) & (view.tier == TIER_FAST) & (view.expire > st.clock())
    )
    return view.rid[rows] if int(view.tokens[rows].sum()) > limit else None


def _over_caps(
    st: EngineState, view: ColumnsView, rows: np.ndarray, max_items: int, kinds: dict[str, int]
) -> bool:
    """Whether the namespace's ``rows`` pass its cap or a kind's (a quick count before a plan)."""
    if max_items and int(np.count_nonzero(rows)) > max_items:
        return True
    for kind, cap in kinds.items():
        kid = st.columns.kinds.get(kind)
        if cap > 0 and kid >= 0 and int(np.count_nonzero(rows & (view.kind == kid))) > cap:
            return True
    return False


def _plan(st: EngineState, view: ColumnsView, namespace: str, scheduled: bool, now: float) -> Plan:
    tables = st.policy_tables()
    if namespace:
        in_scope = view.alive & (view.ns == st.columns.namespaces.get(namespace))
    else:
        in_scope = view.alive.copy()
    n_ns = tables.ttl.shape[0]
    if scheduled:
        if st.last_run.shape[0] < n_ns:
            grown = np.full((n_ns, 5), -np.inf)
            grown[: st.last_run.shape[0]] = st.last_run
            st.last_run = grown
        due = (now - st.last_run[:n_ns]) >= tables.cadence
    else:
        due = np.ones((n_ns, 5), np.bool_)
    plan = plan_pass(
        view,
        tables,
        now=now,
        tau_seconds=st.config.recency_tau_seconds,
        in_scope=in_scope,
        due=due,
        kinds=st.columns.kinds,
    )
    if scheduled:
        st.last_run[:n_ns][due] = now
    return plan


def _listed_moves(st: EngineState, plan: Plan, rids: np.ndarray, most: int) -> list[PlannedMove]:
    """The plan's first ``most`` steps (a memory evicted on from a tier it entered is listed once a step)."""
    steps = plan.steps
    at = steps.at[:most].tolist()
    with st.store.read() as txn:
        listed = {i: st.store.get(txn, int(rids[i])) for i in dict.fromkeys(at)}
    return [
        PlannedMove(
            namespace=rec.namespace,
            id=rec.id,
            from_tier=int(steps.from_tier[j]),
            to_tier=int(steps.to_tier[j]),
            reason=int(steps.reason[j]),
        )
        for j, i in enumerate(at)
        if (rec := listed[i]) is not None
    ]


def _apply_plan(
    st: EngineState, report: ConsolidationReport, rids: np.ndarray, plan: Plan, now: float
) -> None:
    """Apply a pass's moves through the writer, a chunk a commit; fills in the report's timings."""
    for idx in st.all_indexes():
        idx.max_pause_seconds = 0.0
    t1 = time.perf_counter()
    report.skipped += _apply_in_commits(st, _moves(rids, plan), now)
    report.apply_seconds = time.perf_counter() - t1
    report.max_pause_seconds = max([idx.max_pause_seconds for idx in st.all_indexes()], default=0.0)


def _moves(rids: np.ndarray, plan: Plan) -> list[Move]:
    """A plan's moves, ``rids`` the record ids of its rows; a move of several steps lists them."""
    several: dict[int, list[tuple[int, int]]] = {}
    if plan.steps.at.shape[0] > plan.rows.shape[0]:
        s = plan.steps
        for i, frm, why in zip(s.at.tolist(), s.from_tier.tolist(), s.reason.tolist(), strict=True):
            several.setdefault(i, []).append((frm, why))
    return [
        Move(rid, frm, to, why, tuple(steps) if len(steps := several.get(i, ())) > 1 else ())
        for i, (rid, frm, to, why) in enumerate(
            zip(
                rids.tolist(),
                plan.from_tier.tolist(),
                plan.to_tier.tolist(),
                plan.reason.tolist(),
                strict=True,
            )
        )
    ]


def _apply_in_commits(st: EngineState, items: list[Move], now: float) -> int:
    """Apply the moves through the writer, MOVES_PER_COMMIT a commit; returns how many were skipped."""
    return sum(
        apply_moves(st, items[lo : lo + MOVES_PER_COMMIT], now)
        for lo in range(0, len(items), MOVES_PER_COMMIT)
    )


@dataclass
class _MovesDone:
    moved: list[tuple[Record, Record]] = field(default_factory=list)  # (before, after)
    deleted: list[Record] = field(default_factory=list)
    skipped: int = 0
    deltas: dict[tuple[str, int], list[int]] = field(default_factory=dict)  # lifecycle counts


def _event_kind(reason: int) -> int:
    if reason in PROMOTIONS:
        return PROMOTION
    if reason in DEMOTIONS or reason == FLUSH_WORKING:
        return DEMOTION
    return EVICTION if reason == EVICT_CAPACITY else DELETION


def apply_moves(st: EngineState, items: list[Move], now: float) -> int:
    """Commit one chunk of planned moves; returns how many were skipped (memory changed meanwhile)."""

    def prepare(txn: Txn) -> _MovesDone:
        done = _MovesDone()
        # (memories enter their tier at the commit: an access committed since the plan is evidence
        # before the entry, not since)
        entered = max(now, st.clock())
        for rid, frm, to, reason, steps in items:
            rec = st.store.get(txn, rid)
            if rec is None or rec.tier != frm or (reason == EXPIRED and not rec.expired(now)):
                done.skipped += 1
                continue
            for left, why in steps or ((frm, reason),):  # each step booked to the tier it left
                d = done.deltas.setdefault((rec.namespace, left), [0, 0, 0, 0])
                d[_event_kind(why)] += 1
                if why == DELETE_CAPACITY:
                    d[EVICTION] += 1  # a capacity deletion is an eviction too
            if to == 0:
                st.store.delete(txn, rec)
                done.deleted.append(rec)
                continue
            old = Record.unpack(rec.pack())
            enter_tier(rec, to, entered)
            _, rec.vk = st.alloc_ids()
            st.store.put(txn, rec)
            done.moved.append((old, rec))
        for (ns, tier), d in done.deltas.items():
            # From the transaction: a move committed in the same group is not applied yet.
            total = st.store.lifecycle_counter(txn, ns, tier)
            st.store.put_lifecycle_counters(txn, ns, tier, [a + b for a, b in zip(total, d, strict=True)])
        return done

    def apply(done: _MovesDone) -> int:
        for old, rec in done.moved:
            upkeep.reindex(st, old.vk, rec, None)
        upkeep.unindex(st, done.deleted)
        st.lifecycle.add(done.deltas, st.clock())
        return done.skipped

    return int(st.writer.submit(prepare, apply))


def sweep(st: EngineState, chunk: int = 1000) -> SweepReport:
    """Delete expired memories and forget request ids older than request_id_ttl_seconds."""
    now = st.clock()
    view = st.columns.view()
    rows = np.flatnonzero(view.alive & (view.expire <= now))
    items = [
        Move(rid, tier, 0, EXPIRED)
        for rid, tier in zip(view.rid[rows].tolist(), view.tier[rows].tolist(), strict=True)
    ]
    skipped = 0
    for lo in range(0, len(items), chunk):  # the same path as a pass's expiry: counted in the stats
        skipped += apply_moves(st, items[lo : lo + chunk], now)
    deleted = len(items) - skipped
    forgotten = 0
    before = now - st.config.request_id_ttl_seconds
    while True:
        n = int(st.writer.submit(lambda txn: st.store.expire_requests(txn, before, chunk), lambda n: n))
        forgotten += n
        if n < chunk:
            break
    if deleted or forgotten:
        logger.info("maintenance: %d expired memories deleted, %d request ids forgotten", deleted, forgotten)
    return SweepReport(expired_deleted=deleted, request_ids_forgotten=forgotten)


def compact_indexes(st: EngineState) -> int:
    """Compact the indexes that are mostly tombstones (``Tuning.compact_*``: at least
    compact_min_entries large, at least compact_dead_share dead, at most compact_max_live live;
    start-up rebuilds any with > 25% dead), in the writer thread (a follower: between two
    catch-ups); returns how many entries were dropped."""
    try:
        if st.following:
            with st.follow_lock:
                return _compact(st)
        return int(st.writer.barrier(lambda: _compact(st)))
    except Exception:  # optional upkeep: the write that called it has committed already
        logger.exception("compacting indexes failed")
        return 0


def _compact(st: EngineState) -> int:
    tuning = st.config.tuning
    dropped = 0
    for sp in list(st.spaces.values()):
        for tier, idx in list(sp.indexes.items()):
            _, _, live = idx.counts()
            if (
                idx.n < tuning.compact_min_entries
                or idx.n - live < tuning.compact_dead_share * idx.n
                or live > tuning.compact_max_live
            ):
                continue

            def relocate(rows: np.ndarray, ids: np.ndarray, sp: Space = sp, tier: int = tier) -> None:
                st.columns.relocate(rows, location(sp.id, tier, ids))

            n = idx.n
            gone = idx.compact(relocate)
            logger.info("compacted index %s/%d: %d of %d entries were dead", sp.model, tier, gone, n)
            dropped += gone
    if st.keywords.posted_rows > 2 * len(st.columns) + tuning.compact_min_entries:
        # Mostly the postings of deleted rows and replaced contents: keep those of live rows only.
        gone = st.keywords.compact(st.columns.view().alive)
        logger.info("compacted the keyword index: %d postings dropped", gone)
    return dropped
