"""Summaries the server keeps itself, for namespaces whose policy sets ``auto_summarize``: once a
create makes a namespace's summary due (its new tokens exceed ``summary_token_threshold``), the
summarizer thread condenses the previous summary and the memories since into a new one (by the
namespace's ``summary_strategy``, within ``summary_max_tokens``, no LLM) and stores it as the
namespace's summary (kind "summary"), replacing the previous one like an agent's would.

The summary covers the memories it read: a memory created while it was built counts toward the
next one (the scope keeps the last record id covered, and the tokens that arrived since the
summary was started). A failure
keeps the previous summary; the namespace is tried again at its next create or maintenance pass.

Concurrency: one thread builds (reading the columns and LMDB) and stores through ``create``, so
the writer serializes it with every other write."""

from __future__ import annotations

import logging

import numpy as np

from tiermem.server.config import SUMMARY_STRATEGIES
from tiermem.server.core.create import create_detailed, scope_progress
from tiermem.server.core.evictions import EVICTION_SUMMARY_KIND
from tiermem.server.core.state import EngineState
from tiermem.server.model.condense import Piece, hierarchical, rolling, sentences
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.text import estimate_tokens

logger = logging.getLogger(__name__)

SUMMARY_KIND = "summary"
SUMMARIZER_SOURCE = "tiermem:summarizer"
MAX_SOURCE_IDS = 1000
HIERARCHICAL = SUMMARY_STRATEGIES["hierarchical"]


def loop(st: EngineState) -> None:
    """Keep the summaries of the namespaces requested (``EngineState.request_summary``) until stop."""
    while not st.stop.is_set():
        st.summaries_wake.wait(1.0)
        st.summaries_wake.clear()
        with st.summaries_lock:
            due, st.summaries_due = st.summaries_due, set()
        for ns in sorted(due):
            if st.stop.is_set():
                return
            keep(st, ns)


def retry_failed(st: EngineState) -> None:
    """Request again the summaries that failed (the maintenance pass)."""
    with st.summaries_lock:
        failed, st.summaries_failed = st.summaries_failed, set()
    for ns in failed:
        st.request_summary(ns)


def keep(st: EngineState, namespace: str) -> bool:
    """Build and store the namespace's summary if it is due and the policy keeps one; whether one
    was stored. A failure is logged and counted, and the namespace kept for a retry."""
    try:
        return _keep(st, namespace)
    except Exception:
        logger.exception("keeping the summary of %s failed; the previous one stays", namespace)
        st.summaries.failed(namespace)
        with st.summaries_lock:
            st.summaries_failed.add(namespace)
        return False


def _keep(st: EngineState, namespace: str) -> bool:
    policy = st.policy_for(namespace)
    if not policy.auto_summarize:
        return False
    progress = scope_progress(st, namespace)
    if not progress.summary_due:
        return False
    previous, recs, last_rid = _since_last(st, namespace, progress.summary_rid, progress.covered_rid)
    if not recs:
        return False
    pieces = [Piece(r.content, r.importance) for r in recs]
    if previous is not None:
        pieces = [Piece(s, previous.importance) for s in sentences(previous.content)] + pieces
    budget = min(policy.summary_max_tokens, st.config.max_content_bytes // 4 - 1)
    if policy.summary_strategy == HIERARCHICAL:
        text, _ = hierarchical(pieces, budget)
    else:
        text = rolling(pieces, budget)
    condensed = sum(r.token_cost for r in recs) + (previous.token_cost if previous is not None else 0)
    summary = NewMemory(
        namespace=namespace,
        content=text,
        kind=SUMMARY_KIND,
        importance=max(p.importance for p in pieces),
        source=SUMMARIZER_SOURCE,
        source_ids=[r.id for r in recs][-MAX_SOURCE_IDS:],
    )
    create_detailed(
        st, [summary], allow_duplicates=True, confirm=True, summary_covers=(last_rid, progress.summary_tokens)
    )
    st.summaries.stored(namespace, max(0, condensed - estimate_tokens(text)))
    return True


def _since_last(
    st: EngineState, namespace: str, summary_rid: int, covered_rid: int
) -> tuple[Record | None, list[Record], int]:
    """The namespace's current summary, its memories after the last one it covers (oldest first,
    summaries left out) and the highest record id read. Rows not yet visible to searches (their
    vector still being indexed) are read too: LMDB says which are deleted."""
    nid = st.columns.namespaces.get(namespace)
    view = st.columns.view()
    now = st.clock()
    rows = np.flatnonzero((view.ns == nid) & (view.rid > covered_rid))
    rows = rows[np.lexsort((view.rid[rows], view.created[rows]))]
    with st.store.read() as txn:
        previous = st.store.get(txn, summary_rid) if summary_rid else None
        recs = [
            r
            for r in (st.store.get(txn, int(view.rid[row])) for row in rows)
            if r is not None and not r.expired(now) and r.kind not in (SUMMARY_KIND, EVICTION_SUMMARY_KIND)
        ]
    if previous is not None and (previous.namespace != namespace or previous.kind != SUMMARY_KIND):
        previous = None
    return previous, recs, int(view.rid[rows].max()) if rows.shape[0] else covered_rid
