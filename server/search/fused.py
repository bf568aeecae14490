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
from tiermem.kernels import keywords as kw_kernels
from tiermem.server.search.keywords import KeywordScores
from tiermem.server.search.ranking import Ranked, Scored, Scorer, concat_scored


@dataclass(frozen=True)
class FusedWeights:
    alpha: float = 1.0  # relevance
    beta: float = 0.1  # recency
    gamma: float = 0.1  # importance
    vector: float = 0.5  # the similarity's share of relevance, when the request has a vector
    keyword: float = 0.5  # the keyword score's share, when the request has text


def fused_scores(
    similarity: np.ndarray | None,
    keyword: np.ndarray | None,
    recency: np.ndarray,
    importance: np.ndarray,
    w: FusedWeights,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, relevance) of each candidate; ``similarity`` / ``keyword`` None when the request has no
    vector / no text (a candidate a signal did not find has its minimum: 0 keyword score)."""
    return kw_kernels.fused_scores(
        similarity, keyword, recency, importance, w.vector, w.keyword, w.alpha, w.beta, w.gamma
    )


def best_by_similarity(scored: Scored, depth: int) -> Scored:
    """The ``depth`` rows of ``scored`` most similar to the query, best first."""
    order = kernels.topk(scored.rel, depth)
    return Scored(
        scored.rows[order], scored.rel[order], scored.score[order], scored.rec[order], scored.imp[order]
    )


def rank_fused(
    vector: Scored | None,
    keywords: KeywordScores | None,
    depth: int,
    scorer: Scorer,
    weights: FusedWeights,
    row_w: np.ndarray | None,
    min_similarity: float | None,
) -> Ranked:
    """The fused ranking of the candidates: ``vector``, the best rows by similarity (best first; the
    keyword scores probed for them), and the ``depth`` best keyword matches, which the vector list
    lacks are scored by ``scorer`` (similarity 0 when they have no vector yet)."""
    parts = [] if vector is None else [vector]
    kw_parts = [] if keywords is None or vector is None else [keywords.probed]
    k_rows = np.empty(0, np.int64)
    if keywords is not None:
        best = kernels.topk(keywords.scores, depth)
        k_rows = keywords.rows[best]
        seen = set() if vector is None else set(vector.rows.tolist())
        new = np.array([r not in seen for r in k_rows.tolist()], np.bool_)
        if new.any():
            extra = scorer(k_rows[new], True)
            parts.append(extra)
            kw_parts.append(keywords.scores[best][new])
    both = concat_scored(parts) if parts else scorer(np.empty(0, np.int64))
    kw = k_rank = None
    if keywords is not None:
        kw = np.concatenate(kw_parts) if kw_parts else np.zeros(both.rows.shape[0], np.float32)
        rank_of = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
        k_rank = np.array([rank_of.get(int(r), 0) for r in both.rows.tolist()], np.int64)
    v_rank = None
    if vector is not None:
        v_rank = np.zeros(both.rows.shape[0], np.int64)
        v_rank[: vector.rows.shape[0]] = np.arange(1, vector.rows.shape[0] + 1)
    base, _ = fused_scores(both.rel if vector is not None else None, kw, both.rec, both.imp, weights)
    score = base if row_w is None else base * row_w[both.rows]
    if min_similarity is not None:
        score = np.where(both.rel < min_similarity, np.float32(np.nan), score)
    ranked = Scored(both.rows, both.rel, base, both.rec, both.imp)  # base: the fused score before weights
    return Ranked(ranked, score, vector_rank=v_rank, keyword_rank=k_rank, keyword_score=kw)
