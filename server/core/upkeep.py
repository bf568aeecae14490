"""Keeping the columns and the vector indexes in line with LMDB after a commit: new records indexed
then shown, changed vectors added before the old entry dies, deleted rows hidden before their
entries die; and memories stored while the embedder failed, embedded later.

Concurrency: these functions run in the writer thread (a follower: in its catch-up), after the
commit they mirror; searches read the columns and indexes meanwhile, so each change is ordered to
keep every row a search can see pointing at a live entry."""

from __future__ import annotations

import logging

import numpy as np

from tiermem.server.core.state import EngineState
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.index.spaces import Index
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import Record
from tiermem.server.model.types import INTERNAL_MASK, SPACE_SHIFT, TIER_SHIFT, location
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)


def post_content(st: EngineState, row: int, rec: Record) -> None:
    """Post a row's content to the keyword index (again, when it changed: old postings stop counting)."""
    st.keywords.add(row, st.columns.namespaces.get(rec.namespace), rec.content)


def index_new(st: EngineState, items: list[tuple[Record, np.ndarray]]) -> None:
    """Add committed records to the keyword index and HNSW first, then make their rows visible."""
    cols = st.columns
    groups: dict[tuple[int, int], list[tuple[int, Record, np.ndarray]]] = {}
    for rec, vec in items:
        if vec.shape[0] == 0:  # waiting for its embedding: visible to keyword search only
            row = cols.add(rec, -1)
            post_content(st, row, rec)
            cols.activate(np.array([row], np.int64), np.array([-1], np.int64))
            continue
        sp = st.space(rec.embedding_model, int(vec.shape[0]))
        row = cols.add(rec, sp.id)
        post_content(st, row, rec)
        groups.setdefault((sp.id, rec.tier), []).append((row, rec, vec))
    for (sid, tier), group in groups.items():
        sp = st.space_list[sid]
        rows = np.array([g[0] for g in group], np.int64)
        internal = st.index(sp, tier).add(
            np.stack([g[2] for g in group]),
            rows,
            np.array([g[1].vk for g in group], np.int64),
            max_pending=st.max_pending,
        )
        cols.activate(rows, location(sid, tier, internal))


def reindex(st: EngineState, old_vk: int, rec: Record, vec: np.ndarray | None) -> None:
    """Refresh a row whose vector key was ``old_vk``; when its vector moved (a new vector, or the
    same one in another tier: ``vec`` None), add the new entry, then kill the old."""
    row = st.columns.rows[rec.rid]
    view = st.columns.view()
    loc = int(view.vpos[row])
    if rec.vk == old_vk or (loc < 0 and vec is None):  # same vector (or still none)
        st.columns.set(row, rec, int(view.space[row]), loc)
        return
    old = entry(st, loc)
    if vec is None:  # tier move: same vector, new index
        assert old is not None
        vec = old[0].vectors(old[1])[0]
    sp = st.space(rec.embedding_model, int(vec.shape[0]))
    internal = st.index(sp, rec.tier).add(
        vec[None, :],
        np.array([row], np.int64),
        np.array([rec.vk], np.int64),
        max_pending=st.max_pending,
    )
    st.columns.set(row, rec, sp.id, location(sp.id, rec.tier, int(internal[0])))
    if old is not None:
        old[0].kill(old[1])


def refresh_rows(st: EngineState, recs: list[Record]) -> None:
    """Rewrite the rows of records whose vector did not change (gone rows are skipped)."""
    view = st.columns.view()
    for rec in recs:
        row = st.columns.rows.get(rec.rid)
        if row is not None:
            st.columns.set(row, rec, int(view.space[row]), int(view.vpos[row]))


def entry(st: EngineState, loc: int) -> tuple[Index, np.ndarray] | None:
    """The index and internal id of a ``vpos`` location (None: no entry)."""
    if loc < 0:
        return None
    sp = st.space_list[loc >> SPACE_SHIFT]
    return sp.indexes[(loc >> TIER_SHIFT) & 0xF], np.array([loc & INTERNAL_MASK], np.int64)


def unindex(st: EngineState, recs: list[Record] | list[tuple[int, str]]) -> int:
    """Hide rows first, then tombstone their HNSW entries. ``recs``: records, or (rid, namespace)
    pairs. Returns how many."""
    gone = []
    for rec in recs:
        rid, ns = rec if isinstance(rec, tuple) else (rec.rid, rec.namespace)
        row = st.columns.remove(rid, ns)
        st.keywords.remove(row)
        found = entry(st, int(st.columns.view().vpos[row]))
        if found is not None:  # (a memory still waiting for its embedding has no index entry)
            found[0].kill(found[1])
            gone.append(row)
    if gone:
        # A search whose mask still holds such a row then drops it instead of reading an
        # internal id a later compaction may have given to another entry.
        st.columns.relocate(np.array(gone, np.int64), np.full(len(gone), -1, np.int64))
    return len(recs)


def retry_embeddings(st: EngineState, limit: int = 256) -> int:
    """Embed memories stored while the embedder failed; returns how many got their vector."""
    with st.store.read() as txn:
        recs = [r for r in (st.store.get(txn, rid) for rid in st.store.pending_rids(txn, limit)) if r]
    done = 0
    for rec in recs:
        try:
            vec = check.vector("embedding", st.embedder.embed(rec.content), st.config)
        except EmbedderError as e:
            logger.warning("embedding still failing (%d waiting): %s", len(recs) - done, e)
            break
        except InvalidArgument as e:  # (this text's vector, not the embedder: the others go on)
            logger.warning("memory %s of %r has no usable vector: %s", rec.id, rec.namespace, e)
            continue
        done += _attach_vector(st, rec.rid, vec)
    return done


def _attach_vector(st: EngineState, rid: int, vec: np.ndarray) -> int:
    def prepare(txn: Txn) -> Record | None:
        rec = st.store.get(txn, rid)
        if rec is None or not st.store.is_pending(txn, rid):
            return None  # deleted, or done meanwhile
        model = rec.embedding_model
        st.claim_space(txn, "embedding", model, int(vec.shape[0]), st.store.space(txn, model))
        _, rec.vk = st.alloc_ids()
        st.store.put(txn, rec)
        st.store.put_vector(txn, rid, vec)
        st.store.mark_pending(txn, rid, False)
        return rec

    def apply(rec: Record | None) -> int:
        if rec is None or rec.rid not in st.columns.rows:
            return 0
        sp = st.space(rec.embedding_model, int(vec.shape[0]))
        row = st.columns.rows[rec.rid]
        internal = st.index(sp, rec.tier).add(
            vec[None, :], np.array([row], np.int64), np.array([rec.vk], np.int64)
        )
        st.columns.set(row, rec, sp.id, location(sp.id, rec.tier, int(internal[0])))
        return 1

    return int(st.writer.submit(prepare, apply))
