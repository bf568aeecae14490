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
