"""Access accounting: searches count as accesses of what they return (committed in the background,
soft state) and as hits or misses of the namespaces they searched; a follower hands both to its
leader instead of writing them.

Concurrency: searches record from any thread (the counters lock themselves); the flush runs on
the flush thread, at shutdown, or when a test asks, and commits through the writer."""

from __future__ import annotations

import logging

from tiermem.server.core import upkeep
from tiermem.server.core.state import EngineState
from tiermem.server.model.records import Record
from tiermem.server.model.reports import FollowerReport
from tiermem.server.search.query import SearchHit, SearchQuery
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)


def record_hits(st: EngineState, q: SearchQuery, hits: list[SearchHit]) -> list[SearchHit]:
    """A search's side effects: its results count as accessed (unless read_only) and as hits."""
    if hits and not q.read_only and st.config.search_records_access:
        # (never later than now: a search ranking at a future as_of must not keep its results from fading)
        now = st.clock()
        record_access(st, [h.record.rid for h in hits], now if q.as_of is None else min(q.as_of, now))
    st.searches.count(q.namespaces, {h.record.namespace for h in hits}, bool(hits))
    return hits


def record_access(st: EngineState, rids: list[int], when: float) -> None:
    """Count an access of each memory; committed by the next flush."""
    st.accesses.add((rid, 1, when) for rid in rids)


def flush_access(st: EngineState) -> int:
    """Commit the accesses recorded so far (soft state: a crash may lose the last second of them,
    never a memory). Returns how many memories were updated.

    A follower hands them, with its search hit counts, to its access sink (the leader) instead;
    returns how many memories it handed over."""
    pending = st.accesses.take()
    if st.following:
        return hand_over_to_leader(st, pending)
    if not pending:
        return 0

    def prepare(txn: Txn) -> list[Record]:
        recs = []
        for rid, (n, last) in pending.items():
            rec = st.store.get(txn, rid)
            if rec is None:
                continue
            rec.access_count += n
            rec.accessed_at = max(rec.accessed_at, last)
            st.store.put(txn, rec)
            recs.append(rec)
        return recs

    def apply(recs: list[Record]) -> int:
        upkeep.refresh_rows(st, recs)
        return len(recs)

    return int(st.writer.submit(prepare, apply))


def hand_over_to_leader(st: EngineState, pending: dict[int, tuple[int, float]]) -> int:
    """A follower's accesses and hit counts, sent to its leader (``merge_follower_report`` there).
    Returns how many accesses were handed over."""
    counts, total = st.searches.take()
    if not pending and not any(total):
        return 0
    if st.access_sink is not None:
        try:
            st.access_sink(FollowerReport([(r, n, t) for r, (n, t) in pending.items()], counts, list(total)))
        except Exception as e:  # soft state, as a crash loses the last second of them
            logger.warning("%d accesses not handed to the leader: %s", len(pending), e)
            return 0
    return len(pending)


def merge_follower_report(st: EngineState, report: FollowerReport) -> int:
    """The leader's side of ``hand_over_to_leader``: a follower's recorded accesses join this
    engine's (committed by the next flush) and its hit counts these. Returns how many accesses."""
    st.accesses.add(report.accesses)
    st.searches.merge(report.searches, report.total)
    return len(report.accesses)
