"""BM25 over in-memory postings: the keyword half of hybrid and default searches.

A query's postings arrive as parallel arrays, each posting a (query term, row, term frequency, content
generation) tuple. A posting counts only when its row is allowed
by the request and its generation is the row's current one (a row whose content changed keeps stale
postings until the next compaction). The public wrapper checks arrays before the kernel runs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_kernel = njit(nogil=True, cache=True, error_model="numpy")


@_kernel
def _bm25(
    terms, n_terms, rows, tfs, gens, current_gen, allowed, lengths, n_docs, avgdl, k1, b
):  # pragma: no cover
    n_rows = allowed.shape[0]
    valid = np.zeros(rows.shape[0], np.bool_)
    df = np.zeros(n_terms, np.int64)
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < n_rows and allowed[r] and gens[i] == current_gen[r]:
            valid[i] = True
            df[terms[i]] += 1
    idf = np.empty(n_terms, np.float64)
    for t in range(n_terms):
        idf[t] = math.log(1.0 + (n_docs - df[t] + 0.5) / (df[t] + 0.5))
    hit_rows = np.empty(rows.shape[0], np.int64)
    hit_scores = np.empty(rows.shape[0], np.float32)
    m = 0
    for i in range(rows.shape[0]):
        if valid[i]:
            r = rows[i]
            tf = tfs[i]
            norm = k1 * (1.0 - b + b * lengths[r] / avgdl)
            hit_rows[m] = r
            hit_scores[m] = idf[terms[i]] * tf * (k1 + 1.0) / (tf + norm)
            m += 1
    order = np.argsort(hit_rows[:m], kind="mergesort")
    out_rows = np.empty(m, np.int64)
    out_scores = np.zeros(m, np.float32)
    n = -1
    last = -1
    for j in range(m):
        i = order[j]
        if hit_rows[i] != last:
            n += 1
            last = hit_rows[i]
            out_rows[n] = last
        out_scores[n] += hit_scores[i]
    return out_rows[: n + 1], out_scores[: n + 1]


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


@_kernel
def _masked_mean(values, mask):  # pragma: no cover
    total = 0.0
    n = 0
    for i in range(mask.shape[0]):
        if mask[i]:
            total += values[i]
            n += 1
    return total / n if n else 0.0


def _need(array: np.ndarray, name: str, dtype: type, ndim: int = 1) -> None:
    if not isinstance(array, np.ndarray) or array.dtype != dtype or array.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d {np.dtype(dtype).name} array")
    if not array.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")


def bm25(
    terms: np.ndarray,
    n_terms: int,
    rows: np.ndarray,
    tfs: np.ndarray,
    gens: np.ndarray,
    current_gen: np.ndarray,
    allowed: np.ndarray,
    lengths: np.ndarray,
    n_docs: int,
    avgdl: float,
    k1: float = 1.2,
    b: float = 0.75,
) -> tuple[np.ndarray, np.ndarray]:
    """BM25 of every allowed row holding a query term: (rows ascending, scores). Posting i is term
    ``terms[i]`` (0 <= terms[i] < n_terms) in row ``rows[i]``; ``n_docs`` and ``avgdl`` describe the
    allowed rows (the corpus of this search)."""
    _need(terms, "terms", np.int32)
    _need(rows, "rows", np.int32)
    _need(tfs, "tfs", np.float32)
    _need(gens, "gens", np.int32)
    _need(current_gen, "current_gen", np.int32)
    _need(allowed, "allowed", np.bool_)
    _need(lengths, "lengths", np.int32)
    if not (rows.shape[0] == tfs.shape[0] == gens.shape[0] == terms.shape[0]):
        raise ValueError("terms, rows, tfs and gens must have one entry per posting")
    if terms.shape[0] and (int(terms.min()) < 0 or int(terms.max()) >= n_terms):
        raise ValueError("terms must be in [0, n_terms)")
    if current_gen.shape[0] < allowed.shape[0] or lengths.shape[0] < allowed.shape[0]:
        raise ValueError("current_gen and lengths must cover every allowed row")
    if not (avgdl > 0 and math.isfinite(avgdl)):
        raise ValueError("avgdl must be a finite number > 0")
    out: tuple[np.ndarray, np.ndarray] = _bm25(
        terms,
        int(n_terms),
        rows,
        tfs,
        gens,
        current_gen,
        allowed,
        lengths,
        float(n_docs),
        float(avgdl),
        float(k1),
        float(b),
    )
    return out


def match_keys(keys: np.ndarray, wanted: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``keys`` whose key is in ``wanted``, the ``labels`` entry of that key); ``wanted``
    sorted ascending without repeats, ``labels`` one per wanted key."""
    _need(keys, "keys", np.int32)
    _need(wanted, "wanted", np.int32)
    _need(labels, "labels", np.int32)
    if wanted.shape != labels.shape:
        raise ValueError("labels must have one entry per wanted key")
    if wanted.shape[0] > 1 and not (np.diff(wanted) > 0).all():
        raise ValueError("wanted must be sorted ascending without repeats")
    out: tuple[np.ndarray, np.ndarray] = _match_keys(keys, wanted, labels)
    return out


def masked_mean(values: np.ndarray, mask: np.ndarray) -> float:
    """Mean of ``values`` where ``mask`` holds (0.0 when it holds nowhere)."""
    _need(mask, "mask", np.bool_)
    if values.ndim != 1 or values.shape[0] < mask.shape[0]:
        raise ValueError("values must be 1-d and cover the mask")
    return float(_masked_mean(values, mask))
