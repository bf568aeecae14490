"""BM25 over in-memory postings: the keyword half of hybrid and default searches.

A query's postings arrive as parallel arrays, each posting a (query term, row, term frequency, content
generation, the row's current generation) tuple. A posting counts only when its row is allowed
by the request and its generation is the row's current one (a row whose content changed keeps stale
postings until the next compaction). The public wrapper checks arrays before the kernel runs.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import njit

from ._checks import _check

_kernel = njit(nogil=True, cache=True, error_model="numpy")


@_kernel
def _bm25(
    terms, n_terms, rows, tfs, gens, current, allowed, lengths, n_docs, avgdl, k1, b, probe, acc
):  # pragma: no cover
    n_rows = allowed.shape[0]
    valid = np.zeros(rows.shape[0], np.bool_)
    df = np.zeros(n_terms, np.int64)
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < n_rows and allowed[r] and gens[i] == current[i]:
            valid[i] = True
            df[terms[i]] += 1
    idf = np.empty(n_terms, np.float64)
    for t in range(n_terms):
        idf[t] = math.log(1.0 + (n_docs - df[t] + 0.5) / (df[t] + 0.5))
    # Scores gather in a row-indexed accumulator, all zeros on entry and left so (a contribution is
    # always > 0, so 0 means untouched); rows come out in the order first met, without a sort.
    touched = np.empty(rows.shape[0], np.int64)
    m = 0
    for i in range(rows.shape[0]):
        if valid[i]:
            r = rows[i]
            tf = tfs[i]
            norm = k1 * (1.0 - b + b * lengths[r] / avgdl)
            if acc[r] == 0.0:
                touched[m] = r
                m += 1
            acc[r] += idf[terms[i]] * tf * (k1 + 1.0) / (tf + norm)
    out_rows = touched[:m].copy()
    out_scores = np.empty(m, np.float32)
    for j in range(m):
        out_scores[j] = acc[out_rows[j]]
    probed = np.zeros(probe.shape[0], np.float32)
    for j in range(probe.shape[0]):
        if 0 <= probe[j] < n_rows:
            probed[j] = acc[probe[j]]
    for j in range(m):
        acc[out_rows[j]] = 0.0
    return out_rows, out_scores, probed


@_kernel
def _match_keys(keys, wanted, labels):  # pragma: no cover
    """Positions of the entries of ``keys`` found in sorted ``wanted``, and the label of each."""
    pos = np.empty(keys.shape[0], np.int64)
    lab = np.empty(keys.shape[0], np.int32)
    m = 0
    for i in range(keys.shape[0]):
        j = np.searchsorted(wanted, keys[i])
        if j < wanted.shape[0] and wanted[j] == keys[i]:
            pos[m] = i
            lab[m] = labels[j]
            m += 1
    return pos[:m], lab[:m]


def bm25(
    terms: np.ndarray,
    n_terms: int,
    rows: np.ndarray,
    tfs: np.ndarray,
    gens: np.ndarray,
    current: np.ndarray,
    allowed: np.ndarray,
    lengths: np.ndarray,
    n_docs: int,
    avgdl: float,
    k1: float = 1.2,
    b: float = 0.75,
    probe: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BM25 of every allowed row holding a query term: (rows in the order first met, their scores, the
    scores of the ``probe`` rows, 0 where they hold no term). Posting i is term ``terms[i]``
    (0 <= terms[i] < n_terms) in row ``rows[i]``; ``n_docs`` is how many rows are allowed (the corpus
    of this search), ``avgdl`` the mean length of a memory in the searched namespaces."""
    probe = np.empty(0, np.int64) if probe is None else probe
    _check("probe", probe, np.int64)
    _check("terms", terms, np.int32)
    _check("rows", rows, np.int32)
    _check("tfs", tfs, np.float32)
    _check("gens", gens, np.int32)
    _check("current", current, np.int32)
    _check("allowed", allowed, np.bool_)
    _check("lengths", lengths, np.int32)
    if not (rows.shape[0] == tfs.shape[0] == gens.shape[0] == terms.shape[0] == current.shape[0]):
        raise ValueError("terms, rows, tfs, gens and current must have one entry per posting")
    if terms.shape[0] and (int(terms.min()) < 0 or int(terms.max()) >= n_terms):
        raise ValueError("terms must be in [0, n_terms)")
    if lengths.shape[0] < allowed.shape[0]:
        raise ValueError("lengths must cover every allowed row")
    if not (avgdl > 0 and math.isfinite(avgdl)):
        raise ValueError("avgdl must be a finite number > 0")
    out: tuple[np.ndarray, np.ndarray, np.ndarray] = _bm25(
        terms,
        int(n_terms),
        rows,
        tfs,
        gens,
        current,
        allowed,
        lengths,
        float(n_docs),
        float(avgdl),
        float(k1),
        float(b),
        probe,
        _accumulator(allowed.shape[0]),
    )
    return out


_scratch = threading.local()  # per thread: a zeroed accumulator as long as the rows, reused


def _accumulator(n: int) -> np.ndarray:
    acc: np.ndarray | None = getattr(_scratch, "acc", None)
    if acc is None or acc.shape[0] < n:
        acc = _scratch.acc = np.zeros(max(n, 1024, 0 if acc is None else 2 * acc.shape[0]), np.float32)
    return acc


def match_keys(keys: np.ndarray, wanted: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``keys`` whose key is in ``wanted``, the ``labels`` entry of that key); ``wanted``
    sorted ascending without repeats, ``labels`` one per wanted key."""
    _check("keys", keys, np.int32)
    _check("wanted", wanted, np.int32)
    _check("labels", labels, np.int32)
    if wanted.shape != labels.shape:
        raise ValueError("labels must have one entry per wanted key")
    if wanted.shape[0] > 1 and not (np.diff(wanted) > 0).all():
        raise ValueError("wanted must be sorted ascending without repeats")
    out: tuple[np.ndarray, np.ndarray] = _match_keys(keys, wanted, labels)
    return out


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
            if x.shape[0] and spans[p] > 0 and x[i] == x[i]:
                norm[p] = (x[i] - lows[p]) / spans[p]
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
    each min-max normalized over the candidates (NaN and a constant signal count as 0); a signal given
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
def _segment_postings(seg_keys, starts, rows, tfs, gens, keys, labels):  # pragma: no cover
    at = np.searchsorted(seg_keys, keys)
    total = 0
    for j in range(keys.shape[0]):
        if at[j] < seg_keys.shape[0] and seg_keys[at[j]] == keys[j]:
            total += starts[at[j] + 1] - starts[at[j]]
    out_terms = np.empty(total, np.int32)
    out_rows = np.empty(total, np.int32)
    out_tfs = np.empty(total, np.float32)
    out_gens = np.empty(total, np.int32)
    m = 0
    for j in range(keys.shape[0]):
        if at[j] < seg_keys.shape[0] and seg_keys[at[j]] == keys[j]:
            for i in range(starts[at[j]], starts[at[j] + 1]):
                out_terms[m] = labels[j]
                out_rows[m] = rows[i]
                out_tfs[m] = tfs[i]
                out_gens[m] = gens[i]
                m += 1
    return out_terms, out_rows, out_tfs, out_gens


def segment_postings(
    seg_keys: np.ndarray,
    starts: np.ndarray,
    rows: np.ndarray,
    tfs: np.ndarray,
    gens: np.ndarray,
    keys: np.ndarray,
    labels: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The postings of ``keys`` in one sorted segment (key ``seg_keys[i]``'s are
    ``starts[i]:starts[i + 1]``): (the key's label, row, tf, generation) per posting."""
    _check("seg_keys", seg_keys, np.int32)
    _check("starts", starts, np.int64)
    for name, a, dtype in (("rows", rows, np.int32), ("tfs", tfs, np.float32), ("gens", gens, np.int32)):
        _check(name, a, dtype)
    _check("keys", keys, np.int32)
    _check("labels", labels, np.int32)
    if starts.shape[0] != seg_keys.shape[0] + 1 or int(starts[-1]) != rows.shape[0]:
        raise ValueError("starts must bound every key's postings")
    if not (rows.shape[0] == tfs.shape[0] == gens.shape[0]) or keys.shape != labels.shape:
        raise ValueError("rows, tfs and gens must match; labels one per key")
    out: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = _segment_postings(
        seg_keys, starts, rows, tfs, gens, keys, labels
    )
    return out
