"""The default ranking's fusion: normalized signals, relevance first, recency and importance on near ties."""

from __future__ import annotations

import numpy as np

from tiermem.server.search.fused import FusedWeights, fused_scores, normalized

W = FusedWeights()


def order(sim, kw, rec, imp, w=W):
    score, _ = fused_scores(
        None if sim is None else np.array(sim, np.float32),
        None if kw is None else np.array(kw, np.float32),
        np.array(rec, np.float32),
        np.array(imp, np.float32),
        w,
    )
    return np.argsort(-score, kind="stable").tolist()


def test_normalized_spans_zero_to_one_and_handles_ties_and_nan() -> None:
    np.testing.assert_allclose(normalized(np.array([0.2, 0.4, 0.3], np.float32)), [0.0, 1.0, 0.5], atol=1e-6)
    assert normalized(np.array([0.7, 0.7], np.float32)).tolist() == [0.0, 0.0]
    assert normalized(np.array([np.nan, 1.0, 3.0], np.float32)).tolist() == [0.0, 0.0, 1.0]
    assert normalized(np.array([], np.float32)).shape == (0,)


def test_relevance_wins_over_recency_and_importance() -> None:
    # candidate 0: clearly the most similar and the best keyword match, but old and unimportant
    assert order([0.62, 0.35, 0.30], [9.0, 1.0, 0.0], [0.0, 1.0, 0.9], [0.1, 0.9, 0.8])[0] == 0


def test_recency_decides_between_equally_relevant_memories() -> None:
    # "lives in Paris" (older) and "lives in Berlin now" (newer): about as similar, same keywords
    assert order([0.55, 0.54, 0.20], [4.1, 4.0, 0.5], [0.1, 0.9, 0.5], [0.5, 0.5, 0.5])[:2] == [1, 0]


def test_importance_decides_between_equally_relevant_memories() -> None:
    assert order([0.50, 0.50, 0.10], [3.0, 3.0, 0.0], [0.5, 0.5, 0.5], [0.2, 0.9, 0.5])[:2] == [1, 0]


def test_relevance_uses_only_the_signals_the_request_has() -> None:
    # keyword-only: the vector share is ignored, not counted as zero
    score, rel = fused_scores(
        None, np.array([2.0, 0.0], np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32), W
    )
    assert rel.tolist() == [1.0, 0.0] and score[0] > score[1]
    score, rel = fused_scores(
        np.array([0.1, 0.3], np.float32), None, np.zeros(2, np.float32), np.zeros(2, np.float32), W
    )
    assert rel.tolist() == [0.0, 1.0]
    # weights: keyword only when its share is everything
    only_kw = FusedWeights(vector=0.0, keyword=1.0)
    assert order([0.9, 0.1], [0.0, 5.0], [0, 0], [0, 0], only_kw)[0] == 1
