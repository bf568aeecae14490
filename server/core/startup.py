"""Start-up: the data directory checked writable and locked, then the columns and indexes loaded
from their snapshots and LMDB (records changed since a snapshot are decoded again, vectors it lacks
are indexed again).

Runs before the writer starts and before any search: nothing else touches the state meanwhile.
A follower loads while its leader writes, so it reads again when the leader replaces the snapshot
under it."""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from tiermem.server.core import upkeep
from tiermem.server.core.counters import LifecycleTotals
from tiermem.server.core.state import EngineState
from tiermem.server.index.columns import Columns
from tiermem.server.index.keyword_index import KeywordIndex
from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.snapshot_files import entries_by_vk
from tiermem.server.index.spaces import Index, Space
from tiermem.server.index.threads import set_faiss_threads
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.model.errors import FailedPrecondition, StorageError
from tiermem.server.model.records import Record
from tiermem.server.model.types import location
from tiermem.server.storage import datafile, snapshots
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)

_CHUNK = 4096  # vectors read from LMDB and added to an index at a time


class _SnapshotReplaced(Exception):
    pass


def prepare_data_dir(data: Path) -> None:
    """Create the data directory and its ``indexes`` and ``lmdb`` folders, and check the server can
    write in each of them and the files it writes in place: a StorageError (DATA_DIR_NOT_WRITABLE)
    names the first it cannot (a read-only mount, missing permissions) before anything is opened."""
    for folder in (data, data / "indexes", data / "lmdb"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if e.errno in datafile.NOT_WRITABLE:
                raise datafile.not_writable(_existing_parent(folder), e) from None
            raise StorageError(f"cannot create {folder}: {e}") from None
        probe = folder / f".write-probe-{os.getpid()}"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            probe.unlink()
        except OSError as e:
            if e.errno in datafile.NOT_WRITABLE:
                raise datafile.not_writable(folder, e) from None
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk: the server still serves
                raise StorageError(f"cannot write in {folder}: {e}") from None
    for path in (data / "LOCK", data / "lmdb" / datafile.DATA_FILE, data / "lmdb" / "lock.mdb"):
        try:
            os.close(os.open(path, os.O_WRONLY))
        except FileNotFoundError:
            continue
        except OSError as e:
            if e.errno in datafile.NOT_WRITABLE:
                raise datafile.not_writable(path, e) from None
            raise StorageError(f"cannot open {path}: {e}") from None


def _existing_parent(folder: Path) -> Path:
    """The deepest existing folder above ``folder`` (where a mkdir failed)."""
    parent = folder.parent
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    return parent


def lock_data_dir(data: Path) -> IO[str]:
    """Hold an exclusive lock on ``data/LOCK`` for the engine's lifetime: two servers on one data
    directory would each keep their own columns and indexes over the same LMDB and snapshot over each
    other. The lock goes with the process, so a server killed with -9 leaves nothing to clean up."""
    import fcntl

    f = open(data / "LOCK", "a+")  # noqa: SIM115 (held open until close)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise StorageError(
            f"data directory {data} is in use by another tiermem server", reason="DATA_DIR_IN_USE"
        ) from None
    return f


def load(st: EngineState) -> None:
    """Fill the columns and indexes from the snapshots and LMDB."""
    for _ in range(8):
        try:
            _load_once(st)
            _release_freed_heap()
            return
        except _SnapshotReplaced:  # a follower: the leader wrote a newer snapshot meanwhile
            continue
    raise StorageError("the columns snapshot kept changing while this follower loaded")


def _load_once(st: EngineState) -> None:
    t0 = time.monotonic()
    set_faiss_threads()  # rebuilds use every core; no searches yet
    snap = snapshots.load_columns(st.index_dir, st.store.instance)
    with st.store.read() as txn:
        if st.following and snap is not None and snapshots.current_seq(st.index_dir) != snap[1]:
            # The leader wrote the next snapshot after this one was read, and may have dropped
            # the change-log entries this load would replay (they go once a snapshot holds
            # them): read it again. (Written after the check, a new one cannot have dropped
            # them before this transaction began.)
            raise _SnapshotReplaced
        st.applied = st.store.committed_seq(txn)
        if st.following:
            st.store.seq = st.applied  # the commits this read sees, not those at open
        st.next_rid, st.next_vk = st.store.counters(txn)
        st.ns_config = st.store.namespace_configs(txn)
        st.routing = st.store.scope_routing(txn)
        st.lifecycle = LifecycleTotals(st.store.lifecycle_counters(txn))
        for model, dim in st.store.spaces(txn).items():
            _check_declared(st, model, dim)
            st.space(model, dim)
        how = _load_rows(st, txn, snap)
        for name in st.ns_config:
            st.columns.namespaces.id(name)
        _load_indexes(st, txn)
    logger.info(
        "loaded %d memories in %d spaces in %.2f s (%s)",
        len(st.columns),
        len(st.spaces),
        time.monotonic() - t0,
        how,
    )


def _release_freed_heap() -> None:
    """Hand the heap the load freed (the decoded snapshot, read buffers) back to the system:
    glibc keeps freed pages below its heap's top for reuse, which a serving process may never
    need again. (The process's own symbols, as elsewhere: ``find_library`` would run ldconfig.)"""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:  # (None: not glibc, nothing to ask)
        trim(0)


def _check_declared(st: EngineState, model: str, dim: int) -> None:
    """FAILED_PRECONDITION when ``embedding_spaces`` gives a stored space another dimension."""
    declared = st.config.declared_spaces.get(model, dim)
    if declared != dim:
        raise FailedPrecondition(
            f"embedding_spaces declares {model}={declared}, but the data holds its vectors of dimension {dim}",
            "EMBEDDING_SPACE_CONFLICT",
        )


def _load_rows(st: EngineState, txn: Txn, snap: tuple[dict[str, Any], int] | None) -> str:
    """The columns: the snapshot, then every record a later commit changed; or every record.
    Returns how they were loaded (for the log)."""
    unembedded = set(st.store.pending_rids(txn))
    if snap is not None and snap[1] > st.store.seq:
        # Newer than LMDB (LMDB rolled back, e.g. sync off and power lost, or restored from
        # a copy): it would hold memories LMDB no longer has.
        logger.warning("ignoring a columns snapshot of commit %d: LMDB is at %d", snap[1], st.store.seq)
        snap = None
    how = "by decoding every record"
    if snap is not None:
        try:
            st.columns = _restore_columns(st, snap[0])
            st.keywords = KeywordIndex.restore(snap[0]["keywords"])
            changed = st.store.changed_since(txn, snap[1])
            for rid in changed:
                _load_row(st, rid, st.store.get(txn, rid), unembedded)
            dead, tuning = st.columns.n - len(st.columns), st.config.tuning
            if dead < tuning.columns_rebuild_dead or dead < tuning.columns_rebuild_dead_share * st.columns.n:
                return f"from a snapshot and {len(changed)} changed records"
            # (rows are never reused while serving: here the deleted ones go, with their keywords)
            how = f"by decoding every record ({dead:,} of the snapshot's {st.columns.n:,} rows were deleted)"
        except Exception as e:  # a damaged snapshot: decode every record instead
            logger.warning("ignoring a columns snapshot that cannot be restored: %r", e)
        st.columns = Columns(change_log=st.config.tuning.columns_change_log)
        st.keywords = KeywordIndex()
    for rec in st.store.iter_records(txn):
        _load_row(st, rec.rid, rec, unembedded)
    return how


def _restore_columns(st: EngineState, state: dict[str, Any]) -> Columns:
    """Columns from a snapshot, with embedding-space ids renumbered: ids follow the order spaces
    were first used while serving, but start-up numbers them in LMDB's (model name) order."""
    cols = Columns.restore(state, change_log=st.config.tuning.columns_change_log)
    space = cols.column("space")
    models = state["spaces"]
    remap = np.array([st.spaces[m].id for m in models] or [-1], np.int32)  # KeyError: unusable
    used = space >= 0
    if used.any() and int(space[used].max()) >= len(models):
        raise ValueError("space id beyond the snapshot's spaces")
    space[used] = remap[space[used]]
    return cols


def _load_row(st: EngineState, rid: int, rec: Record | None, unembedded: set[int]) -> None:
    """Bring the row of ``rid`` in line with its record (None: deleted)."""
    row = st.columns.rows.get(rid)
    if rec is None:
        if row is not None:
            st.columns.remove(rid, st.columns.namespace_of(row))
            st.keywords.remove(row)
        return
    space = -1 if rid in unembedded else st.spaces[rec.embedding_model].id
    if row is None:
        row = st.columns.add(rec, space)
    else:
        st.columns.set(row, rec, space, -1)
    upkeep.post_content(st, row, rec)


def _load_indexes(st: EngineState, txn: Txn) -> None:
    """Restore or rebuild every (space, tier) index of the live rows, and point the rows at them."""
    cols = st.columns
    live = np.sort(np.fromiter(cols.rows.values(), np.int64, len(cols.rows)))
    space, tier = cols.column("space")[live], cols.column("tier")[live]
    vks, rids = cols.column("vk")[live], cols.column("rid")[live]
    waiting = space < 0  # stored while the embedder failed: keyword-searchable only
    cols.activate(live[waiting], np.full(int(waiting.sum()), -1, np.int64))
    # A search scans the pending vectors of every index of its space: they share one budget.
    budget = {sp.id: st.config.startup_pending_max for sp in st.space_list}
    for sid, t in sorted({(int(a), int(b)) for a, b in zip(space[~waiting], tier[~waiting], strict=True)}):
        sel = (space == sid) & (tier == t)
        budget[sid] -= _load_index(
            st, txn, st.space_list[sid], t, _Rows(live[sel], vks[sel], rids[sel]), budget[sid]
        )


@dataclass
class _Rows:
    """The live rows of one index: column rows, their vector keys and record ids."""

    rows: np.ndarray
    vks: np.ndarray
    rids: np.ndarray


def _load_index(st: EngineState, txn: Txn, sp: Space, tier: int, live: _Rows, pending_max: int) -> int:
    """Restore or rebuild one index; returns how many of its vectors were left pending (at
    most ``pending_max``)."""
    idx, internal = _from_snapshot(st, sp, tier, live)
    sp.indexes[tier] = idx
    missing = np.flatnonzero(internal < 0)
    # Vectors a stale snapshot lacks (written after it: kill -9), or all of them when there is
    # no snapshot to start from (none, or compaction), are searchable at once as pending
    # entries and enter HNSW in the background after SERVING: up to startup_pending_max of
    # them in each embedding space, all its indexes together (every search of the space scans
    # them exactly meanwhile); any beyond that are indexed before SERVING, first, however many
    # the snapshot holds, so a large backlog never keeps the server from SERVING for long.
    later = min(int(missing.shape[0]), pending_max)
    first = int(missing.shape[0]) - later
    for part, defer in ((missing[:first], False), (missing[first:], True)):
        if defer and later:
            # Room for the writes that may arrive while these drain, too (a write waits once
            # max_pending beyond the backlog are pending): the first must not copy them all.
            idx.reserve(later + st.config.tuning.max_pending + st.config.max_batch_size)
        for start in range(0, part.shape[0], _CHUNK):
            chunk = part[start : start + _CHUNK]
            vecs = _stored_vectors(st, txn, sp, live.rids[chunk])
            if defer:
                internal[chunk] = idx.add(vecs, live.rows[chunk], live.vks[chunk], defer=True)
            else:  # no searches yet: FAISS adds in big batches on every core
                internal[chunk] = idx.add(vecs, live.rows[chunk], live.vks[chunk], chunk=_CHUNK)
    st.columns.activate(live.rows, location(sp.id, tier, internal))
    if missing.shape[0]:
        logger.info(
            "index %s/%d: %d vectors from snapshot, %d from LMDB (%d indexed before serving, "
            "%d pending, indexed in the background)",
            sp.model,
            tier,
            live.rows.shape[0] - missing.shape[0],
            missing.shape[0],
            first,
            later,
        )
    return later


def _from_snapshot(st: EngineState, sp: Space, tier: int, live: _Rows) -> tuple[Index, np.ndarray]:
    """The index snapshot of a space's tier with the live rows revived in it, or a new index when
    there is none or too much of it is dead; and each row's internal id in it (-1: not in it).
    A follower maps the snapshot's HNSW from its file (shared with the other followers) under an
    index of its own for what it adds (``LayeredIndex``); it keeps a snapshot as dead as the
    leader lets its own indexes get before compacting them, since it would rebuild a private
    copy instead."""
    none = np.full(live.rows.shape[0], -1, np.int64)  # (no row in it)
    loaded = st.load_snapshot(sp, tier, mapped=st.following)
    if loaded is None or not loaded[0].n:
        return st.empty_index(sp), none
    snap, snap_vks = loaded
    if not st.following:  # (a follower's snapshot may be newer than its read of LMDB: catch-up adds those)
        snap_vks = _forget_lost_keys(st, sp, tier, snap, snap_vks)
    # Map each record's current vk to its entry in the snapshot; unmatched entries stay dead.
    internal = entries_by_vk(snap_vks, live.vks)
    hit = internal >= 0
    dead_after = snap.n - int(hit.sum())
    most = st.config.tuning.compact_dead_share if snap.mapped else 0.25
    if dead_after / snap.n > most:  # compaction: too many tombstones, rebuild from LMDB
        logger.info("rebuilding index %s/%d: %d of %d entries dead", sp.model, tier, dead_after, snap.n)
        idx = st.empty_index(sp)
        if isinstance(idx, LayeredIndex):
            idx.seen = snap.token  # (not to be considered again)
        return idx, none
    snap.revive(internal[hit], live.rows[hit])
    if snap.mapped:
        return LayeredIndex(snap, st.new_index(sp)), internal
    snap.advise_huge_pages()  # (kept: its arrays were read in 4 KB pages)
    return snap, internal


def _forget_lost_keys(
    st: EngineState, sp: Space, tier: int, snap: VectorIndex, snap_vks: np.ndarray
) -> np.ndarray:
    """``snap_vks`` without the vector keys LMDB never handed out as far as it knows: it rolled
    back under the snapshot (an older copy; sync off and a power loss), and new memories get
    those keys again. Cleared in the index too, so no later snapshot of it carries them."""
    stale = snap_vks >= st.next_vk
    if not stale.any():
        return snap_vks
    logger.warning(
        "index %s/%d: %d snapshot entries of commits LMDB no longer has", sp.model, tier, int(stale.sum())
    )
    snap_vks = np.where(stale, -1, snap_vks)
    snap.vks[: snap_vks.shape[0]] = snap_vks
    return snap_vks


def _stored_vectors(st: EngineState, txn: Txn, sp: Space, rids: np.ndarray) -> np.ndarray:
    vecs = np.empty((rids.shape[0], sp.dim), np.float32)
    for j, rid in enumerate(rids.tolist()):
        v = st.store.get_vector(txn, int(rid))
        if v is None or v.shape[0] != sp.dim:
            raise RuntimeError(f"record {int(rid)} has no valid vector in LMDB")
        vecs[j] = v
    return vecs
