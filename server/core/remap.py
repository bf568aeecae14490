"""A search follower moving its indexes onto its leader's newer snapshots.

Why: a follower maps the index snapshots its leader wrote last (index/layered.py) and keeps every
entry added since in an index of its own: memory of its own and, past a few thousand entries, a
second graph every search walks. The leader writes new snapshots every
``snapshot_interval_seconds`` once enough has changed; an index of the follower whose own entries
passed ``follower_remap_entries`` then maps the newer snapshot and keeps of its own only what came
after it. An index the follower built itself (no snapshot at its start: a fresh data directory)
is moved the same way.

Concurrency: the follow thread. The snapshot is read and checked first; the switch holds
``follow_lock`` (no catch-up meanwhile) and, while the rows' locations change, the replaced index
alone (``exclusive``, as compaction's relocation holds its index): searches holding it finish
first, and later lookups find the new index in the space's table with the rows' new locations.
"""

from __future__ import annotations

import logging

import numpy as np

from tiermem.server.core.state import EngineState
from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.snapshot_files import entries_by_vk, snapshot_token
from tiermem.server.index.spaces import Index, Space
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.model.types import INTERNAL_MASK, SPACE_SHIFT, TIER_SHIFT, location

logger = logging.getLogger(__name__)

MOSTLY_DEAD = 0.25  # a snapshot with more dead entries than this share is not mapped (start-up's rule)


def remap_indexes(st: EngineState) -> int:
    """Move each index whose own entries passed ``follower_remap_entries`` onto its leader's
    newer snapshot, if there is one. Returns how many indexes moved."""
    moved = 0
    for sp in list(st.spaces.values()):
        for tier, idx in list(sp.indexes.items()):
            own = idx.tail.n if isinstance(idx, LayeredIndex) else idx.n
            if own < st.config.tuning.follower_remap_entries:
                continue
            base = st.snapshot_base(sp, tier)
            mapped = idx.base.token if isinstance(idx, LayeredIndex) else None
            if snapshot_token(base) in (None, mapped):
                continue
            loaded = VectorIndex.load(
                base,
                sp.model,
                sp.dim,
                st.config.hnsw_ef_construction,
                st.store.instance,
                tuning=st.config.tuning,
                mapped=True,
            )
            if loaded is None or not loaded[0].n:
                continue
            with st.follow_lock:
                if st.follow_error is None and sp.indexes.get(tier) is idx:
                    moved += _switch(st, sp, tier, idx, *loaded)
    return moved


def _switch(
    st: EngineState, sp: Space, tier: int, old: Index, snap: VectorIndex, snap_vks: np.ndarray
) -> int:
    """Under ``follow_lock``: replace ``old`` by ``snap`` (mapped) and an index of its own for the
    entries the snapshot lacks, their vectors copied from ``old``. Returns 1, or 0 when most of the
    snapshot is dead already (it stays as it is)."""
    cols = st.columns
    live = np.fromiter(cols.rows.values(), np.int64, len(cols.rows))
    vpos = cols.column("vpos")[live]
    here = (vpos >= 0) & ((vpos >> SPACE_SHIFT) == sp.id) & (((vpos >> TIER_SHIFT) & 0xF) == tier)
    rows, old_ids = live[here], vpos[here] & INTERNAL_MASK
    vks = cols.column("vk")[rows]
    internal = entries_by_vk(snap_vks, vks)
    found = internal >= 0
    if snap.n - int(found.sum()) > MOSTLY_DEAD * snap.n:
        return 0
    snap.revive(internal[found], rows[found])
    new = LayeredIndex(snap, st.new_index(sp))
    missing = np.flatnonzero(~found)
    if missing.shape[0]:
        # Searchable at once as pending entries; the indexer moves them into HNSW after the switch.
        new.reserve(int(missing.shape[0]))
        internal[missing] = new.add(old.vectors(old_ids[missing]), rows[missing], vks[missing], defer=True)
    with old.exclusive():
        cols.relocate(rows, location(sp.id, tier, internal))
        sp.indexes[tier] = new
    for part in (old, old.base, old.tail) if isinstance(old, LayeredIndex) else (old,):
        st.indexer.forget(part)
    st.indexer.attach(new)
    logger.info(
        "index %s/%d: mapped the leader's newer snapshot (%d entries live in it, %d of this process's own)",
        sp.model,
        tier,
        int(found.sum()),
        int(missing.shape[0]),
    )
    return 1
