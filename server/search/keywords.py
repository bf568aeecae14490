"""Hybrid search: BM25 keyword scores of the allowed rows, and their reciprocal rank fusion with the
vector ranking. Keyword postings are read from the store (LMDB)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tiermem import kernels
from tiermem.server.index.columns import ColumnsView
from tiermem.server.model.text import term_counts
from tiermem.server.search.query import Hybrid
from tiermem.server.search.ranking import Ranked, Scored, Scorer
from tiermem.server.search.source import SearchSource


@dataclass
class KeywordScores:
    """BM25 of every allowed row containing a term of the keywords."""

    rows: np.ndarray
    scores: np.ndarray


def bm25(
    source: SearchSource, view: ColumnsView, mask: np.ndarray, text: str, k1: float = 1.2, b: float = 0.75
) -> KeywordScores:
    """BM25 of every allowed row containing a term of ``text``. Terms in more than
    max_keyword_postings memories are skipped (they carry almost no information)."""
    n_docs = int(mask.sum())
    if n_docs == 0:
        return KeywordScores(np.empty(0, np.int64), np.empty(0, np.float32))
    lengths = view.words
    avgdl = max(1.0, float(lengths[mask].mean()))
    acc: dict[int, float] = {}
    rows_of = source.columns.rows
    store = source.store
    with store.read() as txn:
        for term in term_counts(text):
            posts = store.term_postings(txn, term, source.config.max_keyword_postings)
            if not posts:
                continue
            found = [
                (row, tf)
                for row, tf in ((rows_of.get(rid, -1), tf) for rid, tf in posts)
                if 0 <= row < view.n and mask[row]
            ]
            if not found:
                continue
            df = len(found)
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            for row, tf in found:
                dl = float(lengths[row])
                acc[row] = acc.get(row, 0.0) + idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    rows = np.fromiter(acc.keys(), np.int64, len(acc))
    return KeywordScores(rows, np.fromiter(acc.values(), np.float32, len(acc)))


def fuse(keywords: KeywordScores, hybrid: Hybrid, scored: Scored, depth: int, scorer: Scorer) -> Ranked:
    """Reciprocal rank fusion of the vector (combined score) list and the keyword (BM25) list,
    each cut at ``depth``: fused = w_v / (k + rank_v) + w_k / (k + rank_k). Keyword rows not in
    the vector list are scored by ``scorer`` (relevance 0 when they have no vector yet)."""
    k, w_vec, w_kw = hybrid.rrf_k, hybrid.vector_weight, hybrid.keyword_weight
    v_order = kernels.topk(scored.score, depth)
    v_rows = scored.rows[v_order]
    k_order = kernels.topk(keywords.scores, depth)
    k_rows = keywords.rows[k_order]
    extra = scorer(np.setdiff1d(k_rows, v_rows), True)
    all_rows = np.concatenate([v_rows, extra.rows])
    pos = {int(r): i for i, r in enumerate(all_rows.tolist())}
    n = all_rows.shape[0]
    v_rank = np.zeros(n, np.int64)
    v_rank[: v_rows.shape[0]] = np.arange(1, v_rows.shape[0] + 1)
    k_rank = np.zeros(n, np.int64)
    kw_of = np.zeros(n, np.float32)
    ranked_keywords = zip(k_rows.tolist(), keywords.scores[k_order].tolist(), strict=True)
    for r, (row, s) in enumerate(ranked_keywords, start=1):
        i = pos.get(row)
        if i is not None:
            k_rank[i], kw_of[i] = r, s
    fused = np.zeros(n, np.float32)
    fused[v_rank > 0] += w_vec / (k + v_rank[v_rank > 0])
    fused[k_rank > 0] += w_kw / (k + k_rank[k_rank > 0])
    fused[fused <= 0] = np.nan  # in neither weighted list: not a result
    cat = np.concatenate
    both = Scored(
        all_rows,
        cat([scored.rel[v_order], extra.rel]),
        cat([scored.score[v_order], extra.score]),
        cat([scored.rec[v_order], extra.rec]),
        cat([scored.imp[v_order], extra.imp]),
    )
    return Ranked(both, fused, vector_rank=v_rank, keyword_rank=k_rank, keyword_score=kw_of)
