"""Keyword search: BM25 scores of the allowed rows from the in-memory keyword index, and their
reciprocal rank fusion with the vector ranking (``hybrid`` on a weighted-sum strategy)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiermem import kernels
from tiermem.kernels import fusion
from tiermem.kernels.keywords import Sums, no_sums
from tiermem.server.index.columns import ColumnsView
from tiermem.server.index.keyword_index import keyword_sums
from tiermem.server.search.query import Hybrid
from tiermem.server.search.ranking import Ranked, Scored, Scorer
from tiermem.server.search.source import SearchSource


@dataclass
class KeywordScores:
    """The best BM25 matches of the keywords among the allowed rows, best first."""

    rows: np.ndarray
    scores: np.ndarray
    probed: np.ndarray  # the scores of the rows the caller asked about (0: no term)
    sims: np.ndarray | None = None  # the rows' similarities with the query, when looked up already


def keyword_pass(
    source: SearchSource,
    mask: np.ndarray,
    count: int,
    namespaces: list[str],
    text: str,
    depth: int,
) -> Sums:
    """The keyword pass of ``bm25``, its sums to read out (``Sums.collect``, or ``Sums.best`` when the
    rows to probe come later)."""
    if count == 0:
        return no_sums()
    ids = [i for i in (source.columns.namespaces.get(ns) for ns in namespaces) if i >= 0]
    bits = source.shared_mask_bits(mask)
    return keyword_sums(source.keywords, ids, text, mask, source.config.max_keyword_postings, depth, bits)


def bm25(
    source: SearchSource,
    view: ColumnsView,
    mask: np.ndarray,
    count: int,
    namespaces: list[str],
    text: str,
    depth: int,
    probe: np.ndarray | None = None,
) -> KeywordScores:
    """The ``depth`` allowed rows (``count`` of them) of the namespaces best matching ``text`` by BM25,
    best first, and the scores of the ``probe`` rows; terms found in more than max_keyword_postings of
    their memories are skipped (they say almost nothing)."""
    sums = keyword_pass(source, mask, count, namespaces, text, depth)
    # (the probe rows are read out with the best: exact even where the pass skipped postings)
    rows, scores, probed = sums.collect(probe, depth)
    return KeywordScores(rows, scores, probed)


def fuse(keywords: KeywordScores, hybrid: Hybrid, scored: Scored, depth: int, scorer: Scorer) -> Ranked:
    """Reciprocal rank fusion of the vector (combined score) list and the keyword (BM25) list,
    each cut at ``depth``: fused = w_v / (k + rank_v) + w_k / (k + rank_k). Keyword rows not in
    the vector list are scored by ``scorer``'s ranking (relevance 0 when they have no vector yet),
    in one kernel call (``rrf_rank``) with the fusion."""
    v_order = kernels.topk(scored.score, depth)
    vector = (
        scored.rows[v_order],
        scored.rel[v_order],
        scored.score[v_order],
        scored.rec[v_order],
        scored.imp[v_order],
    )
    k_rows, k_scores = keywords.rows[:depth], keywords.scores[:depth]  # (best first already)
    a = scorer.params
    f = fusion.rrf_rank(
        vector, k_rows, scorer.relevance(k_rows), k_scores, rrf_k=hybrid.rrf_k, w_vec=hybrid.vector_weight,
        w_kw=hybrid.keyword_weight, row_w=scorer.row_w, min_similarity=a.min_similarity, alpha=a.alpha,
        beta=a.beta, gamma=a.gamma, **scorer.columns,
    )  # fmt: skip
    both = Scored(f.rows, f.rel, f.score, f.rec, f.imp)
    return Ranked(
        both, f.fused, vector_rank=f.vector_rank, keyword_rank=f.keyword_rank, keyword_score=f.keyword_score
    )
