"""A search follower moving its indexes onto its leader's newer snapshots.

Why: a follower maps the index snapshots its leader wrote last (index/layered.py) and keeps every
entry added since in an index of its own: memory of its own and, past a few thousand entries, a
second graph every search walks. The leader writes new snapshots every
``snapshot_interval_seconds`` once enough has changed; an index of the follower whose own entries
passed ``follower_remap_entries`` then maps the newer snapshot and keeps of its own only what came
after it. An index with no snapshot under it (none when the follower started: a fresh data
directory) moves the same way. A snapshot is considered once: one that cannot be used (damaged, or
more dead than ``compact_dead_share``) waits for the next.

Concurrency: the follow thread. The snapshot is read and checked first; the switch holds
``follow_lock`` (no catch-up meanwhile), and the index object stays the same: its parts are
replaced, and the rows' locations changed, while no search uses it (``LayeredIndex.rebase``).
"""

from __future__ import annotations

import logging

import numpy as np

from tiermem.server.core.state import EngineState
from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.snapshot_files import entries_by_vk, snapshot_token
from tiermem.server.index.spaces import Space
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.model.types import INTERNAL_MASK, SPACE_SHIFT, TIER_SHIFT, location

logger = logging.getLogger(__name__)


def remap_indexes(st: EngineState) -> int:
    """Move each index whose own entries passed ``follower_remap_entries`` onto its leader's
    newer snapshot, if there is one. Returns how many indexes moved. Optional upkeep: a failure
    is logged, and leaves the index as it was."""
    moved = 0
    for sp in list(st.spaces.values()):
        for tier, idx in list(sp.indexes.items()):
            if (
                not isinstance(idx, LayeredIndex)
                or idx.own_entries() < st.config.tuning.follower_remap_entries
            ):
                continue
            base = st.snapshot_base(sp, tier)
            token = snapshot_token(base)
            if token is None or token == idx.seen:
                continue
            idx.seen = token
            try:
                moved += _remap(st, sp, tier, idx)
            except Exception:
                logger.exception("mapping the newer snapshot of index %s/%d failed", sp.model, tier)
    return moved


def _remap(st: EngineState, sp: Space, tier: int, idx: LayeredIndex) -> int:
    loaded = st.load_snapshot(sp, tier, mapped=True)
    if loaded is None or not loaded[0].n:
        return 0
    idx.seen = loaded[0].token
    with st.follow_lock:
        if st.follow_error is not None or sp.indexes.get(tier) is not idx:
            return 0
        return _switch(st, sp, tier, idx, *loaded)


def _switch(
    st: EngineState, sp: Space, tier: int, idx: LayeredIndex, snap: VectorIndex, snap_vks: np.ndarray
) -> int:
    """Under ``follow_lock``: put ``snap`` (mapped) under ``idx`` with a new tail for the entries
    the snapshot lacks, their vectors copied from ``idx``. Returns 1, or 0 when too much of the
    snapshot is dead already (``idx`` stays as it is)."""
    cols = st.columns
    live = np.fromiter(cols.rows.values(), np.int64, len(cols.rows))
    vpos = cols.column("vpos")[live]
    here = (vpos >= 0) & ((vpos >> SPACE_SHIFT) == sp.id) & (((vpos >> TIER_SHIFT) & 0xF) == tier)
    rows, old_ids = live[here], vpos[here] & INTERNAL_MASK
    vks = cols.column("vk")[rows]
    internal = entries_by_vk(snap_vks, vks)
    found = internal >= 0
    if snap.n - int(found.sum()) > st.config.tuning.compact_dead_share * snap.n:
        return 0
    snap.revive(internal[found], rows[found])
    tail = st.new_index(sp)
    missing = np.flatnonzero(~found)
    if missing.shape[0]:
        # Searchable at once as pending entries; the indexer moves them into HNSW after the switch.
        tail.reserve(int(missing.shape[0]))
        vectors = idx.vectors(old_ids[missing])
        internal[missing] = tail.add(vectors, rows[missing], vks[missing], defer=True) + snap.n
    replaced = idx.rebase(snap, tail, lambda: cols.relocate(rows, location(sp.id, tier, internal)))
    for part in replaced:
        st.indexer.forget(part)
    if tail.pending:
        st.indexer.notify(tail)
    logger.info(
        "index %s/%d: mapped the leader's newer snapshot (%d entries live in it, %d of this process's own)",
        sp.model,
        tier,
        int(found.sum()),
        int(missing.shape[0]),
    )
    return 1
