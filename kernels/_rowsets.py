"""Row bitmaps of a sorted segment's common keys: for a key held by many of the rows the segment
spans, one bit per row and, per 64-row word, where the word's first posting lies among the key's. A
row's posting is then found with a bit test and a popcount instead of a search through the key's rows
(the read-out for the best rows looks up each candidate's other terms, most of them common words). A
second bit per row says whether its posting's term frequency is other than 1: most are 1, and then the
look-up reads nothing more (the frequency's own read waits on the popcount, a cache miss in a row).

A key gets a bitmap when it holds at least one row in ``SHARE`` of the segment's span. Its words take
20 bytes each (bits, counts, frequency bits): at the share about twice what its postings take (rows,
term frequencies, generations and lengths, 14 bytes each), far less for the most common keys; over
a segment of short memories about 0.6 times the postings. Built once with the segment (immutable,
like it), never saved: a restore builds them again.

The read-out's kernels in ``keywords.py`` compile ``find_row`` into themselves, and Numba's on-disk
cache keys them on that file alone: after editing this one, clear the cache (or touch that file)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

_kernel = njit(nogil=True, cache=True, error_model="numpy")

SHARE = 100  # a key with a row in at least 1 / SHARE of the segment's span gets a bitmap


class RowBitmaps(NamedTuple):
    """Per key of a segment: ``key_map[k]``, its bitmap's index in ``words``/``ranks``/``tf_bits`` (-1:
    none). Bit ``r & 63`` of ``words[d, (r >> 6) - first]`` is set when row r holds the key, the same
    bit of ``tf_bits`` when its posting's term frequency is not 1; ``ranks[d, w]`` counts the key's
    postings before word ``w``."""

    key_map: np.ndarray  # int32 per key
    words: np.ndarray  # uint64, (bitmaps, words of the span)
    ranks: np.ndarray  # uint32, the same shape
    tf_bits: np.ndarray  # uint64, the same shape
    first: int  # the span's first word (its lowest row >> 6)


def popcount(x: int) -> int:
    """The set bits of the 64-bit ``x`` (compiled: one instruction, llvm.ctpop)."""
    return bin(int(x) & 0xFFFF_FFFF_FFFF_FFFF).count("1")


@intrinsic
def _ctpop(typingctx, x):
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        return builder.ctpop(args[0])

    return sig, codegen


@overload(popcount, jit_options={"nogil": True})
def _popcount_jit(x):
    return lambda x: _ctpop(np.uint64(x))


@_kernel
def _build(starts, rows, tfs, share):  # pragma: no cover
    n_keys = starts.shape[0] - 1
    key_map = np.full(n_keys, -1, np.int32)
    first, last = rows.min() >> 6, rows.max() >> 6
    n_words = last - first + 1
    n = 0
    for k in range(n_keys):
        if (starts[k + 1] - starts[k]) * share >= n_words * 64:
            key_map[k] = n
            n += 1
    words = np.zeros((n, n_words), np.uint64)
    ranks = np.zeros((n, n_words), np.uint32)
    tf_bits = np.zeros((n, n_words), np.uint64)
    for k in range(n_keys):
        d = key_map[k]
        if d < 0:
            continue
        for p in range(starts[k], starts[k + 1]):
            r = rows[p] - (first << 6)
            bit = np.uint64(1) << np.uint64(r & 63)
            words[d, r >> 6] |= bit
            if tfs[p] != 1.0:
                tf_bits[d, r >> 6] |= bit
        c = 0
        for w in range(n_words):
            ranks[d, w] = c
            c += popcount(words[d, w])
    return key_map, words, ranks, tf_bits, first


def row_bitmaps(starts: np.ndarray, rows: np.ndarray, tfs: np.ndarray) -> RowBitmaps:
    """The bitmaps of a segment whose keys' rows (``starts`` bound each key's) ascend strictly, with
    its term frequencies ``tfs``; the caller (``postings``) has checked the arrays."""
    if rows.shape[0] == 0:
        return no_bitmaps(starts.shape[0] - 1)
    key_map, words, ranks, tf_bits, first = _build(starts, rows, tfs, SHARE)
    return RowBitmaps(key_map, words, ranks, tf_bits, int(first))


def no_bitmaps(n_keys: int) -> RowBitmaps:
    """None of ``n_keys`` keys with a bitmap (a segment whose rows are not in order within each key)."""
    none = np.zeros((0, 0), np.uint64)
    return RowBitmaps(np.full(n_keys, -1, np.int32), none, np.zeros((0, 0), np.uint32), none.copy(), 0)


@_kernel
def find_row(words, ranks, d, first, r):  # pragma: no cover
    """Where row ``r`` lies among the postings of the key whose bitmap is ``d`` (counted from the
    key's first), or -1 when it holds no posting there."""
    w = (r >> 6) - first
    if w < 0 or w >= words.shape[1]:
        return -1
    word = words[d, w]
    bit = np.uint64(r & 63)
    if not (word >> bit) & np.uint64(1):
        return -1
    return np.int64(ranks[d, w]) + np.int64(popcount(word & ((np.uint64(1) << bit) - np.uint64(1))))


@_kernel
def tf_is_one(tf_bits, d, first, r):  # pragma: no cover
    """Whether the posting ``find_row`` found for row ``r`` in bitmap ``d`` has a term frequency of 1."""
    return not (tf_bits[d, (r >> 6) - first] >> np.uint64(r & 63)) & np.uint64(1)
