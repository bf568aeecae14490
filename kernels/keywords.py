"""BM25 over in-memory postings: the keyword half of hybrid and default searches.

Postings are read where they lie, in sorted segments (``Postings``) and an unsorted append buffer
(``Appended``), each checked once when built: a search copies none of them. One pass adds each
posting's BM25 term to a row-indexed accumulator (idf comes with the query, from the index's counts). A
posting counts only when its row is allowed by the request and its generation is the row's current one
(a row whose content changed keeps stale postings until the next compaction).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from ._checks import _check
from ._jit import topk as _topk

_kernel = njit(nogil=True, cache=True, error_model="numpy")


class Postings(NamedTuple):
    """Sorted postings: key ``keys[i]``'s are ``starts[i]:starts[i + 1]`` of rows, tfs, gens and lens. Built
    through ``postings``, which checks them once: a NamedTuple's arrays keep their dtype and length."""

    keys: np.ndarray  # int32, ascending, unique
    starts: np.ndarray  # int64, len(keys) + 1
    rows: np.ndarray  # int32
    tfs: np.ndarray  # float32
    gens: np.ndarray  # int32: the row's content generation when posted
    lens: np.ndarray  # uint16: the length in words of the content posted (at most 65,535)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


class Appended(NamedTuple):
    """Unsorted postings (one key each) in buffers of which the first ``filled`` count."""

    keys: np.ndarray  # int32
    rows: np.ndarray  # int32
    tfs: np.ndarray  # float32
    gens: np.ndarray  # int32
    lens: np.ndarray  # uint16
    filled: int


def postings(
    keys: np.ndarray,
    starts: np.ndarray,
    rows: np.ndarray,
    tfs: np.ndarray,
    gens: np.ndarray,
    lens: np.ndarray,
) -> Postings:
    """Checked sorted postings (see ``Postings``)."""
    _check("keys", keys, np.int32)
    _check("starts", starts, np.int64, keys.shape[0] + 1)
    n = _check("rows", rows, np.int32).shape[0]
    _check("tfs", tfs, np.float32, n)
    _check("gens", gens, np.int32, n)
    _check("lens", lens, np.uint16, n)
    if int(starts[0]) != 0 or int(starts[-1]) != n or (keys.shape[0] and (np.diff(starts) < 0).any()):
        raise ValueError("starts must bound every key's postings")
    if keys.shape[0] > 1 and not (np.diff(keys) > 0).all():
        raise ValueError("keys must be sorted ascending without repeats")
    return Postings(keys, starts, rows, tfs, gens, lens)


def appended(
    keys: np.ndarray, rows: np.ndarray, tfs: np.ndarray, gens: np.ndarray, lens: np.ndarray, filled: int
) -> Appended:
    """Checked unsorted postings (see ``Appended``)."""
    n = _check("keys", keys, np.int32).shape[0]
    _check("rows", rows, np.int32, n)
    _check("tfs", tfs, np.float32, n)
    _check("gens", gens, np.int32, n)
    _check("lens", lens, np.uint16, n)
    if not 0 <= filled <= n:
        raise ValueError("filled must be within the buffers")
    return Appended(keys, rows, tfs, gens, lens, int(filled))


@_kernel
def _add_term(
    lo, hi, w, rows, tfs, gens, lens, row_gen, allowed, avgdl, k1, b, acc, touched, m, current
):  # pragma: no cover
    """Adds the BM25 terms (idf ``w``) of the valid postings ``lo:hi`` to ``acc``, a row-indexed
    accumulator zero where untouched (a term's contribution is always > 0); returns how many rows
    ``touched`` holds. ``allowed`` is no longer than ``row_gen`` or ``acc``. ``current``: every
    posting is of its row's current content, so generations are not compared (one random read
    fewer a posting)."""
    n_rows = allowed.shape[0]
    for i in range(lo, hi):
        r = rows[i]
        if r < n_rows and allowed[r] and (current or gens[i] == row_gen[r]):
            tf = tfs[i]
            norm = k1 * (1.0 - b + b * lens[i] / avgdl)
            if acc[r] == 0.0:
                touched[m] = r
                m += 1
            acc[r] += w * tf * (k1 + 1.0) / (tf + norm)
    return m


@_kernel
def _score_sorted(
    keys, starts, rows, tfs, gens, lens, wanted, idf, row_gen, allowed, avgdl, k1, b, acc, touched, m, current
):  # pragma: no cover
    at = np.searchsorted(keys, wanted)
    for j in range(wanted.shape[0]):
        if idf[j] > 0.0 and at[j] < keys.shape[0] and keys[at[j]] == wanted[j]:
            lo, hi = starts[at[j]], starts[at[j] + 1]
            m = _add_term(
                lo,
                hi,
                idf[j],
                rows,
                tfs,
                gens,
                lens,
                row_gen,
                allowed,
                avgdl,
                k1,
                b,
                acc,
                touched,
                m,
                current,
            )
    return m


@_kernel
def _score_appended(
    keys, filled, rows, tfs, gens, lens, wanted, idf, row_gen, allowed, avgdl, k1, b, acc, touched, m
):  # pragma: no cover
    for i in range(filled):
        j = np.searchsorted(wanted, keys[i])
        if j < wanted.shape[0] and wanted[j] == keys[i] and idf[j] > 0.0:
            m = _add_term(
                i,
                i + 1,
                idf[j],
                rows,
                tfs,
                gens,
                lens,
                row_gen,
                allowed,
                avgdl,
                k1,
                b,
                acc,
                touched,
                m,
                False,
            )
    return m


@_kernel
def _collect(acc, touched, m, probe, depth):  # pragma: no cover
    """(rows, scores, the probe rows' scores) out of the accumulator, which is left all zeros again:
    every touched row in the order first met (depth < 0), or the ``depth`` best, best first (ties: the
    row met first)."""
    probed = np.zeros(probe.shape[0], np.float32)
    for j in range(probe.shape[0]):
        if 0 <= probe[j] < acc.shape[0]:
            probed[j] = acc[probe[j]]
    scores = np.empty(m, np.float32)
    for j in range(m):  # one pass over the touched rows: read, and zero for the next search
        r = touched[j]
        scores[j] = acc[r]
        acc[r] = 0.0
    if depth < 0:
        out_rows = touched[:m].copy()
        out_scores = scores
    else:
        order = _topk(scores, depth)
        out_rows = touched[order]
        out_scores = scores[order]
    return out_rows, out_scores, probed


def idf(n_docs: float, df: np.ndarray) -> np.ndarray:
    """BM25's idf, log(1 + (N - df + 0.5) / (df + 0.5)), kept > 0 when the counts lag (df > N)."""
    return np.log1p((np.maximum(n_docs - df, 0.0) + 0.5) / (df + 0.5))


def bm25(
    sources: Sequence[Postings | Appended],
    wanted: np.ndarray,
    weights: np.ndarray,
    row_gen: np.ndarray,
    allowed: np.ndarray,
    avgdl: float,
    k1: float = 1.2,
    b: float = 0.75,
    probe: np.ndarray | None = None,
    depth: int = -1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BM25 of every allowed row holding a wanted key, read in place from the postings of ``sources``:
    (rows in the order first met, their scores, the scores of the ``probe`` rows, 0 where they hold no
    key); with ``depth`` >= 0 only the ``depth`` best rows, best first (ties: the row met first).
    Key ``wanted[j]`` (sorted, unique) weighs ``weights[j]`` (its term's idf; 0 skips it). A posting
    counts when its row is allowed and its generation is the row's ``row_gen``; ``avgdl`` is
    the mean length of a memory (each posting carries its content's)."""
    if probe is not None:
        _check("probe", probe, np.int64)
    return accumulate(sources, wanted, weights, row_gen, allowed, avgdl, k1, b).collect(probe, depth)


class Sums:
    """A keyword pass's per-row sums (see ``accumulate``), read out once by ``collect``. The pass and
    the read-out are apart so a search can learn which rows to probe while the pass runs."""

    def __init__(self, scratch: _Scratch | None, m: int, n: int) -> None:
        self._scratch, self._m, self._n = scratch, m, n

    def collect(
        self, probe: np.ndarray | None = None, depth: int = -1
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, scores, the ``probe`` rows' scores) as ``bm25`` returns them; once only."""
        probe = np.empty(0, np.int64) if probe is None else probe
        _check("probe", probe, np.int64)
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            if self._n < 0:
                raise RuntimeError("the sums were collected already")
            self._n = -1
            return np.empty(0, np.int64), np.empty(0, np.float32), np.zeros(probe.shape[0], np.float32)
        out: tuple[np.ndarray, np.ndarray, np.ndarray] = _collect(
            scratch.acc[: self._n], scratch.touched, self._m, probe, int(depth)
        )
        self._n = -1
        _free.append(scratch)
        return out


def no_sums() -> Sums:
    """The sums of a pass that matched nothing (a query without terms)."""
    return Sums(None, 0, 0)


def accumulate(
    sources: Sequence[Postings | Appended],
    wanted: np.ndarray,
    weights: np.ndarray,
    row_gen: np.ndarray,
    allowed: np.ndarray,
    avgdl: float,
    k1: float = 1.2,
    b: float = 0.75,
    current: Sequence[bool] | None = None,
) -> Sums:
    """The pass of ``bm25`` (same arguments): each valid posting's term added to its row's sum.
    ``current[i]`` True: every posting of ``sources[i]`` (sorted ones only) is known to be of its
    row's current content (the caller vouches for it), so its generations are not compared."""
    _check("wanted", wanted, np.int32)
    _check("weights", weights, np.float64, wanted.shape[0])
    _check("row_gen", row_gen, np.int32)
    _check("allowed", allowed, np.bool_)
    if wanted.shape[0] > 1 and not (wanted[1:] > wanted[:-1]).all():
        raise ValueError("wanted must be sorted ascending without repeats")
    if not (avgdl > 0 and math.isfinite(avgdl)):
        raise ValueError("avgdl must be a finite number > 0")
    if row_gen.shape[0] < allowed.shape[0]:
        allowed = allowed[: row_gen.shape[0]]  # rows never posted hold no term
    if not all(isinstance(s, Postings | Appended) for s in sources):
        raise ValueError("sources must be built by postings() or appended()")
    if current is None:
        current = (False,) * len(sources)
    elif len(current) != len(sources):
        raise ValueError("current must have one flag per source")
    scratch = _take_scratch(allowed.shape[0])  # (dropped if a kernel raises: it may hold partial sums)
    acc, touched = scratch
    m = 0
    args = (wanted, weights, row_gen, allowed, float(avgdl), float(k1), float(b), acc, touched)
    for s, known in zip(sources, current, strict=True):
        if isinstance(s, Postings):
            m = _score_sorted(s.keys, s.starts, s.rows, s.tfs, s.gens, s.lens, *args, m, bool(known))
        else:
            m = _score_appended(s.keys, s.filled, s.rows, s.tfs, s.gens, s.lens, *args, m)
    return Sums(scratch, m, allowed.shape[0])


class _Scratch(NamedTuple):
    acc: np.ndarray  # float32 per row, all zeros between searches
    touched: np.ndarray  # int64 per row


# Free accumulators, the last used on top: a search takes the one most likely still in the cache,
# whichever thread it runs on (a buffer per thread would be cold on a server's many threads).
_free: list[_Scratch] = []


def _take_scratch(n: int) -> _Scratch:
    try:
        s = _free.pop()
    except IndexError:
        s = _Scratch(np.zeros(max(n, 1024), np.float32), np.empty(max(n, 1024), np.int64))
    if s.acc.shape[0] < n:
        size = max(n, 2 * s.acc.shape[0])
        s = _Scratch(np.zeros(size, np.float32), np.empty(size, np.int64))
    return s


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
