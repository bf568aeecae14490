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
from tiermem.kernels import fusion
from tiermem.server.search.keywords import KeywordScores
from tiermem.server.search.ranking import Ranked, Scored, Scorer


@dataclass(frozen=True)
class FusedWeights:
    alpha: float = 1.0  # relevance
    beta: float = 0.1  # recency
    gamma: float = 0.1  # importance
    vector: float = 0.5  # the similarity's share of relevance, when the request has a vector
    keyword: float = 0.5  # the keyword score's share, when the request has text


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
    lacks with their similarity looked up (NaN when they have no vector in the query's space: the
    bottom of the normalized range, reported as relevance 0; ``keywords.sims`` has them so too).
    Every candidate is scored once, for its recency and importance, in one kernel call
    (``fused_rank``)."""
    v_rows = _NO_ROWS if vector is None else vector.rows
    use_sim = vector is not None and vector.sims is not None
    v_sims = vector.sims if vector is not None and vector.sims is not None else _zeros(v_rows.shape[0])
    if keywords is None:
        k_rows, k_sims, k_scores, probed = _NO_ROWS, _zeros(0), _zeros(0), _zeros(v_rows.shape[0])
    else:
        k_rows, k_scores, probed = keywords.rows[:depth], keywords.scores[:depth], keywords.probed
        # A row without a vector in the query's space has no similarity: NaN, the bottom of the
        # normalized range (as 0 it stood above every negative cosine among the candidates). (Those
        # of rows the vector list holds go unread.)
        k_sims = scorer.relevance(k_rows, np.nan) if keywords.sims is None else keywords.sims[:depth]
    nan_sims = use_sim and scorer.space is not None
    vectorless = np.isnan(k_sims)
    vectorless_any = bool(vectorless.any())
    if vectorless_any and not nan_sims:  # (no similarity to rank by: 0, as before the NaN)
        k_sims = np.where(vectorless, np.float32(0.0), k_sims)
    w = weights
    f = fusion.fused_rank(
        v_rows, v_sims, k_rows, k_sims, k_scores, probed, use_sim=use_sim, use_kw=keywords is not None,
        w_sim=w.vector, w_kw=w.keyword, alpha=w.alpha, beta=w.beta, gamma=w.gamma, **scorer.columns,
    )  # fmt: skip
    score = f.score if row_w is None else f.score * row_w[f.rows]
    rel = f.rel
    if vectorless_any and nan_sims:  # (a row without a vector reports relevance 0)
        rel = np.where(np.isnan(rel), np.float32(0.0), rel)
    if min_similarity is not None:
        score = np.where(rel < min_similarity, np.float32(np.nan), score)
    ranked = Scored(f.rows, rel, f.score, f.rec, f.imp)  # (the fused score before weights)
    return Ranked(
        ranked,
        score,
        vector_rank=None if vector is None else f.vector_rank,
        keyword_rank=None if keywords is None else f.keyword_rank,
        keyword_score=None if keywords is None else f.keyword_score,
    )


_NO_ROWS = np.empty(0, np.int64)


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, np.float32)
