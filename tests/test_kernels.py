"""Tests for ``tiermem.kernels`` against plain NumPy / Python reference implementations.

The references below are written from the documented semantics, not from the kernel code:

* decay_importance: importance * 0.5**(max(0, now - created)/3600 / half_life[tier]),
  floored at floor * importance; a half-life <= 0 or infinite means no decay.
* recency: exp(-max(0, now - last_access) / tau).
* combined_scores: alpha*rel + beta*rec + gamma*imp.
* score_rows: the three above, fused, over a gather of ``rows``.
* surprise_ema: s <- alpha*max(0, actual - predicted) + (1 - alpha)*s, item by item.
* topk: indices of the k largest, best first, ties -> lower index, NaN never selected.
* filter_mask: alive & namespace ok & tier ok & kind ok & lo <= created < hi & unexpired.

Each group has: randomised comparisons over several sizes (0, 1, small, larger), hand-computed edge
cases, and a pure-Python run of the kernel body through the jitted function's ``.py_func``.
Argument validation of every wrapper is tested at the end.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiermem import kernels as K
from tiermem.kernels import _jit

SIZES = [0, 1, 2, 17, 1000]
F32 = {"rtol": 1e-6, "atol": 0.0}
F32_SUM = {"rtol": 1e-6, "atol": 1e-7}  # sums of signed terms may land near zero
HL = np.array([0.0, 1.0, 24.0, 168.0, np.inf])  # tier 0 and tier 4 never decay


def rng_for(*key: object) -> np.random.Generator:
    """A fixed-seed generator per test case (seed derived from the case parameters, not hash())."""
    seed = 12345
    for part in key:
        for ch in repr(part):
            seed = (seed * 131 + ord(ch)) % (2**32)
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# Reference implementations (float64 internally, rounded to float32 at the end)
# --------------------------------------------------------------------------------------------


def ref_decay64(importance, created_at, tier, now, half_life_hours, floor) -> np.ndarray:
    imp = np.asarray(importance, np.float64)
    hl_table = np.asarray(half_life_hours, np.float64)
    hl = hl_table[np.asarray(tier, np.intp)]
    with np.errstate(all="ignore"):
        age_hours = np.maximum(now - np.asarray(created_at, np.float64), 0.0) / 3600.0
        decays = (hl > 0) & np.isfinite(hl)
        exponent = np.where(decays, age_hours / np.where(decays, hl, 1.0), 0.0)
        decayed = imp * np.power(0.5, exponent)
        decayed = np.where(decays, np.maximum(decayed, floor * imp), imp)
    return decayed


def ref_decay(importance, created_at, tier, now, half_life_hours, floor) -> np.ndarray:
    return ref_decay64(importance, created_at, tier, now, half_life_hours, floor).astype(np.float32)


def ref_recency64(last_access, now, tau) -> np.ndarray:
    with np.errstate(all="ignore"):
        dt = np.maximum(now - np.asarray(last_access, np.float64), 0.0)
        return np.exp(-dt / tau)


def ref_recency(last_access, now, tau) -> np.ndarray:
    return ref_recency64(last_access, now, tau).astype(np.float32)


def ref_combined(rel, rec, imp, alpha, beta, gamma) -> np.ndarray:
    with np.errstate(all="ignore"):
        s = (
            alpha * np.asarray(rel, np.float64)
            + beta * np.asarray(rec, np.float64)
            + gamma * np.asarray(imp, np.float64)
        )
    return s.astype(np.float32)


def ref_score_rows(rows, relevance, cols, now, tau, hl, floor, alpha, beta, gamma):
    r = np.asarray(rows, np.intp)
    imp64 = ref_decay64(cols["importance"][r], cols["created_at"][r], cols["tier"][r], now, hl, floor)
    rec64 = ref_recency64(cols["last_access"][r], now, tau)
    score = ref_combined(relevance, rec64, imp64, alpha, beta, gamma)
    return score, rec64.astype(np.float32), imp64.astype(np.float32)


def ref_surprise(state, index, predicted, actual, alpha):
    """Sequential Python loop; state is stored as float32 after every item (as the column is)."""
    state = state.copy()
    out = np.empty(len(index), np.float32)
    for i, j in enumerate(index.tolist()):
        gain = max(0.0, float(actual[i]) - float(predicted[i]))
        s = alpha * gain + (1.0 - alpha) * float(state[j])
        state[j] = np.float32(s)
        out[i] = np.float32(s)
    return state, out


def ref_topk(scores, k) -> np.ndarray:
    vals = [float(x) for x in scores]
    candidates = [i for i, v in enumerate(vals) if not math.isnan(v)]
    candidates.sort(key=lambda i: (-vals[i], i))
    return np.array(candidates[:k], dtype=np.int64)


def ref_filter(
    alive,
    ns_id,
    ns_ok,
    tier,
    tier_ok,
    kind_id,
    kind_ok,
    created_at,
    created_lo,
    created_hi,
    expire_at,
    now,
    space_id=None,
    space=-1,
):
    def lookup(ids, table):
        ids = np.asarray(ids, np.int64)
        inside = (ids >= 0) & (ids < len(table))
        ok = np.zeros(len(ids), np.bool_)
        ok[inside] = table[ids[inside]]
        return ok

    mask = alive.copy()
    mask &= lookup(ns_id, ns_ok)
    mask &= tier_ok[tier.astype(np.intp)]
    if len(kind_ok):
        mask &= lookup(kind_id, kind_ok)
    if not (created_lo == -np.inf and created_hi == np.inf):  # an open window reads no created_at
        mask &= (created_at >= created_lo) & (created_at < created_hi)
    if expire_at is not None:  # None: the caller knows nothing has expired
        mask &= expire_at > now
    if space >= 0:
        mask &= space_id == space
    return mask, int(mask.sum())


# --------------------------------------------------------------------------------------------
# Random data
# --------------------------------------------------------------------------------------------

NOW = 1.7e9


def make_columns(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    importance = rng.random(n).astype(np.float32)
    importance[rng.random(n) < 0.1] = 0.0
    # Ages from -2 h (created in the future) to ~6 weeks, plus exact-zero ages.
    created_at = NOW - rng.uniform(-7200.0, 1000.0 * 3600.0, n)
    created_at[rng.random(n) < 0.05] = NOW
    last_access = NOW - rng.exponential(3600.0, n) + rng.choice([0.0, 600.0], n, p=[0.9, 0.1])
    tier = rng.integers(0, 5, n).astype(np.int8)
    return {"importance": importance, "created_at": created_at, "last_access": last_access, "tier": tier}


# --------------------------------------------------------------------------------------------
# decay_importance
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("floor", [0.0, 0.1, 0.5, 1.0])
@pytest.mark.parametrize(
    "hl",
    [HL, np.array([1.0, 2.0, 4.0, 8.0, 16.0]), np.array([-1.0, 0.5, np.inf, -np.inf, 1e-3, 99.0])],
    ids=["mixed", "finite", "negative-inf-extra"],
)
def test_decay_importance_random(n, floor, hl):
    cols = make_columns(n, rng_for("decay", n, floor, hl.tolist()))
    imp0 = cols["importance"].copy()
    got = K.decay_importance(cols["importance"], cols["created_at"], cols["tier"], NOW, hl, floor)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, ref_decay(imp0, cols["created_at"], cols["tier"], NOW, hl, floor), **F32)
    np.testing.assert_array_equal(cols["importance"], imp0)  # inputs untouched


def test_decay_importance_accepts_list_half_lives():
    cols = make_columns(50, rng_for("decay-list"))
    hl = [2.0, 4.0, 8.0, 16.0, 32.0]
    got = K.decay_importance(cols["importance"], cols["created_at"], cols["tier"], NOW, hl, 0.0)
    np.testing.assert_allclose(
        got, ref_decay(cols["importance"], cols["created_at"], cols["tier"], NOW, hl, 0.0), **F32
    )


@pytest.mark.parametrize(
    ("importance", "age_seconds", "half_life", "floor", "expected"),
    [
        (1.0, 3600.0, 1.0, 0.0, 0.5),  # one half-life
        (1.0, 7200.0, 1.0, 0.0, 0.25),  # two half-lives
        (0.8, 3 * 3600.0, 3.0, 0.0, 0.4),
        (1.0, 7200.0, 1.0, 0.3, 0.3),  # floored
        (1.0, 0.0, 1.0, 0.0, 1.0),  # zero age
        (1.0, -5000.0, 1.0, 0.0, 1.0),  # negative age counts as zero
        (1.0, -1e300, 1.0, 0.0, 1.0),  # huge negative age
        (1.0, 1e300, 1.0, 0.0, 0.0),  # huge age decays fully
        (1.0, 1e300, 1.0, 0.25, 0.25),  # ... down to the floor
        (1.0, 1e300, 1e-300, 0.0, 0.0),  # tiny half-life
        (1.0, np.inf, 1.0, 0.1, 0.1),  # infinite age
        (0.7, 1e300, 0.0, 0.0, 0.7),  # half-life 0: no decay
        (0.7, 1e9, -3.0, 0.0, 0.7),  # negative half-life: no decay
        (0.7, 1e300, np.inf, 0.0, 0.7),  # infinite half-life: no decay
        (0.7, 1e9, -np.inf, 0.0, 0.7),
        (0.0, 3600.0, 1.0, 0.5, 0.0),  # zero importance stays zero
        (3e38, 3600.0, 1.0, 0.0, 1.5e38),  # near float32 max
        (1e-45, 0.0, 1.0, 0.0, 1e-45),  # subnormal kept
    ],
)
def test_decay_importance_edge_cases(importance, age_seconds, half_life, floor, expected):
    now = 0.0 if abs(age_seconds) > 1e10 else NOW
    tier = np.array([2], np.int8)
    hl = np.array([1.0, 1.0, half_life, 1.0, 1.0])
    got = K.decay_importance(
        np.array([importance], np.float32), np.array([now - age_seconds]), tier, now, hl, floor
    )
    np.testing.assert_allclose(got, np.array([expected], np.float32), **F32)
    np.testing.assert_allclose(
        got,
        ref_decay(np.array([importance], np.float32), np.array([now - age_seconds]), tier, now, hl, floor),
        **F32,
    )


def test_decay_importance_nan_importance_propagates():
    imp = np.array([np.nan, 1.0, np.nan, np.nan], np.float32)
    created = np.array([NOW - 3600.0, NOW - 3600.0, NOW - 1e6, NOW], np.float64)
    tier = np.array([1, 1, 0, 4], np.int8)  # decaying, decaying, hl=0, hl=inf
    got = K.decay_importance(imp, created, tier, NOW, HL, 0.2)
    assert np.isnan(got[[0, 2, 3]]).all()
    assert got[1] == np.float32(0.5)


def test_decay_importance_tiers_use_own_half_life():
    n = 5
    imp = np.ones(n, np.float32)
    created = np.full(n, NOW - 24 * 3600.0)
    tier = np.arange(n, dtype=np.int8)
    hl = np.array([24.0, 12.0, 8.0, 6.0, 0.0])
    got = K.decay_importance(imp, created, tier, NOW, hl, 0.0)
    np.testing.assert_allclose(got, np.array([0.5, 0.25, 0.125, 0.0625, 1.0], np.float32), **F32)


# --------------------------------------------------------------------------------------------
# recency
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("tau", [1e-3, 60.0, 3600.0, 1e12, np.inf])
def test_recency_random(n, tau):
    rng = rng_for("recency", n, tau)
    last = NOW - rng.normal(0.0, 7200.0, n)  # roughly half in the future
    got = K.recency(last, NOW, tau)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, ref_recency(last, NOW, tau), **F32)


@pytest.mark.parametrize(
    ("dt", "tau", "expected"),
    [
        (0.0, 60.0, 1.0),
        (60.0, 60.0, math.exp(-1.0)),
        (600.0, 60.0, math.exp(-10.0)),
        (-100.0, 60.0, 1.0),  # accessed "in the future": clamped
        (-1e300, 60.0, 1.0),
        (1e300, 60.0, 0.0),
        (np.inf, 60.0, 0.0),
        (1e300, 1e-300, 0.0),
    ],
)
def test_recency_edge_cases(dt, tau, expected):
    now = 0.0
    got = K.recency(np.array([now - dt]), now, tau)
    np.testing.assert_allclose(got, np.array([expected], np.float32), **F32)


# --------------------------------------------------------------------------------------------
# combined_scores
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "weights", [(0.5, 0.3, 0.2), (1.0, 0.0, 0.0), (0.0, 0.0, 0.0), (-1.0, 2.5, 1e-3), (1e30, 1e-30, 3.0)]
)
def test_combined_scores_random(n, weights):
    rng = rng_for("combined", n, weights)
    rel = rng.uniform(-1.0, 1.0, n).astype(np.float32)
    rec = rng.random(n).astype(np.float32)
    imp = rng.random(n).astype(np.float32)
    got = K.combined_scores(rel, rec, imp, *weights)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, ref_combined(rel, rec, imp, *weights), **F32_SUM)


def test_combined_scores_nan_and_inf():
    rel = np.array([np.nan, 1.0, 1.0, np.inf, 0.0], np.float32)
    rec = np.array([1.0, np.nan, 1.0, 1.0, 0.0], np.float32)
    imp = np.array([1.0, 1.0, np.nan, 1.0, 0.0], np.float32)
    got = K.combined_scores(rel, rec, imp, 0.5, 0.3, 0.2)
    assert np.isnan(got[:3]).all()
    assert got[3] == np.inf
    assert got[4] == 0.0
    np.testing.assert_allclose(got, ref_combined(rel, rec, imp, 0.5, 0.3, 0.2), **F32)


# --------------------------------------------------------------------------------------------
# score_rows
# --------------------------------------------------------------------------------------------

SCORE_PARAMS = {"tau_seconds": 1800.0, "floor": 0.1, "alpha": 0.6, "beta": 0.25, "gamma": 0.15}


@pytest.mark.parametrize("n", [1, 2, 17, 1000])
@pytest.mark.parametrize("m_kind", ["empty", "one", "all-permuted", "repeats"])
def test_score_rows_random(n, m_kind):
    rng = rng_for("score_rows", n, m_kind)
    cols = make_columns(n, rng)
    if m_kind == "empty":
        rows = np.empty(0, np.int64)
    elif m_kind == "one":
        rows = np.array([n - 1], np.int64)
    elif m_kind == "all-permuted":
        rows = rng.permutation(n).astype(np.int64)
    else:
        rows = rng.integers(0, n, 3 * n).astype(np.int64)
    rel = rng.uniform(-1.0, 1.0, len(rows)).astype(np.float32)
    p = SCORE_PARAMS
    score, rec, imp = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=HL, **p)
    for a in (score, rec, imp):
        assert a.dtype == np.float32 and a.shape == rows.shape
    e_score, e_rec, e_imp = ref_score_rows(
        rows, rel, cols, NOW, p["tau_seconds"], HL, p["floor"], p["alpha"], p["beta"], p["gamma"]
    )
    np.testing.assert_allclose(imp, e_imp, **F32)
    np.testing.assert_allclose(rec, e_rec, **F32)
    np.testing.assert_allclose(score, e_score, **F32_SUM)


def test_score_rows_empty_columns():
    cols = make_columns(0, rng_for("score-empty"))
    score, rec, imp = K.score_rows(
        np.empty(0, np.int64), np.empty(0, np.float32), **cols, now=NOW, half_life_hours=HL, **SCORE_PARAMS
    )
    assert score.shape == rec.shape == imp.shape == (0,)


def test_score_rows_matches_unfused_wrappers():
    rng = rng_for("score-unfused")
    cols = make_columns(300, rng)
    rows = rng.integers(0, 300, 120).astype(np.int64)
    rel = rng.random(120).astype(np.float32)
    p = SCORE_PARAMS
    score, rec, imp = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=HL, **p)
    g = {k: np.ascontiguousarray(v[rows]) for k, v in cols.items()}
    imp2 = K.decay_importance(g["importance"], g["created_at"], g["tier"], NOW, HL, p["floor"])
    rec2 = K.recency(g["last_access"], NOW, p["tau_seconds"])
    np.testing.assert_array_equal(imp, imp2)
    np.testing.assert_array_equal(rec, rec2)
    np.testing.assert_allclose(
        score, K.combined_scores(rel, rec2, imp2, p["alpha"], p["beta"], p["gamma"]), **F32_SUM
    )


def test_score_rows_nan_importance_and_extremes():
    cols = {
        "importance": np.array([np.nan, 1.0, 1.0, 1.0], np.float32),
        "created_at": np.array([NOW - 3600.0, -1e300, 1e300, NOW - 3600.0]),
        "last_access": np.array([NOW, -1e300, 1e300, NOW - 1800.0]),
        "tier": np.array([1, 1, 1, 0], np.int8),
    }
    rows = np.array([0, 1, 2, 3], np.int64)
    rel = np.zeros(4, np.float32)
    score, rec, imp = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=HL, **SCORE_PARAMS)
    assert np.isnan(imp[0]) and np.isnan(score[0])
    np.testing.assert_allclose(
        imp[1:], np.array([0.1, 1.0, 1.0], np.float32), **F32
    )  # floor, future, no-decay tier
    np.testing.assert_allclose(rec[1:], np.array([0.0, 1.0, math.exp(-1.0)], np.float32), **F32)


# --------------------------------------------------------------------------------------------
# surprise_ema
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [1, 3, 50])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 1.0])
def test_surprise_ema_random(n, k, alpha):
    rng = rng_for("surprise", n, k, alpha)
    state = rng.random(k).astype(np.float32)
    index = rng.integers(0, k, n).astype(np.int64)  # k small -> many repeats
    predicted = rng.random(n).astype(np.float32)
    actual = rng.random(n).astype(np.float32)
    e_state, e_out = ref_surprise(state, index, predicted, actual, alpha)
    got = K.surprise_ema(state, index, predicted, actual, alpha)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, e_out, **F32)
    np.testing.assert_allclose(state, e_state, **F32)  # updated in place


def test_surprise_ema_default_alpha_and_compounding():
    assert K.DEFAULT_SURPRISE_ALPHA == 0.3
    state = np.array([0.0, 1.0], np.float32)
    index = np.array([0, 0, 1, 0], np.int64)
    predicted = np.array([0.0, 0.0, 0.9, 1.0], np.float32)
    actual = np.array([1.0, 1.0, 0.1, 0.5], np.float32)  # gains 1, 1, 0 (clamped), 0 (clamped)
    out = K.surprise_ema(state, index, predicted, actual)
    s1 = 0.3
    s2 = 0.3 + 0.7 * s1
    t1 = 0.7
    s3 = 0.7 * s2
    np.testing.assert_allclose(out, np.array([s1, s2, t1, s3], np.float32), **F32)
    np.testing.assert_allclose(state, np.array([s3, t1], np.float32), **F32)


def test_surprise_ema_unique_indices_closed_form():
    rng = rng_for("surprise-unique")
    k = 200
    state = rng.random(k).astype(np.float32)
    index = rng.permutation(k)[:120].astype(np.int64)
    predicted = rng.random(120).astype(np.float32)
    actual = rng.random(120).astype(np.float32)
    alpha = 0.4
    expected = alpha * np.maximum(actual.astype(np.float64) - predicted, 0.0) + (1 - alpha) * state[index]
    untouched = np.setdiff1d(np.arange(k), index)
    before = state.copy()
    out = K.surprise_ema(state, index, predicted, actual, alpha)
    np.testing.assert_allclose(out, expected.astype(np.float32), **F32)
    np.testing.assert_allclose(state[index], expected.astype(np.float32), **F32)
    np.testing.assert_array_equal(state[untouched], before[untouched])


def test_surprise_ema_extremes():
    # Large but finite gains (the float32 difference actual - predicted does not overflow).
    state = np.array([0.0, 3e38, 0.0, 1e-45], np.float32)
    index = np.array([0, 1, 2, 3], np.int64)
    predicted = np.array([-1.5e38, 0.0, 3e38, 0.0], np.float32)
    actual = np.array([1.5e38, 3e38, -3e38, 0.0], np.float32)
    e_state, e_out = ref_surprise(state, index, predicted, actual, 0.5)
    out = K.surprise_ema(state, index, predicted, actual, 0.5)
    np.testing.assert_allclose(out, e_out, **F32)
    np.testing.assert_allclose(out[:3], np.array([1.5e38, 3e38, 0.0], np.float32), **F32)
    np.testing.assert_allclose(state, e_state, **F32)


# --------------------------------------------------------------------------------------------
# topk
# --------------------------------------------------------------------------------------------


def random_scores(n: int, dtype, rng: np.random.Generator) -> np.ndarray:
    s = rng.integers(-3, 4, n).astype(np.float64)  # few distinct values -> many ties
    s += np.where(rng.random(n) < 0.5, rng.random(n), 0.0)
    special = rng.random(n)
    s[special < 0.05] = np.nan
    s[(special >= 0.05) & (special < 0.07)] = np.inf
    s[(special >= 0.07) & (special < 0.09)] = -np.inf
    s[(special >= 0.09) & (special < 0.11)] = -0.0
    return s.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("k", [0, 1, 2, 5, 100, 5000])
def test_topk_random(dtype, n, k):
    s = random_scores(n, dtype, rng_for("topk", np.dtype(dtype).name, n, k))
    got = K.topk(s, k)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref_topk(s, k))


@pytest.mark.parametrize(
    ("scores", "k", "expected"),
    [
        ([], 3, []),
        ([1.0], 0, []),
        ([1.0], 1, [0]),
        ([1.0], 5, [0]),
        ([np.nan], 1, []),
        ([np.nan, np.nan, np.nan], 2, []),
        ([3.0, 1.0, 2.0], 2, [0, 2]),
        ([1.0, 1.0, 1.0, 1.0], 2, [0, 1]),  # ties -> lower index
        ([1.0, 2.0, 1.0, 2.0, 1.0], 3, [1, 3, 0]),
        ([np.nan, 0.5, np.nan, 0.7], 4, [3, 1]),
        ([np.nan, -np.inf, np.nan], 2, [1]),  # -inf is a score, NaN is not
        ([-np.inf, np.inf, 0.0, np.nan], 4, [1, 2, 0]),
        ([0.0, -0.0, 0.0], 3, [0, 1, 2]),  # -0.0 == 0.0 ties
        ([-5.0, -1.0, -3.0], 1, [1]),
        ([1e30, -1e30, 1e-30], 3, [0, 2, 1]),
        ([3.4e38, -3.4e38, 1e-45], 3, [0, 2, 1]),  # float32 extremes incl. subnormal
        ([5.0, 4.0, 3.0, 2.0, 1.0, 6.0], 3, [5, 0, 1]),  # late winner evicts
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_edge_cases(scores, k, expected, dtype):
    s = np.array(scores, dtype=dtype)
    got = K.topk(s, k)
    np.testing.assert_array_equal(got, np.array(expected, np.int64))
    np.testing.assert_array_equal(got, ref_topk(s, k))


def test_topk_sorted_and_reverse_sorted():
    s = np.arange(1000, dtype=np.float64)
    np.testing.assert_array_equal(K.topk(s, 10), np.arange(999, 989, -1))
    np.testing.assert_array_equal(K.topk(s[::-1].copy(), 10), np.arange(10))


def test_topk_k_much_larger_than_n_moderate():
    s = np.array([0.1, np.nan, 0.3], np.float32)
    np.testing.assert_array_equal(K.topk(s, 1_000_000), np.array([2, 0], np.int64))


def test_topk_huge_k_returns_all():
    s = np.array([3.0, 1.0, 2.0])
    np.testing.assert_array_equal(K.topk(s, 2**62), np.array([0, 2, 1], np.int64))


# --------------------------------------------------------------------------------------------
# filter_mask
# --------------------------------------------------------------------------------------------


def make_filter_inputs(n: int, rng: np.random.Generator, n_ns: int = 4, n_kind: int = 3) -> dict:
    created = NOW - rng.uniform(0.0, 1e6, n)
    created[rng.random(n) < 0.05] = np.nan
    expire = NOW + rng.uniform(-1e5, 1e5, n)
    expire[rng.random(n) < 0.2] = np.inf
    expire[rng.random(n) < 0.05] = NOW  # expiring exactly now counts as expired
    return {
        "alive": rng.random(n) < 0.8,
        "ns_id": rng.integers(-2, n_ns + 2, n).astype(np.int32),
        "ns_ok": rng.random(n_ns) < 0.6,
        "tier": rng.integers(0, 5, n).astype(np.int8),
        "tier_ok": rng.random(5) < 0.7,
        "kind_id": rng.integers(-1, n_kind + 1, n).astype(np.int32),
        "kind_ok": rng.random(n_kind) < 0.6,
        "created_at": created,
        "created_lo": NOW - 8e5,
        "created_hi": NOW - 1e5,
        "expire_at": expire,
        "now": NOW,
    }


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize(
    "variant",
    [
        "base",
        "any-kind",
        "open-window",
        "empty-ns",
        "all-allowed",
        "space",
        "no-expiry",
        "half-open",
        "one-ns-tiers-1-4",  # the kernel's lookup-free paths (one namespace id, tier > 0)
        "one-ns-every-tier",
    ],
)
def test_filter_mask_random(n, variant):
    rng = rng_for("filter", n, variant)
    args = make_filter_inputs(n, rng)
    if variant == "space":
        args["space_id"] = rng.integers(-1, 3, n).astype(np.int32)
        args["space"] = 1
    elif variant == "no-expiry":
        args["expire_at"] = None
    elif variant.startswith("one-ns"):
        args["ns_ok"] = np.zeros(4, np.bool_)
        args["ns_ok"][2] = True
        args["tier_ok"] = np.array([variant.endswith("every-tier"), True, True, True, True])
        args["kind_ok"] = np.zeros(0, np.bool_)
    elif variant == "half-open":
        args["created_lo"] = -np.inf  # still a window: created_at is read (NaN never passes)
    if variant == "any-kind":
        args["kind_ok"] = np.zeros(0, np.bool_)
    elif variant == "open-window":
        args["created_lo"], args["created_hi"] = -np.inf, np.inf
    elif variant == "empty-ns":
        args["ns_ok"] = np.zeros(0, np.bool_)
    elif variant == "all-allowed":
        args["ns_ok"][:] = True
        args["tier_ok"][:] = True
        args["kind_ok"][:] = True
    mask, count = K.filter_mask(**args)
    e_mask, e_count = ref_filter(**args)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    assert isinstance(count, int)
    np.testing.assert_array_equal(mask, e_mask)
    assert count == e_count == int(mask.sum())
    if variant == "empty-ns":
        assert count == 0


def test_filter_mask_each_condition():
    n = 9
    base = {
        "alive": np.ones(n, np.bool_),
        "ns_id": np.zeros(n, np.int32),
        "ns_ok": np.array([True, False]),
        "tier": np.zeros(n, np.int8),
        "tier_ok": np.array([True, True, False, True, True]),
        "kind_id": np.zeros(n, np.int32),
        "kind_ok": np.array([True, False]),
        "created_at": np.full(n, 100.0),
        "created_lo": 100.0,
        "created_hi": 200.0,
        "expire_at": np.full(n, np.inf),
        "now": 150.0,
    }
    base["alive"][1] = False  # dead
    base["ns_id"][2] = 1  # disallowed namespace
    base["ns_id"][3] = 7  # namespace id beyond the table
    base["tier"][4] = 2  # disallowed tier
    base["kind_id"][5] = 1  # disallowed kind
    base["created_at"][6] = 200.0  # hi is exclusive (lo == 100 is inclusive for the others)
    base["expire_at"][7] = 150.0  # expires exactly now
    base["expire_at"][8] = 150.5  # expires later: kept
    mask, count = K.filter_mask(**base)
    np.testing.assert_array_equal(mask, [True, False, False, False, False, False, False, False, True])
    assert count == 2
    e_mask, e_count = ref_filter(**base)
    np.testing.assert_array_equal(mask, e_mask)
    assert count == e_count


def test_filter_mask_empty_kind_table_allows_any_kind_id():
    n = 4
    mask, count = K.filter_mask(
        alive=np.ones(n, np.bool_),
        ns_id=np.zeros(n, np.int32),
        ns_ok=np.ones(1, np.bool_),
        tier=np.arange(n, dtype=np.int8),
        tier_ok=np.ones(5, np.bool_),
        kind_id=np.array([-5, 0, 99, 2**31 - 1], np.int32),
        kind_ok=np.zeros(0, np.bool_),
        created_at=np.array([-1e300, 0.0, 1e300, np.inf]),
        created_lo=-1e308,
        created_hi=np.inf,
        expire_at=np.full(n, np.inf),
        now=1e300,
    )
    # created_at = +inf is not < +inf, so the last row is outside the half-open window.
    np.testing.assert_array_equal(mask, [True, True, True, False])
    assert count == 3


def test_filter_mask_open_window_and_no_expiry_read_neither_column():
    n = 3
    args = {
        "alive": np.ones(n, np.bool_),
        "ns_id": np.zeros(n, np.int32),
        "ns_ok": np.ones(1, np.bool_),
        "tier": np.ones(n, np.int8),
        "tier_ok": np.ones(5, np.bool_),
        "kind_id": np.zeros(n, np.int32),
        "kind_ok": np.zeros(0, np.bool_),
        "created_at": np.array([np.nan, np.inf, 0.0]),
        "created_lo": -np.inf,
        "created_hi": np.inf,
        "expire_at": None,
        "now": 10.0,
        "space_id": np.array([0, 1, 1], np.int32),
        "space": 1,
    }
    mask, count = K.filter_mask(**args)
    np.testing.assert_array_equal(mask, [False, True, True])
    assert count == 2
    args["expire_at"] = np.array([np.inf, 10.0, 11.0])  # expiring exactly now counts as expired
    mask, count = K.filter_mask(**args)
    np.testing.assert_array_equal(mask, [False, False, True])
    assert (mask, count)[1] == ref_filter(**args)[1] == 1


# --------------------------------------------------------------------------------------------
# Kernel bodies in pure Python (.py_func), helpers swapped for their py_func too
# --------------------------------------------------------------------------------------------


@pytest.fixture
def pure_python(monkeypatch):
    """Make the jitted helpers resolve to plain Python inside the kernels' py_func bodies."""
    for helper in ("_decayed", "_recency", "_sift_down"):
        monkeypatch.setattr(_jit, helper, getattr(_jit, helper).py_func)
    with np.errstate(all="ignore"):
        yield


@pytest.mark.parametrize("n", [0, 1, 60])
def test_py_func_decay_recency_combined_score_rows(pure_python, n):
    rng = rng_for("pyfunc-score", n)
    cols = make_columns(n, rng)
    hl = np.array([0.0, 1.0, 24.0, -1.0, np.inf])
    floor = 0.2

    out = np.empty(n, np.float32)
    _jit.decay_importance.py_func(cols["importance"], cols["created_at"], cols["tier"], NOW, hl, floor, out)
    np.testing.assert_allclose(
        out, ref_decay(cols["importance"], cols["created_at"], cols["tier"], NOW, hl, floor), **F32
    )

    rec = np.empty(n, np.float32)
    _jit.recency.py_func(cols["last_access"], NOW, 900.0, rec)
    np.testing.assert_allclose(rec, ref_recency(cols["last_access"], NOW, 900.0), **F32)

    rel = rng.uniform(-1, 1, n).astype(np.float32)
    comb = np.empty(n, np.float32)
    _jit.combined.py_func(rel, rec, out, 0.5, 0.3, 0.2, comb)
    np.testing.assert_allclose(comb, ref_combined(rel, rec, out, 0.5, 0.3, 0.2), **F32_SUM)

    rows = rng.integers(0, max(n, 1), n).astype(np.int64) if n else np.empty(0, np.int64)
    score, rec2, imp2 = (np.empty(n, np.float32) for _ in range(3))
    _jit.score_rows.py_func(
        rows,
        rel,
        cols["importance"],
        cols["created_at"],
        cols["last_access"],
        cols["tier"],
        np.zeros(1, np.int32),
        NOW,
        900.0,
        hl.reshape(1, -1),
        floor,
        0.5,
        0.3,
        0.2,
        score,
        rec2,
        imp2,
    )
    e_score, e_rec, e_imp = ref_score_rows(rows, rel, cols, NOW, 900.0, hl, floor, 0.5, 0.3, 0.2)
    np.testing.assert_allclose(imp2, e_imp, **F32)
    np.testing.assert_allclose(rec2, e_rec, **F32)
    np.testing.assert_allclose(score, e_score, **F32_SUM)


def test_py_func_decay_edge_values(pure_python):
    imp = np.array([1.0, 1.0, 1.0, np.nan, 0.5, 1.0], np.float32)
    created = np.array([NOW + 10.0, -1e300, NOW - 3600.0, NOW - 3600.0, -1e300, NOW - 7200.0])
    tier = np.array([1, 1, 1, 1, 4, 1], np.int8)
    out = np.empty(6, np.float32)
    _jit.decay_importance.py_func(imp, created, tier, NOW, HL, 0.3, out)
    expected = np.array([1.0, 0.3, 0.5, np.nan, 0.5, 0.3], np.float32)
    np.testing.assert_allclose(out, expected, **F32)
    np.testing.assert_allclose(out, ref_decay(imp, created, tier, NOW, HL, 0.3), **F32)


@pytest.mark.parametrize("n", [0, 1, 40])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_py_func_surprise_ema(pure_python, n, alpha):
    rng = rng_for("pyfunc-surprise", n, alpha)
    k = 4
    state = rng.random(k).astype(np.float32)
    index = rng.integers(0, k, n).astype(np.int64)
    predicted = rng.random(n).astype(np.float32)
    actual = rng.random(n).astype(np.float32)
    e_state, e_out = ref_surprise(state, index, predicted, actual, alpha)
    out = np.empty(n, np.float32)
    _jit.surprise_ema.py_func(state, index, predicted, actual, alpha, out)
    np.testing.assert_allclose(out, e_out, **F32)
    np.testing.assert_allclose(state, e_state, **F32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 2, 150])
@pytest.mark.parametrize("k", [1, 3, 10, 400])
def test_py_func_topk(pure_python, dtype, n, k):
    s = random_scores(n, dtype, rng_for("pyfunc-topk", np.dtype(dtype).name, n, k))
    got = _jit.topk.py_func(s, k)
    np.testing.assert_array_equal(np.asarray(got, np.int64), ref_topk(s, k))


@pytest.mark.parametrize("n", [0, 1, 80])
def test_py_func_filter_mask(pure_python, n):
    rng = rng_for("pyfunc-filter", n)
    args = make_filter_inputs(n, rng)
    space_id = rng.integers(0, 3, n).astype(np.int32)
    out = np.empty(n, np.bool_)
    count = _jit.filter_mask.py_func(
        args["alive"],
        args["ns_id"],
        args["ns_ok"],
        -1,  # lookups (the one_ns and tier_mode shortcuts are compared in test_filter_mask_random)
        args["tier"],
        args["tier_ok"],
        0,
        args["kind_id"],
        args["kind_ok"],
        args["created_at"],
        args["created_lo"],
        args["created_hi"],
        True,
        args["expire_at"],
        args["now"],
        True,
        space_id,
        1,
        out,
    )
    e_mask, e_count = ref_filter(**args, space_id=space_id, space=1)
    np.testing.assert_array_equal(out, e_mask)
    assert count == e_count


# --------------------------------------------------------------------------------------------
# warm_up
# --------------------------------------------------------------------------------------------


def test_warm_up_runs():
    K.warm_up()


# --------------------------------------------------------------------------------------------
# Argument validation: every wrapper raises ValueError before any kernel runs
# --------------------------------------------------------------------------------------------

# Valid keyword arguments per wrapper, and which array arguments are tied to which length.
N, M, KSTATE = 5, 3, 4


def valid_kwargs(fn: str) -> dict:
    f32 = np.linspace(0.1, 0.9, N).astype(np.float32)
    f64 = np.linspace(NOW - 1e4, NOW, N)
    t8 = np.array([0, 1, 2, 3, 4], np.int8)
    if fn == "decay_importance":
        return {
            "importance": f32,
            "created_at": f64,
            "tier": t8,
            "now": NOW,
            "half_life_hours": HL,
            "floor": 0.1,
        }
    if fn == "recency":
        return {"last_access": f64, "now": NOW, "tau_seconds": 60.0}
    if fn == "combined_scores":
        return {
            "relevance": f32,
            "rec": f32.copy(),
            "imp": f32.copy(),
            "alpha": 0.5,
            "beta": 0.3,
            "gamma": 0.2,
        }
    if fn == "score_rows":
        return {
            "rows": np.array([4, 0, 2], np.int64),
            "relevance": np.ones(M, np.float32),
            "importance": f32,
            "created_at": f64,
            "last_access": f64.copy(),
            "tier": t8,
            "now": NOW,
            "tau_seconds": 60.0,
            "half_life_hours": HL,
            **{k: v for k, v in SCORE_PARAMS.items() if k != "tau_seconds"},
        }
    if fn == "surprise_ema":
        return {
            "state": np.zeros(KSTATE, np.float32),
            "index": np.array([0, 3, 3, 1, 2], np.int64),
            "predicted": f32,
            "actual": f32[::-1].copy(),
            "alpha": 0.3,
        }
    if fn == "topk":
        return {"scores": f32, "k": 2}
    if fn == "filter_mask":
        return {
            "alive": np.ones(N, np.bool_),
            "ns_id": np.zeros(N, np.int32),
            "ns_ok": np.ones(2, np.bool_),
            "tier": t8,
            "tier_ok": np.ones(5, np.bool_),
            "kind_id": np.zeros(N, np.int32),
            "kind_ok": np.ones(2, np.bool_),
            "created_at": f64,
            "created_lo": -np.inf,
            "created_hi": np.inf,
            "expire_at": np.full(N, np.inf),
            "now": NOW,
        }
    raise AssertionError(fn)


# (wrapper, array argument, must it have the same length as another argument?)
ARRAY_ARGS = [
    ("decay_importance", "importance", False),
    ("decay_importance", "created_at", True),
    ("decay_importance", "tier", True),
    ("recency", "last_access", False),
    ("combined_scores", "relevance", False),
    ("combined_scores", "rec", True),
    ("combined_scores", "imp", True),
    ("score_rows", "rows", False),
    ("score_rows", "relevance", True),
    ("score_rows", "importance", False),
    ("score_rows", "created_at", True),
    ("score_rows", "last_access", True),
    ("score_rows", "tier", True),
    ("surprise_ema", "state", False),
    ("surprise_ema", "index", False),
    ("surprise_ema", "predicted", True),
    ("surprise_ema", "actual", True),
    ("topk", "scores", False),
    ("filter_mask", "alive", False),
    ("filter_mask", "ns_id", True),
    ("filter_mask", "ns_ok", False),
    ("filter_mask", "tier", True),
    ("filter_mask", "tier_ok", True),
    ("filter_mask", "kind_id", True),
    ("filter_mask", "kind_ok", False),
    ("filter_mask", "created_at", True),
    ("filter_mask", "expire_at", True),
]

WRONG_DTYPE = {
    np.dtype(np.float32): np.float64,
    np.dtype(np.float64): np.float32,
    np.dtype(np.int8): np.int16,
    np.dtype(np.int32): np.int64,
    np.dtype(np.int64): np.int32,
    np.dtype(np.bool_): np.uint8,
}


def call(fn: str, kwargs: dict):
    return getattr(K, fn)(**kwargs)


def test_valid_kwargs_are_valid():
    for fn in {a[0] for a in ARRAY_ARGS}:
        call(fn, valid_kwargs(fn))


def _ids(case):
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_wrong_dtype(case):
    fn, arg, _ = case
    kw = valid_kwargs(fn)
    a = kw[arg]
    kw[arg] = a.astype(WRONG_DTYPE[a.dtype])
    if fn == "topk":
        kw[arg] = a.astype(np.int64)  # float32 and float64 are both valid for topk
    with pytest.raises(ValueError):
        call(fn, kw)


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_non_contiguous(case):
    fn, arg, _ = case
    kw = valid_kwargs(fn)
    strided = np.repeat(kw[arg], 2)[::2]
    assert not strided.flags.c_contiguous and len(strided) == len(kw[arg])
    kw[arg] = strided
    with pytest.raises(ValueError):
        call(fn, kw)


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_2d_and_non_arrays(case):
    fn, arg, _ = case
    kw = valid_kwargs(fn)
    a = kw[arg]
    with pytest.raises(ValueError):
        call(fn, {**kw, arg: a.reshape(1, -1)})
    with pytest.raises(ValueError):
        call(fn, {**kw, arg: a.tolist()})


@pytest.mark.parametrize("case", [c for c in ARRAY_ARGS if c[2]], ids=_ids)
@pytest.mark.parametrize("delta", [-1, 1])
def test_rejects_wrong_length(case, delta):
    fn, arg, _ = case
    kw = valid_kwargs(fn)
    a = kw[arg]
    kw[arg] = a[:-1].copy() if delta < 0 else np.concatenate([a, a[:1]])
    with pytest.raises(ValueError):
        call(fn, kw)


def test_surprise_state_may_have_any_length_but_items_must_match():
    kw = valid_kwargs("surprise_ema")
    call("surprise_ema", {**kw, "state": np.zeros(100, np.float32)})
    with pytest.raises(ValueError):
        call("surprise_ema", {**kw, "index": np.array([0, 1], np.int64)})


@pytest.mark.parametrize("bad_rows", [[-1, 0, 1], [0, 1, N], [0, 2**40, 1]])
def test_score_rows_rejects_out_of_range_rows(bad_rows):
    kw = valid_kwargs("score_rows")
    with pytest.raises(ValueError, match="rows"):
        call("score_rows", {**kw, "rows": np.array(bad_rows, np.int64)})


def test_score_rows_rejects_any_row_on_empty_columns():
    cols = make_columns(0, rng_for("empty"))
    with pytest.raises(ValueError):
        K.score_rows(
            np.array([0], np.int64),
            np.ones(1, np.float32),
            **cols,
            now=NOW,
            half_life_hours=HL,
            **SCORE_PARAMS,
        )


@pytest.mark.parametrize("bad_index", [[-1, 0, 0, 0, 0], [0, 0, KSTATE, 0, 0], [0, 0, 0, 0, -(2**40)]])
def test_surprise_rejects_out_of_range_index_and_leaves_state(bad_index):
    kw = valid_kwargs("surprise_ema")
    kw["state"] = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    before = kw["state"].copy()
    with pytest.raises(ValueError, match="index"):
        call("surprise_ema", {**kw, "index": np.array(bad_index, np.int64)})
    np.testing.assert_array_equal(kw["state"], before)


def test_surprise_rejects_any_item_with_empty_state():
    with pytest.raises(ValueError):
        K.surprise_ema(
            np.zeros(0, np.float32), np.array([0], np.int64), np.zeros(1, np.float32), np.zeros(1, np.float32)
        )
    # No items and no state is fine.
    out = K.surprise_ema(
        np.zeros(0, np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32)
    )
    assert out.shape == (0,)


@pytest.mark.parametrize("alpha", [-0.1, 1.0001, np.nan, np.inf])
def test_surprise_rejects_bad_alpha_and_leaves_state(alpha):
    kw = valid_kwargs("surprise_ema")
    before = kw["state"].copy()
    with pytest.raises(ValueError, match="alpha"):
        call("surprise_ema", {**kw, "alpha": alpha})
    np.testing.assert_array_equal(kw["state"], before)


@pytest.mark.parametrize("fn", ["recency", "score_rows"])
@pytest.mark.parametrize("tau", [0.0, -0.0, -1.0, -np.inf, np.nan])
def test_rejects_bad_tau(fn, tau):
    with pytest.raises(ValueError, match="tau"):
        call(fn, {**valid_kwargs(fn), "tau_seconds": tau})


@pytest.mark.parametrize("fn", ["decay_importance", "filter_mask"])
@pytest.mark.parametrize("bad_tier", [-1, 5, 127, -128])
def test_rejects_out_of_range_tier(fn, bad_tier):
    kw = valid_kwargs(fn)
    tier = kw["tier"].copy()
    tier[2] = bad_tier
    with pytest.raises(ValueError, match="tier"):
        call(fn, {**kw, "tier": tier})


@pytest.mark.parametrize("bad_tier", [-1, 5])
def test_score_rows_rejects_out_of_range_tier(bad_tier):
    kw = valid_kwargs("score_rows")
    tier = kw["tier"].copy()
    tier[2] = bad_tier  # rows [4, 0, 2] include row 2
    # The kernel checks the tier before it indexes the half-life table: no out-of-bounds read.
    with pytest.raises(ValueError, match="tier"):
        call("score_rows", {**kw, "tier": tier})


@pytest.mark.parametrize(
    "fn,hl",
    [
        (fn, hl)
        for fn in ("decay_importance", "score_rows")
        for hl in ([1.0, 1.0, 1.0, 1.0], [], [1.0, np.nan, 1.0, 1.0, 1.0])
    ]
    + [("decay_importance", [[1.0] * 5]), ("score_rows", [[1.0] * 4]), ("score_rows", [[[1.0] * 5]])],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_rejects_bad_half_lives(fn, hl):
    with pytest.raises(ValueError, match="half_life"):
        call(fn, {**valid_kwargs(fn), "half_life_hours": hl})


@pytest.mark.parametrize("k", [-1, -(2**40)])
def test_topk_rejects_negative_k(k):
    with pytest.raises(ValueError, match="k"):
        K.topk(np.ones(3, np.float64), k)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int64, np.bool_, np.complex128])
def test_topk_rejects_other_dtypes(dtype):
    with pytest.raises(ValueError):
        K.topk(np.ones(3, dtype), 1)


def test_topk_k_zero_returns_empty_int64():
    got = K.topk(np.array([np.nan, 1.0], np.float32), 0)
    assert got.dtype == np.int64 and got.shape == (0,)


# --------------------------------------------------------------------------------------------
# dot_rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,d,m", [(1, 1, 0), (1, 3, 1), (50, 384, 17), (1000, 16, 1000)])
def test_dot_rows_matches_numpy(n: int, d: int, m: int) -> None:
    rng = np.random.default_rng(n * 31 + d)
    xb = rng.normal(size=(n, d)).astype(np.float32)
    xb[0] = 0.0  # a zero row
    ids = rng.integers(0, n, m).astype(np.int64)
    q = rng.normal(size=d).astype(np.float32)
    want = (xb[ids].astype(np.float64) @ q.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(K.dot_rows(xb, ids, q), want, rtol=1e-5, atol=1e-5)
    out = np.empty(m, np.float32)
    assert _jit.dot_rows.py_func(xb, ids, q, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_dot_rows_reads_a_view_without_copying_and_checks_inputs() -> None:
    big = np.arange(12, dtype=np.float32).reshape(4, 3)
    q = np.array([1.0, 0.0, -1.0], np.float32)
    np.testing.assert_array_equal(K.dot_rows(big, np.array([3, 0], np.int64), q), [-2.0, -2.0])
    for bad in ([4], [0, 4], [-1], [2, -5]):  # (the kernel refuses them before reading a row)
        with pytest.raises(ValueError, match="ids out of range"):
            K.dot_rows(big, np.array(bad, np.int64), q)
        out = np.full(len(bad), 7.0, np.float32)
        assert not _jit.dot_rows(big, np.array(bad, np.int64), q, out)
        assert not _jit.dot_rows.py_func(big, np.array(bad, np.int64), q, out)
        np.testing.assert_array_equal(out, 7.0)  # (nothing written)
    with pytest.raises(ValueError, match="query"):
        K.dot_rows(big, np.array([0], np.int64), np.ones(2, np.float32))
    with pytest.raises(ValueError, match="xb"):
        K.dot_rows(big.astype(np.float64), np.array([0], np.int64), q)
    with pytest.raises(ValueError, match="xb"):
        K.dot_rows(big[:, :2], np.array([0], np.int64), q[:2])


def _split_codes(rng: np.random.Generator, sizes: list[int], m: int, shift: int, tag: int) -> np.ndarray:
    """m codes naming a random row of a random non-empty matrix, tagged."""
    parts = rng.choice([p for p, n in enumerate(sizes) if n], m)
    rows = np.array([rng.integers(0, sizes[p]) for p in parts], np.int64)
    return (np.int64(tag) << (shift + 4)) | (parts.astype(np.int64) << shift) | rows


@pytest.mark.parametrize("d,m", [(3, 0), (16, 1), (384, 37)])
def test_dot_rows_split_matches_numpy_and_dot_rows_bit_for_bit(d: int, m: int) -> None:
    """Each code's row of its matrix times the query: NumPy's product to rounding, ``dot_rows``'s for
    the same rows to the last bit (a row's similarity must not depend on which kernel read it), and
    the plain-Python kernel agrees."""
    rng = np.random.default_rng(d + m)
    sizes = [0, 40, 7, 0, 25]
    xbs = tuple(rng.normal(size=(n, d)).astype(np.float32) for n in sizes)
    q = rng.normal(size=d).astype(np.float32)
    shift, tag = 48, 3
    codes = _split_codes(rng, sizes, m, shift, tag)
    got = K.dot_rows_split(xbs, codes, shift, tag, q)
    assert got is not None and got.dtype == np.float32 and got.shape == (m,)
    parts, rows = (codes >> shift) & 15, codes & ((1 << shift) - 1)
    want = np.array([xbs[p][r].astype(np.float64) @ q for p, r in zip(parts, rows, strict=True)])
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-5)
    for p in set(parts.tolist()):
        sel = parts == p
        np.testing.assert_array_equal(
            got[sel].view(np.int32), K.dot_rows(xbs[p], rows[sel], q).view(np.int32)
        )
    out = np.empty(m, np.float32)
    assert _jit.dot_rows_split.py_func(xbs, codes, shift, tag, q, out)
    np.testing.assert_allclose(out, want.astype(np.float32), rtol=1e-5, atol=1e-5)


def test_dot_rows_split_refuses_codes_outside_its_matrices_and_checks_inputs() -> None:
    """A code naming a missing matrix, a row past its matrix's end, or another tag gives None, with
    nothing read; malformed matrices and queries raise."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones((1, 3), np.float32)
    q = np.array([1.0, 0.0, -1.0], np.float32)
    shift, tag = 8, 2
    code = lambda p, r, t=tag: (t << (shift + 4)) | (p << shift) | r  # noqa: E731
    got = K.dot_rows_split((a, b), np.array([code(0, 1), code(1, 0)], np.int64), shift, tag, q)
    np.testing.assert_array_equal(got, [-2.0, 0.0])
    for bad in ([code(2, 0)], [code(0, 2)], [code(1, 1)], [code(0, 0, tag + 1)], [code(0, 0), -1]):
        codes = np.array(bad, np.int64)
        assert K.dot_rows_split((a, b), codes, shift, tag, q) is None
        out = np.full(len(bad), 7.0, np.float32)
        assert not _jit.dot_rows_split.py_func((a, b), codes, shift, tag, q, out)
        np.testing.assert_array_equal(out, 7.0)
    one = np.array([code(0, 0)], np.int64)
    with pytest.raises(ValueError, match="query"):
        K.dot_rows_split((a, b), one, shift, tag, q.astype(np.float64))
    for xbs in ((a, b[:, :2]), (a, b.astype(np.float64)), (np.ones((2, 6), np.float32)[:, ::2],), ()):
        with pytest.raises(ValueError, match="xbs"):
            K.dot_rows_split(xbs, one, shift, tag, q)
