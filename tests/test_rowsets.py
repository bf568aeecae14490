"""Row bitmaps of a segment's common keys (``kernels._rowsets``) against NumPy references, and the
read-out for the best rows giving the same answer with them as without."""

from __future__ import annotations

import numpy as np
import pytest

from tiermem.kernels import _rowsets
from tiermem.kernels import keywords as kw_kernels


def _segment(rng: np.random.Generator, lo_row: int, span: int, shares: list[float]) -> kw_kernels.Postings:
    """Key k holds each row of ``lo_row : lo_row + span`` with probability ``shares[k]`` (rows
    ascending within a key, each row's postings with its content's one length, as the index builds
    them)."""
    keys, rows = [], []
    for k, share in enumerate(shares):
        held = lo_row + np.flatnonzero(rng.random(span) < share)
        keys.append(np.full(held.shape[0], k, np.int32))
        rows.append(held.astype(np.int32))
    keys_a, rows_a = np.concatenate(keys), np.concatenate(rows)
    uniq, counts = np.unique(keys_a, return_counts=True)
    n = rows_a.shape[0]
    return kw_kernels.postings(
        uniq.astype(np.int32),
        np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        rows_a,
        rng.integers(1, 4, size=n).astype(np.float32),
        np.ones(n, np.int32),
        rng.integers(1, 40, size=lo_row + span).astype(np.uint16)[rows_a],
    )


def _reference(seg: kw_kernels.Postings) -> tuple[list[int], int, int]:
    """(keys that get a bitmap, the span's first word, its words) from the rule in plain NumPy."""
    first = int(seg.rows.min()) // 64
    n_words = int(seg.rows.max()) // 64 - first + 1
    counts = np.diff(seg.starts)
    return [k for k in range(counts.shape[0]) if counts[k] * _rowsets.SHARE >= n_words * 64], first, n_words


@pytest.mark.parametrize("seed", range(4))
def test_bitmaps_hold_the_common_keys_rows_and_counts_as_numpy_does(seed: int) -> None:
    """The keys held by at least one row in SHARE of the span get a bitmap, in key order; its bits
    are the rows the key holds (np.packbits), its counts the key's postings before each word, and a
    row's posting is found where np.searchsorted finds it, absent rows (inside the span and on
    either side of it) not at all."""
    rng = np.random.default_rng(seed)
    lo_row = int(rng.integers(0, 5000))
    shares = [0.6, 0.001, 0.05, 1 / _rowsets.SHARE, 0.3, 0.004]
    seg = _segment(rng, lo_row, int(rng.integers(500, 4000)), shares)
    bm = seg.bitmaps
    dense, first, n_words = _reference(seg)
    assert bm.first == first and bm.words.shape == bm.ranks.shape == bm.tf_bits.shape == (len(dense), n_words)
    assert np.flatnonzero(bm.key_map >= 0).tolist() == dense
    assert bm.key_map[dense].tolist() == list(range(len(dense)))
    assert 0 < len(dense) < seg.keys.shape[0]  # (both kinds present: the test means something)
    ones = others = 0
    for k in dense:
        d = int(bm.key_map[k])
        mine = seg.rows[seg.starts[k] : seg.starts[k + 1]]
        member = np.zeros(n_words * 64, np.bool_)
        member[mine - first * 64] = True
        want_words = np.packbits(member, bitorder="little").view("<u8")
        np.testing.assert_array_equal(bm.words[d], want_words)
        per_word = member.reshape(n_words, 64).sum(axis=1)
        np.testing.assert_array_equal(bm.ranks[d], np.concatenate([[0], np.cumsum(per_word)[:-1]]))
        tfs = seg.tfs[seg.starts[k] : seg.starts[k + 1]]
        above = np.zeros(n_words * 64, np.bool_)
        above[mine[tfs != 1.0] - first * 64] = True
        np.testing.assert_array_equal(bm.tf_bits[d], np.packbits(above, bitorder="little").view("<u8"))
        ones += int((tfs == 1.0).sum())
        others += int((tfs != 1.0).sum())
        for r in mine.tolist():
            one = _rowsets.tf_is_one(bm.tf_bits, d, bm.first, r)
            assert one == (tfs[_rowsets.find_row(bm.words, bm.ranks, d, bm.first, r)] == 1.0)
        for r in rng.integers(first * 64 - 200, (first + n_words) * 64 + 200, size=300).tolist():
            at = int(np.searchsorted(mine, r))
            want = at if at < mine.shape[0] and mine[at] == r else -1
            assert _rowsets.find_row(bm.words, bm.ranks, d, bm.first, r) == want
        for r in mine[rng.integers(0, mine.shape[0], size=50)].tolist():
            assert mine[_rowsets.find_row(bm.words, bm.ranks, d, bm.first, r)] == r
    assert ones > 100 and others > 100  # (both kinds of posting: the tf bits mean something)


def test_a_key_at_exactly_the_share_gets_a_bitmap_and_one_posting_fewer_does_not() -> None:
    """Rows 64-575 span 8 words (512 rows): the fewest postings that are one in SHARE of them get a
    bitmap, one fewer do not (nor the two that set the span)."""
    n_words = 8
    at_share = -(-n_words * 64 // _rowsets.SHARE)
    assert at_share > 3
    rows = np.concatenate([np.arange(64, 64 + at_share), np.arange(100, 100 + at_share - 1), [64, 575]])
    counts = np.array([at_share, at_share - 1, 2])
    n = rows.shape[0]
    seg = kw_kernels.postings(
        np.arange(3, dtype=np.int32), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        rows.astype(np.int32), np.ones(n, np.float32), np.ones(n, np.int32), np.ones(n, np.uint16),
    )  # fmt: skip
    assert seg.bitmaps.first == 1 and seg.bitmaps.words.shape[1] == n_words
    assert seg.bitmaps.key_map.tolist() == [0, -1, -1]


def test_popcount_counts_the_set_bits_compiled_and_in_python() -> None:
    rng = np.random.default_rng(9)
    values = np.concatenate(
        [
            np.array([0, 1, 2**63, 2**64 - 1], np.uint64),
            rng.integers(0, 2**63, size=200, dtype=np.uint64) * 2 + 1,
        ]
    )
    want = np.bitwise_count(values)
    # (compiled inside find_row: a word whose every bit below the row's is set counts them)
    words = values.reshape(1, -1) | np.uint64(1 << 63)
    ranks = np.zeros_like(words, np.uint32)
    for i in range(values.shape[0]):
        assert _rowsets.popcount(int(values[i])) == want[i]
        below = np.bitwise_count(values[i] & np.uint64((1 << 63) - 1))
        assert _rowsets.find_row(words, ranks, 0, 0, i * 64 + 63) == below


def test_segments_out_of_row_order_or_empty_have_no_bitmaps() -> None:
    keys = np.array([0], np.int32)
    rows = np.array([5, 3, 9], np.int32)
    ones = np.ones(3, np.float32), np.ones(3, np.int32), np.ones(3, np.uint16)
    seg = kw_kernels.postings(keys, np.array([0, 3], np.int64), rows, *ones)
    assert not seg.by_row and seg.bitmaps.key_map.tolist() == [-1] and seg.bitmaps.words.shape[0] == 0
    empty = kw_kernels.postings(
        keys[:0], np.zeros(1, np.int64), rows[:0], ones[0][:0], ones[1][:0], ones[2][:0]
    )
    assert empty.bitmaps.key_map.shape == (0,) and empty.bitmaps.words.shape[0] == 0


def _assert_same_and_exact(got: list, by_row: dict[int, float], probe: np.ndarray, depth: int) -> None:
    """Two read-outs' (rows, scores, probes) the same bit for bit, and the first the reference's
    (``by_row``: every row's full score): its best ``depth`` scores and the probes' scores."""
    for a, b in zip(got[0], got[1], strict=True):
        np.testing.assert_array_equal(a, b)
    rows, scores, probed = got[0]
    np.testing.assert_allclose(scores, sorted(by_row.values(), reverse=True)[:depth], rtol=1e-6)
    np.testing.assert_allclose(scores, [by_row[r] for r in rows.tolist()], rtol=1e-6)
    np.testing.assert_allclose(probed, [by_row.get(r, 0.0) for r in probe.tolist()], rtol=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_the_best_and_their_probes_are_the_same_with_bitmaps_as_without(seed: int) -> None:
    """Segments over different spans of rows (so their bitmaps start at different words), common
    and rare keys, some rows not allowed: the read-out for the best rows and the probes give the
    same rows and scores bit for bit whether the common keys' postings are found by their bitmaps
    or by searching their rows, and the full pass's scores; postings of a row's older content
    (every posting of a fifth of the rows, and a fifth of the postings) count in neither."""
    rng = np.random.default_rng(40 + seed)
    n = 9000
    shares = [0.5, 0.2, 0.05, 0.01, 0.003]
    segs = [
        _segment(rng, 0, 6000, shares),
        _segment(rng, 6000, 2000, shares),
        _segment(rng, 8500, 400, shares),
    ]
    assert all((s.bitmaps.key_map >= 0).any() and (s.bitmaps.key_map < 0).any() for s in segs)
    bare = [s._replace(bitmaps=_rowsets.no_bitmaps(s.keys.shape[0])) for s in segs]
    row_gen = np.ones(n, np.int32)
    row_gen[rng.random(n) < 0.2] = 2  # (their postings here are stale: a newer content holds no term)
    for seg in segs:  # (and some single postings of an older content, beside the current one's)
        seg.gens[rng.random(seg.size) < 0.2] = 0
    allowed = rng.random(n) < 0.9
    wanted = np.arange(len(shares), dtype=np.int32)
    weights = kw_kernels.idf(n, np.array([s * n for s in shares]))
    full_rows, full_scores, _ = kw_kernels.bm25(segs, wanted, weights, row_gen, allowed, 20.0)
    assert not set(full_rows.tolist()) & set(np.flatnonzero(row_gen == 2).tolist())
    by_row = dict(zip(full_rows.tolist(), full_scores.tolist(), strict=True))
    for depth in (1, 10, 32, 200):
        probe = rng.integers(0, n + 5, size=40).astype(np.int64)
        got = [
            kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 20.0, depth=depth).collect(
                probe, depth
            )
            for sources in (segs, bare)
        ]
        _assert_same_and_exact(got, by_row, probe, depth)
        assert got[0][1].shape[0] == depth


@pytest.mark.parametrize("seed", range(6))
def test_sources_whose_every_term_has_a_bitmap_are_read_by_words_with_the_same_answer(seed: int) -> None:
    """Every term common in every segment and every posting current, so the read-out walks each
    term a 64-row word at a time (``_walk_words``): terms held by the same rows (as a name's two
    words), rows holding one term only, tfs of 1 to 3, a span ending mid-byte and rows past the
    allowed ones. The best rows, scores and probes are those found without bitmaps bit for bit and
    the reference's; over all of them, fewer rows are scored whole than without them."""
    rng = np.random.default_rng(70 + seed)
    n = 9003  # (allowed bits end mid-byte and mid-word)
    lengths = rng.integers(1, 60, size=n + 40).astype(np.uint16)

    def segment(lo_row: int, span: int) -> kw_kernels.Postings:
        held = [rng.random(span) < share for share in (0.03, 0.2, 0.06, 0.4)]
        held.insert(1, held[0].copy())  # (key 1 always beside key 0)
        held[3] |= held[0] & (rng.random(span) < 0.5)  # (key 3 often beside key 0)
        rows = [lo_row + np.flatnonzero(h).astype(np.int32) for h in held]
        counts = [r.shape[0] for r in rows]
        all_rows = np.concatenate(rows)
        tfs = rng.choice(np.array([1, 1, 1, 2, 3], np.float32), size=all_rows.shape[0])
        return kw_kernels.postings(
            np.arange(len(held), dtype=np.int32), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            all_rows, tfs, np.ones(all_rows.shape[0], np.int32), lengths[all_rows],
        )  # fmt: skip

    segs = [segment(0, 6100), segment(6100, 2000), segment(8100, n + 40 - 8100)]
    assert all((s.bitmaps.key_map >= 0).all() for s in segs)
    bare = [s._replace(bitmaps=_rowsets.no_bitmaps(s.keys.shape[0])) for s in segs]
    row_gen = np.ones(n + 40, np.int32)
    allowed = rng.random(n) < 0.9
    wanted = np.arange(5, dtype=np.int32)
    scored = np.zeros(2, np.int64)  # (by words, without bitmaps)
    for weights in (kw_kernels.idf(n, np.array([270.0, 270, 1800, 540, 3600])), rng.random(5) + 0.1):
        avgdl = float(lengths.mean())
        want_rows, want_scores = kw_kernels.bm25(segs, wanted, weights, row_gen, allowed, avgdl)[:2]
        by_row = dict(zip(want_rows.tolist(), want_scores.tolist(), strict=True))
        for depth in (1, 10, 32, 200):
            probe = rng.integers(0, n + 45, size=40).astype(np.int64)
            sums = [
                kw_kernels.accumulate(
                    sources, wanted, weights, row_gen, allowed, avgdl, current=(True,) * 3, depth=depth
                )
                for sources in (segs, bare)
            ]
            _assert_same_and_exact([s.collect(probe, depth) for s in sums], by_row, probe, depth)
            scored += np.array([s.scored for s in sums])
    assert scored[0] < scored[1]


def test_rows_holding_the_walked_term_alone_are_kept_where_they_belong() -> None:
    """A weighty term in 5% of the rows, most with a tf of 1, beside a nearly weightless one in
    half of them: the best are the weighty term's shortest rows, held alone or not. Read by words,
    the rows holding it alone with a tf of 1 are left out only where that bound is under the cut,
    so the answer is the reference's, the same as without bitmaps."""
    rng = np.random.default_rng(12)
    n = 6000
    held = [np.flatnonzero(rng.random(n) < share).astype(np.int32) for share in (0.05, 0.5)]
    tfs = [np.ones(held[0].shape[0], np.float32), np.ones(held[1].shape[0], np.float32)]
    tfs[0][::25] = 2.0  # (a few other tfs: the term's bound is above its bound with a tf of 1)
    lengths = rng.integers(1, 300, size=n).astype(np.uint16)
    rows = np.concatenate(held)
    seg = kw_kernels.postings(
        np.array([0, 1], np.int32), np.array([0, held[0].shape[0], rows.shape[0]], np.int64), rows,
        np.concatenate(tfs), np.ones(rows.shape[0], np.int32), lengths[rows],
    )  # fmt: skip
    bare = seg._replace(bitmaps=_rowsets.no_bitmaps(2))
    row_gen, allowed = np.ones(n, np.int32), np.ones(n, np.bool_)
    wanted, weights = np.array([0, 1], np.int32), np.array([3.0, 0.01])
    want_rows, want_scores = kw_kernels.bm25([seg], wanted, weights, row_gen, allowed, 150.0)[:2]
    order = np.lexsort((want_rows, -want_scores.astype(np.float64)))
    for depth in (10, 32, 100):
        best = want_rows[order][:depth]
        alone_tf1 = [r for r in best.tolist() if r not in set(held[1].tolist())]
        assert alone_tf1  # (the case: some of the best hold the weighty term alone)
        got = [
            kw_kernels.accumulate(
                [s], wanted, weights, row_gen, allowed, 150.0, current=(True,), depth=depth
            ).collect(None, depth)
            for s in (seg, bare)
        ]
        for a, b in zip(got[0], got[1], strict=True):
            np.testing.assert_array_equal(a, b)
        assert got[0][0].tolist() == best.tolist()
