"""A search follower keeping up with its leader: the commits since the last one applied are read
from the commit log, and every record they wrote or deleted is brought in line in the columns and
indexes (settings and spaces reloaded when they changed).

Concurrency: catch-ups (a search's, and the follow thread's) take ``follow_lock``; the follower
never writes LMDB. A failed catch-up leaves the follower unusable: searches then fail until its
leader starts another."""

from __future__ import annotations

import logging
import time

import numpy as np

from tiermem.server.config import Tuning
from tiermem.server.core import upkeep
from tiermem.server.core.lifecycle import compact_indexes
from tiermem.server.core.remap import remap_indexes
from tiermem.server.core.state import EngineState
from tiermem.server.model.errors import FollowerBehind
from tiermem.server.model.records import Record
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)

COMPACT_EVERY_SECONDS = 5.0  # the leader's passes kill entries here too
REMAP_EVERY_SECONDS = 1.0  # a look at each index's snapshot manifest: the leader's newer snapshots
APPLY_SLICE = 4096  # records a catch-up reads back and applies at a time


def catch_up(st: EngineState) -> int:
    """Apply the commits since the last one applied. A search calls it first, so it sees every
    write acknowledged before it began. Returns the commits applied. Raises FollowerBehind when
    the commit log no longer holds them (the follower reloads)."""
    if st.follow_error is not None:
        raise FollowerBehind(f"this follower stopped following: {st.follow_error!r}")
    with st.follow_lock, st.store.read() as txn:
        seq = st.store.committed_seq(txn)
        if seq == st.applied:
            return 0
        try:
            log = st.store.commits_after(txn, st.applied)
            if log is None or log[0] != st.applied + 1:
                raise FollowerBehind(f"commits {st.applied + 1}..{seq} are no longer in the commit log")
            _, settings, rids = log
            if settings:
                follow_settings(st, txn)
            follow_records(st, txn, rids)
        except Exception as e:
            # Applied in part, maybe: this process can no longer be trusted to match LMDB. It
            # stops serving searches and exits; its leader starts another, which loads afresh.
            st.follow_error = e
            raise FollowerBehind(f"this follower stopped following: {e!r}") from e
        done, st.applied = seq - st.applied, seq
        st.store.seq = seq
        return done


def follow_settings(st: EngineState, txn: Txn) -> None:
    for model, dim in st.store.spaces(txn).items():
        st.space(model, dim)
    before = st.ns_config
    # (the settings that did not change stay the same objects: their policies are kept)
    st.ns_config = {
        ns: s if before.get(ns) != s else before[ns] for ns, s in st.store.namespace_configs(txn).items()
    }
    st.routing = st.store.scope_routing(txn)
    for name in st.ns_config:
        st.columns.namespaces.id(name)
    st.config_version += 1


def follow_records(st: EngineState, txn: Txn, rids: np.ndarray) -> None:
    """Bring the rows of ``rids`` in line with their records, as the leader's writes did, a slice
    of ``APPLY_SLICE`` at a time (a catch-up after a bulk write left alone holds that many records
    read back, not all of them)."""
    for start in range(0, rids.shape[0], APPLY_SLICE):
        _follow_slice(st, txn, rids[start : start + APPLY_SLICE])


def _follow_slice(st: EngineState, txn: Txn, rids: np.ndarray) -> None:
    """New rows indexed then shown, changed vectors added before the old entry dies, deleted rows
    hidden before their entries die."""
    cols = st.columns
    fresh: list[tuple[Record, np.ndarray]] = []
    gone: list[tuple[int, str]] = []
    for rid, rec in zip(rids.tolist(), st.store.get_many(txn, rids.tolist()), strict=True):
        row = cols.rows.get(rid)
        if row is not None and (rec is None or cols.namespace_of(row) != rec.namespace):
            gone.append((rid, cols.namespace_of(row)))
            row = None
        if rec is None:
            continue
        vec = None if st.store.is_pending(txn, rid) else st.store.get_vector(txn, rid)
        if row is None:
            fresh.append((rec, np.empty(0, np.float32) if vec is None else vec))
            continue
        # As the leader's update or tier move did (a memory never waits for an embedding again
        # once it has one: every new vector gets a new vk).
        upkeep.reindex(st, int(cols.view().vk[row]), rec, vec)
        upkeep.post_content(st, row, rec)  # (its old content is not known here: posted again)
    upkeep.unindex(st, gone)
    upkeep.index_new(st, fresh)


def may_rank(st: EngineState) -> bool:
    """A search came (the follower counts as searched from now): whether this follower ranks it
    itself. Not while more than ``follower_forward_backlog`` records wait to be applied (after a
    bulk write it left alone): its leader answers then, while the follow thread catches up."""
    st.searched_at = time.monotonic()
    most = st.config.tuning.follower_forward_backlog
    with st.store.read() as txn:
        return (
            st.store.committed_seq(txn) == st.applied or st.store.records_after(txn, st.applied, most) <= most
        )


class Pace:
    """When the follow thread catches up: at once while searches come. A follower no search came
    to for ``follower_idle_seconds`` leaves the commits while its leader keeps committing (a bulk
    write alone, which applying it again beside it would slow on the same cores) until the
    leader has been quiet for ``follower_quiet_seconds``, or for at most ``follower_defer_seconds``
    (and half of ``commit_log_seconds``) since the last catch-up. Fed what the loop reads, so it is a plain state machine."""

    def __init__(self, tuning: Tuning, applied: int, now: float) -> None:
        self.tuning = tuning
        self.seq = self.applied = applied
        self.moved = now  # when the leader's last commit was seen
        self.behind: float | None = None  # since when commits wait (since the last catch-up)

    def due(self, seq: int, applied: int, searched_at: float, now: float) -> bool:
        """``seq``: the leader's last commit; ``applied``: the follower's (a search's catch-up
        counts too); ``searched_at``: when a search last came."""
        if applied != self.applied:  # (caught up since: the wait starts again)
            self.applied, self.behind = applied, None
        if seq != self.seq:
            self.seq, self.moved = seq, now
        if seq == applied:  # (nothing waits: ``behind`` was cleared when ``applied`` moved)
            return False
        if self.behind is None:
            self.behind = now
        t = self.tuning
        idle = now - searched_at >= t.follower_idle_seconds
        writing = now - self.moved < t.follower_quiet_seconds
        # (never near the commit log's keeping: commits it dropped would make the follower reload)
        most = min(t.follower_defer_seconds, t.commit_log_seconds / 2)
        return not (idle and writing) or now - self.behind >= most


def follow_loop(st: EngineState) -> None:
    """The follow thread: catch up every ``follow_interval_seconds`` when no search does (at the
    ``Pace`` of the searches)."""
    compacted = remapped = time.monotonic()
    pace = Pace(st.config.tuning, st.applied, compacted)
    while not st.stop.wait(st.config.tuning.follow_interval_seconds):
        try:
            with st.store.read() as txn:
                seq = st.store.committed_seq(txn)
            if pace.due(seq, st.applied, st.searched_at, time.monotonic()):
                catch_up(st)
            if time.monotonic() - compacted >= COMPACT_EVERY_SECONDS:
                compacted = time.monotonic()
                compact_indexes(st)
            if time.monotonic() - remapped >= REMAP_EVERY_SECONDS:
                remapped = time.monotonic()
                remap_indexes(st)
        except Exception as e:  # searches now fail (UNAVAILABLE) until the follower reloads
            logger.exception("following the leader's commits failed")
            st.follow_error = st.follow_error or e
            return
