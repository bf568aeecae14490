"""BM25 over in-memory postings: the keyword half of hybrid and default searches.

Postings are read where they lie, in sorted segments (``Postings``) and an unsorted append buffer
(``Appended``), each checked once when built: a search copies none of them. One pass adds each
posting's BM25 term to a row-indexed accumulator (idf comes with the query, from the index's counts). A
posting counts only when its row is allowed by the request and its generation is the row's current one
(a row whose content changed keeps stale postings until the next compaction).

A search that wants only the best ``depth`` rows reads fewer postings (the MaxScore idea, term at a
time): terms are read in order of their highest possible contribution, and once the ``depth``-th best
sum so far beats what all the terms not yet read could add together, no row they alone hold can reach
the best ``depth``. Those terms are then added only to the rows still in reach (and to the rows the
caller probes), which costs a check per posting instead of an update. The answer is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    max_tf: np.ndarray  # float32 per key: its highest term frequency (0: no posting)
    min_len: np.ndarray  # uint16 per key: its shortest content (together, a bound on its BM25 term)

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The six arrays ``postings`` is built from (the bounds are derived)."""
        return self.keys, self.starts, self.rows, self.tfs, self.gens, self.lens


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
    max_tf, min_len = _key_bounds(starts, tfs, lens)
    return Postings(keys, starts, rows, tfs, gens, lens, max_tf, min_len)


@_kernel
def _key_bounds(starts, tfs, lens):  # pragma: no cover
    n = starts.shape[0] - 1
    max_tf = np.zeros(n, np.float32)
    min_len = np.full(n, 65535, np.uint16)
    for k in range(n):
        for i in range(starts[k], starts[k + 1]):
            max_tf[k] = max(max_tf[k], tfs[i])
            min_len[k] = min(min_len[k], lens[i])
    return max_tf, min_len


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
def _term(w, tf, length, avgdl, k1, b):  # pragma: no cover
    """One posting's BM25 term: idf ``w``, term frequency ``tf``, its content's ``length``."""
    return w * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * length / avgdl))


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
            if acc[r] == 0.0:
                touched[m] = r
                m += 1
            acc[r] += _term(w, tfs[i], lens[i], avgdl, k1, b)
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


@_kernel
def _kth_lower(acc, touched, m, depth, top, counts, sums):  # pragma: no cover
    """A lower bound of the ``depth``-th largest sum among the ``m`` touched rows, all of them at most
    ``top``: the lower edge of the histogram bin where the count from the top reaches ``depth``. The
    sums are copied to ``sums`` in touched order."""
    bins = counts.shape[0] - 1
    counts[:] = 0
    scale = bins / top
    for j in range(m):
        v = acc[touched[j]]
        sums[j] = v
        counts[int(min(v * scale, bins))] += 1
    seen = 0
    for k in range(bins, -1, -1):
        seen += counts[k]
        if seen >= depth:
            return k / scale * (1.0 - 1e-6)
    return 0.0


@_kernel
def _term_ranges(
    keys_t, starts_t, max_tf_t, min_len_t, nseg, wanted, weights, avgdl, k1, b
):  # pragma: no cover
    """Per wanted key: its postings' range in each sorted source, their count, and the most one of
    them can add to a row (from the key's highest tf and shortest content in each source)."""
    t = wanted.shape[0]
    lo = np.zeros((t, nseg), np.int64)
    hi = np.zeros((t, nseg), np.int64)
    ub = np.zeros(t)
    size = np.zeros(t, np.int64)
    for j in range(t):
        if not weights[j] > 0.0:  # (NaN too, as the full pass skips it)
            continue
        for s in range(nseg):
            keys = keys_t[s]
            at = np.searchsorted(keys, wanted[j])
            if at < keys.shape[0] and keys[at] == wanted[j] and starts_t[s][at + 1] > starts_t[s][at]:
                lo[j, s], hi[j, s] = starts_t[s][at], starts_t[s][at + 1]
                size[j] += hi[j, s] - lo[j, s]
                # (the term grows with tf and shrinks with length: these two bound it)
                ub[j] = max(ub[j], _term(weights[j], max_tf_t[s][at], min_len_t[s][at], avgdl, k1, b))
    return lo, hi, ub, size


@_kernel
def _discard(acc, touched, m, mark):  # pragma: no cover
    """Sums given up: the accumulator and the bit set all zeros again."""
    for j in range(m):
        acc[touched[j]] = 0.0
    mark[:] = 0


@_kernel
def _mark_in_reach(sums, touched, m, cut, mark):  # pragma: no cover
    for q in range(m):
        if sums[q] >= cut:
            r = touched[q]
            mark[r >> 3] |= np.uint8(1 << (r & 7))


@_kernel
def _pass_sorted(
    keys_t,
    starts_t,
    rows_t,
    tfs_t,
    gens_t,
    lens_t,
    max_tf_t,
    min_len_t,
    nseg,
    current,
    wanted,
    weights,
    row_gen,
    allowed,
    avgdl,
    k1,
    b,
    acc,
    touched,
    m,
    depth,
    counts,
    sums,
    mark,
):  # pragma: no cover
    """The sorted sources' part of a pass, pruned for the ``depth`` best (see the module's doc): returns
    (touched count, the terms left: their ranges per source and idf). Rows whose sums are too low to
    reach the best ``depth`` stay out of the bit set ``mark``; the terms left count only for those in."""
    lo, hi, ub, size = _term_ranges(
        keys_t, starts_t, max_tf_t, min_len_t, nseg, wanted, weights, avgdl, k1, b
    )
    order = np.argsort(-ub)  # (keys without postings last)
    t = order.shape[0]
    rest = np.zeros(t + 1)  # what the terms from i on could add to a row, at most
    left = np.zeros(t + 1, np.int64)  # their postings
    for i in range(t - 1, -1, -1):
        rest[i] = rest[i + 1] + ub[order[i]]
        left[i] = left[i + 1] + size[order[i]]
    split, done = t, 0.0
    for i in range(t):
        j = order[i]
        # Only worth a look when what is left to read outweighs the look (one read per touched row).
        if depth > 0 and i > 0 and m >= depth and 4 * left[i] > m:
            theta = _kth_lower(acc, touched, m, depth, done * (1.0 + 1e-6), counts, sums)
            margin = 1e-4 * (done + rest[i])  # (float32 sums against float64 bounds)
            if theta - margin > rest[i]:
                split = i
                _mark_in_reach(sums, touched, m, theta - rest[i] - margin, mark)
                break
        for s in range(nseg):
            if hi[j, s] > lo[j, s]:
                m = _add_term(
                    lo[j, s],
                    hi[j, s],
                    weights[j],
                    rows_t[s],
                    tfs_t[s],
                    gens_t[s],
                    lens_t[s],
                    row_gen,
                    allowed,
                    avgdl,
                    k1,
                    b,
                    acc,
                    touched,
                    m,
                    current[s],
                )
        done += ub[j]
    terms = order[split:][size[order[split:]] > 0]
    return m, lo[terms], hi[terms], weights[terms]


@_kernel
def _rest_pass(
    rows_t,
    tfs_t,
    gens_t,
    lens_t,
    nseg,
    current,
    lo,
    hi,
    w,
    row_gen,
    allowed,
    avgdl,
    k1,
    b,
    acc,
    touched,
    m,
    probe,
    mark,
):  # pragma: no cover
    """The terms a pruned pass left, added to the rows in the bit set ``mark`` (those in reach) and to
    the ``probe`` rows; ``mark`` is all zeros after. Returns the touched count."""
    n_rows = allowed.shape[0]
    for p in probe:
        if 0 <= p < n_rows:
            mark[p >> 3] |= np.uint8(1 << (p & 7))
    for j in range(w.shape[0]):
        for s in range(nseg):
            rows, tfs, gens, lens = rows_t[s], tfs_t[s], gens_t[s], lens_t[s]
            for i in range(lo[j, s], hi[j, s]):
                r = rows[i]
                in_reach = r < n_rows and mark[r >> 3] & (1 << (r & 7))
                if in_reach and allowed[r] and (current[s] or gens[i] == row_gen[r]):
                    if acc[r] == 0.0:
                        touched[m] = r
                        m += 1
                    acc[r] += _term(w[j], tfs[i], lens[i], avgdl, k1, b)
    mark[: (n_rows >> 3) + 1] = 0
    return m


def idf(n_docs: float, df: np.ndarray) -> np.ndarray:
    """BM25's idf, log(1 + (N - df + 0.5) / (df + 0.5)), kept > 0 when the counts lag (df > N)."""
    return np.log1p((np.maximum(n_docs - df, 0.0) + 0.5) / (df + 0.5))


def term_idf(n_docs: float, df: float) -> float:
    """``idf`` of one term (a search has a few: no array needed)."""
    return math.log1p((max(n_docs - df, 0.0) + 0.5) / (df + 0.5))


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
    sums = accumulate(sources, wanted, weights, row_gen, allowed, avgdl, k1, b, depth=depth)
    return sums.collect(probe, depth)


class _Rest(NamedTuple):
    """What a pruned pass left to read: its terms' ranges in the sorted sources, their idf, and the
    cut below which a row cannot reach the best ``depth`` (see ``_pass_sorted``)."""

    packed: _Packed
    lo: np.ndarray
    hi: np.ndarray
    weights: np.ndarray
    row_gen: np.ndarray
    allowed: np.ndarray
    avgdl: float
    k1: float
    b: float
    depth: int


class Sums:
    """A keyword pass's per-row sums (see ``accumulate``), read out once by ``collect``. The pass and
    the read-out are apart so a search can learn which rows to probe while the pass runs."""

    def __init__(self, scratch: _Scratch | None, m: int, n: int, rest: _Rest | None = None) -> None:
        self._scratch, self._m, self._n, self._rest = scratch, m, n, rest
        self._still: Callable[[], bool] | None = None
        self._again: Callable[[], Sums] = no_sums

    def collect(
        self, probe: np.ndarray | None = None, depth: int = -1
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, scores, the ``probe`` rows' scores) as ``bm25`` returns them; once only. A pass
        pruned for its best ``depth`` rows gives at most that many."""
        probe = np.empty(0, np.int64) if probe is None else probe
        _check("probe", probe, np.int64)
        rest = self._rest
        if rest is not None and not 0 <= depth <= rest.depth:
            raise ValueError(f"the pass kept the best {rest.depth} rows only: depth must be 0 to that")
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            if self._n < 0:
                raise RuntimeError("the sums were collected already")
            self._n = -1
            return np.empty(0, np.int64), np.empty(0, np.float32), np.zeros(probe.shape[0], np.float32)
        acc, m = scratch.acc[: self._n], self._m
        if rest is not None:
            k = rest.packed
            m = _rest_pass(
                k.rows,
                k.tfs,
                k.gens,
                k.lens,
                k.used,
                k.current,
                rest.lo,
                rest.hi,
                rest.weights,
                rest.row_gen,
                rest.allowed,
                rest.avgdl,
                rest.k1,
                rest.b,
                acc,
                scratch.touched,
                m,
                probe,
                scratch.mark,
            )
        out: tuple[np.ndarray, np.ndarray, np.ndarray] = _collect(acc, scratch.touched, m, probe, int(depth))
        self._n = -1
        _free.append(scratch)
        if rest is not None and self._still is not None and not self._still():
            return self._again().collect(probe, depth)
        return out

    @property
    def pruned(self) -> bool:
        """The pass skipped postings that could not change its best rows (its depth then bounds the
        read-out)."""
        return self._rest is not None

    def release(self) -> None:
        """Give the sums up unread."""
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            return
        self._n = -1
        _discard(scratch.acc, scratch.touched, self._m, scratch.mark)
        _free.append(scratch)

    def recheck(self, still: Callable[[], bool], again: Callable[[], Sums]) -> None:
        """After the read-out of a pruned pass (which reads generations later than the pass), ask
        ``still``; False: what it read may mix two contents of a row, so read ``again()`` instead."""
        self._still, self._again = still, again


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
    depth: int = -1,
) -> Sums:
    """The pass of ``bm25`` (same arguments): each valid posting's term added to its row's sum.
    ``current[i]`` True: every posting of ``sources[i]`` (sorted ones only) is known to be of its
    row's current content (the caller vouches for it), so its generations are not compared.
    ``depth`` > 0: only the best ``depth`` rows will be collected (and probes), so the pass may
    skip what cannot change them; it relies on what the index guarantees: a row holds a key at most
    once in each generation of its content."""
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
    acc, touched = scratch.acc, scratch.touched
    m = 0
    args = (wanted, weights, row_gen, allowed, float(avgdl), float(k1), float(b), acc, touched)
    for s in sources:  # the unsorted first: the pruned pass's sums then hold their terms already
        if isinstance(s, Appended):
            m = _score_appended(s.keys, s.filled, s.rows, s.tfs, s.gens, s.lens, *args, m)
    sorted_ = [(s, bool(known)) for s, known in zip(sources, current, strict=True) if isinstance(s, Postings)]
    packed = _pack(sorted_) if depth > 0 else None
    rest = None
    if packed is not None:
        k = packed
        m, lo, hi, left = _pass_sorted(
            k.keys,
            k.starts,
            k.rows,
            k.tfs,
            k.gens,
            k.lens,
            k.max_tf,
            k.min_len,
            k.used,
            k.current,
            *args,
            m,
            int(depth),
            scratch.counts,
            scratch.sums,
            scratch.mark,
        )
        if left.shape[0]:
            rest = _Rest(packed, lo, hi, left, row_gen, allowed, float(avgdl), float(k1), float(b), depth)
    else:
        for s, known in sorted_:
            m = _score_sorted(s.keys, s.starts, s.rows, s.tfs, s.gens, s.lens, *args, m, known)
    return Sums(scratch, m, allowed.shape[0], rest)


MAX_PACKED = 10  # sorted sources a pruned pass reads at once (more: the plain pass)


class _Packed(NamedTuple):
    """Sorted sources as tuples of ``MAX_PACKED`` arrays each (padded with an empty source), so one
    kernel call reads them all; the first ``used`` are real."""

    keys: tuple[np.ndarray, ...]
    starts: tuple[np.ndarray, ...]
    rows: tuple[np.ndarray, ...]
    tfs: tuple[np.ndarray, ...]
    gens: tuple[np.ndarray, ...]
    lens: tuple[np.ndarray, ...]
    max_tf: tuple[np.ndarray, ...]
    min_len: tuple[np.ndarray, ...]
    used: int
    current: np.ndarray  # bool per source


# The last sources packed: a search reads the same segments as the one before it until a flush.
_last_packed: tuple[list[Postings], _Packed | None] = ([], None)


def forget_packed() -> None:
    """Drop the sources packed last: an index that replaced them calls this, so they do not stay in
    memory until the next search."""
    global _last_packed
    _last_packed = ([], None)


def _pack(sources: list[tuple[Postings, bool]]) -> _Packed | None:
    """The sources packed for ``_pass_sorted``; None when there are too many, or an array a kernel
    would see as another type (not C-contiguous and writable)."""
    global _last_packed
    if len(sources) > MAX_PACKED:
        return None
    segments = [s for s, _ in sources]
    known = [k for _, k in sources]
    last, packed = _last_packed
    same = len(last) == len(segments) and all(a is b for a, b in zip(last, segments, strict=True))
    if same and (packed is None or packed.current[: len(known)].tolist() == known):
        return packed
    flags = np.zeros(MAX_PACKED, np.bool_)
    flags[: len(known)] = known
    if same and packed is not None:  # (only which of them are current changed)
        packed = packed._replace(current=flags)
    elif all(a.flags.c_contiguous and a.flags.writeable for s in segments for a in s):
        pad = (_EMPTY,) * (MAX_PACKED - len(segments))
        keys, starts, rows, tfs, gens, lens, max_tf, min_len = (
            tuple(c) for c in zip(*segments, *pad, strict=True)
        )
        packed = _Packed(keys, starts, rows, tfs, gens, lens, max_tf, min_len, len(segments), flags)
    else:
        packed = None
    _last_packed = (segments, packed)
    return packed


class _Scratch(NamedTuple):
    acc: np.ndarray  # float32 per row, all zeros between searches
    touched: np.ndarray  # int64 per row
    mark: np.ndarray  # a bit per row, all zeros between searches
    counts: np.ndarray  # int32, a histogram's bins
    sums: np.ndarray  # float32 per row


# Free accumulators, the last used on top: a search takes the one most likely still in the cache,
# whichever thread it runs on (a buffer per thread would be cold on a server's many threads).
_free: list[_Scratch] = []


def _new_scratch(size: int) -> _Scratch:
    return _Scratch(
        np.zeros(size, np.float32),
        np.empty(size, np.int64),
        np.zeros((size >> 3) + 1, np.uint8),
        np.zeros(4097, np.int32),
        np.empty(size, np.float32),
    )


def _take_scratch(n: int) -> _Scratch:
    try:
        s = _free.pop()
    except IndexError:
        s = _new_scratch(max(n, 1024))
    if s.acc.shape[0] < n:
        s = _new_scratch(max(n, 2 * s.acc.shape[0]))
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


_i32, _i64 = np.empty(0, np.int32), np.zeros(1, np.int64)
_EMPTY = Postings(
    _i32,
    _i64,
    _i32,
    np.empty(0, np.float32),
    _i32,
    np.empty(0, np.uint16),
    np.empty(0, np.float32),
    np.empty(0, np.uint16),
)  # (pads a pack)
