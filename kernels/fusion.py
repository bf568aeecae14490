"""The default ranking's fusion over its candidates: the rows found by similarity and the best keyword
matches joined, each row's recency and decayed importance, and each signal min-max normalized over
the candidates before they are weighted (``fused_rank``, the search path's one call; ``fused_scores``
and ``fusion_rows``, its parts). One compiled call for the whole step: the glue it replaces held the
GIL, which searches running side by side queue for.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ._checks import ScoreTables, _check, score_columns
from ._jit import score_rows as _score_rows

_kernel = njit(nogil=True, cache=True, error_model="numpy")


@_kernel
def _minmax(x):  # pragma: no cover
    lo, hi = np.inf, -np.inf
    for v in x:
        if v == v:  # NaN counts as the minimum: skipped here
            lo = min(lo, v)
            hi = max(hi, v)
    return lo, hi


@_kernel
def _fused(sim, kw, rec, imp, w_sim, w_kw, alpha, beta, gamma):  # pragma: no cover
    n = rec.shape[0]
    parts = (sim, kw, rec, imp)
    lows = np.empty(4)
    spans = np.empty(4)
    for p in range(4):
        lo, hi = _minmax(parts[p]) if parts[p].shape[0] else (0.0, 0.0)
        lows[p] = lo
        spans[p] = hi - lo if hi > lo else 0.0
    total = w_sim + w_kw
    score = np.empty(n, np.float32)
    relevance = np.empty(n, np.float32)
    for i in range(n):
        norm = np.zeros(4)
        for p in range(4):
            x = parts[p]
            if x.shape[0] and x[i] == x[i]:
                # (a signal equal for every candidate says nothing of their order: the middle)
                norm[p] = (x[i] - lows[p]) / spans[p] if spans[p] > 0 else 0.5
        rel = (w_sim * norm[0] + w_kw * norm[1]) / total if total > 0 else 0.0
        relevance[i] = rel
        score[i] = alpha * rel + beta * norm[2] + gamma * norm[3]
    return score, relevance


def fused_scores(
    sim: np.ndarray | None,
    kw: np.ndarray | None,
    rec: np.ndarray,
    imp: np.ndarray,
    w_sim: float,
    w_kw: float,
    alpha: float,
    beta: float,
    gamma: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(score, relevance) of each candidate from its similarity, keyword score, recency and importance,
    each min-max normalized over the candidates (NaN counts as 0, a signal equal for all as 0.5); a signal given
    as None, or with weight 0, is not part of relevance."""
    n = rec.shape[0]
    empty = np.empty(0, np.float32)
    sim_a = empty if sim is None or w_sim <= 0 else sim
    kw_a = empty if kw is None or w_kw <= 0 else kw
    for name, a in (("sim", sim_a), ("kw", kw_a), ("rec", rec), ("imp", imp)):
        _check(name, a, np.float32)
        if a.shape[0] not in (0, n):
            raise ValueError(f"{name} must have one entry per candidate")
    out: tuple[np.ndarray, np.ndarray] = _fused(
        sim_a,
        kw_a,
        rec,
        imp,
        float(w_sim) if sim_a.shape[0] or n == 0 else 0.0,
        float(w_kw) if kw_a.shape[0] or n == 0 else 0.0,
        float(alpha),
        float(beta),
        float(gamma),
    )
    return out


@_kernel
def _fusion_rows(v_rows, k_rows):  # pragma: no cover
    nv, nk = v_rows.shape[0], k_rows.shape[0]
    new = np.ones(nk, np.bool_)
    k_rank = np.zeros(nv + nk, np.int64)
    order = np.argsort(k_rows)
    ks = k_rows[order]
    for i in range(nv):
        j = np.searchsorted(ks, v_rows[i])
        if j < nk and ks[j] == v_rows[i]:
            new[order[j]] = False
            k_rank[i] = order[j] + 1
    m = nv
    for j in range(nk):
        if new[j]:
            k_rank[m] = j + 1
            m += 1
    return new, k_rank[:m].copy()


def fusion_rows(v_rows: np.ndarray, k_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates of a fused search from the rows found by similarity and those found by keywords
    (each distinct, best first): (which keyword rows are new, the 1-based keyword rank of each row of
    ``v_rows`` then the new ones, 0 when keywords did not find it)."""
    _check("v_rows", v_rows, np.int64)
    _check("k_rows", k_rows, np.int64)
    out: tuple[np.ndarray, np.ndarray] = _fusion_rows(v_rows, k_rows)
    return out


@_kernel
def _fused_rank(
    v_rows,
    v_sims,
    k_rows,
    k_sims,
    k_scores,
    probed,
    use_sim,
    use_kw,
    importance,
    created_at,
    last_access,
    tier,
    ns,
    now,
    tau_seconds,
    half_life_hours,
    floor,
    w_sim,
    w_kw,
    alpha,
    beta,
    gamma,
):  # pragma: no cover
    new, k_rank = _fusion_rows(v_rows, k_rows)
    nv, m = v_rows.shape[0], k_rank.shape[0]
    rows = np.concatenate((v_rows, k_rows[new]))
    rel = np.concatenate((v_sims, k_sims[new]))
    kw = np.concatenate((probed, k_scores[new]))
    combined = np.empty(m, np.float32)  # (score_rows writes one; the fused score replaces it)
    # Normalized from float64: memories stored seconds apart differ in recency and decayed
    # importance by less than float32 resolves, and rounding alone would decide their order.
    rec64 = np.empty(m)
    imp64 = np.empty(m)
    _score_rows(
        rows, rel, importance, created_at, last_access, tier, ns, now, tau_seconds, half_life_hours, floor,
        1.0, 0.0, 0.0, combined, rec64, imp64,
    )  # fmt: skip
    none = np.empty(0)
    ws = w_sim if use_sim and w_sim > 0.0 else 0.0
    wk = w_kw if use_kw and w_kw > 0.0 else 0.0
    score, _ = _fused(  # (every signal as float64: one dtype for the kernel's tuple of them)
        rel.astype(np.float64) if ws > 0.0 else none,
        kw.astype(np.float64) if wk > 0.0 else none,
        rec64,
        imp64,
        ws,
        wk,
        alpha,
        beta,
        gamma,
    )
    rec, imp = rec64.astype(np.float32), imp64.astype(np.float32)
    v_rank = np.zeros(m, np.int64)
    for i in range(nv):
        v_rank[i] = i + 1
    return rows, rel, score, rec, imp, v_rank, k_rank, kw


class FusedRank(NamedTuple):
    """The candidates of a fused ranking, the rows found by similarity first, then the keyword rows
    they lack, in keyword order."""

    rows: np.ndarray  # int64
    rel: np.ndarray  # float32: the similarity (a keyword row's as the caller looked it up)
    score: np.ndarray  # float32: the fused score
    rec: np.ndarray  # float32: recency
    imp: np.ndarray  # float32: decayed importance
    vector_rank: np.ndarray  # int64, 1-based; 0: not found by similarity
    keyword_rank: np.ndarray  # int64, 1-based; 0: not among the keyword rows
    keyword_score: np.ndarray  # float32: BM25 (a similarity row's as probed)


def fused_rank(
    v_rows: np.ndarray,
    v_sims: np.ndarray,
    k_rows: np.ndarray,
    k_sims: np.ndarray,
    k_scores: np.ndarray,
    probed: np.ndarray,
    *,
    use_sim: bool,
    use_kw: bool,
    importance: np.ndarray,
    created_at: np.ndarray,
    last_access: np.ndarray,
    tier: np.ndarray,
    now: float,
    tau_seconds: float,
    half_life_hours: np.ndarray | list[float] | ScoreTables,
    floor: float | np.ndarray | None,
    w_sim: float,
    w_kw: float,
    alpha: float,
    beta: float,
    gamma: float,
    ns: np.ndarray | None = None,
) -> FusedRank:
    """The fused ranking of two candidate lists, each of distinct rows, best first: ``v_rows`` found by
    similarity (``v_sims``; ``probed``, their keyword scores) and ``k_rows`` found by keywords
    (``k_scores``; ``k_sims``, their similarities). The candidates are joined (``fusion_rows``), each
    scored for recency and decayed importance as ``score_rows`` does from the columns, and fused as
    ``fused_scores`` does, the similarity part of relevance only with ``use_sim``, the keyword part
    only with ``use_kw``."""
    nv = _check("v_rows", v_rows, np.int64).shape[0]
    _check("v_sims", v_sims, np.float32, nv)
    _check("probed", probed, np.float32, nv)
    nk = _check("k_rows", k_rows, np.int64).shape[0]
    _check("k_sims", k_sims, np.float32, nk)
    _check("k_scores", k_scores, np.float32, nk)
    hl, fl, ns = score_columns(
        importance, created_at, last_access, tier, tau_seconds, half_life_hours, floor, ns
    )
    out = _fused_rank(
        v_rows, v_sims, k_rows, k_sims, k_scores, probed, bool(use_sim), bool(use_kw),
        importance, created_at, last_access, tier, ns, float(now), float(tau_seconds), hl, fl,
        float(w_sim), float(w_kw), float(alpha), float(beta), float(gamma),
    )  # fmt: skip
    return FusedRank(*out)


@_kernel
def _rrf_rank(
    v_rows,
    v_rel,
    v_score,
    v_rec,
    v_imp,
    k_rows,
    k_sims,
    k_scores,
    rrf_k,
    w_vec,
    w_kw,
    row_w,
    min_similarity,
    importance,
    created_at,
    last_access,
    tier,
    ns,
    now,
    tau_seconds,
    half_life_hours,
    floor,
    alpha,
    beta,
    gamma,
):  # pragma: no cover
    new, k_rank = _fusion_rows(v_rows, k_rows)
    nv, m = v_rows.shape[0], k_rank.shape[0]
    rows = np.concatenate((v_rows, k_rows[new]))
    rel = np.concatenate((v_rel, k_sims[new]))
    score = np.concatenate((v_score, np.empty(m - nv, np.float32)))
    rec = np.concatenate((v_rec, np.empty(m - nv, np.float32)))
    imp = np.concatenate((v_imp, np.empty(m - nv, np.float32)))
    # (the keyword rows the vector list lacks, scored in place)
    _score_rows(
        rows[nv:], rel[nv:], importance, created_at, last_access, tier, ns, now, tau_seconds, half_life_hours,
        floor, alpha, beta, gamma, score[nv:], rec[nv:], imp[nv:],
    )  # fmt: skip
    v_rank = np.zeros(m, np.int64)
    kw = np.zeros(m, np.float32)
    fused = np.zeros(m, np.float32)
    for i in range(m):
        below = False
        if i < nv:
            v_rank[i] = i + 1
            fused[i] = np.float32(w_vec / (rrf_k + v_rank[i]))
        else:
            if row_w.shape[0]:
                score[i] = score[i] * row_w[rows[i]]
            if rel[i] < np.float32(min_similarity):  # (as NumPy compares them; NaN: no floor)
                score[i] = np.nan
                below = True  # (under the floor: not a result, as in every ranking)
        if k_rank[i] > 0:
            kw[i] = k_scores[k_rank[i] - 1]
            if not below:
                fused[i] = np.float32(np.float64(fused[i]) + w_kw / (rrf_k + k_rank[i]))
        if not fused[i] > 0.0:
            fused[i] = np.nan  # in neither weighted list: not a result
    return rows, rel, score, rec, imp, fused, v_rank, k_rank, kw


class RrfRank(NamedTuple):
    """The candidates of a reciprocal rank fusion: the vector list's rows first, then the keyword rows
    it lacks, in keyword order."""

    rows: np.ndarray  # int64
    rel: np.ndarray  # float32: the similarity
    score: np.ndarray  # float32: the strategy's combined score (a keyword row's times its row weight)
    rec: np.ndarray  # float32: recency
    imp: np.ndarray  # float32: decayed importance
    fused: np.ndarray  # float32: w_vec / (k + vector rank) + w_kw / (k + keyword rank); NaN in neither
    vector_rank: np.ndarray  # int64, 1-based; 0: not in the vector list
    keyword_rank: np.ndarray  # int64, 1-based; 0: not in the keyword list
    keyword_score: np.ndarray  # float32: BM25 (0 where the keyword list lacks the row)


def rrf_rank(
    vector: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    k_rows: np.ndarray,
    k_sims: np.ndarray,
    k_scores: np.ndarray,
    *,
    rrf_k: float,
    w_vec: float,
    w_kw: float,
    row_w: np.ndarray | None,
    min_similarity: float | None,
    importance: np.ndarray,
    created_at: np.ndarray,
    last_access: np.ndarray,
    tier: np.ndarray,
    now: float,
    tau_seconds: float,
    half_life_hours: np.ndarray | list[float] | ScoreTables,
    floor: float | np.ndarray | None,
    alpha: float,
    beta: float,
    gamma: float,
    ns: np.ndarray | None = None,
) -> RrfRank:
    """Reciprocal rank fusion of a scored vector list (``vector``: its rows, similarities, combined
    scores, recency and importance, best first) and a keyword list (``k_rows`` best first, their BM25
    ``k_scores`` and similarities ``k_sims``), each of distinct rows: the keyword rows the vector list
    lacks are scored as ``score_rows`` does (times ``row_w`` at the row when given; NaN where their
    similarity is below ``min_similarity``, and so is their fused score: not results), and every other
    candidate gets ``w_vec / (rrf_k + vector rank) + w_kw / (rrf_k + keyword rank)``."""
    v_rows, v_rel, v_score, v_rec, v_imp = vector
    nv = _check("vector rows", v_rows, np.int64).shape[0]
    for name, a in (
        ("vector rel", v_rel),
        ("vector score", v_score),
        ("vector rec", v_rec),
        ("vector imp", v_imp),
    ):
        _check(name, a, np.float32, nv)
    nk = _check("k_rows", k_rows, np.int64).shape[0]
    _check("k_sims", k_sims, np.float32, nk)
    _check("k_scores", k_scores, np.float32, nk)
    weights = np.empty(0, np.float32) if row_w is None else _check("row_w", row_w, np.float32)
    if row_w is not None and weights.shape[0] < importance.shape[0]:
        raise ValueError("row_w must have an entry per row of the columns")
    hl, fl, ns = score_columns(
        importance, created_at, last_access, tier, tau_seconds, half_life_hours, floor, ns
    )
    out = _rrf_rank(
        v_rows, v_rel, v_score, v_rec, v_imp, k_rows, k_sims, k_scores, float(rrf_k), float(w_vec), float(w_kw),
        weights, np.nan if min_similarity is None else float(min_similarity), importance, created_at,
        last_access, tier, ns, float(now), float(tau_seconds), hl, fl, float(alpha), float(beta), float(gamma),
    )  # fmt: skip
    return RrfRank(*out)
