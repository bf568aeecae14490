"""The default ranking's fusion: normalized signals, relevance first, recency and importance on near ties."""

from __future__ import annotations

import numpy as np
import pytest

from tiermem.kernels import keywords as kw_kernels
from tiermem.server.search.fused import FusedWeights, fused_scores


def normalized(values: np.ndarray) -> np.ndarray:
    """Reference: min-max to [0, 1] over the candidates (all 0 when equal); NaN counts as the minimum."""
    v = np.nan_to_num(values.astype(np.float64), nan=-np.inf)
    finite = np.isfinite(v)
    out = np.zeros(values.shape[0], np.float64)
    if finite.any() and v[finite].max() > v[finite].min():
        lo, hi = v[finite].min(), v[finite].max()
        out[finite] = (v[finite] - lo) / (hi - lo)
    return out


def reference_fused(sim, kw, rec, imp, w: FusedWeights) -> tuple[np.ndarray, np.ndarray]:
    """The fused score in plain NumPy, as docs/search.md writes it."""
    used = [
        (weight, normalized(x))
        for weight, x in ((w.vector, sim), (w.keyword, kw))
        if x is not None and weight > 0
    ]
    total = sum(weight for weight, _ in used)
    rel = sum((weight / total) * x for weight, x in used) if used else np.zeros(rec.shape[0])
    score = w.alpha * rel + w.beta * normalized(rec) + w.gamma * normalized(imp)
    return np.asarray(score, np.float64), np.asarray(rel, np.float64)


@pytest.mark.parametrize("seed", range(6))
def test_fused_kernel_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    sim, kw, rec, imp = (rng.random(n).astype(np.float32) for _ in range(4))
    if n > 4:
        sim[3] = np.nan  # a NaN counts as the minimum
        kw[: n // 2] = 0.0  # keyword rows that did not match
        rec[:] = rec[0]  # a constant signal normalizes to 0
    for w in (FusedWeights(), FusedWeights(0.7, 0.3, 0.0, 1.0, 0.0), FusedWeights(1.0, 0.1, 0.1, 0.0, 1.0)):
        for s, k in ((sim, kw), (None, kw), (sim, None)):
            got = fused_scores(s, k, rec, imp, w)
            want = reference_fused(s, k, rec, imp, w)
            np.testing.assert_allclose(got[0], want[0], atol=1e-6)
            np.testing.assert_allclose(got[1], want[1], atol=1e-6)


def test_fused_kernel_checks_its_inputs() -> None:
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="one entry per candidate"):
        kw_kernels.fused_scores(np.zeros(2, np.float32), x, x, x, 0.5, 0.5, 1, 0.1, 0.1)
    with pytest.raises(ValueError, match="rec"):
        kw_kernels.fused_scores(x, x, x.astype(np.float64), x, 0.5, 0.5, 1, 0.1, 0.1)


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


@pytest.mark.parametrize("seed", range(4))
def test_fusion_rows_match_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for nv, nk in ((0, 0), (0, 7), (9, 0), (30, 25), (50, 50), (3000, 2500)):
        pool = rng.permutation(max(120, 3 * (nv + nk))).astype(np.int64)
        v_rows = pool[:nv]
        lo = max(100, nv)  # (rows not in v_rows)
        k_rows = rng.permutation(np.concatenate([pool[: nv // 2], pool[lo : lo + nk - nv // 2]]))[:nk]
        k_rows = k_rows.astype(np.int64)
        new, k_rank = kw_kernels.fusion_rows(v_rows, k_rows)
        np.testing.assert_array_equal(new, ~np.isin(k_rows, v_rows))
        rows = np.concatenate([v_rows, k_rows[new]])
        where = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
        np.testing.assert_array_equal(k_rank, [where.get(int(r), 0) for r in rows])
    with pytest.raises(ValueError):
        kw_kernels.fusion_rows(np.zeros(2, np.int32), np.zeros(2, np.int64))
