"""Summaries the server keeps itself, for namespaces whose policy sets ``auto_summarize``: once a
create makes a namespace's summary due (its new tokens exceed ``summary_token_threshold``), the
summarizer thread condenses the previous summary and the memories since into a new one (by the
namespace's ``summary_strategy``, within ``summary_max_tokens``, no LLM) and stores it as the
namespace's summary (kind "summary"), replacing the previous one like an agent's would.

The summary covers the memories it read: a memory created while it was built counts toward the
next one (the scope keeps the last record id covered, and the tokens of what it did not cover).
It is stored only if no other summary was stored, and nothing it read deleted, meanwhile (else it
is built again). A failure keeps the previous summary; the namespace is tried again at its next
create that finds the summary due, or at the next maintenance pass. In a protected namespace the
server replaces the summary only if the namespace's own policy sets ``auto_summarize``.

Concurrency: one thread builds (reading the columns and LMDB) and stores through ``create``, so
the writer serializes it with every other write."""

from __future__ import annotations

import logging

import numpy as np

from tiermem.server.config import SUMMARY_STRATEGIES
from tiermem.server.core.create import SummaryCovers, create_detailed, due_of, scope_progress
from tiermem.server.core.evictions import EVICTION_SUMMARY_KIND
from tiermem.server.core.failures import Failures
from tiermem.server.core.state import EngineState
from tiermem.server.model.condense import Piece, hierarchical, rolling, sentences, sources
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.text import estimate_tokens

logger = logging.getLogger(__name__)

SUMMARY_KIND = "summary"
SUMMARIZER_SOURCE = "tiermem:summarizer"
MAX_SOURCE_IDS = 1000
HIERARCHICAL = SUMMARY_STRATEGIES["hierarchical"]


def loop(st: EngineState) -> None:
    """Keep the summaries of the namespaces requested (``EngineState.request_summary``) until stop,
    those due already first."""
    try:
        request_due(st)
    except Exception:  # (the loop goes on: creates request theirs)
        logger.exception("finding the summaries due at the start failed")
    while not st.stop.is_set():
        st.summaries_wake.wait(1.0)
        st.summaries_wake.clear()
        with st.summaries_lock:
            due, st.summaries_due = st.summaries_due, set()
        for ns in sorted(due):
            if st.stop.is_set():
                return
            keep(st, ns)


def request_due(st: EngineState) -> int:
    """Request every summary the server keeps that is due now: a create requests its own, but in
    memory only (a crash loses it), and a summary can be due from before (a restart, a policy that
    turned auto_summarize on or lowered the threshold) with no create to request it."""
    with st.store.read() as txn:
        states = st.store.scope_states(txn)
    due = [ns for ns, state in states if due_of(st, ns, state).summary_kept]
    for ns in due:
        st.request_summary(ns)
    return len(due)


def retry_failed(st: EngineState) -> None:
    """Request again the summaries that failed (the maintenance pass)."""
    with st.summaries_lock:
        failed, st.summaries_failed = st.summaries_failed, set()
    for ns in failed:
        st.request_summary(ns)


FAILURES = Failures("keeping a summary")  # (its log lines: a full disk is said once a minute)


def keep(st: EngineState, namespace: str) -> bool:
    """Build and store the namespace's summary if it is due and the policy keeps one; whether one
    was stored. A failure is logged and counted, and the namespace kept for a retry."""
    try:
        return _keep(st, namespace)
    except FailedPrecondition as e:
        if e.reason != "SUMMARY_STALE":
            raise
        st.request_summary(namespace)  # (another summary, or a deletion, came first: build again)
        return False
    except Exception as e:
        FAILURES.failed(e, f"of {namespace}; the previous one stays")
        st.summaries.failed(namespace)
        with st.summaries_lock:
            st.summaries_failed.add(namespace)
        return False


def _keep(st: EngineState, namespace: str) -> bool:
    policy = st.policy_for(namespace)
    if not policy.auto_summarize or not _may_replace(st, namespace):
        return False
    progress = scope_progress(st, namespace)
    if not progress.summary_due:
        return False
    got = _since_last(st, namespace, progress.summary_rid, progress.covered_rid)
    if got is None:
        return False
    previous, recs, covers = got
    pieces = [Piece(r.content, r.importance) for r in recs]
    earlier: list[Piece] = []
    if previous is not None:
        # The previous summary's sentences rank oldest, as important as the new memories on
        # average: an important memory once summarized does not keep every later one out.
        usual = sum(p.importance for p in pieces) / len(pieces)
        earlier = [Piece(s, usual) for s in sentences(previous.content)]
    budget = min(policy.summary_max_tokens, st.config.max_content_bytes // 4 - 1)
    if policy.summary_strategy == HIERARCHICAL:
        text, _, quoted = hierarchical(earlier + pieces, budget)
    else:
        text, quoted = rolling(earlier + pieces, budget)
    named = sources(len(recs), [i - len(earlier) for i in quoted if i >= len(earlier)], MAX_SOURCE_IDS)
    condensed = sum(r.token_cost for r in recs) + (previous.token_cost if previous is not None else 0)
    summary = NewMemory(
        namespace=namespace,
        content=text,
        kind=SUMMARY_KIND,
        importance=max(r.importance for r in recs),
        source=SUMMARIZER_SOURCE,
        source_ids=[recs[i].id for i in named],
    )
    create_detailed(st, [summary], allow_duplicates=True, confirm=True, summary_covers=covers)
    st.summaries.stored(namespace, max(0, condensed - estimate_tokens(text)))
    return True


def _may_replace(st: EngineState, namespace: str) -> bool:
    """A protected namespace's summary is replaced only where the namespace itself (not a preset
    or the server's default) asks for kept summaries: its policy changes need confirmation."""
    settings = st.ns_config.get(namespace, {})
    return not settings.get("protected") or (settings.get("policy") or {}).get("auto_summarize") is True


def _since_last(
    st: EngineState, namespace: str, summary_rid: int, covered_rid: int
) -> tuple[Record | None, list[Record], SummaryCovers] | None:
    """The namespace's current summary, its memories (with some content) after the last one it
    covers, oldest first, and what a summary of them covers; None when there are none. Rows not
    yet visible to searches (their vector still being indexed) are read too: LMDB says which are
    deleted."""
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
            if r is not None and r.kind not in (SUMMARY_KIND, EVICTION_SUMMARY_KIND)
        ]
    recs = [r for r in recs if not r.expired(now) and r.content.strip()]
    if previous is not None and (previous.namespace != namespace or previous.kind != SUMMARY_KIND):
        previous = None
    if not recs:
        return None
    last = max(r.rid for r in recs)
    # The tokens creates counted for the rows covered (deleted ones included), summaries apart.
    summaries = [
        k for k in (st.columns.kinds.get(SUMMARY_KIND), st.columns.kinds.get(EVICTION_SUMMARY_KIND)) if k >= 0
    ]
    counted = rows[(view.rid[rows] <= last) & ~np.isin(view.kind[rows], summaries)]
    covers = SummaryCovers(last, int(view.tokens[counted].sum()), summary_rid, covered_rid)
    return previous, recs, covers
