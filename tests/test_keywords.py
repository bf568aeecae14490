"""The in-memory keyword index and its BM25 kernel, against plain NumPy/Python references."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from tiermem.kernels import keywords as kw_kernels
from tiermem.server.index.keyword_index import KeywordIndex, bm25
from tiermem.server.model.text import STOP_WORDS, keyword_terms


def reference_bm25(terms, n_terms, rows, tfs, gens, current, allowed, lengths, n_docs, avgdl, k1=1.2, b=0.75):
    """BM25 as a textbook loop: per term, df over valid postings, then the saturated tf sum."""
    scores: dict[int, float] = {}
    for t in range(n_terms):
        valid = [
            i
            for i in range(len(rows))
            if terms[i] == t and rows[i] < len(allowed) and allowed[rows[i]] and gens[i] == current[i]
        ]
        if not valid:
            continue
        idf = math.log(1 + (n_docs - len(valid) + 0.5) / (len(valid) + 0.5))
        for i in valid:
            r, tf = int(rows[i]), float(tfs[i])
            s = idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths[r] / avgdl))
            scores[r] = scores.get(r, 0.0) + s
    out = sorted(scores)
    return np.array(out, np.int64), np.array([scores[r] for r in out], np.float32)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bm25_kernel_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, total, n_terms = 200, 150, 6
    terms = rng.integers(0, n_terms, size=total).astype(np.int32)
    rows = rng.integers(0, n + 10, size=total).astype(np.int32)  # some beyond the allowed rows
    tfs = rng.integers(1, 5, size=total).astype(np.float32)
    row_gen = rng.integers(1, 3, size=n + 10).astype(np.int32)
    current = row_gen[rows]  # each posting's row's generation
    gens = np.where(rng.random(total) < 0.8, current, 0).astype(np.int32)  # some stale
    allowed = rng.random(n) < 0.7
    lengths = rng.integers(0, 60, size=n + 10).astype(np.int32)  # zeros included
    n_docs = int(allowed.sum())
    avgdl = float(lengths[:n][allowed].mean())
    args = (terms, n_terms, rows, tfs, gens, current, allowed, lengths, n_docs, avgdl)
    probe = np.array([0, 5, 17, n + 3, n + 100, 42], np.int64)  # hits, misses, beyond the rows
    got, want = kw_kernels.bm25(*args, probe=probe), reference_bm25(*args)
    order = np.argsort(got[0])
    np.testing.assert_array_equal(got[0][order], want[0])
    np.testing.assert_allclose(got[1][order], want[1], rtol=1e-5)
    by_row = dict(zip(want[0].tolist(), want[1].tolist(), strict=True))
    np.testing.assert_allclose(got[2], [by_row.get(r, 0.0) for r in probe.tolist()], rtol=1e-5)


def test_bm25_kernel_edges_and_checks() -> None:
    none_i, none_f = np.empty(0, np.int32), np.empty(0, np.float32)
    gen, allowed, lengths = np.empty(0, np.int32), np.ones(3, np.bool_), np.ones(3, np.int32)
    rows, scores, _ = kw_kernels.bm25(none_i, 2, none_i, none_f, none_i, gen, allowed, lengths, 3, 1.0)
    assert rows.shape == (0,) and scores.shape == (0,)
    with pytest.raises(ValueError, match="rows"):
        kw_kernels.bm25(none_i, 2, none_i.astype(np.int64), none_f, none_i, gen, allowed, lengths, 3, 1.0)
    with pytest.raises(ValueError, match="avgdl"):
        kw_kernels.bm25(none_i, 2, none_i, none_f, none_i, gen, allowed, lengths, 3, float("nan"))
    one = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="n_terms"):
        kw_kernels.bm25(one + 2, 2, one, np.ones(1, np.float32), one, one, allowed, lengths, 3, 1.0)


def test_match_keys_matches_isin() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 50, size=500).astype(np.int32)
    wanted = np.unique(rng.integers(0, 50, size=8)).astype(np.int32)
    labels = np.arange(wanted.shape[0], dtype=np.int32)[::-1].copy()
    pos, lab = kw_kernels.match_keys(keys, wanted, labels)
    np.testing.assert_array_equal(pos, np.flatnonzero(np.isin(keys, wanted)))
    np.testing.assert_array_equal(lab, labels[np.searchsorted(wanted, keys[pos])])
    with pytest.raises(ValueError, match="sorted"):
        kw_kernels.match_keys(keys, wanted[::-1].copy(), labels)


def test_terms_drop_stop_words_and_meet_by_stem() -> None:
    terms = keyword_terms("She moved to Berlin; they were moving, and he moves often.")
    assert not set(terms) & STOP_WORDS
    assert terms["move"] == 3  # moved, moving, moves
    assert terms["berlin"] == 1


def _search_in(
    index: KeywordIndex, namespaces: list[int], text: str, alive: np.ndarray, lengths: np.ndarray
) -> dict[int, float]:
    rows, scores, _ = bm25(index, namespaces, text, alive, int(alive.sum()), lengths, 10**6)
    return dict(zip(rows.tolist(), scores.tolist(), strict=True))


def _search(index: KeywordIndex, text: str, alive: np.ndarray, lengths: np.ndarray) -> dict[int, float]:
    return _search_in(index, [0], text, alive, lengths)


def test_index_finds_replaces_and_compacts() -> None:
    index = KeywordIndex()
    texts = ["Ana lives in Paris", "Ana moved to Berlin", "the weather is nice", "Paris in spring"]
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    alive = np.ones(4, np.bool_)
    lengths = np.array([len(t.split()) for t in texts], np.int32)
    found = _search(index, "where does Ana live? Paris?", alive, lengths)
    assert set(found) == {0, 1, 3} and max(found, key=found.__getitem__) == 0
    index.add(0, 0, "Ana lives in Rome")  # its old postings (paris) stop counting
    assert set(_search(index, "Paris", alive, lengths)) == {3}
    assert set(_search(index, "Rome", alive, lengths)) == {0}
    alive[3] = False  # deleted rows are never found
    assert _search(index, "Paris", alive, lengths) == {}
    before = _search(index, "Ana Rome Berlin", alive, lengths)
    assert index.average_length([0]) == pytest.approx(np.mean([4, 4, 4, 3]))  # the dead row still counts
    assert index.compact(alive) >= 2  # paris of the old row 0 and of the dead row 3 at least
    assert index.average_length([0]) == pytest.approx(4.0)  # ... until a compaction
    after = _search(index, "Ana Rome Berlin", alive, lengths)
    assert sorted(after, key=after.__getitem__) == sorted(before, key=before.__getitem__)


def test_snapshot_round_trip_keeps_every_answer_and_allows_appends() -> None:
    rng = np.random.default_rng(5)
    vocab = [f"word{i}" for i in range(50)]
    index = KeywordIndex()
    texts = [" ".join(rng.choice(vocab, size=8)) for _ in range(300)]
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    index.add(7, 0, "word1 word2 fresh")
    alive = rng.random(300) < 0.9
    lengths = np.full(300, 8, np.int32)
    restored = KeywordIndex.restore(index.state())
    for q in ["word1", "word3 word4", "fresh word2", "absent"]:
        assert _search(restored, q, alive, lengths) == pytest.approx(_search(index, q, alive, lengths))
    restored.add(300, 0, "word1 extra")  # appends after a restore write into the term's own buffer
    index.add(300, 0, "word1 extra")
    more_alive = np.append(alive, True)
    more_lengths = np.append(lengths, 2).astype(np.int32)
    assert 300 in _search(restored, "extra", more_alive, more_lengths)
    assert _search(restored, "word2", more_alive, more_lengths) == pytest.approx(
        _search(index, "word2", more_alive, more_lengths)
    )
    assert _search(restored, "word1", more_alive, more_lengths) == pytest.approx(
        _search(index, "word1", more_alive, more_lengths)
    )


def test_readers_see_whole_postings_while_the_writer_appends() -> None:
    index = KeywordIndex()
    stop = threading.Event()
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                q = index.postings([0], ["share"], 10**6)
                assert q.rows.shape == q.tfs.shape == q.gens.shape
                assert (q.gens >= 1).all()  # never a slot that was not written yet
        except BaseException as e:
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for row in range(20000):
        index.add(row, 0, "shared term")
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert index.postings([0], ["share"], 10**6).rows.shape[0] == 20000  # "shared" stems to "share"


def test_segments_and_merges_answer_as_one_list() -> None:
    """Many small deltas flushed into segments that merge answer exactly as one big delta does."""
    rng = np.random.default_rng(9)
    vocab = [f"term{i}" for i in range(30)]
    small, big = KeywordIndex(delta_size=16), KeywordIndex(delta_size=1 << 16)
    alive = np.ones(400, np.bool_)
    for row in range(400):
        text = " ".join(rng.choice(vocab, size=6))
        for index in (small, big):
            index.add(row, row % 3, text)
        if row % 50 == 7:
            for index in (small, big):
                index.add(row - 5, (row - 5) % 3, "term1 replaced")
    assert len(small._view[0]) > 1  # several segments, merged along the way
    lengths = np.full(400, 6, np.int32)
    for namespaces in ([0], [1, 2], [0, 1, 2]):
        mask = np.isin(np.arange(400) % 3, namespaces)
        for q in ["term1", "term2 term3 replaced", "nothing"]:
            a = _search_in(small, namespaces, q, mask, lengths)
            assert a == pytest.approx(_search_in(big, namespaces, q, mask, lengths), rel=1e-6)
    assert big.compact(alive) > 0  # the replaced contents' postings (merges dropped the small one's)
    small.compact(alive)
    a = _search_in(small, [0, 1, 2], "term1", alive, lengths)
    assert a == pytest.approx(_search_in(big, [0, 1, 2], "term1", alive, lengths), rel=1e-6)


def test_a_search_reads_only_its_namespaces() -> None:
    index = KeywordIndex()
    index.add(0, 0, "the blue whale")
    index.add(1, 1, "a blue bird")
    alive, lengths = np.ones(2, np.bool_), np.full(2, 3, np.int32)
    rows, _, _ = bm25(index, [0], "blue", alive, 2, lengths, 10**6)
    assert rows.tolist() == [0]
    rows, _, _ = bm25(index, [0, 1], "blue", alive, 2, lengths, 10**6)
    assert sorted(rows.tolist()) == [0, 1]
    q = index.postings([0, 1], ["blue"], 1)  # a term in more rows than the cap is skipped
    assert q.rows.shape[0] == 0


def test_a_search_sees_a_rows_postings_and_generation_together() -> None:
    """Postings and the generations they are checked against are read as one pair: a content replaced
    after a search read them cannot make the row vanish from that search."""
    index = KeywordIndex()
    index.add(0, 0, "apple pie")
    q = index.postings([0], ["appl"], 10)
    index.add(0, 0, "apple tart")  # the writer moves on after the read
    assert (q.gens == q.current).all() and q.rows.tolist() == [0]


def test_the_same_content_posted_again_changes_nothing() -> None:
    index = KeywordIndex()
    index.add(0, 0, "apple pie")
    before = index.postings_count
    index.add(0, 0, "apple pie")  # a follower's or a start-up's replay of an unchanged record
    assert index.postings_count == before and index.posted_rows == 1
    index.add(0, 0, "apple tart")
    assert index.postings_count > before


def test_segment_postings_match_a_plain_gather() -> None:
    rng = np.random.default_rng(4)
    n = 300
    seg_keys = np.unique(rng.integers(0, 40, size=n)).astype(np.int32)
    counts = rng.integers(0, 6, size=seg_keys.shape[0])
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(starts[-1])
    rows = rng.integers(0, 1000, size=total).astype(np.int32)
    tfs = rng.integers(1, 4, size=total).astype(np.float32)
    gens = rng.integers(1, 3, size=total).astype(np.int32)
    keys = np.unique(rng.integers(0, 45, size=9)).astype(np.int32)  # some absent from the segment
    labels = rng.integers(0, 5, size=keys.shape[0]).astype(np.int32)
    got = kw_kernels.segment_postings(seg_keys, starts, rows, tfs, gens, keys, labels)
    want: list[list[float]] = [[], [], [], []]
    for key, label in zip(keys.tolist(), labels.tolist(), strict=True):
        i = np.searchsorted(seg_keys, key)
        if i < seg_keys.shape[0] and seg_keys[i] == key:
            lo, hi = starts[i], starts[i + 1]
            for col, values in zip(
                want, ([label] * (hi - lo), rows[lo:hi], tfs[lo:hi], gens[lo:hi]), strict=True
            ):
                col.extend(np.asarray(values).tolist())
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, np.array(b, a.dtype))
    with pytest.raises(ValueError, match="starts"):
        kw_kernels.segment_postings(seg_keys, starts[:-1], rows, tfs, gens, keys, labels)


def test_warm_up_compiles_every_keyword_kernel() -> None:
    """A server compiles its kernels before it reports SERVING: the keyword ones too."""
    from tiermem import kernels

    kernels.warm_up()
    for name in ("_bm25", "_match_keys", "_fused", "_segment_postings"):
        assert getattr(kw_kernels, name).signatures, name
