"""The default ranking's fusion: normalized signals, relevance first, recency and importance on near ties."""

from __future__ import annotations

import numpy as np
import pytest

from tiermem import kernels
from tiermem.kernels import fusion
from tiermem.server.search.fused import FusedWeights


def fused_scores(sim, kw, rec, imp, w: FusedWeights) -> tuple[np.ndarray, np.ndarray]:
    """The fusion kernel with the default ranking's weights."""
    return fusion.fused_scores(sim, kw, rec, imp, *weights_of(w))


def weights_of(w: FusedWeights) -> tuple[float, float, float, float, float]:
    return w.vector, w.keyword, w.alpha, w.beta, w.gamma


def normalized(values: np.ndarray) -> np.ndarray:
    """Reference: min-max to [0, 1] over the candidates (all 0.5 when equal); NaN counts as 0."""
    v = np.nan_to_num(values.astype(np.float64), nan=-np.inf)
    finite = np.isfinite(v)
    out = np.zeros(values.shape[0], np.float64)
    if finite.any() and v[finite].max() > v[finite].min():
        lo, hi = v[finite].min(), v[finite].max()
        out[finite] = (v[finite] - lo) / (hi - lo)
    elif finite.any():
        out[finite] = 0.5
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
        rec[:] = rec[0]  # a constant signal normalizes to 0.5
    for w in (FusedWeights(), FusedWeights(0.7, 0.3, 0.0, 1.0, 0.0), FusedWeights(1.0, 0.1, 0.1, 0.0, 1.0)):
        for s, k in ((sim, kw), (None, kw), (sim, None)):
            got = fused_scores(s, k, rec, imp, w)
            want = reference_fused(s, k, rec, imp, w)
            np.testing.assert_allclose(got[0], want[0], atol=1e-6)
            np.testing.assert_allclose(got[1], want[1], atol=1e-6)


def test_fused_kernel_checks_its_inputs() -> None:
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="one entry per candidate"):
        fusion.fused_scores(np.zeros(2, np.float32), x, x, x, 0.5, 0.5, 1, 0.1, 0.1)
    with pytest.raises(ValueError, match="rec"):
        fusion.fused_scores(x, x, x.astype(np.float64), x, 0.5, 0.5, 1, 0.1, 0.1)


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
    assert normalized(np.array([0.7, 0.7], np.float32)).tolist() == [0.5, 0.5]
    assert normalized(np.array([0.7, np.nan], np.float32)).tolist() == [0.5, 0.0]
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
        new, k_rank = fusion.fusion_rows(v_rows, k_rows)
        np.testing.assert_array_equal(new, ~np.isin(k_rows, v_rows))
        rows = np.concatenate([v_rows, k_rows[new]])
        where = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
        np.testing.assert_array_equal(k_rank, [where.get(int(r), 0) for r in rows])
    with pytest.raises(ValueError):
        fusion.fusion_rows(np.zeros(2, np.int32), np.zeros(2, np.int64))


def random_columns(rng, n: int, now: float, ahead: float, namespaces: int) -> dict[str, np.ndarray]:
    """Scoring columns of ``n`` rows; ``ahead`` seconds of last access may lie in the future (recency
    1); one namespace means every row in namespace 0."""
    return {
        "importance": rng.random(n).astype(np.float32),
        "created_at": now - rng.random(n) * 1e6,
        "last_access": now - rng.random(n) * 1e5 + ahead,
        "tier": rng.integers(0, 5, n).astype(np.int8),
        "ns": rng.integers(0, namespaces, n).astype(np.int32) if namespaces > 1 else np.zeros(n, np.int32),
    }


def two_rows(f32: np.ndarray) -> dict[str, object]:
    """The columns, time and tables of two rows, for the input checks."""
    return {
        "importance": f32,
        "created_at": np.zeros(2),
        "last_access": np.zeros(2),
        "tier": np.zeros(2, np.int8),
        "now": 1.0,
        "tau_seconds": 60.0,
        "half_life_hours": np.ones(5),
        "floor": 0.0,
    }


def reference_rec_imp(rows, cols, now, tau, hl, floor, dtype=np.float32):
    """Recency and decayed importance of ``rows`` in plain NumPy (float64, rounded to ``dtype``)."""
    age = np.maximum(now - cols["created_at"][rows], 0.0) / 3600.0
    half = hl[cols["ns"][rows], cols["tier"][rows]]
    decays = (half > 0) & np.isfinite(half)
    imp = cols["importance"][rows].astype(np.float64)
    with np.errstate(all="ignore"):
        decayed = np.where(decays, imp * 0.5 ** (age / np.where(decays, half, 1.0)), imp)
    decayed = np.where(decays, np.maximum(decayed, floor[cols["ns"][rows]] * imp), imp)
    rec = np.exp(-np.maximum(now - cols["last_access"][rows], 0.0) / tau)
    return rec.astype(dtype), decayed.astype(dtype)


@pytest.mark.parametrize("seed", range(4))
def test_fused_rank_matches_numpy(seed: int) -> None:
    """The search path's one call: the candidates joined, scored and fused as the plain NumPy
    reference does it step by step."""
    rng = np.random.default_rng(seed)
    n, now, tau = 300, 1.0e9, 3600.0
    cols = random_columns(rng, n, now, ahead=50.0, namespaces=3)
    hl = rng.random((3, 5)) * 500.0
    hl[0, 4], hl[1, 0] = np.inf, 0.0  # no decay
    floor = np.array([0.0, 0.2, 0.5])
    for nv, nk in ((0, 0), (0, 7), (9, 0), (30, 25), (50, 50)):
        pool = rng.permutation(n).astype(np.int64)
        v_rows = pool[:nv]
        k_rows = rng.permutation(np.concatenate([pool[: nv // 3], pool[nv : nv + nk - nv // 3]]))[:nk]
        v_sims, k_sims, k_scores, probed = (rng.random(m).astype(np.float32) for m in (nv, nk, nk, nv))
        probed[: nv // 4] = 0.0  # similarity rows without a keyword
        for use_sim, use_kw in ((True, True), (True, False), (False, True)):
            w = FusedWeights(1.0, 0.1, 0.2, 0.6, 0.4)
            got = fusion.fused_rank(
                v_rows, v_sims, k_rows, k_sims, k_scores, probed, use_sim=use_sim, use_kw=use_kw,
                now=now, tau_seconds=tau, half_life_hours=hl, floor=floor, w_sim=w.vector, w_kw=w.keyword,
                alpha=w.alpha, beta=w.beta, gamma=w.gamma, **cols,
            )  # fmt: skip
            new = ~np.isin(k_rows, v_rows)
            rows = np.concatenate([v_rows, k_rows[new]])
            rel = np.concatenate([v_sims, k_sims[new]])
            kw = np.concatenate([probed, k_scores[new]])
            at = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
            rec, imp = reference_rec_imp(rows, cols, now, tau, hl, floor)
            # (normalized from float64, not from the float32 recency and importance returned)
            rec64, imp64 = reference_rec_imp(rows, cols, now, tau, hl, floor, np.float64)
            score, _ = reference_fused(rel if use_sim else None, kw if use_kw else None, rec64, imp64, w)
            np.testing.assert_array_equal(got.rows, rows)
            np.testing.assert_array_equal(got.rel, rel)
            np.testing.assert_array_equal(got.keyword_score, kw)
            np.testing.assert_array_equal(got.vector_rank, [i + 1 if i < nv else 0 for i in range(len(rows))])
            np.testing.assert_array_equal(got.keyword_rank, [at.get(int(r), 0) for r in rows])
            np.testing.assert_allclose(got.rec, rec, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got.imp, imp, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got.score, score, atol=1e-5)
            # bit for bit the recency and importance the scoring kernel gives
            _, s_rec, s_imp = kernels.score_rows(
                rows, rel, alpha=1.0, beta=0.0, gamma=0.0, now=now, tau_seconds=tau,
                half_life_hours=hl, floor=floor, **cols,
            )  # fmt: skip
            np.testing.assert_array_equal(got.rec, s_rec)
            np.testing.assert_array_equal(got.imp, s_imp)


def test_memories_stored_seconds_apart_rank_by_time_whenever_searched() -> None:
    """Equally relevant memories stored a second apart, a month later: their recency and decayed
    importance differ by less than float32 resolves. The newest ranks first, and the scores are
    the same whenever the search runs (rounding decided the order, and changed with the clock)."""
    t0, n = 1.7e9, 12
    cols = {
        "importance": np.full(n, 0.3, np.float32),
        "created_at": t0 + np.arange(n, dtype=np.float64),
        "last_access": t0 + np.arange(n, dtype=np.float64),
        "tier": np.full(n, 3, np.int8),
    }
    rows = np.arange(n, dtype=np.int64)
    same = np.full(n, 0.5, np.float32)
    hl = np.full(5, 24.0 * 30)
    seen = []
    for later in np.linspace(30 * 86400.0, 30 * 86400.0 + 3.7, 9):
        got = fusion.fused_rank(
            rows, same, rows[:0], same[:0], same[:0], same, use_sim=True, use_kw=True,
            now=t0 + later, tau_seconds=86400.0 * 7, half_life_hours=hl, floor=0.0, w_sim=0.5, w_kw=0.5,
            alpha=1.0, beta=0.1, gamma=0.1, **cols,
        )  # fmt: skip
        assert list(np.argsort(-got.score, kind="stable")) == list(range(n - 1, -1, -1))
        seen.append(got.score)
    for score in seen[1:]:
        np.testing.assert_allclose(score, seen[0], atol=1e-6)


def test_fused_rank_checks_its_inputs() -> None:
    f32, rows = np.zeros(2, np.float32), np.array([0, 1], np.int64)
    cols = two_rows(f32)
    weights = {"w_sim": 0.5, "w_kw": 0.5, "alpha": 1.0, "beta": 0.1, "gamma": 0.1}
    with pytest.raises(ValueError, match="probed"):
        fusion.fused_rank(rows, f32, rows, f32, f32, f32[:1], use_sim=True, use_kw=True, **cols, **weights)
    with pytest.raises(ValueError, match="k_rows"):
        fusion.fused_rank(
            rows, f32, rows.astype(np.int32), f32, f32, f32, use_sim=True, use_kw=True, **cols, **weights
        )
    with pytest.raises(ValueError, match="rows out of range"):
        fusion.fused_rank(rows + 5, f32, rows, f32, f32, f32, use_sim=True, use_kw=True, **cols, **weights)
    bad_tau = cols | {"tau_seconds": 0.0}
    with pytest.raises(ValueError, match="tau_seconds"):
        fusion.fused_rank(rows, f32, rows, f32, f32, f32, use_sim=True, use_kw=True, **bad_tau, **weights)


def test_warm_up_compiles_the_fusion_kernels() -> None:
    """A server compiles its kernels before it reports SERVING: the fusion ones too."""
    from tiermem import kernels

    kernels.warm_up()
    for name in ("_fused", "_fusion_rows", "_fused_rank", "_rrf_rank"):
        assert getattr(fusion, name).signatures, name


@pytest.mark.parametrize("seed", range(4))
def test_rrf_rank_matches_numpy(seed: int) -> None:
    """Reciprocal rank fusion in one call: the keyword rows the vector list lacks scored (row weight,
    similarity floor) and every candidate fused, as plain NumPy does it step by step."""
    rng = np.random.default_rng(100 + seed)
    n, now, tau, k = 300, 1.0e9, 3600.0, 60
    tables = 3 if seed % 2 else 1  # (one half-life table per namespace, or one for all)
    cols = random_columns(rng, n, now, ahead=0.0, namespaces=tables)
    hl, floor = rng.random((tables, 5)) * 500.0, np.linspace(0.0, 0.4, tables)
    alpha, beta, gamma = 0.5, 0.3, 0.2
    for nv, nk in ((0, 0), (0, 7), (9, 0), (30, 25), (50, 50)):
        pool = rng.permutation(n).astype(np.int64)
        v_rows = pool[:nv]
        k_rows = rng.permutation(np.concatenate([pool[: nv // 3], pool[nv : nv + nk - nv // 3]]))[:nk]
        vector = (v_rows, *(rng.random(nv).astype(np.float32) for _ in range(4)))
        k_sims, k_scores = rng.random(nk).astype(np.float32), rng.random(nk).astype(np.float32) * 9
        for row_w, min_sim in ((None, None), (rng.random(n).astype(np.float32) + 0.5, 0.4)):
            got = fusion.rrf_rank(
                vector, k_rows, k_sims, k_scores, rrf_k=k, w_vec=0.7, w_kw=1.3, row_w=row_w,
                min_similarity=min_sim, now=now, tau_seconds=tau, half_life_hours=hl, floor=floor,
                alpha=alpha, beta=beta, gamma=gamma, **cols,
            )  # fmt: skip
            new = ~np.isin(k_rows, v_rows)
            extra = k_rows[new]
            rec, imp = reference_rec_imp(extra, cols, now, tau, hl, floor)
            rel = k_sims[new]
            score = (alpha * rel.astype(np.float64) + beta * rec.astype(np.float64) + gamma * imp).astype(
                np.float32
            )
            if row_w is not None:
                score = score * row_w[extra]
            if min_sim is not None:
                score[rel < min_sim] = np.nan
            rows = np.concatenate([v_rows, extra])
            at = {int(r): i + 1 for i, r in enumerate(k_rows.tolist())}
            k_rank = np.array([at.get(int(r), 0) for r in rows], np.int64)
            v_rank = np.array([i + 1 if i < nv else 0 for i in range(len(rows))], np.int64)
            fused = np.zeros(len(rows), np.float32)
            fused[v_rank > 0] += 0.7 / (k + v_rank[v_rank > 0])
            fused[k_rank > 0] += 1.3 / (k + k_rank[k_rank > 0])
            fused[fused <= 0] = np.nan
            if min_sim is not None:  # (a keyword row the vector list lacks, under the floor: no result)
                fused[nv:][rel < min_sim] = np.nan
            np.testing.assert_array_equal(got.rows, rows)
            np.testing.assert_array_equal(got.rel, np.concatenate([vector[1], rel]))
            np.testing.assert_array_equal(got.vector_rank, v_rank)
            np.testing.assert_array_equal(got.keyword_rank, k_rank)
            np.testing.assert_array_equal(got.fused, fused)
            kw = np.array([k_scores[i - 1] if i else 0.0 for i in k_rank], np.float32)
            np.testing.assert_array_equal(got.keyword_score, kw)
            np.testing.assert_allclose(got.score, np.concatenate([vector[2], score]), rtol=1e-5, atol=1e-6)
            exact, _, _ = kernels.score_rows(
                extra, rel, alpha=alpha, beta=beta, gamma=gamma, now=now, tau_seconds=tau,
                half_life_hours=hl, floor=floor, **cols,
            )  # fmt: skip
            if row_w is not None:
                exact = exact * row_w[extra]
            if min_sim is not None:
                exact[rel < min_sim] = np.nan
            np.testing.assert_array_equal(got.score[nv:], exact)  # (bit for bit what it was)
            np.testing.assert_allclose(got.rec, np.concatenate([vector[3], rec]), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got.imp, np.concatenate([vector[4], imp]), rtol=1e-5, atol=1e-6)


def test_rrf_rank_without_a_list_weight_and_its_checks() -> None:
    """A list weighted 0 makes no candidate of it a result alone; bad inputs are refused by name."""
    f32 = np.array([0.5, 0.25], np.float32)
    cols = two_rows(f32) | {"alpha": 1.0, "beta": 0.0, "gamma": 0.0}
    vector = (np.array([0], np.int64), f32[:1], f32[:1], f32[:1], f32[:1])
    k_rows = np.array([1], np.int64)
    rank = {"rrf_k": 60, "row_w": None, "min_similarity": None}
    got = fusion.rrf_rank(vector, k_rows, f32[:1], f32[:1], w_vec=1.0, w_kw=0.0, **rank, **cols)
    assert got.rows.tolist() == [0, 1] and got.fused[0] > 0 and np.isnan(got.fused[1])
    got = fusion.rrf_rank(vector, k_rows, f32[:1], f32[:1], w_vec=0.0, w_kw=1.0, **rank, **cols)
    assert np.isnan(got.fused[0]) and got.fused[1] > 0
    with pytest.raises(ValueError, match="row_w"):
        fusion.rrf_rank(
            vector, k_rows, f32[:1], f32[:1], w_vec=1.0, w_kw=1.0, **(rank | {"row_w": f32[:1]}), **cols
        )
    with pytest.raises(ValueError, match="k_scores"):
        fusion.rrf_rank(vector, k_rows, f32[:1], f32, w_vec=1.0, w_kw=1.0, **rank, **cols)
    with pytest.raises(ValueError, match="vector score"):
        bad = (vector[0], f32[:1], f32[:1].astype(np.float64), f32[:1], f32[:1])
        fusion.rrf_rank(bad, k_rows, f32[:1], f32[:1], w_vec=1.0, w_kw=1.0, **rank, **cols)
