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
from tiermem.server.search.ranking import Ranked, Scored, Scorer


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


@dataclass
class Candidates:
    """Rows found by similarity, with it (None: not asked, as when no vector ranks)."""

    rows: np.ndarray
    sims: np.ndarray | None

    def best(self, depth: int) -> Candidates:
        """The ``depth`` most similar, best first."""
        assert self.sims is not None
        order = kernels.topk(self.sims, depth)
        return Candidates(self.rows[order], self.sims[order])


def rank_fused(
    vector: Candidates | None,
    keywords: KeywordScores | None,
    depth: int,
    scorer: Scorer,
    weights: FusedWeights,
    row_w: np.ndarray | None,
    min_similarity: float | None,
) -> Ranked:
    """The fused ranking of the candidates: ``vector``, the rows found by similarity (best first; the
    keyword scores probed for them), and the ``depth`` best keyword matches, those the vector list
    lacks with their similarity looked up (0 when they have no vector in the query's space). Every
    candidate is scored once, by ``scorer``, for its recency and importance."""
    rows = np.empty(0, np.int64) if vector is None else vector.rows
    rel = None if vector is None else vector.sims
    kw = k_rank = None
    if keywords is not None:
        k_rows = keywords.rows[:depth]  # (best first already)
        new, k_rank = kw_kernels.fusion_rows(rows, k_rows)
        extra = k_rows[new]
        kw = np.concatenate([keywords.probed, keywords.scores[:depth][new]])
        if extra.shape[0]:
            if rel is not None or scorer.query is not None:
                rel = np.concatenate(
                    [np.zeros(0, np.float32) if rel is None else rel, scorer.relevance(extra)]
                )
            rows = np.concatenate([rows, extra])
    scored = scorer(rows, rel=rel if rel is not None else np.zeros(rows.shape[0], np.float32))
    v_rank = None
    if vector is not None:
        v_rank = np.zeros(rows.shape[0], np.int64)
        v_rank[: vector.rows.shape[0]] = np.arange(1, vector.rows.shape[0] + 1)
    has_vector = vector is not None and vector.sims is not None
    base, _ = fused_scores(scored.rel if has_vector else None, kw, scored.rec, scored.imp, weights)
    score = base if row_w is None else base * row_w[rows]
    if min_similarity is not None:
        score = np.where(scored.rel < min_similarity, np.float32(np.nan), score)
    ranked = Scored(rows, scored.rel, base, scored.rec, scored.imp)  # base: the fused score before weights
    return Ranked(ranked, score, vector_rank=v_rank, keyword_rank=k_rank, keyword_score=kw)
