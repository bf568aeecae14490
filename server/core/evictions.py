"""Summaries of what a lifecycle pass evicted, for namespaces whose policy sets
``summarize_evictions``: per (namespace, tier), one extractive summary (no LLM) of the memories the
tier's capacity evicted, stored in that tier as a memory of kind ``eviction_summary`` with the
evicted ids as its sources. The pass evicted one memory more than the surplus to make room for it.

The contents are read, and the summaries written (one commit each), before the pass applies its
moves: a crash between leaves the summary and the memories, which the next pass evicts again. They count toward no reflection or summary."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import numpy as np

from tiermem.server.core import upkeep
from tiermem.server.core.policy import EVICTION_SUMMARY_KIND, TIERS
from tiermem.server.core.state import EngineState
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.index.columns import ColumnsView
from tiermem.server.model.condense import cut
from tiermem.server.model.records import Record
from tiermem.server.model.text import estimate_tokens, first_sentence, fitting_sentences, sentences
from tiermem.server.model.types import NO_VECTOR
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)

EVICTION_SUMMARY_SOURCE = "tiermem:lifecycle"
MAX_SOURCE_IDS = 1000


@dataclass
class PendingSummary:
    """A summary to store once the pass's moves are applied."""

    namespace: str
    tier: int
    text: str
    importance: float  # the highest importance among the evicted
    source_ids: list[str]
    covered_tokens: int = 0  # the evicted memories' tokens


def extract(recs: list[Record], max_tokens: int) -> str:
    """The first sentence of each record (every sentence of an evicted summary: what it summarized
    goes on), the most important first (the latest created among equals), kept within
    ``max_tokens``, then put in creation order."""
    units = [(r, first_sentence(r.content), False) for r in recs]
    for r in recs:  # (a summary's further sentences come after every evicted memory's first)
        if r.kind == EVICTION_SUMMARY_KIND:
            units += [(r, s, True) for s in sentences(r.content)[1:]]
    order = sorted(
        range(len(units)), key=lambda i: (units[i][2], -units[i][0].importance, -units[i][0].created_at, i)
    )
    chosen = fitting_sentences([s for _, s, _ in units], order, max_tokens)
    if not chosen and units:  # not one sentence fits: the most important one, cut to the budget
        return cut(units[order[0]][1], max_tokens)
    chosen.sort(key=lambda i: (units[i][0].created_at, units[i][0].rid, units[i][2], i))
    return " ".join(units[i][1] for i in chosen)


def collect(
    st: EngineState, view: ColumnsView, evicted: dict[tuple[int, int], np.ndarray]
) -> list[PendingSummary]:
    """The summaries of the rows evicted per (namespace id, tier), read before they move."""
    out = []
    with st.store.read() as txn:
        for (_, tier), rows in sorted(evicted.items()):
            recs = [r for r in (st.store.get(txn, int(view.rid[row])) for row in rows) if r is not None]
            text = extract(recs, st.config.tuning.eviction_summary_tokens)
            if text:
                ids = _sources(sorted(recs, key=lambda r: (r.created_at, r.rid)), tier)
                top = max(r.importance for r in recs)
                covered = sum(r.token_cost for r in recs)
                out.append(PendingSummary(recs[0].namespace, tier, text, top, ids, covered))
    return out


def _sources(recs: list[Record], tier: int) -> list[str]:
    """The ids a summary of ``recs`` lists: theirs; a summary GLACIAL deletes lists its own sources
    instead (it is gone; they may not be), after the memories evicted themselves."""
    gone = [tier == TIERS[-1] and r.kind == EVICTION_SUMMARY_KIND for r in recs]
    ids = [r.id for r, g in zip(recs, gone, strict=True) if not g]
    ids += [i for r, g in zip(recs, gone, strict=True) if g for i in r.source_ids]
    return list(dict.fromkeys(ids))[:MAX_SOURCE_IDS]


def store(st: EngineState, pending: list[PendingSummary], now: float) -> int:
    """Store the summaries (embedded by the server's embedder); returns how many were stored."""
    stored = 0
    for p in pending:
        try:
            vec = st.embedder.embed(p.text)
        except EmbedderError as e:  # stored anyway; the maintenance pass embeds it later
            logger.warning("storing an eviction summary without its embedding for now: %s", e)
            vec = NO_VECTOR
        try:
            _submit(st, p, vec, now)
        except Exception:  # (it ends the pass before it evicts: nothing is lost)
            st.summaries.failed(p.namespace)
            raise
        st.summaries.stored(p.namespace, max(0, p.covered_tokens - estimate_tokens(p.text)))
        stored += 1
    return stored


def _submit(st: EngineState, p: PendingSummary, vec: np.ndarray, now: float) -> None:
    def prepare(txn: Txn) -> tuple[Record, np.ndarray]:
        return _insert(st, txn, p, vec, now)

    def apply(item: tuple[Record, np.ndarray]) -> None:
        upkeep.index_new(st, [item])

    st.writer.submit(prepare, apply)


def _insert(
    st: EngineState, txn: Txn, p: PendingSummary, vec: np.ndarray, now: float
) -> tuple[Record, np.ndarray]:
    model = st.embedder.model
    if vec.shape[0]:
        known = st.store.space(txn, model)
        if known is None:
            st.store.put_space(txn, model, int(vec.shape[0]))
        elif known != vec.shape[0]:
            vec = NO_VECTOR  # (the space changed dimension: stored for keywords only)
    rid, vk = st.alloc_ids()
    rec = Record(
        rid=rid,
        id=uuid.uuid4().hex,
        namespace=p.namespace,
        content=p.text,
        kind=EVICTION_SUMMARY_KIND,
        tier=p.tier,
        importance=float(p.importance),
        source=EVICTION_SUMMARY_SOURCE,
        embedding_model=model,
        created_at=now,
        updated_at=now,
        accessed_at=now,
        tier_since=now,
        token_cost=estimate_tokens(p.text),
        source_ids=p.source_ids,
        vk=vk,
    )
    st.store.insert(txn, rec)
    if vec.shape[0]:
        st.store.put_vector(txn, rid, vec, new=True)
    else:
        st.store.mark_pending(txn, rid, True)
    return rec, vec
