"""The default ranking: relevance first, recency and importance between near ties.

Over a search's candidates (the best by vector similarity and the best by keywords), each signal is
min-max normalized to [0, 1]: raw cosine of a sentence model spans a narrow band and BM25 has no fixed
scale, so neither can be added to recency or importance as it comes. Relevance is the weighted mean of
the normalized similarity and keyword score (only those the request carries); the score is

    alpha * relevance + beta * recency + gamma * importance

with small default beta and gamma, so recency and importance decide between memories about equally
relevant and do not push aside one clearly more relevant. Scores compare within one search only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tiermem import kernels
from tiermem.server.search.keywords import KeywordScores
from tiermem.server.search.ranking import Ranked, Scored, Scorer, concat_scored


@dataclass(frozen=True)
class FusedWeights:
    alpha: float = 1.0  # relevance
    beta: float = 0.1  # recency
    gamma: float = 0.1  # importance
    vector: float = 0.5  # the similarity's share of relevance, when the request has a vector
    keyword: float = 0.5  # the keyword score's share, when the request has text


def normalized(values: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] over the candidates (all 0 when they are all equal); NaN counts as the minimum."""
    v = np.nan_to_num(values.astype(np.float64), nan=-np.inf)
    finite = np.isfinite(v)
    if not finite.any():
        return np.zeros(values.shape[0], np.float64)
    lo, hi = v[finite].min(), v[finite].max()
    out = np.zeros(values.shape[0], np.float64)
    if hi > lo:
        out[finite] = (v[finite] - lo) / (hi - lo)
    return out


def fused_scores(
    similarity: np.ndarray | None,
    keyword: np.ndarray | None,
    recency: np.ndarray,
    importance: np.ndarray,
    w: FusedWeights,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, relevance) of each candidate; ``similarity`` / ``keyword`` None when the request has no
    vector / no text (a candidate a signal did not find has its minimum: 0 keyword score)."""
    parts = [(w.vector, similarity), (w.keyword, keyword)]
    used = [(weight, normalized(x)) for weight, x in parts if x is not None and weight > 0]
    total = sum(weight for weight, _ in used)
    relevance = np.zeros(recency.shape[0], np.float64)
    for weight, x in used:
        relevance += (weight / total) * x
    score = w.alpha * relevance + w.beta * normalized(recency) + w.gamma * normalized(importance)
    return score.astype(np.float32), relevance.astype(np.float32)


def rank_fused(
    vector: Scored | None,
    keywords: KeywordScores | None,
    depth: int,
    scorer: Scorer,
    weights: FusedWeights,
    row_w: np.ndarray | None,
    min_similarity: float | None,
) -> Ranked:
    """The fused ranking of the candidates: the ``depth`` best of ``vector`` (rows scored by
    similarity) and the ``depth`` best keyword matches; keyword rows the vector list lacks are scored
    by ``scorer`` (similarity 0 when they have no vector yet)."""
    parts = []
    if vector is not None:
        parts.append(_top(vector, vector.rel, depth))
    k_rows = np.empty(0, np.int64)
    if keywords is not None:
        k_rows = keywords.rows[kernels.topk(keywords.scores, depth)]
        known = parts[0].rows if parts else np.empty(0, np.int64)
        extra = np.setdiff1d(k_rows, known)
        if extra.shape[0]:
            parts.append(scorer(extra, True))
    both = concat_scored(parts) if parts else scorer(np.empty(0, np.int64))
    kw = None
    k_rank = None
    if keywords is not None:
        kw, k_rank = _keyword_columns(both.rows, keywords, k_rows)
    v_rank = None
    if vector is not None:
        v_rank = np.zeros(both.rows.shape[0], np.int64)
        n_vec = parts[0].rows.shape[0]
        v_rank[:n_vec] = np.argsort(np.argsort(-parts[0].rel, kind="stable"), kind="stable") + 1
    base, _ = fused_scores(both.rel if vector is not None else None, kw, both.rec, both.imp, weights)
    score = base if row_w is None else base * row_w[both.rows]
    if min_similarity is not None:
        score = np.where(both.rel < min_similarity, np.float32(np.nan), score)
    ranked = Scored(both.rows, both.rel, base, both.rec, both.imp)  # base: the fused score before weights
    return Ranked(ranked, score, vector_rank=v_rank, keyword_rank=k_rank, keyword_score=kw)


def _top(scored: Scored, key: np.ndarray, depth: int) -> Scored:
    order = kernels.topk(key, depth)
    return Scored(
        scored.rows[order], scored.rel[order], scored.score[order], scored.rec[order], scored.imp[order]
    )


def _keyword_columns(
    rows: np.ndarray, keywords: KeywordScores, k_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's BM25 (0: no match) and its 1-based rank among the keyword candidates (0: not one)."""
    order = np.argsort(keywords.rows)
    at = np.minimum(np.searchsorted(keywords.rows, rows, sorter=order), max(keywords.rows.shape[0] - 1, 0))
    kw = np.zeros(rows.shape[0], np.float32)
    if keywords.rows.shape[0]:
        hit = keywords.rows[order[at]] == rows
        kw[hit] = keywords.scores[order[at[hit]]]
    rank_of = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
    k_rank = np.array([rank_of.get(int(r), 0) for r in rows.tolist()], np.int64)
    return kw, k_rank
