"""BM25 over in-memory postings: the keyword half of hybrid and default searches.

Postings are read where they lie, in sorted segments (``Postings``) and an unsorted append buffer
(``Appended``), each checked once when built: a search copies none of them. One pass adds each
posting's BM25 term to a row-indexed accumulator (idf comes with the query, from the index's counts). A
posting counts only when its row is allowed by the request and its generation is the row's current one
(a row whose content changed keeps stale postings until the next compaction).

A search that wants only the best ``depth`` rows (and the scores of rows it probes) reads the sorted
segments a row at a time instead (the MaxScore idea, document at a time; each key's rows are in
order). Per segment, terms are taken in order of their highest possible contribution (from the key's
highest tf and shortest content there); each row holding a term and none taken before it is scored
whole, its other terms looked up forward in their lists. A row whose bound cannot reach the lowest of
the best so far is skipped, and once the terms left cannot lift any row in, the segment is done. A
row's current content is posted to one source, so each row is scored in one place. The answer is
the same as the full pass's.

Where every term of a segment has a row bitmap (``_rowsets``) and none of its postings is stale, a
term is read a 64-row word at a time instead: its rows as bits (allowed, held by no earlier term),
those holding every later term scored first, then, with the cut they set, the rest narrowed in
whole-array passes to the rows whose terms, as their bits say, could still reach it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

from ._checks import _check
from ._rowsets import RowBitmaps, find_row, no_bitmaps, popcount, row_bitmaps, tf_is_one

_kernel = njit(nogil=True, cache=True, error_model="numpy")
_inlined = njit(nogil=True, cache=True, error_model="numpy", inline="always")  # (called once a word)


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
    by_row: bool  # each key's rows strictly ascending (as the index builds them): read row by row
    bitmaps: RowBitmaps  # the common keys' rows as bits (by_row only): a row's posting found at once

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
    max_tf, min_len, by_row = _key_bounds(starts, rows, tfs, lens)
    bitmaps = row_bitmaps(starts, rows, tfs) if by_row else no_bitmaps(keys.shape[0])
    return Postings(keys, starts, rows, tfs, gens, lens, max_tf, min_len, bool(by_row), bitmaps)


@_kernel
def _key_bounds(starts, rows, tfs, lens):  # pragma: no cover
    n = starts.shape[0] - 1
    max_tf = np.zeros(n, np.float32)
    min_len = np.full(n, 65535, np.uint16)
    by_row = True
    for k in range(n):
        for i in range(starts[k], starts[k + 1]):
            max_tf[k] = max(max_tf[k], tfs[i])
            min_len[k] = min(min_len[k], lens[i])
            if i > starts[k] and rows[i] <= rows[i - 1]:
                by_row = False
    return max_tf, min_len, by_row


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
    return _normed_term(w, tf, _length_norm(length, avgdl, k1, b), k1)


@_kernel
def _length_norm(length, avgdl, k1, b):  # pragma: no cover
    """The part of a term's BM25 denominator that its content's ``length`` sets (all of a row's
    terms share it)."""
    return k1 * (1.0 - b + b * length / avgdl)


@_kernel
def _normed_term(w, tf, norm, k1):  # pragma: no cover
    """``_term`` with the length part ``norm`` computed (``_length_norm``): the same float."""
    tf = np.float64(tf)
    return w * tf * (k1 + 1.0) / (tf + norm)


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
def _collect(acc, touched, m, probe, depth, keep):  # pragma: no cover
    """(rows, scores, the probe rows' scores) out of the accumulator, which is left all zeros again
    (unless ``keep``: rows are probed later): every touched row in the order first met (depth < 0), or
    the ``depth`` best, best first (ties: the lower row, as ``_best`` breaks them)."""
    probed = np.zeros(probe.shape[0], np.float32)
    for j in range(probe.shape[0]):
        if 0 <= probe[j] < acc.shape[0]:
            probed[j] = acc[probe[j]]
    scores = np.empty(m, np.float32)
    for j in range(m):  # one pass over the touched rows: read, and zero for the next search
        r = touched[j]
        scores[j] = acc[r]
        if not keep:
            acc[r] = 0.0
    if depth < 0:
        out_rows = touched[:m].copy()
        out_scores = scores
    else:
        hs = np.empty(max(depth, 0))
        hr = np.empty(max(depth, 0), np.int64)
        n = 0
        if depth > 0:
            for j in range(m):
                n = _push(hs, hr, n, np.float64(scores[j]), touched[j])
        out_rows, best = _best_first(hs, hr, n)
        out_scores = best.astype(np.float32)
    return out_rows, out_scores, probed


@_kernel
def _term_ranges(
    keys_t, starts_t, max_tf_t, min_len_t, maps_t, nseg, wanted, weights, avgdl, k1, b
):  # pragma: no cover
    """Per wanted key and sorted source: its postings' range there, the most one of them can add
    to a row (from the key's highest tf and shortest content in that source), the most one with a
    tf of 1 can add, and its bitmap there (-1: none)."""
    t = wanted.shape[0]
    lo = np.zeros((t, nseg), np.int64)
    hi = np.zeros((t, nseg), np.int64)
    ub = np.zeros((t, nseg))
    ub1 = np.zeros((t, nseg))
    maps = np.full((t, nseg), -1, np.int64)
    for j in range(t):
        if not weights[j] > 0.0:  # (NaN too, as the full pass skips it)
            continue
        for s in range(nseg):
            keys = keys_t[s]
            at = np.searchsorted(keys, wanted[j])
            if at < keys.shape[0] and keys[at] == wanted[j] and starts_t[s][at + 1] > starts_t[s][at]:
                lo[j, s], hi[j, s] = starts_t[s][at], starts_t[s][at + 1]
                # (the term grows with tf and shrinks with length: these two bound it)
                ub[j, s] = _term(weights[j], max_tf_t[s][at], min_len_t[s][at], avgdl, k1, b)
                ub1[j, s] = _term(weights[j], 1.0, min_len_t[s][at], avgdl, k1, b)
                maps[j, s] = maps_t[s][at]
    return lo, hi, ub, ub1, maps


@_kernel
def _discard(acc, touched, m):  # pragma: no cover
    """Sums given up: the accumulator all zeros again."""
    for j in range(m):
        acc[touched[j]] = 0.0


@_kernel
def _worse(s1, r1, s2, r2):  # pragma: no cover
    """(score, row) 1 ranks below 2: a lower score, or the same and a higher row."""
    return s1 < s2 or (s1 == s2 and r1 > r2)


@_kernel
def _best_first(hs, hr, n):  # pragma: no cover
    """The ``n`` rows and scores a heap of ``_push`` holds, best first (ties: the lower row)."""
    by_row = np.argsort(hr[:n])
    order = by_row[np.argsort(-hs[:n][by_row], kind="mergesort")]
    return hr[:n][order], hs[:n][order]


@_kernel
def _push(hs, hr, n, s, r):  # pragma: no cover
    """Offer (score ``s``, row ``r``) to the min-heap of the best ``hs.shape[0]``, ``n`` held; returns n."""
    if n < hs.shape[0]:
        i = n
        n += 1
        while i > 0:
            up = (i - 1) >> 1
            if not _worse(s, r, hs[up], hr[up]):
                break
            hs[i], hr[i] = hs[up], hr[up]
            i = up
    elif _worse(hs[0], hr[0], s, r):
        i = 0
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and _worse(hs[c + 1], hr[c + 1], hs[c], hr[c]):
                c += 1
            if not _worse(hs[c], hr[c], s, r):
                break
            hs[i], hr[i] = hs[c], hr[c]
            i = c
    else:
        return n
    hs[i], hr[i] = s, r
    return n


@_kernel
def _seek(rows, i, hi, r):  # pragma: no cover
    """The first position in ``i:hi`` (rows ascending) whose row is >= ``r`` (galloping from ``i``)."""
    stop = min(i + 16, hi)  # (near rows first, in order: the common case in a dense list)
    while i < stop and rows[i] < r:
        i += 1
    if i >= hi or rows[i] >= r:
        return i
    step = 1
    while i + step < hi and rows[i + step] < r:
        i += step
        step <<= 1
    return _lower_bound(rows, i + 1, min(i + step, hi), r)


@_kernel
def _lower_bound(rows, lo, hi, r):  # pragma: no cover
    """The first position in ``lo:hi`` (rows ascending) whose row is >= ``r``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if rows[mid] < r:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_kernel
def _segment_best(
    rows,
    tfs,
    gens,
    lens,
    cur,
    lo,
    hi,
    ub,
    ub1,
    w,
    maps,
    words,
    ranks,
    tf_bits,
    first,
    row_gen,
    bits,
    bits64,
    n_rows,
    avgdl,
    k1,
    b,
    hs,
    hr,
    n,
):  # pragma: no cover
    """One sorted source's rows offered to the heap of the best (``hs``/``hr``, ``n`` held). Terms in
    order of their bound ``ub``, highest first: each row of a term's postings that holds no term
    before it is scored whole (``_walk_postings``; ``_walk_words`` where every term has a bitmap
    and no posting is stale). Before each term what is left to add is weighed against the heap's
    lowest: once the terms left together cannot lift a row into the heap, the rest is skipped.
    ``ub1``: the terms' bounds with a tf of 1. Returns (the heap's count, how many rows were scored
    whole)."""
    t = lo.shape[0]
    order = np.argsort(-ub)
    lo, hi, ub, ub1, w, maps = lo[order], hi[order], ub[order], ub1[order], w[order], maps[order]
    after = np.zeros(t + 1)  # after[i]: what terms i.. could add together, at most
    for i in range(t - 1, -1, -1):
        after[i] = after[i + 1] + ub[i]
    depth = hs.shape[0]
    scored = 0
    by_words = cur and t > 0 and (maps >= 0).all()
    for i in range(t):
        if n == depth and after[i] < hs[0] * (1.0 - 1e-6):  # (float sums against float bounds)
            break
        if by_words:
            n, more = _walk_words(
                i, lo, ub, ub1, after, w, maps, words, ranks, tf_bits, first, tfs, lens, bits, bits64, avgdl, k1, b,
                hs, hr, n,
            )  # fmt: skip
        else:
            n, more = _walk_postings(
                i, rows, tfs, gens, lens, cur, lo, hi, after, w, maps, words, ranks, tf_bits, first, row_gen, bits,
                n_rows, avgdl, k1, b, hs, hr, n,
            )  # fmt: skip
        scored += more
    return n, scored


@_kernel
def _walk_postings(
    i, rows, tfs, gens, lens, cur, lo, hi, after, w, maps, words, ranks, tf_bits, first, row_gen, bits, n_rows,
    avgdl, k1, b, hs, hr, n,
):  # pragma: no cover  # fmt: skip
    """Term ``i``'s rows offered to the heap a posting at a time: each allowed one of the row's
    current content that holds no earlier term is scored whole, its other terms looked up (in the
    key's bitmap ``maps[j]`` of ``words``/``ranks``/``tf_bits`` when it has one, else galloping: the
    rows ascend). Before each row, and each look-up, what it could still gain is weighed against
    the heap's lowest. Returns (the heap's count, rows scored)."""
    t, depth = lo.shape[0], hs.shape[0]
    full = n == depth
    cut = hs[0] * (1.0 - 1e-6) if full else -1.0  # (float sums against float bounds)
    at = lo.copy()
    scored = 0
    wk, k0, kb = w[i] * (k1 + 1.0), k1 * (1.0 - b), k1 * b / avgdl  # (the skip test, without a division)
    for p in range(lo[i], hi[i]):
        r = rows[p]
        # Allowed (as bits: 8x less to cache) and of the row's current content (no random read
        # where no posting is stale).
        if not (r < n_rows and (bits[r >> 3] >> (r & 7)) & 1 and (cur or gens[p] == row_gen[r])):
            continue
        g = 0 if cur else row_gen[r]
        tf = np.float64(tfs[p])
        # Skipped when its term and what the later terms could add stay under the cut, tested
        # without dividing: rounding moves it by far less than the cut's slack.
        if full and wk * tf < (cut - after[i + 1]) * (tf + k0 + kb * np.float64(lens[p])):
            continue
        norm = _length_norm(lens[p], avgdl, k1, b)  # (the row's other postings here share it)
        score = _normed_term(w[i], tf, norm, k1)
        for j in range(t):
            if j == i:
                continue
            if j > i and full and score + after[j] < cut:
                score = -1.0  # (the terms left cannot lift it in)
                break
            d = maps[j]  # (the key's bitmap: a common word's posting found at once)
            one = False  # (its tf is 1, known from the bitmap's tf bits)
            if d >= 0:
                q = find_row(words, ranks, d, first, r)
                one = q >= 0 and tf_is_one(tf_bits, d, first, r)
                q = lo[j] + q if q >= 0 else -1
            else:  # (galloping: each term's look-ups come in row order)
                q = _seek(rows, at[j], hi[j], r)
                at[j] = q
                q = q if q < hi[j] and rows[q] == r else -1
            if q >= 0 and (cur or gens[q] == g):
                if j < i:  # (a term before i holds it: it was scored with that one)
                    score = -1.0
                    break
                # (most tfs are 1: no read then, which would wait on the popcount)
                score += _normed_term(w[j], np.float32(1.0) if one else tfs[q], norm, k1)
        if score >= 0.0:
            scored += 1
            n, full, cut = _offered(hs, hr, n, score, r)
    return n, scored


@_inlined
def _offered(hs, hr, n, score, r):  # pragma: no cover
    """Row ``r``'s ``score`` offered to the heap (as float32, the precision returned: equal rows tie
    there, by row). Returns (the heap's count, whether it is full, its cut: -1 until it is)."""
    n = _push(hs, hr, n, np.float64(np.float32(score)), r)
    full = n == hs.shape[0]
    return n, full, hs[0] * (1.0 - 1e-6) if full else -1.0


@_inlined
def _allowed_word(bits, g):  # pragma: no cover
    """Rows ``64 g`` to ``64 g + 63`` of the packed (little-endian) allowed bits as one word."""
    at, x = g << 3, np.uint64(0)
    for k in range(min(8, bits.shape[0] - at)):
        x |= np.uint64(bits[at + k]) << np.uint64(8 * k)
    return x


@_kernel
def _walk_words(
    i,
    lo,
    ub,
    ub1,
    after,
    w,
    maps,
    words,
    ranks,
    tf_bits,
    first,
    tfs,
    lens,
    bits,
    bits64,
    avgdl,
    k1,
    b,
    hs,
    hr,
    n,
):  # pragma: no cover
    """Term ``i``'s rows in a source whose every term has a bitmap and whose postings are all
    current, offered to the heap as ``_walk_postings`` offers them, a 64-row word at a time. Their
    words are computed over the span in whole-array passes (``_term_words``). The rows holding every
    later term are visited first: their sums lift the heap's cut. Then, with the cut known, the
    rest are narrowed in whole-array passes too (``_narrow``) and visited. Returns (the heap's
    count, rows scored)."""
    rows = _term_words(i, maps, words, first, bits, bits64)
    t, nw = lo.shape[0], words.shape[1]
    scored = 0
    if t - i > 1:  # the rows holding every later term
        every = rows.copy()
        for j in range(i + 1, t):
            _and(every, words[maps[j]])
        _and_not(rows, every)
        n, scored = _offer_words(
            every, np.full(nw, ~np.uint64(0)), i, lo, after, w, maps, words, ranks, tf_bits, first, tfs, lens,
            avgdl, k1, b, hs, hr, n,
        )  # fmt: skip
    later = np.zeros(nw, np.uint64)
    for j in range(i + 1, t):
        _or(later, words[maps[j]])
    if n == hs.shape[0]:
        _narrow(rows, later, i, ub, ub1, after, maps, words, tf_bits, hs[0] * (1.0 - 1e-6))
    n, more = _offer_words(
        rows, later, i, lo, after, w, maps, words, ranks, tf_bits, first, tfs, lens, avgdl, k1, b, hs, hr, n
    )
    return n, scored + more


@_kernel
def _term_words(i, maps, words, first, bits, bits64):  # pragma: no cover
    """Term ``i``'s bitmap over its source's span, allowed (``bits``, ``bits64`` its whole words) and
    without the rows of the terms before it (they were scored with those)."""
    d, nw = maps[i], words.shape[1]
    rows = np.empty(nw, np.uint64)
    within = min(nw, max(0, bits64.shape[0] - first))  # (words of bits64; the rest byte by byte)
    for y in range(within):
        rows[y] = words[d, y] & bits64[first + y]
    for y in range(within, nw):
        rows[y] = words[d, y] & _allowed_word(bits, first + y)
    for j in range(i):
        _and_not(rows, words[maps[j]])
    return rows


@_kernel
def _narrow(rows, later, i, ub, ub1, after, maps, words, tf_bits, cut):  # pragma: no cover
    """Term ``i``'s ``rows`` (``later``: the later terms' bits OR-ed) left where a row could reach
    ``cut``: holding each later term without which none could, and, unless the term alone could,
    some later term (or, when only a tf of 1 could not, a tf other than 1)."""
    for j in range(i + 1, ub.shape[0]):
        if ub[i] + after[i + 1] - ub[j] < cut:
            _and(rows, words[maps[j]])
    if ub[i] < cut:
        _and(rows, later)
    elif ub1[i] < cut:
        tf_many = tf_bits[maps[i]]
        for y in range(rows.shape[0]):
            rows[y] &= later[y] | tf_many[y]


@_inlined
def _and(a, b):  # pragma: no cover
    for y in range(a.shape[0]):
        a[y] &= b[y]


@_inlined
def _and_not(a, b):  # pragma: no cover
    for y in range(a.shape[0]):
        a[y] &= ~b[y]


@_inlined
def _or(a, b):  # pragma: no cover
    for y in range(a.shape[0]):
        a[y] |= b[y]


@_kernel
def _offer_words(
    rows, later, i, lo, after, w, maps, words, ranks, tf_bits, first, tfs, lens, avgdl, k1, b, hs, hr, n
):  # pragma: no cover
    """``_offer_word`` for each word of ``rows`` with a bit set. Returns (the heap's count, rows
    scored)."""
    scored = 0
    for y in range(rows.shape[0]):
        if rows[y] != 0:
            n, more = _offer_word(
                rows[y], later[y], y, i, lo, after, w, maps, words, ranks, tf_bits, first, tfs, lens, avgdl, k1,
                b, hs, hr, n,
            )  # fmt: skip
            scored += more
    return n, scored


@_inlined
def _offer_word(
    a, later, x, i, lo, after, w, maps, words, ranks, tf_bits, first, tfs, lens, avgdl, k1, b, hs, hr, n
):  # pragma: no cover
    """The rows of ``a`` (bits of word ``x`` of term ``i``'s bitmap; ``later``: the later terms'
    bits there) scored and offered to the heap, as ``_segment_best`` scores a row. Returns (the
    heap's count, rows scored)."""
    t, depth, d, one = lo.shape[0], hs.shape[0], maps[i], np.uint64(1)
    full = n == depth
    cut = hs[0] * (1.0 - 1e-6) if full else -1.0
    wk, k0, kb = w[i] * (k1 + 1.0), k1 * (1.0 - b), k1 * b / avgdl
    held, base = words[d, x], lo[i] + np.int64(ranks[d, x])
    scored = 0
    while a:
        low = a & (~a + one)
        a ^= low
        below = low - one
        p = base + np.int64(popcount(held & below))
        alone = (later & low) == 0
        tf = np.float64(tfs[p])
        rest = 0.0 if alone else after[i + 1]
        if full and wk * tf < (cut - rest) * (tf + k0 + kb * np.float64(lens[p])):
            continue
        norm = _length_norm(lens[p], avgdl, k1, b)
        score = _normed_term(w[i], tf, norm, k1)
        if not alone:
            for j in range(i + 1, t):
                if full and score + after[j] < cut:
                    score = -1.0
                    break
                dj = maps[j]
                other = words[dj, x]
                if other & low:
                    q = lo[j] + np.int64(ranks[dj, x]) + np.int64(popcount(other & below))
                    tf_one = (tf_bits[dj, x] & low) == 0
                    score += _normed_term(w[j], np.float32(1.0) if tf_one else tfs[q], norm, k1)
        if score >= 0.0:
            scored += 1
            n, full, cut = _offered(
                hs, hr, n, score, ((np.int64(x) + first) << 6) + np.int64(popcount(below))
            )
    return n, scored


@_kernel
def _probe_sorted(
    rows_t,
    gens_t,
    tfs_t,
    lens_t,
    maps,
    words_t,
    ranks_t,
    firsts,
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
    probe,
    probed,
):  # pragma: no cover
    """Adds each probe row's terms from the sorted sources to ``probed`` (by the key's bitmap there,
    ``maps[j, s]``, else a binary search where the row lies within the span of the term's rows there:
    a source of recent contents spans few rows)."""
    n_rows = allowed.shape[0]
    for q in range(probe.shape[0]):
        p = probe[q]
        if not (0 <= p < n_rows and allowed[p]):
            continue
        for s in range(nseg):
            rows = rows_t[s]
            for j in range(lo.shape[0]):
                a, z = lo[j, s], hi[j, s]
                if z <= a:
                    continue
                if maps[j, s] >= 0:
                    i = find_row(words_t[s], ranks_t[s], maps[j, s], firsts[s], p)
                    i = a + i if i >= 0 else -1
                elif rows[a] <= p <= rows[z - 1]:
                    i = _lower_bound(rows, a, z, p)
                    i = i if rows[i] == p else -1
                else:
                    continue
                if i >= 0 and (current[s] or gens_t[s][i] == row_gen[p]):
                    probed[q] += _term(w[j], tfs_t[s][i], lens_t[s][i], avgdl, k1, b)


@_kernel
def _best(
    keys_t,
    starts_t,
    rows_t,
    tfs_t,
    gens_t,
    lens_t,
    max_tf_t,
    min_len_t,
    maps_t,
    words_t,
    ranks_t,
    tf_bits_t,
    firsts,
    nseg,
    current,
    wanted,
    weights,
    row_gen,
    allowed,
    bits,
    avgdl,
    k1,
    b,
    acc,
    touched,
    m,
    depth,
    probe,
    keep,
):  # pragma: no cover
    """The ``depth`` best rows (best first; ties: the lower row) and the probe rows' scores: the
    unsorted sources' sums (``acc``, ``m`` rows ``touched``: whole, as a row's content is posted to
    one source) are offered first, then each sorted source's rows (``_segment_best``, which reads
    ``allowed`` as ``bits``, packed little-endian). ``acc`` is left all zeros (unless ``keep``:
    rows are probed later, by ``_probe_later``)."""
    probed = np.zeros(probe.shape[0])
    for q in range(probe.shape[0]):
        if 0 <= probe[q] < acc.shape[0]:
            probed[q] = acc[probe[q]]
    hs = np.empty(max(depth, 0))
    hr = np.empty(max(depth, 0), np.int64)
    n = scored = 0
    for q in range(m):
        r = touched[q]
        if depth > 0:
            n = _push(hs, hr, n, np.float64(acc[r]), r)
        if not keep:
            acc[r] = 0.0
    bits64 = bits[: bits.shape[0] - bits.shape[0] % 8].view(np.uint64)  # (whole words of allowed rows)
    lo, hi, ub, ub1, maps = _term_ranges(
        keys_t, starts_t, max_tf_t, min_len_t, maps_t, nseg, wanted, weights, avgdl, k1, b
    )
    if depth > 0:
        for s in range(nseg):
            live = hi[:, s] > lo[:, s]
            if live.any():
                n, more = _segment_best(
                    rows_t[s], tfs_t[s], gens_t[s], lens_t[s], current[s], lo[live, s], hi[live, s],
                    ub[live, s], ub1[live, s], weights[live], maps[live, s], words_t[s], ranks_t[s],
                    tf_bits_t[s], firsts[s], row_gen, bits, bits64, allowed.shape[0], avgdl, k1, b, hs, hr, n,
                )  # fmt: skip
                scored += more
    _probe_sorted(
        rows_t, gens_t, tfs_t, lens_t, maps, words_t, ranks_t, firsts, nseg, current, lo, hi, weights, row_gen,
        allowed, avgdl, k1, b, probe, probed,
    )  # fmt: skip
    hr, hs = _best_first(hs, hr, n)
    return hr, hs.astype(np.float32), probed.astype(np.float32), scored


@_kernel
def _probe_later(
    keys_t,
    starts_t,
    rows_t,
    tfs_t,
    gens_t,
    lens_t,
    max_tf_t,
    min_len_t,
    maps_t,
    words_t,
    ranks_t,
    tf_bits_t,
    firsts,
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
    probe,
):  # pragma: no cover
    """The probe rows' scores after a read-out that kept ``acc`` (``_best`` with ``keep``), which is
    then left all zeros."""
    probed = np.zeros(probe.shape[0])
    for q in range(probe.shape[0]):
        if 0 <= probe[q] < acc.shape[0]:
            probed[q] = acc[probe[q]]
    for q in range(m):
        acc[touched[q]] = 0.0
    lo, hi, _, _, maps = _term_ranges(
        keys_t, starts_t, max_tf_t, min_len_t, maps_t, nseg, wanted, weights, avgdl, k1, b
    )
    _probe_sorted(
        rows_t, gens_t, tfs_t, lens_t, maps, words_t, ranks_t, firsts, nseg, current, lo, hi, weights, row_gen,
        allowed, avgdl, k1, b, probe, probed,
    )  # fmt: skip
    return probed.astype(np.float32)


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
    key); with ``depth`` >= 0 only the ``depth`` best rows, best first (ties: the lower row when the
    pass is deferred, see ``accumulate``; else the row met first).
    Key ``wanted[j]`` (sorted, unique) weighs ``weights[j]`` (its term's idf; 0 skips it). A posting
    counts when its row is allowed and its generation is the row's ``row_gen``; ``avgdl`` is
    the mean length of a memory (each posting carries its content's)."""
    if probe is not None:
        _check("probe", probe, np.int64)
    sums = accumulate(sources, wanted, weights, row_gen, allowed, avgdl, k1, b, depth=depth)
    return sums.collect(probe, depth)


class _Deferred(NamedTuple):
    """What a pass for the best ``depth`` rows reads at its read-out: the sorted sources (row by row,
    with the probe rows then known) and the search's terms."""

    packed: _Packed
    wanted: np.ndarray
    weights: np.ndarray
    row_gen: np.ndarray
    allowed: np.ndarray
    bits: np.ndarray  # ``allowed`` packed (little-endian bits)
    avgdl: float
    k1: float
    b: float
    depth: int


class Sums:
    """A keyword pass's per-row sums (see ``accumulate``), read out once by ``collect``. The pass and
    the read-out are apart so a search can learn which rows to probe while the pass runs; a pass for
    the best ``depth`` rows reads its sorted sources at the read-out (``deferred``)."""

    def __init__(self, scratch: _Scratch | None, m: int, n: int, later: _Deferred | None = None) -> None:
        self._scratch, self._m, self._n, self._later = scratch, m, n, later
        self._still: Callable[[], bool] | None = None
        self._again: Callable[[], Sums] = no_sums
        self._kept: _Scratch | None = None  # the scratch ``best`` keeps for its probes
        self._size = n  # the accumulator's rows (``_n`` is -1 once read)
        self.scored = -1  # after a deferred read-out: the rows it scored whole (a measure of its work)

    def collect(
        self, probe: np.ndarray | None = None, depth: int = -1
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, scores, the ``probe`` rows' scores) as ``bm25`` returns them; once only. A deferred
        pass for its best ``depth`` rows gives at most that many."""
        probe = np.empty(0, np.int64) if probe is None else probe
        _check("probe", probe, np.int64)
        rows, scores, probed, again = self._read(probe, depth, False)
        if again is not None:
            return again.collect(probe, depth)
        assert probed is not None
        return rows, scores, probed

    def best(self, depth: int = -1) -> tuple[np.ndarray, np.ndarray, Callable[[np.ndarray], np.ndarray]]:
        """(rows, scores) as ``collect`` gives them, and a function that gives the scores of rows to
        probe afterwards (once; it frees the sums): for a caller that learns them while this runs. A
        deferred pass whose rows moved before the probes were read is read again for them."""
        rows, scores, _, again = self._read(np.empty(0, np.int64), depth, True)
        if again is not None:
            return again.best(depth)
        kept: list[_Scratch | None] = [self._kept]  # (emptied by the probes' read)
        self._kept = None

        def probed(probe: np.ndarray) -> np.ndarray:
            _check("probe", probe, np.int64)
            if not kept:
                raise RuntimeError("the probes were read already")
            scratch = kept.pop()
            if scratch is None:  # (a pass that matched nothing)
                return np.zeros(probe.shape[0], np.float32)
            later, acc = self._later, scratch.acc[: self._size]
            try:
                if later is None:  # (the plain pass: every sum is in the accumulator, read and zeroed)
                    return _collect(acc, scratch.touched, self._m, probe, 0, False)[2]
                k = later.packed
                out = _probe_later(
                    *k, later.wanted, later.weights, later.row_gen, later.allowed, later.avgdl, later.k1, later.b,
                    acc, scratch.touched, self._m, probe,
                )  # fmt: skip
            finally:
                _free.append(scratch)
            if self._still is not None and not self._still():
                # (read after the best: a row replaced since could hold neither content's postings)
                return self._again().collect(probe, depth)[2]
            return out

        return rows, scores, probed

    def _read(
        self, probe: np.ndarray, depth: int, keep: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, Sums | None]:
        """The read-out: (rows, scores, probed, None), or the sums to read instead (a row moved while
        a deferred read-out ran). With ``keep`` the accumulator is kept for ``best``'s probes."""
        later = self._later
        if later is not None and not 0 <= depth <= later.depth:
            raise ValueError(f"the pass kept the best {later.depth} rows only: depth must be 0 to that")
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            if self._n < 0:
                raise RuntimeError("the sums were collected already")
            self._n = -1
            return np.empty(0, np.int64), np.empty(0, np.float32), np.zeros(probe.shape[0], np.float32), None
        acc, m = scratch.acc[: self._n], self._m
        if later is not None:
            k = later.packed
            rows, scores, probed, self.scored = _best(
                *k,
                later.wanted,
                later.weights,
                later.row_gen,
                later.allowed,
                later.bits,
                later.avgdl,
                later.k1,
                later.b,
                acc,
                scratch.touched,
                m,
                int(depth),
                probe,
                keep,
            )
        else:
            rows, scores, probed = _collect(acc, scratch.touched, m, probe, int(depth), keep)
        self._size, self._n = self._n, -1
        if later is not None and self._still is not None and not self._still():
            if keep:
                _discard(acc, scratch.touched, m)
            _free.append(scratch)
            return rows, scores, None, self._again()
        if keep:
            self._kept = scratch
        else:
            _free.append(scratch)
        return rows, scores, probed, None

    @property
    def deferred(self) -> bool:
        """The sorted sources are read at the read-out, for the best ``depth`` rows only (which then
        bounds the read-out)."""
        return self._later is not None

    def release(self) -> None:
        """Give the sums up unread."""
        scratch, self._scratch = self._scratch, None
        if scratch is None:
            return
        self._n = -1
        _discard(scratch.acc, scratch.touched, self._m)
        _free.append(scratch)

    def recheck(self, still: Callable[[], bool], again: Callable[[], Sums]) -> None:
        """After the read-out of a deferred pass (which reads generations later than the pass), ask
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
    allowed_bits: np.ndarray | None = None,
) -> Sums:
    """The pass of ``bm25`` (same arguments): each valid posting's term added to its row's sum.
    ``current[i]`` True: every posting of ``sources[i]`` (sorted ones only) is known to be of its
    row's current content (the caller vouches for it), so its generations are not compared.
    ``depth`` > 0: only the best ``depth`` rows will be collected (and probes), so the sorted sources
    are read at the read-out, for those only (when there are at most ``MAX_PACKED`` and each holds
    its keys' rows in order); it relies on what the index guarantees: a row's current content is
    posted to one source, every posting of it with the content's one length. That read-out takes
    ``allowed`` as bits: ``allowed_bits``, when the caller keeps them with a mask it shares
    (``np.packbits(allowed, bitorder="little")``), else packed here."""
    _check("wanted", wanted, np.int32)
    _check("weights", weights, np.float64, wanted.shape[0])
    _check("row_gen", row_gen, np.int32)
    _check("allowed", allowed, np.bool_)
    if wanted.shape[0] > 1 and not _ascending(wanted):
        raise ValueError("wanted must be sorted ascending without repeats")
    if not (avgdl > 0 and math.isfinite(avgdl)):
        raise ValueError("avgdl must be a finite number > 0")
    if not (k1 >= 0 and 0 <= b <= 1):  # (the bounds on a term assume it grows with tf, falls with length)
        raise ValueError("k1 must be >= 0 and b within [0, 1]")
    if allowed_bits is not None:
        _check("allowed_bits", allowed_bits, np.uint8)
        if allowed_bits.shape[0] != (allowed.shape[0] + 7) // 8:
            raise ValueError("allowed_bits must hold allowed packed, 8 rows a byte")
    if row_gen.shape[0] < allowed.shape[0]:
        allowed = allowed[: row_gen.shape[0]]  # rows never posted hold no term
    sorted_, unsorted = _split(sources, current)
    scratch = _take_scratch(allowed.shape[0])  # (dropped if a kernel raises: it may hold partial sums)
    acc, touched = scratch.acc, scratch.touched
    m = 0
    args = (wanted, weights, row_gen, allowed, float(avgdl), float(k1), float(b), acc, touched)
    for a in unsorted:
        m = _score_appended(a.keys, a.filled, a.rows, a.tfs, a.gens, a.lens, *args, m)
    packed = _pack(sorted_) if depth > 0 else None
    if packed is not None:  # (read at the read-out, row by row, for the best ``depth``)
        bits = np.packbits(allowed, bitorder="little") if allowed_bits is None else allowed_bits
        later = _Deferred(
            packed, wanted, weights, row_gen, allowed, bits, float(avgdl), float(k1), float(b), depth
        )
        return Sums(scratch, m, allowed.shape[0], later)
    for s, known in sorted_:
        m = _score_sorted(s.keys, s.starts, s.rows, s.tfs, s.gens, s.lens, *args, m, known)
    return Sums(scratch, m, allowed.shape[0])


MAX_PACKED = 10  # sorted sources a deferred pass reads at once (more: the plain pass)


def _ascending(a: np.ndarray) -> bool:
    """Strictly ascending (a query's few keys: a Python loop beats NumPy's set-up)."""
    return all(x < y for x, y in itertools.pairwise(a.tolist()))


def _split(
    sources: Sequence[Postings | Appended], current: Sequence[bool] | None
) -> tuple[list[tuple[Postings, bool]], list[Appended]]:
    """``accumulate``'s sources checked: (the sorted ones with their ``current`` flag, the unsorted
    ones holding postings)."""
    if current is None:
        current = (False,) * len(sources)
    elif len(current) != len(sources):
        raise ValueError("current must have one flag per source")
    sorted_: list[tuple[Postings, bool]] = []
    unsorted: list[Appended] = []
    for s, known in zip(sources, current, strict=True):
        if isinstance(s, Postings):
            sorted_.append((s, bool(known)))
        elif not isinstance(s, Appended):
            raise ValueError("sources must be built by postings() or appended()")
        elif s.filled:  # (an empty one adds nothing)
            unsorted.append(s)
    return sorted_, unsorted


class _Packed(NamedTuple):
    """Sorted sources as tuples of ``MAX_PACKED`` arrays each (padded with an empty source), so one
    kernel call reads them all; the first ``used`` are real. In the order ``_best`` takes them."""

    keys: tuple[np.ndarray, ...]
    starts: tuple[np.ndarray, ...]
    rows: tuple[np.ndarray, ...]
    tfs: tuple[np.ndarray, ...]
    gens: tuple[np.ndarray, ...]
    lens: tuple[np.ndarray, ...]
    max_tf: tuple[np.ndarray, ...]
    min_len: tuple[np.ndarray, ...]
    maps: tuple[np.ndarray, ...]  # per key, its bitmap (RowBitmaps.key_map)
    words: tuple[np.ndarray, ...]
    ranks: tuple[np.ndarray, ...]
    tf_bits: tuple[np.ndarray, ...]
    firsts: np.ndarray  # int64 per source: its bitmaps' first word
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
    """The sources packed for ``_best``; None when there are too many, one not sorted by row within
    its keys, or an array a kernel would see as another type (not C-contiguous and writable)."""
    global _last_packed
    if len(sources) > MAX_PACKED or not all(s.by_row for s, _ in sources):
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
    elif all(a.flags.c_contiguous and a.flags.writeable for s in segments for a in (*s[:8], *s.bitmaps[:4])):
        padded = (*segments, *(_EMPTY,) * (MAX_PACKED - len(segments)))
        keys, starts, rows, tfs, gens, lens, max_tf, min_len = (
            tuple(c) for c in zip(*(s[:8] for s in padded), strict=True)
        )
        maps, words, ranks, tf_bits = (tuple(c) for c in zip(*(s.bitmaps[:4] for s in padded), strict=True))
        firsts = np.array([s.bitmaps.first for s in padded], np.int64)
        packed = _Packed(
            keys,
            starts,
            rows,
            tfs,
            gens,
            lens,
            max_tf,
            min_len,
            maps,
            words,
            ranks,
            tf_bits,
            firsts,
            len(segments),
            flags,
        )
    else:
        packed = None
    _last_packed = (segments, packed)
    return packed


class _Scratch(NamedTuple):
    acc: np.ndarray  # float32 per row, all zeros between searches
    touched: np.ndarray  # int64 per row


# Free accumulators, the last used on top: a search takes the one most likely still in the cache,
# whichever thread it runs on (a buffer per thread would be cold on a server's many threads).
_free: list[_Scratch] = []


def _new_scratch(size: int) -> _Scratch:
    return _Scratch(
        np.zeros(size, np.float32),
        np.empty(size, np.int64),
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
def _by_row(keys, rows, at):  # pragma: no cover
    """``at[r]``: where row r's keys start; moved past them (the caller's array is consumed)."""
    out = np.empty(keys.shape[0], np.int32)
    for i in range(keys.shape[0]):
        r = rows[i]
        out[at[r]] = keys[i]
        at[r] += 1
    return out


def keys_by_row(keys: np.ndarray, rows: np.ndarray, minlength: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(``keys`` grouped by row, rows ascending and each row's keys in the order given; how many
    keys each row holds, at least ``minlength`` rows long): ``keys[np.argsort(rows, kind="stable")]``
    by counting, in one pass instead of a sort (a restore at 1,000,000 memories groups millions)."""
    _check("keys", keys, np.int32)
    _check("rows", rows, np.int32, keys.shape[0])
    if rows.shape[0] and rows.min() < 0:
        raise ValueError("rows must be >= 0")
    counts = np.bincount(rows, minlength=minlength)
    return _by_row(keys, rows, np.cumsum(counts) - counts), counts


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
    True,
    no_bitmaps(0),
)  # (pads a pack)
