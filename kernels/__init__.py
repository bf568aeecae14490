"""Numba kernels over whole columns: decay, recency, combined scores, surprise EMA, top-k, filters.

These functions know nothing of gRPC or LMDB. Each public wrapper checks dtypes, shapes and
contiguity and raises ``ValueError`` before any kernel runs; it converts inputs only where a copy is
cheap and unavoidable (scalars, small lookup tables). ``warm_up()`` compiles every kernel (or loads it
from Numba's on-disk cache) so the server reports SERVING only once scoring is ready.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _jit
from ._checks import ScoreTables, _check, _floor_table, _table, score_columns, score_tables

__all__ = [
    "DEFAULT_SURPRISE_ALPHA",
    "ScoreTables",
    "allowed_entries",
    "combined_scores",
    "decay_importance",
    "dot_rows",
    "dot_rows_split",
    "filter_mask",
    "ordered_bounds",
    "plan_moves",
    "prior_bounds",
    "recency",
    "retention_scores",
    "row_weights",
    "score_rows",
    "score_tables",
    "select_evictions",
    "selection_bitmap",
    "split_top",
    "surprise_ema",
    "tier_counts",
    "topk",
    "warm_up",
]

DEFAULT_SURPRISE_ALPHA = 0.3

# Held while a parallel (prange) kernel runs: the whole-array lifecycle passes. Request-path
# kernels are serial and nogil, so gRPC threads never wait on it.
PARALLEL_LOCK = threading.Lock()


def _half_lives(half_life_hours: np.ndarray | list[float]) -> np.ndarray:
    hl = np.ascontiguousarray(half_life_hours, dtype=np.float64)
    if hl.ndim != 1 or hl.shape[0] < 5:
        raise ValueError("half_life_hours must have one entry per tier value 0..4")
    if np.any(np.isnan(hl)):
        raise ValueError("half_life_hours must not be NaN")
    return hl


def _check_tiers(tier: np.ndarray) -> None:
    if tier.shape[0] and (int(tier.min()) < 0 or int(tier.max()) > 4):
        raise ValueError("tier values must be in 0..4")


def decay_importance(
    importance: np.ndarray,
    created_at: np.ndarray,
    tier: np.ndarray,
    now: float,
    half_life_hours: np.ndarray | list[float],
    floor: float = 0.0,
) -> np.ndarray:
    """importance * 0.5**(age_hours / half_life[tier]), never below ``floor * importance``.

    Ages below zero count as zero; a half-life <= 0 or infinite means no decay.
    importance: float32, created_at: float64 epoch seconds, tier: int8 (0..4).
    """
    n = _check("importance", importance, np.float32).shape[0]
    _check("created_at", created_at, np.float64, n)
    _check("tier", tier, np.int8, n)
    _check_tiers(tier)
    out = np.empty(n, np.float32)
    _jit.decay_importance(
        importance, created_at, tier, float(now), _half_lives(half_life_hours), float(floor), out
    )
    return out


def recency(last_access: np.ndarray, now: float, tau_seconds: float) -> np.ndarray:
    """exp(-max(0, now - last_access) / tau_seconds) as float32; tau_seconds must be > 0."""
    n = _check("last_access", last_access, np.float64).shape[0]
    if not tau_seconds > 0:
        raise ValueError("tau_seconds must be > 0")
    out = np.empty(n, np.float32)
    _jit.recency(last_access, float(now), float(tau_seconds), out)
    return out


def combined_scores(
    relevance: np.ndarray, rec: np.ndarray, imp: np.ndarray, alpha: float, beta: float, gamma: float
) -> np.ndarray:
    """alpha*relevance + beta*recency + gamma*importance, elementwise, as float32."""
    n = _check("relevance", relevance, np.float32).shape[0]
    _check("recency", rec, np.float32, n)
    _check("importance", imp, np.float32, n)
    out = np.empty(n, np.float32)
    _jit.combined(relevance, rec, imp, float(alpha), float(beta), float(gamma), out)
    return out


def score_rows(
    rows: np.ndarray,
    relevance: np.ndarray,
    *,
    importance: np.ndarray,
    created_at: np.ndarray,
    last_access: np.ndarray,
    tier: np.ndarray,
    now: float,
    tau_seconds: float,
    half_life_hours: np.ndarray | list[Any] | ScoreTables,
    floor: float | np.ndarray | None,
    alpha: float,
    beta: float,
    gamma: float,
    ns: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Score the rows ``rows`` of the columns in one pass: returns (score, recency, importance).

    ``relevance[i]`` is the similarity of row ``rows[i]``; importance is decayed as in
    ``decay_importance``, by ``half_life_hours``: 5 values by tier for every row, or a
    (namespaces, 5) table read at the row's ``ns`` (int32 namespace id column); ``floor`` is one
    value or a (namespaces,) table read the same way. Both may come checked once as ``ScoreTables``
    (``score_tables``), passed as ``half_life_hours`` with ``floor`` None. This is the fused form the
    search path uses.
    """
    m = _check("rows", rows, np.int64).shape[0]
    _check("relevance", relevance, np.float32, m)
    hl, fl, ns = score_columns(
        importance, created_at, last_access, tier, tau_seconds, half_life_hours, floor, ns
    )
    score = np.empty(m, np.float32)
    rec = np.empty(m, np.float32)
    imp = np.empty(m, np.float32)
    _jit.score_rows(
        rows,
        relevance,
        importance,
        created_at,
        last_access,
        tier,
        ns,
        float(now),
        float(tau_seconds),
        hl,
        fl,
        float(alpha),
        float(beta),
        float(gamma),
        score,
        rec,
        imp,
    )
    return score, rec, imp


def dot_rows(xb: np.ndarray, ids: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Inner products of the rows ``ids`` of the (n, d) float32 matrix ``xb`` with ``query``, without
    copying the rows (``xb`` may be a view of FAISS's vector storage). Inputs must be finite."""
    if not isinstance(xb, np.ndarray) or xb.dtype != np.float32 or xb.ndim != 2 or not xb.flags.c_contiguous:
        raise ValueError("xb must be a contiguous 2-D float32 array")
    m = _check("ids", ids, np.int64).shape[0]
    _check("query", query, np.float32, xb.shape[1])
    out = np.empty(m, np.float32)
    if not _jit.dot_rows(xb, ids, query, out):
        raise ValueError("ids out of range")
    return out


def dot_rows_split(
    xbs: tuple[np.ndarray, ...], codes: np.ndarray, shift: int, tag: int, query: np.ndarray
) -> np.ndarray | None:
    """``dot_rows`` over several matrices in one call: for each code ``c``, the inner product with
    ``query`` of row ``c & (2**shift - 1)`` of matrix ``xbs[(c >> shift) & 15]``, bit for bit what
    ``dot_rows`` gives for that row. None when a code names a matrix or row outside ``xbs``, or its
    bits above the matrix number are not ``tag``."""
    if not 0 < len(xbs) <= 16 or not 0 < shift < 60:
        raise ValueError("xbs must hold 1 to 16 matrices and shift lie in 1..59")
    d = _check("query", query, np.float32).shape[0]
    for xb in xbs:
        if (
            not isinstance(xb, np.ndarray)
            or xb.dtype != np.float32
            or xb.shape[1:] != (d,)
            or not xb.flags.c_contiguous
        ):
            raise ValueError("each of xbs must be a contiguous (n, query's dimension) float32 array")
    _check("codes", codes, np.int64)
    out = np.empty(codes.shape[0], np.float32)
    return out if _jit.dot_rows_split(tuple(xbs), codes, shift, int(tag), query, out) else None


def prior_bounds(
    todo: np.ndarray,
    *,
    gen: np.ndarray,
    gen0: np.ndarray,
    rec_ub: np.ndarray,
    imp_ub: np.ndarray,
    importance: np.ndarray,
    beta: float,
    gamma: float,
    base: float,
    bar: float,
    row_w: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``r`` with ``todo[r]`` whose score could still exceed ``bar``: (rows, bounds).

    bound(r) = w(r) * (base + beta*rec_ub[r] + gamma*imp_ub[r]) for rows whose generation ``gen[r]``
    still equals ``gen0[r]`` (the generation at which ``rec_ub``/``imp_ub``, upper bounds of recency
    and decayed importance, were computed; rows at or past ``len(gen0)`` are newer), and
    w(r) * (base + beta + gamma*importance[r]) for every other row. ``row_w`` (float32 per row)
    defaults to 1. Rows come in row order. Bounds carry a 1e-5 slack for float32 rounding.
    """
    n = _check("todo", todo, np.bool_).shape[0]
    _check("gen", gen, np.int64, n)
    n0 = _check("gen0", gen0, np.int64).shape[0]
    if n0 > n:
        raise ValueError("gen0 must not be longer than todo")
    _check("rec_ub", rec_ub, np.float32, n0)
    _check("imp_ub", imp_ub, np.float32, n0)
    _check("importance", importance, np.float32, n)
    if row_w is None:
        w, use_w = np.ones(1, np.float32), False
    else:
        w, use_w = _check("row_w", row_w, np.float32, n), True
    rows = np.empty(n, np.int64)
    bounds = np.empty(n, np.float32)
    c = _jit.prior_bounds(
        todo,
        gen,
        gen0,
        rec_ub,
        imp_ub,
        importance,
        float(beta),
        float(gamma),
        float(base),
        w,
        use_w,
        float(bar),
        rows,
        bounds,
    )
    return rows[:c], bounds[:c]


def ordered_bounds(
    todo: np.ndarray,
    *,
    n0: int,
    order: np.ndarray,
    prior: np.ndarray,
    importance: np.ndarray,
    log: np.ndarray,
    log_from: int,
    log_to: int,
    beta: float,
    gamma: float,
    base: float,
    bar: float,
) -> tuple[np.ndarray, np.ndarray]:
    """``prior_bounds`` (without row weights) from cached prior bounds kept in sorted order: reads
    only the rows it returns or passes over, not every row. (rows, bounds), in that order:

    - rows logged at ring positions ``log_from``..``log_to``-1 (``log[i % len(log)]``: the rows
      changed since the bounds were computed), and rows at or past ``n0`` (newer than the
      bounds), with the trivial bound base + beta + gamma*importance[r];
    - rows of ``order`` (rows sorted by their cached prior bound, ``prior``, best first: prior[i] =
      beta*rec_ub + gamma*imp_ub of row order[i]) while base + prior beats ``bar``, if below ``n0``
      and the length of ``todo``, with bound base + prior.

    Rows come only if ``todo`` and their bound beats ``bar`` (1e-5 slack, as prior_bounds). ``todo``
    is cleared for every row bounded here (logged, newer, or walked), so no row comes twice across
    calls. A walked row is taken as unchanged since the bounds (no generation is read): every row
    changed before ``log_to`` was read is logged in the window and was cleared before the walk
    (Columns logs a row before its generation moves). A row whose change began after that may be
    walked with its cached bound: the caller reads the log again after the call and raises the
    bounds of the rows logged since (``Searcher._bounded``)."""
    n = _check("todo", todo, np.bool_).shape[0]
    m = _check("order", order, np.int64).shape[0]
    _check("prior", prior, np.float32, m)
    _check("importance", importance, np.float32, n)
    _check("log", log, np.int64)
    if n0 < 0:
        raise ValueError("n0 must be >= 0")
    if log.shape[0] == 0 or log_to - log_from > log.shape[0] or log_from > log_to or log_from < 0:
        raise ValueError("log_from..log_to must be a window of at most len(log) positions")
    size = (log_to - log_from) + max(0, n - n0) + m
    rows = np.empty(size, np.int64)
    bounds = np.empty(size, np.float32)
    c = _jit.ordered_bounds(
        todo,
        int(n0),
        order,
        prior,
        importance,
        log,
        int(log_from),
        int(log_to),
        float(beta),
        float(gamma),
        float(base),
        float(bar),
        rows,
        bounds,
    )
    return rows[:c], bounds[:c]


def row_weights(ns: np.ndarray, tier: np.ndarray, by_ns: np.ndarray, by_tier: np.ndarray) -> np.ndarray:
    """Per-row weight by_ns[ns[r]] * by_tier[tier[r]] (float32): a search's scope weight per
    namespace id times its tier weight. A row whose namespace or tier id is out of its table's
    range (a namespace created after the table was built, an unused row) weighs 0."""
    n = _check("ns", ns, np.int32).shape[0]
    _check("tier", tier, np.int8, n)
    out = np.empty(n, np.float32)
    _jit.row_weights(
        ns, tier, np.ascontiguousarray(by_ns, np.float32), np.ascontiguousarray(by_tier, np.float32), out
    )
    return out


def selection_bitmap(slots: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, int]:
    """A FAISS ``IDSelectorBitmap`` over entries 0..len(slots)-1 (little-endian bits): bit i is set
    when the entry is live (``slots[i] >= 0``) and its row is allowed (``allowed[slots[i]]``; rows
    past the end of ``allowed`` are not). Returns (uint8 bitmap, number of bits set)."""
    n = _check("slots", slots, np.int64).shape[0]
    _check("allowed", allowed, np.bool_)
    bitmap = np.zeros((n + 7) // 8, np.uint8)
    count = _jit.selection_bitmap(slots, allowed, bitmap)
    return bitmap, int(count)


def allowed_entries(slots: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entries i that are live (``slots[i] >= 0``) and whose row is allowed (``allowed[slots[i]]``;
    rows past the end of ``allowed`` are not): (positions i, their rows), in position order. Each
    slot is read once, so a slot another thread clears meanwhile never yields a row of -1."""
    n = _check("slots", slots, np.int64).shape[0]
    _check("allowed", allowed, np.bool_)
    ids = np.empty(n, np.int64)
    rows = np.empty(n, np.int64)
    c = _jit.allowed_entries(slots, allowed, ids, rows)
    return ids[:c], rows[:c]


def mask_equal(mask: np.ndarray, column: np.ndarray, value: int) -> tuple[np.ndarray, int]:
    """A new mask of the rows of ``mask`` whose ``column`` (int8 or int32) holds ``value``, and how many:
    one pass, where a copy, a comparison, an and and a count would take four."""
    n = _check("mask", mask, np.bool_).shape[0]
    if not isinstance(column, np.ndarray) or column.dtype not in (np.int8, np.int32):
        raise ValueError("column must be an int8 or int32 numpy array")
    _check("column", column, column.dtype.type, n)
    out = np.empty(n, np.bool_)
    return out, int(_jit.mask_equal(mask, column, int(value), out))


def tier_counts(mask: np.ndarray, tier: np.ndarray) -> np.ndarray:
    """Rows allowed by ``mask`` in each tier: int64[5], entry t for tier t (values outside 0..4 are
    not counted). One pass, instead of a mask of each tier and a count."""
    n = _check("mask", mask, np.bool_).shape[0]
    _check("tier", tier, np.int8, n)
    out = np.zeros(5, np.int64)
    _jit.tier_counts(mask, tier, out)
    return out


def surprise_ema(
    state: np.ndarray,
    index: np.ndarray,
    predicted: np.ndarray,
    actual: np.ndarray,
    alpha: float = DEFAULT_SURPRISE_ALPHA,
) -> np.ndarray:
    """Apply a batch of feedback in order: s <- alpha*max(0, actual - predicted) + (1 - alpha)*s.

    ``state`` (float32, one value per distinct memory) is updated in place; item i updates
    ``state[index[i]]``. Returns each item's surprise right after it was applied.
    """
    k = _check("state", state, np.float32).shape[0]
    n = _check("index", index, np.int64).shape[0]
    _check("predicted", predicted, np.float32, n)
    _check("actual", actual, np.float32, n)
    if n and (int(index.min()) < 0 or int(index.max()) >= k):
        raise ValueError("index out of range")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be in [0, 1]")
    out = np.empty(n, np.float32)
    _jit.surprise_ema(state, index, predicted, actual, float(alpha), out)
    return out


def topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first (ties: lower index first; NaN never selected)."""
    if not isinstance(scores, np.ndarray) or scores.dtype not in (np.float32, np.float64):
        raise ValueError("scores must be a float32 or float64 numpy array")
    _check("scores", scores, scores.dtype.type)
    if k < 0:
        raise ValueError("k must be >= 0")
    k = min(int(k), scores.shape[0])
    if k == 0:
        return np.empty(0, np.int64)
    return _jit.topk(scores, k)


def split_top(bounds: np.ndarray, bar: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``bounds`` (float32) of the entries above ``bar``: the ``size`` largest (ties go
    to the lower position) and the others, each in position order. NaN is never above ``bar``.

    One pass to count, one to pick the size-th largest (in-place selection on a copy of the
    entries above ``bar``), one to split: what ``np.argpartition`` plus two masks did, without
    negating or sorting positions.
    """
    n = _check("bounds", bounds, np.float32).shape[0]
    if size < 1:
        raise ValueError("size must be >= 1")
    top = np.empty(min(n, int(size)), np.int64)
    rest = np.empty(max(n - int(size), 0), np.int64)
    # Compared in float32, as NumPy compares a float32 array with a Python float.
    nt, nr = _jit.split_top(bounds, np.float32(bar), int(size), top, rest)
    return top[:nt], rest[:nr]


def filter_mask(
    *,
    alive: np.ndarray,
    ns_id: np.ndarray,
    ns_ok: np.ndarray,
    tier: np.ndarray,
    tier_ok: np.ndarray,
    kind_id: np.ndarray,
    kind_ok: np.ndarray,
    created_at: np.ndarray,
    created_lo: float,
    created_hi: float,
    expire_at: np.ndarray | None,
    now: float,
    space_id: np.ndarray | None = None,
    space: int = -1,
) -> tuple[np.ndarray, int]:
    """Rows that are alive, in an allowed namespace, tier and kind, created in [lo, hi), unexpired,
    and (with ``space >= 0``) in embedding space ``space`` of the ``space_id`` column.

    ``ns_ok``/``tier_ok``/``kind_ok`` are bool lookup tables indexed by id (``kind_ok`` empty: any
    kind). An open window (lo = -inf, hi = +inf) does not read ``created_at``; ``expire_at=None``
    skips the expiry check (for a caller that knows no row has expired by ``now``). Returns
    (bool mask, count).
    """
    n = _check("alive", alive, np.bool_).shape[0]
    _check("ns_id", ns_id, np.int32, n)
    _check("ns_ok", ns_ok, np.bool_)
    _check("tier", tier, np.int8, n)
    _check("tier_ok", tier_ok, np.bool_, 5)
    _check("kind_id", kind_id, np.int32, n)
    _check("kind_ok", kind_ok, np.bool_)
    _check("created_at", created_at, np.float64, n)
    check_expire = expire_at is not None
    if expire_at is None:
        expire_at = np.empty(0, np.float64)
    else:
        _check("expire_at", expire_at, np.float64, n)
    if space >= 0:
        if space_id is None:
            raise ValueError("space_id is required with space >= 0")
        _check("space_id", space_id, np.int32, n)
    else:
        space_id = np.empty(0, np.int32)
    lo, hi = float(created_lo), float(created_hi)
    allowed_ns = np.flatnonzero(ns_ok)
    one_ns = int(allowed_ns[0]) if allowed_ns.shape[0] == 1 else -1
    tier_mode = 2 if tier_ok.all() else 1 if tier_ok[1:].all() else 0
    out = np.empty(n, np.bool_)
    count = _jit.filter_mask(
        alive,
        ns_id,
        ns_ok,
        one_ns,
        tier,
        tier_ok,
        tier_mode,
        kind_id,
        kind_ok,
        created_at,
        lo,
        hi,
        not (lo == -np.inf and hi == np.inf),
        expire_at,
        float(now),
        check_expire,
        space_id,
        int(space),
        out,
    )
    return out, int(count)


def plan_moves(
    *,
    eligible: np.ndarray,
    ns: np.ndarray,
    tier: np.ndarray,
    importance: np.ndarray,
    created_at: np.ndarray,
    accessed_at: np.ndarray,
    tier_since: np.ndarray,
    access_count: np.ndarray,
    access_base: np.ndarray,
    surprise: np.ndarray,
    success_count: np.ndarray,
    success_base: np.ndarray,
    now: float,
    floor: float | np.ndarray,
    half_life_hours: np.ndarray,
    ttl_seconds: np.ndarray,
    threshold: np.ndarray,
    promote_access: np.ndarray,
    promote_surprise: np.ndarray,
    promote_success: np.ndarray,
    decay_grace: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Lifecycle decision per row: (action int8, decayed importance float32).

    Actions: 0 none, 1 promote (access), 2 promote (surprise), 3 promote (success), 4 demote (idle),
    5 demote (decay); see ``_jit.plan_moves`` for the rules. Only ``eligible`` rows get an action;
    every row with a valid namespace and tier gets its decayed importance. Tables are indexed by
    namespace id: (namespaces, 5) for half_life_hours, ttl_seconds, threshold; (namespaces,) for
    the promotion thresholds, ``decay_grace`` (None: True everywhere) and ``floor`` (or one value).
    """
    n = _check("eligible", eligible, np.bool_).shape[0]
    for name, arr, dtype in (
        ("ns", ns, np.int32),
        ("tier", tier, np.int8),
        ("importance", importance, np.float32),
        ("created_at", created_at, np.float64),
        ("accessed_at", accessed_at, np.float64),
        ("tier_since", tier_since, np.float64),
        ("access_count", access_count, np.int64),
        ("access_base", access_base, np.int64),
        ("surprise", surprise, np.float32),
        ("success_count", success_count, np.int64),
        ("success_base", success_base, np.int64),
    ):
        _check(name, arr, dtype, n)
    hl, ttl, thr, pa, ps, pc, grace = _lifecycle_tables(
        half_life_hours,
        ttl_seconds,
        threshold,
        promote_access,
        promote_surprise,
        promote_success,
        decay_grace,
    )
    fl = _floor_table(floor, hl.shape[0])
    action = np.empty(n, np.int8)
    decayed = np.empty(n, np.float32)
    with PARALLEL_LOCK:
        _jit.plan_moves(
            eligible,
            ns,
            tier,
            importance,
            created_at,
            accessed_at,
            tier_since,
            access_count,
            access_base,
            surprise,
            success_count,
            success_base,
            float(now),
            fl,
            hl,
            ttl,
            thr,
            pa,
            ps,
            pc,
            grace,
            action,
            decayed,
        )
    return action, decayed


def _lifecycle_tables(
    half_life_hours: np.ndarray,
    ttl_seconds: np.ndarray,
    threshold: np.ndarray,
    promote_access: np.ndarray,
    promote_surprise: np.ndarray,
    promote_success: np.ndarray,
    decay_grace: np.ndarray | None,
) -> tuple[np.ndarray, ...]:
    """``plan_moves``'s per-namespace tables, checked (and converted where cheap), in its kernel's
    order; ``decay_grace`` None is True for every namespace."""
    hl = _table("half_life_hours", half_life_hours, np.float64)
    grace = np.ones(hl.shape[0], np.bool_) if decay_grace is None else decay_grace
    tables = (
        hl,
        _table("ttl_seconds", ttl_seconds, np.float64),
        _table("threshold", threshold, np.float32),
        _table("promote_access", promote_access, np.int64, None),
        _table("promote_surprise", promote_surprise, np.float32, None),
        _table("promote_success", promote_success, np.int64, None),
        _table("decay_grace", grace, np.bool_, None),
    )
    if len({t.shape[0] for t in tables}) != 1:
        raise ValueError("lifecycle tables must all have one row per namespace")
    return tables


def retention_scores(
    *,
    ns: np.ndarray,
    policy: np.ndarray,
    decayed: np.ndarray,
    accessed_at: np.ndarray,
    created_at: np.ndarray,
    tier_since: np.ndarray,
    now: float,
    tau_seconds: float,
) -> np.ndarray:
    """Per-row score of how much a memory deserves to stay (higher stays), float64, by the
    namespace's retention policy (``policy[ns]``): 1 importance_weighted = 0.7*decayed +
    0.3*exp(-(now - accessed)/tau), 2 recency = created_at, 3 fifo = tier_since, 4 lru = accessed_at,
    5 importance = decayed, 6 ten_point_weighted = 0.7*(10*decayed) + 0.3*exp(-(now - created)/tau).
    Scores compare only within one namespace (one policy)."""
    n = _check("ns", ns, np.int32).shape[0]
    pol = _table("policy", policy, np.int8, None)
    _check("decayed", decayed, np.float32, n)
    _check("accessed_at", accessed_at, np.float64, n)
    _check("created_at", created_at, np.float64, n)
    _check("tier_since", tier_since, np.float64, n)
    if not tau_seconds > 0:
        raise ValueError("tau_seconds must be > 0")
    out = np.empty(n, np.float64)
    with PARALLEL_LOCK:
        _jit.retention_scores(
            ns, pol, decayed, accessed_at, created_at, tier_since, float(now), float(tau_seconds), out
        )
    return out


def select_evictions(
    group: np.ndarray, score: np.ndarray, candidates: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """Among ``candidates``, per group (int64 ids 0..len(capacity)-1), mark the lowest-scoring rows
    beyond ``capacity[group]``; ties evict the lower row index first. Returns a bool mask."""
    n = _check("group", group, np.int64).shape[0]
    _check("score", score, np.float64, n)
    _check("candidates", candidates, np.bool_, n)
    cap = _table("capacity", capacity, np.int64, None)
    if (cap < 0).any():
        raise ValueError("capacity must not be negative")
    evict = np.zeros(n, np.bool_)  # the kernel checks group ids and NaN scores of candidates
    with PARALLEL_LOCK:
        _jit.select_evictions(group, score, candidates, cap, evict)
    return evict


def warm_up() -> None:
    """Compile (or load from cache) every kernel on tiny inputs."""
    tiny = _Tiny()
    _warm_scoring(tiny)
    _warm_search(tiny)
    _warm_filters(tiny)
    _warm_lifecycle(tiny)
    _warm_keywords(tiny)


@dataclass(frozen=True)
class _Tiny:
    """Two-row inputs of every dtype the kernels take (a warm-up copies those a kernel writes)."""

    f32: np.ndarray = field(default_factory=lambda: np.array([0.5, 0.25], np.float32))
    f64: np.ndarray = field(default_factory=lambda: np.array([0.0, 10.0], np.float64))
    t8: np.ndarray = field(default_factory=lambda: np.array([1, 4], np.int8))
    i32: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int32))
    i64: np.ndarray = field(default_factory=lambda: np.zeros(2, np.int64))
    b: np.ndarray = field(default_factory=lambda: np.ones(2, np.bool_))
    rows: np.ndarray = field(default_factory=lambda: np.array([1, 0], np.int64))


def _warm_keywords(tiny: _Tiny) -> None:
    """Keyword search: BM25 over sorted and appended postings, with probes; the fused score."""
    from tiermem.kernels import fusion, keywords

    i32, f32, b = tiny.i32, tiny.f32, tiny.b
    key = np.array([0], np.int32)
    u16 = np.ones(2, np.uint16)
    sources = (
        keywords.postings(np.array([0, 1], np.int32), np.array([0, 1, 2], np.int64), i32, f32, i32, u16),
        keywords.appended(i32, i32, f32, i32, u16, 2),
    )
    keywords.bm25(sources, key, np.ones(1), i32, b, 1.0, probe=tiny.rows)
    keywords.bm25(sources, key, np.ones(1), i32, b, 1.0, probe=tiny.rows, depth=1)
    # The best read before the probes are known (a search's vector search beside its keyword pass).
    for depth in (-1, 1):
        keywords.accumulate(sources, key, np.ones(1), i32, b, 1.0, depth=depth).best(depth)[2](tiny.rows)
    # The pass for the best row, read row by row: the second term alone cannot lift row 1 to the top.
    two = np.array([0, 1], np.int32)
    skewed = keywords.postings(
        two, np.array([0, 1, 2], np.int64), two, np.array([5.0, 1.0], np.float32), i32, u16
    )
    keywords.bm25((skewed,), two, np.array([3.0, 0.1]), i32, b, 1.0, probe=tiny.rows, depth=1)
    fusion.fused_scores(f32, f32, f32, f32, 0.5, 0.5, 1.0, 0.1, 0.1)
    fusion.fusion_rows(tiny.rows, tiny.rows[:1])
    fusion.fused_scores(None, None, f32, f32, 0.0, 0.0, 1.0, 0.1, 0.1)
    columns = {"importance": f32, "created_at": tiny.f64, "last_access": tiny.f64, "tier": tiny.t8}
    for ns_table in (np.ones(5), np.ones((2, 5))):  # (one table for all, one per namespace)
        fusion.fused_rank(
            tiny.rows, f32, tiny.rows[:1], f32[:1], f32[:1], f32, use_sim=True, use_kw=True,
            now=1.0, tau_seconds=60.0, half_life_hours=ns_table, floor=0.1, w_sim=0.5, w_kw=0.5,
            alpha=1.0, beta=0.1, gamma=0.1, ns=tiny.i32, **columns,
        )  # fmt: skip
        for row_w in (None, f32):
            fusion.rrf_rank(
                (tiny.rows, f32, f32, f32, f32), tiny.rows[:1], f32[:1], f32[:1], rrf_k=60, w_vec=1.0,
                w_kw=1.0, row_w=row_w, min_similarity=None, now=1.0, tau_seconds=60.0,
                half_life_hours=ns_table, floor=0.1, alpha=1.0, beta=0.1, gamma=0.1, ns=tiny.i32, **columns,
            )  # fmt: skip
    keywords.keys_by_row(i32, i32)  # (a compaction's; a restore runs before this)


def _warm_scoring(tiny: _Tiny) -> None:
    """Decay, recency, combined scores, per-row scoring (one and many namespaces), surprise, top-k."""
    f32, f64, t8, rows = tiny.f32, tiny.f64, tiny.t8, tiny.rows
    hl = np.ones(5, np.float64)
    decay_importance(f32, f64, t8, 1.0, hl, 0.1)
    rec = recency(f64, 1.0, 60.0)
    combined_scores(f32, rec, f32, 0.5, 0.3, 0.2)
    for half_lives, ns in ((hl, None), (np.ones((2, 5), np.float64), tiny.i32)):
        score_rows(
            rows,
            f32,
            importance=f32,
            created_at=f64,
            last_access=f64,
            tier=t8,
            now=1.0,
            tau_seconds=60.0,
            half_life_hours=half_lives,
            floor=0.1,
            alpha=0.5,
            beta=0.3,
            gamma=0.2,
            ns=ns,
        )
    surprise_ema(f32.copy(), rows, f32, f32)
    topk(f32, 1)
    topk(f64, 1)


def _warm_search(tiny: _Tiny) -> None:
    """Vector lookups, prior bounds (weighted and not), ordered bounds, selections, splits."""
    f32, i64, b, rows = tiny.f32, tiny.i64, tiny.b, tiny.rows
    dot_rows(np.ones((2, 2), np.float32), rows, f32)
    dot_rows_split((np.ones((2, 2), np.float32),) * 5, rows, 1, 0, f32)  # (a matrix per tier)
    for row_w in (f32, None):  # weighted and unweighted specializations
        prior_bounds(
            b,
            gen=i64,
            gen0=i64,
            rec_ub=f32,
            imp_ub=f32,
            importance=f32,
            beta=0.3,
            gamma=0.2,
            base=0.1,
            bar=0.0,
            row_w=row_w,
        )
    ordered_bounds(
        b.copy(),
        n0=2,
        order=rows,
        prior=f32,
        importance=f32,
        log=i64,
        log_from=0,
        log_to=1,
        beta=0.3,
        gamma=0.2,
        base=0.1,
        bar=0.0,
    )
    selection_bitmap(rows, b)
    allowed_entries(rows, b)
    split_top(f32, 0.0, 1)
    tier_counts(b, tiny.t8)
    row_weights(np.zeros(2, np.int32), tiny.t8, f32, f32)


def _warm_filters(tiny: _Tiny) -> None:
    """Both specializations of the filter: with the expiry column and space check, and without; the
    narrowing of a mask to a space or a tier."""
    i32 = tiny.i32
    mask_equal(tiny.b, i32, 0)
    mask_equal(tiny.b, tiny.t8, 1)
    for expire_at, space_id, space in ((tiny.f64, None, -1), (None, i32, 0)):
        filter_mask(
            alive=tiny.b,
            ns_id=i32,
            ns_ok=tiny.b,
            tier=tiny.t8,
            tier_ok=np.ones(5, np.bool_),
            kind_id=i32,
            kind_ok=np.zeros(0, np.bool_),
            created_at=tiny.f64,
            created_lo=-np.inf if space < 0 else 0.0,
            created_hi=np.inf,
            expire_at=expire_at,
            now=1.0,
            space_id=space_id,
            space=space,
        )


def _warm_lifecycle(tiny: _Tiny) -> None:
    """Move planning, retention scores and evictions."""
    f32, f64, i32, i64, b = tiny.f32, tiny.f64, tiny.i32, tiny.i64, tiny.b
    hl2 = np.ones((2, 5), np.float64)
    _, decayed = plan_moves(
        eligible=b,
        ns=i32,
        tier=tiny.t8,
        importance=f32,
        created_at=f64,
        accessed_at=f64,
        tier_since=f64,
        access_count=i64,
        access_base=i64,
        surprise=f32,
        success_count=i64,
        success_base=i64,
        now=1.0,
        floor=0.1,
        half_life_hours=hl2,
        ttl_seconds=hl2,
        threshold=hl2.astype(np.float32),
        promote_access=np.ones(2, np.int64),
        promote_surprise=np.ones(2, np.float32),
        promote_success=np.ones(2, np.int64),
        decay_grace=np.ones(2, np.bool_),
    )
    score = retention_scores(
        ns=i32,
        policy=np.ones(2, np.int8),
        decayed=decayed,
        accessed_at=f64,
        created_at=f64,
        tier_since=f64,
        now=1.0,
        tau_seconds=60.0,
    )
    select_evictions(i64, score, b, np.zeros(2, np.int64))
