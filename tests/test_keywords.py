"""The in-memory keyword index and its BM25 kernel, against plain NumPy/Python references."""

from __future__ import annotations

import math
import threading
import unicodedata

import numpy as np
import pytest

from tiermem import kernels
from tiermem.kernels import _rowsets
from tiermem.kernels import keywords as kw_kernels
from tiermem.server.index.keyword_index import KeywordIndex, bm25, keyword_sums
from tiermem.server.model.text import STOP_WORDS, keyword_terms, keyword_terms_and_length, words


def reference_bm25(sources, wanted, weights, row_gen, allowed, avgdl, k1=1.2, b=0.75):
    """BM25 as a plain loop over every posting of every source: a posting of a wanted key counts when its
    row is allowed and it holds the row's current generation."""
    weight_of = dict(zip(wanted.tolist(), weights.tolist(), strict=True))
    scores: dict[int, float] = {}
    for src in sources:
        if isinstance(src, kw_kernels.Postings):
            keys = np.repeat(src.keys, np.diff(src.starts))
            n = src.size
        else:
            keys, n = src.keys, src.filled
        for i in range(n):
            w, r = weight_of.get(int(keys[i]), 0.0), int(src.rows[i])
            if w <= 0 or r >= len(allowed) or not allowed[r] or src.gens[i] != row_gen[r]:
                continue
            tf = float(src.tfs[i])
            scores[r] = scores.get(r, 0.0) + w * tf * (k1 + 1) / (
                tf + k1 * (1 - b + b * float(src.lens[i]) / avgdl)
            )
    out = sorted(scores)
    return np.array(out, np.int64), np.array([scores[r] for r in out], np.float32)


def _random_sources(rng: np.random.Generator, n_rows: int, n_keys: int) -> list:
    sources = []
    for size in (120, 40, 0, 9):  # sorted segments of several sizes, one empty
        keys = np.sort(rng.integers(0, n_keys, size=size)).astype(np.int32)
        uniq, counts = np.unique(keys, return_counts=True)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        sources.append(
            kw_kernels.postings(
                uniq.astype(np.int32),
                starts,
                rng.integers(0, n_rows + 10, size=size).astype(np.int32),  # some beyond the allowed rows
                rng.integers(1, 5, size=size).astype(np.float32),
                rng.integers(1, 3, size=size).astype(np.int32),  # generation 1 or 2: some stale
                rng.integers(0, 60, size=size).astype(np.uint16),  # lengths, zeros included
            )
        )
    cap = 64
    sources.append(
        kw_kernels.appended(
            rng.integers(0, n_keys, size=cap).astype(np.int32),
            rng.integers(0, n_rows + 10, size=cap).astype(np.int32),
            rng.integers(1, 5, size=cap).astype(np.float32),
            rng.integers(1, 3, size=cap).astype(np.int32),
            rng.integers(0, 60, size=cap).astype(np.uint16),
            50,  # slots beyond what was filled hold garbage a search must not read
        )
    )
    return sources


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_bm25_kernel_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, n_keys = 200, 12
    sources = _random_sources(rng, n, n_keys)
    wanted = np.unique(rng.integers(0, n_keys + 3, size=6)).astype(np.int32)  # some keys nowhere
    weights = rng.random(wanted.shape[0]) * 3
    weights[0] = 0.0  # a skipped term
    row_gen = rng.integers(1, 3, size=n + 10).astype(np.int32)
    allowed = rng.random(n) < 0.7
    avgdl = 29.5
    probe = np.array([0, 5, 17, n + 3, n + 100, 42], np.int64)  # hits, misses, beyond the rows
    got = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, avgdl, probe=probe)
    want = reference_bm25(sources, wanted, weights, row_gen, allowed, avgdl)
    order = np.argsort(got[0])
    np.testing.assert_array_equal(got[0][order], want[0])
    np.testing.assert_allclose(got[1][order], want[1], rtol=1e-5)
    by_row = dict(zip(want[0].tolist(), want[1].tolist(), strict=True))
    np.testing.assert_allclose(got[2], [by_row.get(r, 0.0) for r in probe.tolist()], rtol=1e-5)
    again = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, avgdl, probe=probe)
    np.testing.assert_array_equal(again[1], got[1])  # the reused accumulator was left all zeros


def test_a_pass_read_out_later_matches_the_reference() -> None:
    """The pass and its read-out apart (a search probes the rows its vector search found meanwhile):
    the same answer as the reference; the sums read out once; a second pass between them is apart."""
    rng = np.random.default_rng(11)
    n, n_keys = 150, 10
    sources = _random_sources(rng, n, n_keys)
    wanted = np.arange(n_keys, dtype=np.int32)
    weights = rng.random(n_keys) + 0.5
    row_gen = rng.integers(1, 3, size=n + 10).astype(np.int32)
    allowed = rng.random(n) < 0.8
    want = reference_bm25(sources, wanted, weights, row_gen, allowed, 20.0)
    first = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 20.0)
    other = kw_kernels.accumulate(sources, wanted[:3], weights[:3], row_gen, ~allowed, 20.0)
    probe = want[0][:5].astype(np.int64)
    rows, scores, probed = first.collect(probe, depth=-1)
    order = np.argsort(rows)
    np.testing.assert_array_equal(rows[order], want[0])
    np.testing.assert_allclose(scores[order], want[1], rtol=1e-5)
    np.testing.assert_allclose(probed, want[1][:5], rtol=1e-5)
    with pytest.raises(RuntimeError, match="collected already"):
        first.collect()
    other_rows, _, _ = other.collect()
    assert not allowed[other_rows].any()  # its own sums, not the first pass's
    empty = kw_kernels.no_sums().collect(np.array([1, 2], np.int64), depth=5)
    assert empty[0].shape == (0,) and empty[2].tolist() == [0.0, 0.0]


def test_bm25_kernel_edges_and_checks() -> None:
    none_i = np.empty(0, np.int32)
    gen, allowed = np.ones(3, np.int32), np.ones(3, np.bool_)
    rows, scores, probed = kw_kernels.bm25([], none_i, np.empty(0), gen, allowed, 1.0)
    assert rows.shape == (0,) and scores.shape == (0,) and probed.shape == (0,)
    key, len16 = np.zeros(1, np.int32), np.ones(1, np.uint16)
    with pytest.raises(ValueError, match="weights"):
        kw_kernels.bm25([], key, np.ones(1, np.float32), gen, allowed, 1.0)
    with pytest.raises(ValueError, match="lens"):
        kw_kernels.appended(key, key, np.ones(1, np.float32), key, np.ones(1, np.int32), 1)
    with pytest.raises(ValueError, match="weights"):
        kw_kernels.bm25([], key, np.ones(1, np.float32), gen, allowed, 1.0)
    with pytest.raises(ValueError, match="avgdl"):
        kw_kernels.bm25([], key, np.ones(1), gen, allowed, float("nan"))
    with pytest.raises(ValueError, match="sorted"):
        kw_kernels.bm25([], np.array([2, 1], np.int32), np.ones(2), gen, allowed, 1.0)
    with pytest.raises(ValueError, match="sources"):
        kw_kernels.bm25([(key, key)], key, np.ones(1), gen, allowed, 1.0)
    with pytest.raises(ValueError, match="starts"):
        kw_kernels.postings(key, np.array([0, 2], np.int64), key, np.ones(1, np.float32), key, len16)
    with pytest.raises(ValueError, match="sorted"):
        kw_kernels.postings(
            np.array([1, 0], np.int32), np.array([0, 1, 1], np.int64), key, np.ones(1, np.float32), key, len16
        )
    with pytest.raises(ValueError, match="filled"):
        kw_kernels.appended(key, key, np.ones(1, np.float32), key, len16, 2)


def test_idf_stays_positive_when_counts_lag() -> None:
    got = kw_kernels.idf(10.0, np.array([0.0, 3.0, 10.0, 25.0]))
    want = [
        math.log(1 + (10 - 0 + 0.5) / 0.5),
        math.log(1 + 7.5 / 3.5),
        math.log(1 + 0.5 / 10.5),
        math.log(1 + 0.5 / 25.5),
    ]
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose([kw_kernels.term_idf(10.0, d) for d in (0.0, 3.0, 10.0, 25.0)], want)
    assert (got > 0).all()


def test_terms_drop_stop_words_and_meet_by_stem() -> None:
    terms = keyword_terms("She moved to Berlin; they were moving, and he moves often.")
    assert not set(terms) & STOP_WORDS
    assert terms["move"] == 3  # moved, moving, moves
    assert terms["berlin"] == 1


def test_terms_are_case_folded_not_only_lower_cased() -> None:
    assert keyword_terms("STRASSE") == keyword_terms("Straße") == keyword_terms("strasse")
    assert keyword_terms("ΣΟΦΟΣ") == keyword_terms("σοφος") == keyword_terms("σοφοσ")
    # Folding leaves a combining mark after some letters: the word stays whole, not split at it.
    assert list(keyword_terms("ῥῆμα")) == ["ῥῆμα"] and list(keyword_terms("ǰob")) == ["ǰob"]
    assert keyword_terms(unicodedata.normalize("NFD", "Café Straße")) == keyword_terms("café strasse")


def test_a_snapshot_of_another_tokenizer_is_refused() -> None:
    index = KeywordIndex()
    index.add(0, 0, "Die Straße am Fluss")
    state = index.state()
    assert set(_search(KeywordIndex.restore(state), "STRASSE", np.ones(1, np.bool_))) == {0}
    for older in ({k: v for k, v in state.items() if k != "tokenizer"}, {**state, "tokenizer": "lower"}):
        with pytest.raises(ValueError, match="tokenizer"):
            KeywordIndex.restore(older)


def _search_in(index: KeywordIndex, namespaces: list[int], text: str, alive: np.ndarray) -> dict[int, float]:
    rows, scores, _ = bm25(index, namespaces, text, alive, 10**6)
    return dict(zip(rows.tolist(), scores.tolist(), strict=True))


def _search(index: KeywordIndex, text: str, alive: np.ndarray) -> dict[int, float]:
    return _search_in(index, [0], text, alive)


def test_index_finds_replaces_and_compacts() -> None:
    index = KeywordIndex()
    texts = ["Ana lives in Paris", "Ana moved to Berlin", "the weather is nice", "Paris in spring"]
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    alive = np.ones(4, np.bool_)
    found = _search(index, "where does Ana live? Paris?", alive)
    assert set(found) == {0, 1, 3} and max(found, key=found.__getitem__) == 0
    index.add(0, 0, "Ana lives in Rome")  # its old postings (paris) stop counting
    assert set(_search(index, "Paris", alive)) == {3}
    assert set(_search(index, "Rome", alive)) == {0}
    alive[3] = False  # deleted rows are never found
    assert _search(index, "Paris", alive) == {}
    before = _search(index, "Ana Rome Berlin", alive)
    assert index.average_length([0]) == pytest.approx(np.mean([4, 4, 4, 3]))  # the dead row still counts
    assert index.compact(alive) >= 2  # paris of the old row 0 and of the dead row 3 at least
    assert index.average_length([0]) == pytest.approx(4.0)  # ... until a compaction
    after = _search(index, "Ana Rome Berlin", alive)
    # the same order (ties by row): only the mean length moved
    assert sorted(after, key=lambda r: (after[r], r)) == sorted(before, key=lambda r: (before[r], r))


def _sessions(index: KeywordIndex, sessions: int, rows_each: int, first_row: int = 0) -> dict[int, int]:
    """Rows of session namespaces 1.. (each row's words its own: ``s{ns}r{row}w{j}``), plus a shared
    word; returns row -> namespace id."""
    held = {}
    row = first_row
    for ns in range(1, sessions + 1):
        for _ in range(rows_each):
            index.add(row, ns, " ".join(f"s{ns}r{row}w{j}" for j in range(12)) + " shared")
            held[row] = ns
            row += 1
    return held


def _two_left(index: KeywordIndex, first: str, second: str) -> tuple[int, np.ndarray]:
    """30 sessions of 20 rows posted and removed, then two live rows of ``first`` and ``second``
    after them: (the first live row, the rows' alive flags)."""
    held = _sessions(index, sessions=30, rows_each=20)
    n = len(held)
    index.add(n, 0, first)
    index.add(n + 1, 0, second)
    alive = np.zeros(n + 2, np.bool_)
    alive[n:] = True
    for row in held:
        index.remove(row)
    return n, alive


def test_a_compaction_forgets_the_words_of_deleted_memories() -> None:
    """Keys (namespace, word) left without a live posting go at a compaction, once there are many:
    the index does not hold every word of every session that ever lived. The live rows' answers
    stay the same, before and after a snapshot, and later posts are found."""
    index = KeywordIndex(delta_size=256)
    project = ["Ana lives in Paris", "Ana moved to Berlin", "the cluster upgrade plan", "budget for spring"]
    for row, text in enumerate(project):
        index.add(row, 0, text + " shared")
    held = _sessions(index, sessions=40, rows_each=20, first_row=len(project))
    n = len(project) + len(held)
    assert len(index) >= 40 * 20 * 12
    alive = np.ones(n, np.bool_)
    keep = {ns for ns in range(1, 41) if ns % 10 == 0}  # four sessions stay
    for row, ns in held.items():
        if ns not in keep:
            index.remove(row)
            alive[row] = False
    queries = ["Ana Paris", "Berlin upgrade", "shared", "budget spring cluster"]
    queries += [f"s{ns}r{row}w3 s{ns}r{row}w7" for row, ns in held.items() if row % 37 == 0]
    spaces = [[0], [0, *sorted(keep)], list(range(41))]
    before = {(q, i): _search_in(index, ns, q, alive) for q in queries for i, ns in enumerate(spaces)}
    index.compact(alive)
    live_keys = len({t for text in project for t in keyword_terms(text + " shared")})
    live_keys += len(keep) * (20 * 12 + 1)  # each row's own words, and its session's "shared"
    assert len(index) == live_keys
    for (q, i), found in before.items():
        assert _search_in(index, spaces[i], q, alive) == pytest.approx(found), q
    restored = KeywordIndex.restore(index.state())
    assert len(restored) == live_keys
    for (q, i), found in before.items():
        assert _search_in(restored, spaces[i], q, alive) == pytest.approx(found), q
    for ix in (index, restored):  # posts after the renumbering: new keys, and old ones met again
        ix.add(n, 0, "Ana moved to Lisbon")
        ix.add(n + 1, 50, "a new session about Paris")
    alive = np.append(alive, [True, True])
    for ix in (index, restored):
        assert set(_search_in(ix, [0], "Lisbon Ana", alive)) == {0, 1, n}
        assert set(_search_in(ix, [50], "Paris", alive)) == {n + 1}
        assert set(_search_in(ix, [0, 50], "Paris", alive)) == {0, n + 1}
    assert _search_in(index, [0, 50], "Ana Paris", alive) == pytest.approx(
        _search_in(restored, [0, 50], "Ana Paris", alive)
    )


def test_a_compaction_that_fails_leaves_the_index_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The maintenance pass logs a failed compaction and carries on: the index must still agree with
    itself (each row's keys in the numbering searches use), so later removes count right."""
    index = KeywordIndex(delta_size=256)
    n, alive = _two_left(index, "alpha beta", "alpha gamma")
    keys = len(index)

    def fail(*args: object) -> None:
        raise MemoryError("injected")

    monkeypatch.setattr(kw_kernels, "keys_by_row", fail)
    with pytest.raises(MemoryError):
        index.compact(alive)
    monkeypatch.undo()
    assert len(index) == keys  # nothing renumbered
    index.remove(n)  # counted by the row's own keys: alpha is in one memory now, beta in none
    alive[n] = False
    index.add(n + 2, 0, "beta delta")
    alive = np.append(alive, True)
    expected = {n + 1: _search(index, "alpha", alive)[n + 1], n + 2: _search(index, "beta", alive)[n + 2]}
    fresh = KeywordIndex()
    fresh.add(n + 1, 0, "alpha gamma")
    fresh.add(n + 2, 0, "beta delta")
    assert _search(fresh, "alpha", alive)[n + 1] == pytest.approx(expected[n + 1])
    assert _search(fresh, "beta", alive)[n + 2] == pytest.approx(expected[n + 2])
    index.compact(alive)
    assert len(index) == 4  # alpha, gamma, beta, delta
    assert _search(index, "alpha beta", alive) == pytest.approx(_search(fresh, "alpha beta", alive))


def test_a_compaction_keeps_the_keys_while_few_went() -> None:
    index = KeywordIndex()
    _sessions(index, sessions=4, rows_each=20)
    alive = np.ones(80, np.bool_)
    alive[:20] = False
    for row in range(20):
        index.remove(row)
    keys = len(index)
    index.compact(alive)
    assert len(index) == keys  # 240 unused keys of 1,040: not worth numbering again


def test_a_search_over_a_renumbering_reads_one_numbering() -> None:
    """A compaction numbers the keys again while searches run: a search that started before it reads
    the old postings by the old numbering, one after it the new by the new; neither mixes them (a
    key id of one numbering read in postings of the other finds another word's rows)."""
    answers: list[dict[int, float]] = []
    alive = np.ones(0, np.bool_)

    class Hooked(KeywordIndex):
        armed = False

        def __setattr__(self, name: str, value: object) -> None:
            if Hooked.armed and name in ("_keys", "_view"):  # a search between the two assignments
                answers.append(_search_in(self, [0, 1, 2], "alpha beta", alive))
            object.__setattr__(self, name, value)
            if Hooked.armed and name in ("_keys", "_view"):
                answers.append(_search_in(self, [0, 1, 2], "alpha beta", alive))

    index = Hooked(delta_size=256)
    n, alive = _two_left(index, "alpha beta gamma", "beta delta")
    expected = _search_in(index, [0, 1, 2], "alpha beta", alive)
    assert set(expected) == {n, n + 1}
    keys = len(index)
    Hooked.armed = True
    index.compact(alive)
    Hooked.armed = False
    assert len(index) < keys // 10  # it did number them again
    assert len(answers) >= 8
    for found in answers:
        assert found == pytest.approx(expected)


def test_snapshot_round_trip_keeps_every_answer_and_allows_appends() -> None:
    rng = np.random.default_rng(5)
    vocab = [f"word{i}" for i in range(50)]
    index = KeywordIndex()
    texts = [" ".join(rng.choice(vocab, size=8)) for _ in range(300)]
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    index.add(7, 0, "word1 word2 fresh")
    alive = rng.random(300) < 0.9
    restored = KeywordIndex.restore(index.state())
    for q in ["word1", "word3 word4", "fresh word2", "absent"]:
        assert _search(restored, q, alive) == pytest.approx(_search(index, q, alive))
    restored.add(300, 0, "word1 extra")  # appends after a restore write into the term's own buffer
    index.add(300, 0, "word1 extra")
    more_alive = np.append(alive, True)
    assert 300 in _search(restored, "extra", more_alive)
    assert _search(restored, "word2", more_alive) == pytest.approx(_search(index, "word2", more_alive))
    assert _search(restored, "word1", more_alive) == pytest.approx(_search(index, "word1", more_alive))


def test_every_posting_of_a_content_carries_its_one_length_in_every_source() -> None:
    """What the row-by-row read-out relies on (it scores a row's other terms with the length of the
    posting that met it): in every source the index builds (the delta, flushed and merged segments,
    a long text's own segment, a compaction, a restore), a row's postings of one content carry one
    length, its own."""
    rng = np.random.default_rng(9)
    vocab = [f"word{i}" for i in range(40)]
    index = KeywordIndex(delta_size=64)  # (small: many flushes and merges)
    lengths: dict[int, int] = {}

    def post(row: int, n: int) -> None:
        text = " ".join(rng.choice(vocab, size=n))
        index.add(row, 0, text)
        lengths[row] = keyword_terms_and_length(text)[1]

    for row in range(300):
        post(row, int(rng.integers(1, 30)))
    for row in rng.choice(300, size=60, replace=False).tolist():  # contents replaced
        post(int(row), int(rng.integers(1, 30)))
    post(300, 200)  # longer than the delta: a segment of its own

    def check(ix: KeywordIndex) -> None:
        segments, delta, _, _ = ix._view
        n = delta.filled
        sources = [(s.rows, s.gens, s.lens) for s in segments]
        sources.append((delta.rows[:n], delta.gens[:n], delta.lens[:n]))
        for rows, gens, lens in sources:
            current = gens == ix._gen[rows]
            for r in np.unique(rows[current]).tolist():
                assert set(lens[current & (rows == r)].tolist()) == {min(lengths[r], 65_535)}, r

    check(index)
    alive = np.ones(301, np.bool_)
    alive[rng.choice(300, size=30, replace=False)] = False
    index.compact(alive)
    check(index)
    check(KeywordIndex.restore(index.state()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_keys_grouped_by_row_match_a_stable_sort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 17, 5_000):
        rows = rng.integers(0, max(1, n // 3), size=n).astype(np.int32)
        keys = rng.integers(0, 1_000, size=n).astype(np.int32)
        grouped, counts = kw_kernels.keys_by_row(keys, rows)
        assert grouped.dtype == np.int32
        np.testing.assert_array_equal(grouped, keys[np.argsort(rows, kind="stable")])
        np.testing.assert_array_equal(counts, np.bincount(rows))
    with pytest.raises(ValueError, match="rows"):
        kw_kernels.keys_by_row(np.zeros(2, np.int32), np.array([0, -1], np.int32))
    with pytest.raises(ValueError, match="rows"):
        kw_kernels.keys_by_row(np.zeros(2, np.int32), np.zeros(2, np.int64))


def test_a_restored_index_forgets_replaced_and_removed_rows_as_the_original() -> None:
    # A restore rebuilds each row's keys and the document counts; replacing or removing a row after
    # it must take the same keys out of the counts as the index that wrote the snapshot.
    rng = np.random.default_rng(11)
    vocab = [f"word{i}" for i in range(40)]
    index = KeywordIndex(delta_size=64)
    for row in range(400):
        index.add(row, row % 2, " ".join(rng.choice(vocab, size=6)))
    for row in range(0, 400, 7):
        index.add(row, row % 2, " ".join(rng.choice(vocab, size=5)))  # replaced before the snapshot
    restored = KeywordIndex.restore(index.state())
    for ix in (index, restored):
        for row in range(3, 400, 11):
            ix.remove(row)
        for row in range(5, 400, 13):
            ix.add(row, row % 2, "word1 word2 novel")
        for row in range(400, 1_100, 50):  # rows the snapshot never held, beyond its last
            ix.add(row, row % 2, "word2 novel later")
        ix.remove(1_050)
    alive = np.ones(1_100, np.bool_)
    alive[3:400:11] = False
    alive[1_050] = False
    for q in ["word1", "word2 word3", "novel", "word7 word9 word11"]:
        for ns in ([0], [1], [0, 1]):
            got = restored.bm25(ns, q.split(), alive, 10**9, np.empty(0, np.int64))
            want = index.bm25(ns, q.split(), alive, 10**9, np.empty(0, np.int64))
            np.testing.assert_array_equal(np.sort(got[0]), np.sort(want[0]))
            order_got, order_want = np.argsort(got[0]), np.argsort(want[0])
            np.testing.assert_allclose(got[1][order_got], want[1][order_want], rtol=1e-6)


def test_index_scores_are_textbook_bm25_over_the_namespaces() -> None:
    """Through the index: idf over the searched namespaces' memories, length normalized by their mean
    length, as a plain BM25 over the stemmed terms computes it; a filter narrows what is found, not
    how a term weighs."""
    rng = np.random.default_rng(11)
    vocab = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "sloe"]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(1, 9))) for _ in range(300)]
    ns = np.arange(300) % 2
    index = KeywordIndex(delta_size=64)  # several segments and a delta
    for row, text in enumerate(texts):
        index.add(row, int(ns[row]), text)
    lengths = np.array([len(words(t)) for t in texts], np.int32)  # every word, as the index counts
    docs = [keyword_terms(t) for t in texts]
    k1, b = 1.2, 0.75
    for namespaces in ([0], [0, 1]):
        members = [r for r in range(300) if ns[r] in namespaces]
        avgdl = float(np.mean(lengths[members]))
        query = ["plum", "kiwi", "date"]
        want = {}
        for r in members:
            s = 0.0
            for t in query:
                if t in docs[r]:
                    df = sum(1 for m in members if t in docs[m])
                    idf = math.log(1 + (len(members) - df + 0.5) / (df + 0.5))
                    tf = docs[r][t]
                    s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * lengths[r] / avgdl))
            if s > 0:
                want[r] = s
        alive = np.isin(ns, namespaces)
        got = _search_in(index, namespaces, "plums, kiwis and dates", alive)
        assert got == pytest.approx(want, rel=1e-5)
        narrow = alive & (np.arange(300) < 100)  # a filter: the same scores for the rows it keeps
        assert _search_in(index, namespaces, "plum kiwi date", narrow) == pytest.approx(
            {r: s for r, s in want.items() if r < 100}, rel=1e-5
        )


def test_a_text_longer_than_the_delta_is_posted_whole() -> None:
    index = KeywordIndex(delta_size=16)
    index.add(0, 0, "alpha beta")
    long_text = " ".join(f"word{i}" for i in range(100))
    index.add(1, 0, long_text)
    index.add(2, 0, "word99 gamma")
    alive = np.ones(3, np.bool_)
    for term in ("word0", "word57", "word99"):
        assert 1 in _search(index, term, alive)
    assert set(_search(index, "word99", alive)) == {1, 2}
    index.add(1, 0, "replaced text")  # the long text's postings stop counting
    assert set(_search(index, "word57 word99", alive)) == {2}


def test_readers_see_whole_postings_while_the_writer_appends() -> None:
    index = KeywordIndex()
    stop = threading.Event()
    errors: list[BaseException] = []
    n = 20000
    alive = np.ones(n, np.bool_)

    def read() -> None:
        try:
            while not stop.is_set():
                rows, scores, _ = bm25(index, [0], "shared", alive, 10**6)
                assert rows.shape == scores.shape and (scores > 0).all()
                assert ((rows >= 0) & (rows < n)).all()  # never a slot that was not written yet
                assert np.unique(rows).shape == rows.shape
        except BaseException as e:
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for row in range(n):
        index.add(row, 0, "shared term")
    stop.set()
    for t in readers:
        t.join()
    assert not errors
    assert len(_search(index, "shares", alive)) == n  # "shared" and "shares" stem to "share"


def test_segments_and_merges_answer_as_one_list() -> None:
    """Many small deltas flushed into segments that merge (dropping replaced contents) answer exactly
    as one big delta does, before and after contents are replaced, deleted and compacted away."""
    rng = np.random.default_rng(9)
    vocab = [f"term{i}" for i in range(30)]
    small, big = KeywordIndex(delta_size=16), KeywordIndex(delta_size=1 << 16)
    alive = np.ones(400, np.bool_)
    queries = ["term1", "term2 term3 replaced", "nothing"]

    def same_answers() -> None:
        for namespaces in ([0], [1, 2], [0, 1, 2]):
            mask = np.isin(np.arange(400) % 3, namespaces) & alive
            for q in queries:
                a = _search_in(small, namespaces, q, mask)
                assert a == pytest.approx(_search_in(big, namespaces, q, mask), rel=1e-6)

    contents: dict[int, str] = {}
    for row in range(400):
        text = contents[row] = " ".join(rng.choice(vocab, size=6))
        for index in (small, big):
            index.add(row, row % 3, text)
    assert len(small._view[0]) > 1  # several segments, merged along the way
    same_answers()
    for row in range(2, 400, 50):
        contents[row] = "term1 replaced"
        for index in (small, big):
            index.add(row, row % 3, "term1 replaced")
    contents[0] = " ".join(f"word{i}" for i in range(40)) + " term1"  # longer than the small delta
    for index in (small, big):
        index.add(0, 0, contents[0])
        for row in range(5, 400, 40):
            index.remove(row)
            alive[row] = False
    same_answers()
    fresh = KeywordIndex()  # what the live rows' current contents alone give
    for row, text in contents.items():
        if alive[row]:
            fresh.add(row, row % 3, text)
    for q in queries:
        assert _search_in(small, [0, 1, 2], q, alive) == pytest.approx(
            _search_in(fresh, [0, 1, 2], q, alive), rel=1e-6
        )
    assert big.compact(alive) > 0  # the replaced contents' and deleted rows' postings
    small.compact(alive)
    same_answers()
    restored = KeywordIndex.restore(small.state())
    for namespaces in ([0], [0, 1, 2]):
        for q in queries:
            got = _search_in(restored, namespaces, q, alive)
            assert got == pytest.approx(_search_in(big, namespaces, q, alive), rel=1e-6)


def test_a_search_reads_only_its_namespaces() -> None:
    index = KeywordIndex()
    index.add(0, 0, "the blue whale")
    index.add(1, 1, "a blue bird")
    alive = np.ones(2, np.bool_)
    rows, _, _ = bm25(index, [0], "blue", alive, 10**6)
    assert rows.tolist() == [0]
    rows, _, _ = bm25(index, [0, 1], "blue", alive, 10**6)
    assert sorted(rows.tolist()) == [0, 1]
    rows, _, _ = bm25(index, [0, 1], "blue", alive, 1)  # a term in more memories than the cap
    assert rows.shape[0] == 0
    rows, _, _ = bm25(index, [0, 1], "blue whale", alive, 1)  # ... is skipped, not the query
    assert rows.tolist() == [0]


def test_a_row_being_rewritten_is_never_lost_to_a_search() -> None:
    """A search reads the postings and the rows' generations as one pair: a content replaced while the
    search runs cannot make the row vanish (the old postings no longer count, the new ones unseen)."""
    index = KeywordIndex(delta_size=64)
    for row in range(1, 200):
        index.add(row, 0, f"filler {row}")
    alive = np.ones(200, np.bool_)
    index.add(0, 0, "apple pie")
    stop = threading.Event()
    misses: list[int] = []

    def read() -> None:
        while not stop.is_set():
            rows, _, _ = bm25(index, [0], "apple", alive, 10**6)
            if rows.tolist() != [0]:
                misses.append(len(rows))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(3000):
        index.add(0, 0, "apple pie" if i % 2 else "apple tart")
    stop.set()
    reader.join()
    assert misses == []


def test_the_same_content_posted_again_changes_nothing() -> None:
    index = KeywordIndex()
    index.add(0, 0, "apple pie")
    before = index.postings_count
    index.add(0, 0, "apple pie")  # a follower's or a start-up's replay of an unchanged record
    assert index.postings_count == before and index.posted_rows == 1
    index.add(0, 0, "apple tart")
    assert index.postings_count > before


def test_warm_up_compiles_every_keyword_kernel() -> None:
    """A server compiles its kernels before it reports SERVING: the keyword ones too."""
    from tiermem import kernels

    kernels.warm_up()
    for name in (
        "_score_sorted",
        "_score_appended",
        "_collect",
        "_best",
        "_key_bounds",
        "_by_row",
        "_probe_later",
        "_discard",
    ):
        assert getattr(kw_kernels, name).signatures, name
    assert _rowsets._build.signatures  # (the common keys' bitmaps; find_row is compiled into _best)


def test_bm25_kernel_returns_the_best_first_when_asked() -> None:
    rng = np.random.default_rng(21)
    n = 300
    sources, row_gen = _indexed_sources(rng, n)
    wanted = np.arange(12, dtype=np.int32)
    weights = rng.random(12) + 0.1
    allowed = np.ones(n, np.bool_)
    probe = np.array([3, 4], np.int64)
    rows, scores, probed = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, 9.0, probe=probe)
    top = kernels.topk(scores, 7)
    best = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, 9.0, probe=probe, depth=7)
    np.testing.assert_array_equal(best[0], rows[top])
    np.testing.assert_allclose(best[1], scores[top], rtol=1e-6)  # (summed in another order)
    assert (np.diff(best[1]) <= 0).all()
    np.testing.assert_allclose(best[2], probed, rtol=1e-6)
    everything = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, 9.0, depth=10**6)
    assert sorted(everything[0].tolist()) == sorted(rows.tolist())


def test_a_snapshot_from_before_postings_carried_lengths_restores_the_same_answers() -> None:
    index = KeywordIndex(delta_size=32)
    texts = [f"apple {'pear ' * (i % 5)}plum number{i}" for i in range(60)]
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    state = index.state()
    old = dict(state)
    old["segments"] = [tuple(seg)[:5] for seg in state["segments"]]  # no lens: the earlier layout
    old["delta"] = state["delta"][:5]
    alive = np.ones(60, np.bool_)
    for q in ("apple", "pear plum", "number7 pear"):
        assert _search(KeywordIndex.restore(old), q, alive) == pytest.approx(
            _search(index, q, alive), rel=1e-6
        )


def test_segments_without_stale_postings_skip_the_generation_check() -> None:
    """A segment built holding only current contents is read without comparing generations until a
    content is replaced; from then on it is checked again, until a compaction rebuilds it: the
    answers stay those of a single unsorted buffer, which always compares them."""
    rng = np.random.default_rng(21)
    vocab = [f"word{i}" for i in range(12)]
    segmented, flat = KeywordIndex(delta_size=32), KeywordIndex(delta_size=1 << 16)
    alive = np.ones(300, np.bool_)

    def answers_agree() -> None:
        for q in ("word1", "word2 word3", "word4 fresh"):
            assert _search(segmented, q, alive) == pytest.approx(_search(flat, q, alive), rel=1e-6)

    for row in range(300):
        text = " ".join(rng.choice(vocab, size=5))
        for index in (segmented, flat):
            index.add(row, 0, text)
    segments, _, stamps, _ = segmented._view
    assert len(segments) > 1 and all(s == segmented._replaced for s in stamps)  # read unchecked
    answers_agree()
    for index in (segmented, flat):
        index.add(7, 0, "fresh words only")  # row 7's old postings are stale in some segment
    assert all(s != segmented._replaced for s in segmented._view[2])  # checked again
    assert 7 not in _search(segmented, " ".join(vocab), alive)  # its old words no longer find it
    assert set(_search(segmented, "fresh", alive)) == {7}
    answers_agree()
    segmented.compact(alive)
    assert segmented._view[2] == (segmented._replaced,)  # rebuilt without them: unchecked again
    answers_agree()


def test_current_sources_match_the_reference() -> None:
    rng = np.random.default_rng(5)
    n, n_keys = 120, 8
    row_gen = np.ones(n + 10, np.int32)
    keys = np.arange(n_keys, dtype=np.int32)
    per_key = rng.integers(5, 30, size=n_keys)
    starts = np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64)
    total = int(starts[-1])
    seg = kw_kernels.postings(
        keys,
        starts,
        rng.integers(0, n, size=total).astype(np.int32),
        rng.integers(1, 4, size=total).astype(np.float32),
        np.ones(total, np.int32),  # every posting current
        rng.integers(1, 40, size=total).astype(np.uint16),
    )
    wanted, weights = keys, rng.random(n_keys) + 0.2
    allowed = rng.random(n) < 0.75
    want = reference_bm25([seg], wanted, weights, row_gen, allowed, 12.0)
    for current in ((True,), (False,)):
        rows, scores, _ = kw_kernels.accumulate(
            [seg], wanted, weights, row_gen, allowed, 12.0, current=current
        ).collect()
        order = np.argsort(rows)
        np.testing.assert_array_equal(rows[order], want[0])
        np.testing.assert_allclose(scores[order], want[1], rtol=1e-5)
    with pytest.raises(ValueError, match="one flag per source"):
        kw_kernels.accumulate([seg], wanted, weights, row_gen, allowed, 12.0, current=(True, False))


def _indexed_sources(rng: np.random.Generator, n_rows: int, n_segments: int = 4) -> list:
    """Sources as the index builds them: a row's content (one generation) posted once, each key at
    most once, in one source (a sorted segment or the delta); some rows posted again later, their
    older postings stale; a sorted segment holds one generation of a row (as a flush keeps), each
    key's rows ascending. Key frequencies skewed, as words are, so pruning has something to skip."""
    n_keys = 12
    popularity = 1.0 / np.arange(1, n_keys + 1)
    gens = np.zeros(n_rows + 10, np.int32)
    batches: list[list[tuple[int, int, float, int, int]]] = [[] for _ in range(n_segments + 1)]
    for row in rng.permutation(n_rows + 10):
        for _ in range(int(rng.integers(1, 3))):  # a second posting: the content replaced
            gens[row] += 1
            count = int(rng.integers(1, 5))
            keys = rng.choice(n_keys, size=count, replace=False, p=popularity / popularity.sum())
            length = int(rng.integers(1, 30))
            batch = batches[int(rng.integers(0, n_segments + 1))]
            batch.extend((int(k), int(row), float(rng.integers(1, 4)), int(gens[row]), length) for k in keys)
    sources = []
    for batch in batches[:-1]:
        newest: dict[int, int] = {}
        for _, row, _, g, _ in batch:
            newest[row] = max(newest.get(row, 0), g)
        batch = [p for p in batch if p[3] == newest[p[1]]]
        keys, rows, tfs, gs, lens = (
            (np.array(c) for c in zip(*batch, strict=True)) if batch else [np.empty(0)] * 5
        )
        order = np.lexsort((rows, keys))
        keys = keys[order].astype(np.int32)
        uniq, counts = np.unique(keys, return_counts=True)
        sources.append(
            kw_kernels.postings(
                uniq.astype(np.int32),
                np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                rows[order].astype(np.int32),
                tfs[order].astype(np.float32),
                gs[order].astype(np.int32),
                lens[order].astype(np.uint16),
            )
        )
    keys, rows, tfs, gs, lens = (np.array(c) for c in zip(*batches[-1], strict=True))
    sources.append(
        kw_kernels.appended(
            keys.astype(np.int32), rows.astype(np.int32), tfs.astype(np.float32), gs.astype(np.int32),
            lens.astype(np.uint16), keys.shape[0],
        )
    )  # fmt: skip
    return sources, gens


@pytest.mark.parametrize("seed", range(12))
def test_a_pass_for_the_best_few_skips_rows_and_matches_the_reference(seed: int) -> None:
    """A pass that only the best ``depth`` rows (and probes) are read from, row by row: the same best
    rows and scores as the full reference, exact probe scores for rows it did not score; it skips
    the rows of common terms once what they could add cannot lift a row into the best."""
    rng = np.random.default_rng(100 + seed)
    n = 400
    sources, row_gen = _indexed_sources(rng, n)
    wanted = np.arange(12, dtype=np.int32)
    weights = kw_kernels.idf(n, np.linspace(5, 300, 12))  # the rare keys weigh most
    allowed = rng.random(n) < 0.9
    want_rows, want_scores = reference_bm25(sources, wanted, weights, row_gen, allowed, 14.0)
    by_row = dict(zip(want_rows.tolist(), want_scores.tolist(), strict=True))
    skipped = 0
    # (a segment holding no stale posting read as the index reads one: without generation checks)
    current = tuple(
        isinstance(s, kw_kernels.Postings) and bool((s.gens == row_gen[s.rows]).all()) for s in sources
    )
    for depth in (1, 5, 20, 300):
        sums = kw_kernels.accumulate(
            sources, wanted, weights, row_gen, allowed, 14.0, current=current, depth=depth
        )
        assert sums.deferred
        probe = rng.integers(0, n + 20, size=30).astype(np.int64)  # most of them not among the best
        rows, scores, probed = sums.collect(probe, depth)
        best = np.sort(want_scores)[::-1][:depth]
        np.testing.assert_allclose(scores, best, rtol=1e-5)  # best first, the same scores
        np.testing.assert_allclose(scores, [by_row[r] for r in rows.tolist()], rtol=1e-5)
        np.testing.assert_allclose(probed, [by_row.get(r, 0.0) for r in probe.tolist()], rtol=1e-5)
        ties = scores[1:] == scores[:-1]
        assert (rows[1:][ties] > rows[:-1][ties]).all()  # (ties: the lower row first)
        assert 0 <= sums.scored <= want_rows.shape[0]
        skipped += want_rows.shape[0] - sums.scored
        with pytest.raises(RuntimeError, match="collected already"):
            sums.collect(probe, depth)
    assert skipped > 0  # (the bounds hold whatever the data; here they also pay)
    again = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, 14.0)  # scratch left clean
    np.testing.assert_array_equal(np.sort(again[0]), want_rows)
    np.testing.assert_allclose(again[1][np.argsort(again[0])], want_scores, rtol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_the_best_read_before_the_probes_answer_as_one_read_out(seed: int) -> None:
    """``Sums.best`` and then its probes (a search learns which rows to probe while the best are read):
    the same rows, scores and probe scores as ``collect`` of the same pass, deferred or not; the
    probes are read once, and the scratch is left clean."""
    rng = np.random.default_rng(200 + seed)
    n = 400
    sources, row_gen = _indexed_sources(rng, n)
    wanted = np.arange(12, dtype=np.int32)
    weights = kw_kernels.idf(n, np.linspace(5, 300, 12))
    allowed = rng.random(n) < 0.9
    want_rows, want_scores = reference_bm25(sources, wanted, weights, row_gen, allowed, 14.0)
    by_row = dict(zip(want_rows.tolist(), want_scores.tolist(), strict=True))
    for depth in (-1, 1, 5, 20, 300):
        probe = rng.integers(0, n + 20, size=30).astype(np.int64)  # most of them not among the best
        one = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0, depth=depth)
        two = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0, depth=depth)
        assert two.deferred == (depth > 0)
        want = one.collect(probe, depth)
        rows, scores, probes = two.best(depth)
        np.testing.assert_array_equal(rows, want[0])
        np.testing.assert_array_equal(scores, want[1])
        got = probes(probe)
        np.testing.assert_array_equal(got, want[2])
        np.testing.assert_allclose(got, [by_row.get(r, 0.0) for r in probe.tolist()], rtol=1e-5)
        with pytest.raises(RuntimeError, match="read already"):
            probes(probe)
        with pytest.raises(RuntimeError, match="collected already"):
            two.best(depth)
    for scratch in kw_kernels._free:
        assert not scratch.acc.any()
    nothing = kw_kernels.no_sums().best(3)
    assert nothing[0].shape == (0,) and nothing[2](np.array([1, 2], np.int64)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("seed", range(6))
def test_a_pass_for_the_best_skips_no_row_that_belongs_among_them(seed: int) -> None:
    """Few terms (a rare, a middling and a common one), contents of very different lengths and
    term frequencies, many rows near the cut: the read-out's skip tests (what a row's term and the
    terms after it could add, weighed against the cut) drop no row the reference ranks among the
    best, at every depth, and the read-out still skips most rows."""
    rng = np.random.default_rng(300 + seed)
    n = 3000
    per_key = [(0, 0.02), (1, 0.15), (2, 0.5)]  # (key, share of the rows holding it)
    postings = [
        (k, r, float(rng.choice([1, 1, 1, 2, 3])))
        for k, share in per_key
        for r in np.flatnonzero(rng.random(n) < share).tolist()
    ]
    lengths = rng.integers(1, 400, size=n).astype(np.uint16)  # short and long contents
    keys = np.array([p[0] for p in postings], np.int32)
    rows = np.array([p[1] for p in postings], np.int32)
    tfs = np.array([p[2] for p in postings], np.float32)
    uniq, counts = np.unique(keys, return_counts=True)
    seg = kw_kernels.postings(uniq, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), rows, tfs,
                              np.ones(rows.shape[0], np.int32), lengths[rows])  # fmt: skip
    row_gen = np.ones(n, np.int32)
    wanted = np.arange(3, dtype=np.int32)
    weights = kw_kernels.idf(n, counts.astype(np.float64))
    allowed = rng.random(n) < 0.95
    avgdl = float(lengths.mean())
    want_rows, want_scores = reference_bm25([seg], wanted, weights, row_gen, allowed, avgdl)
    order = np.lexsort((want_rows, -want_scores.astype(np.float64)))
    for depth in (1, 3, 10, 32, 100):
        for current in ((True,), (False,)):
            sums = kw_kernels.accumulate(
                [seg], wanted, weights, row_gen, allowed, avgdl, current=current, depth=depth
            )
            got_rows, got_scores, _ = sums.collect(None, depth)
            np.testing.assert_allclose(got_scores, want_scores[order][:depth], rtol=1e-6)
            exact = want_scores[order][:depth]
            clear = exact > exact[-1] * (1 + 1e-5)  # (rows clear of the cut: the same ones exactly)
            assert set(got_rows[clear].tolist()) == set(want_rows[order][:depth][clear].tolist())
            assert sums.scored < want_rows.shape[0] / 4


def test_a_pass_for_the_best_keeps_rows_just_above_the_cut_where_bounds_are_tight() -> None:
    """Every content the same length and the common term once in each, so what a term could add
    is what it adds: rows met later that beat the lowest of the best by a hair are kept, and only
    those (the skip test errs by rounding, far below the cut's slack)."""
    rng = np.random.default_rng(11)
    n = 600
    rare_tfs = (1.0 + 0.05 * rng.random(n)).astype(np.float32)  # close scores in random row order
    rows = np.tile(np.arange(n, dtype=np.int32), 2)
    tfs = np.concatenate([rare_tfs, np.ones(n, np.float32)])
    seg = kw_kernels.postings(np.array([0, 1], np.int32), np.array([0, n, 2 * n], np.int64), rows, tfs,
                              np.ones(2 * n, np.int32), np.full(2 * n, 12, np.uint16))  # fmt: skip
    row_gen, allowed = np.ones(n, np.int32), np.ones(n, np.bool_)
    wanted, weights = np.array([0, 1], np.int32), np.array([3.0, 0.5])
    want_rows, want_scores = reference_bm25([seg], wanted, weights, row_gen, allowed, 12.0)
    order = np.lexsort((want_rows, -want_scores.astype(np.float64)))
    for depth in (1, 10, 50):
        sums = kw_kernels.accumulate(
            [seg], wanted, weights, row_gen, allowed, 12.0, current=(True,), depth=depth
        )
        got_rows, got_scores, _ = sums.collect(None, depth)
        assert got_rows.tolist() == want_rows[order][:depth].tolist()
        np.testing.assert_allclose(got_scores, want_scores[order][:depth], rtol=1e-6)
        assert sums.scored < n  # (rows under the cut were skipped without their lookups)


def test_a_pass_for_the_best_reads_the_allowed_rows_as_the_bits_it_is_given() -> None:
    """The read-out reads ``allowed`` packed 8 rows a byte: the caller's bits when given (a mask it
    shares keeps them), else packed by the pass; both give the reference's answer."""
    rng = np.random.default_rng(7)
    n = 403  # (not a whole number of bytes)
    sources, row_gen = _indexed_sources(rng, n)
    wanted = np.arange(12, dtype=np.int32)
    weights = kw_kernels.idf(n, np.linspace(5, 300, 12))
    allowed = rng.random(n) < 0.7
    _, want_scores = reference_bm25(sources, wanted, weights, row_gen, allowed, 14.0)
    best = np.sort(want_scores)[::-1][:20]
    allowed_set = set(np.flatnonzero(allowed).tolist())
    for bits in (None, np.packbits(allowed, bitorder="little")):
        sums = kw_kernels.accumulate(
            sources, wanted, weights, row_gen, allowed, 14.0, depth=20, allowed_bits=bits
        )
        rows, scores, _ = sums.collect(None, 20)
        np.testing.assert_allclose(scores, best, rtol=1e-5)
        assert set(rows.tolist()) <= allowed_set
    # A mask shorter than the rows posted: rows past it are not allowed, their bits never read.
    short = allowed[: n - 11]
    _, short_scores = reference_bm25(sources, wanted, weights, row_gen, short, 14.0)
    for bits in (None, np.packbits(short, bitorder="little")):
        sums = kw_kernels.accumulate(
            sources, wanted, weights, row_gen, short, 14.0, depth=20, allowed_bits=bits
        )
        rows, scores, _ = sums.collect(None, 20)
        np.testing.assert_allclose(scores, np.sort(short_scores)[::-1][:20], rtol=1e-5)
        assert rows.max() < n - 11
    # The bits given are what the read-out reads: none set, no row of a sorted source is found.
    unsorted = [s for s in sources if not isinstance(s, kw_kernels.Postings)]
    none_bits = np.zeros((n + 7) // 8, np.uint8)
    sums = kw_kernels.accumulate(
        sources, wanted, weights, row_gen, allowed, 14.0, depth=20, allowed_bits=none_bits
    )
    rows, _, _ = sums.collect(None, 20)
    from_unsorted = reference_bm25(unsorted, wanted, weights, row_gen, allowed, 14.0)[0]
    assert set(rows.tolist()) <= set(from_unsorted.tolist())
    for bad, match in (
        (np.zeros((n + 7) // 8 - 1, np.uint8), "8 rows a byte"),
        (np.zeros((n + 7) // 8, np.int8), "allowed_bits"),
    ):
        with pytest.raises(ValueError, match=match):
            kw_kernels.accumulate(
                sources, wanted, weights, row_gen, allowed, 14.0, depth=20, allowed_bits=bad
            )


def test_a_pass_for_the_best_is_read_out_at_its_depth_or_less_and_can_be_given_up() -> None:
    rng = np.random.default_rng(7)
    n = 400
    sources, row_gen = _indexed_sources(rng, n)
    wanted = np.arange(12, dtype=np.int32)
    weights = kw_kernels.idf(n, np.linspace(5, 300, 12))
    allowed = np.ones(n, np.bool_)
    sums = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0, depth=3)
    assert sums.deferred
    with pytest.raises(ValueError, match="best 3 rows only"):
        sums.collect(None, 10)
    with pytest.raises(ValueError, match="best 3 rows only"):
        sums.collect(None, -1)  # every row: not kept
    rows, _, _ = sums.collect(None, 2)
    assert rows.shape == (2,)
    kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0, depth=3).release()
    full = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0)
    assert not full.deferred
    full.release()
    want = reference_bm25(sources, wanted, weights, row_gen, allowed, 14.0)
    got = kw_kernels.bm25(sources, wanted, weights, row_gen, allowed, 14.0)  # after the give-ups
    np.testing.assert_allclose(got[1][np.argsort(got[0])], want[1], rtol=1e-5)


def test_more_sorted_sources_than_a_pack_holds_are_read_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(9)
    n = 300
    sources, row_gen = _indexed_sources(rng, n, n_segments=6)
    wanted = np.arange(12, dtype=np.int32)
    weights = kw_kernels.idf(n, np.linspace(5, 300, 12))
    allowed = np.ones(n, np.bool_)
    want = reference_bm25(sources, wanted, weights, row_gen, allowed, 14.0)
    monkeypatch.setattr(kw_kernels, "MAX_PACKED", 5)
    sums = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 14.0, depth=4)
    assert not sums.deferred
    _, scores, _ = sums.collect(None, 4)
    np.testing.assert_allclose(scores, np.sort(want[1])[::-1][:4], rtol=1e-5)


def test_both_read_outs_keep_the_lower_rows_where_memories_tie_at_the_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plain pass (every posting read) and the row-by-row read-out keep the same rows when more
    memories tie than the depth holds: the lower rows, whichever term's postings met them first."""
    n = 100
    rows = np.concatenate([np.arange(50, 100), np.arange(0, 50)]).astype(np.int32)  # key 0: 50-99
    seg = kw_kernels.postings(np.array([0, 1], np.int32), np.array([0, 50, 100], np.int64), rows,
                              np.ones(n, np.float32), np.zeros(n, np.int32), np.full(n, 4, np.uint16))  # fmt: skip
    wanted, weights = np.array([0, 1], np.int32), np.full(2, 1.5)
    row_gen, allowed = np.zeros(n, np.int32), np.ones(n, np.bool_)
    for depth in (1, 10, 50, 60):
        best = kw_kernels.bm25([seg], wanted, weights, row_gen, allowed, 4.0, depth=depth)
        with monkeypatch.context() as m:
            m.setattr(kw_kernels, "MAX_PACKED", 0)  # (every posting read, the rows met 50-99 first)
            sums = kw_kernels.accumulate([seg], wanted, weights, row_gen, allowed, 4.0, depth=depth)
            assert not sums.deferred
            plain = sums.collect(None, depth)
        assert best[0].tolist() == plain[0].tolist() == list(range(depth))
        np.testing.assert_array_equal(best[1], plain[1])


def test_key_bounds_match_numpy() -> None:
    rng = np.random.default_rng(3)
    counts = np.array([3, 0, 1, 5, 0], np.int64)  # keys without postings included
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    tfs = rng.integers(1, 9, size=int(starts[-1])).astype(np.float32)
    lens = rng.integers(0, 500, size=int(starts[-1])).astype(np.uint16)
    seg = kw_kernels.postings(np.arange(5, dtype=np.int32), starts, np.zeros(tfs.shape[0], np.int32), tfs,
                              np.zeros(tfs.shape[0], np.int32), lens)  # fmt: skip
    for k in range(5):
        part = slice(starts[k], starts[k + 1])
        assert seg.max_tf[k] == (tfs[part].max() if counts[k] else 0)
        assert seg.min_len[k] == (lens[part].min() if counts[k] else 65535)


def _replaced_index(rng: np.random.Generator, n: int) -> tuple[KeywordIndex, dict[int, str], list[str]]:
    """An index whose segments hold stale postings (contents replaced), words skewed as in text."""
    vocab = [f"w{i}x" for i in range(40)]
    p = 1.0 / np.arange(1, 41)

    def text() -> str:
        return " ".join(rng.choice(vocab, size=int(rng.integers(3, 25)), p=p / p.sum()))

    index = KeywordIndex(delta_size=64)
    texts = {r: text() for r in range(n)}
    for r, t in texts.items():
        index.add(r, r % 2, t)
    for r in rng.choice(n, n // 5, replace=False).tolist():
        texts[r] = text()
        index.add(r, r % 2, texts[r])
    return index, texts, ["w0x", "w1x", "w5x", "w17x", "w33x", "w39x"]


def test_a_content_replaced_before_a_deferred_pass_is_read_out_is_read_whole() -> None:
    """The read-out of a deferred pass reads generations after the pass: a row replaced in between
    must not come out as a mix of its two contents (the pass runs again)."""
    rng = np.random.default_rng(1)
    index, texts, terms = _replaced_index(rng, 1500)
    allowed = rng.random(1500) < 0.9
    none = np.empty(0, np.int64)
    full = index.bm25([0, 1], terms, allowed, 10**9, none, -1)
    top = int(full[0][np.argmax(full[1])])
    sums = index.sums([0, 1], terms, allowed, 10**9, 1)
    assert sums.deferred
    index.add(top, top % 2, texts[top] + " zzz")  # replaced: the same words and one more
    probe = np.array([top], np.int64)
    _, scores, probed = sums.collect(probe, 1)
    after = index.bm25([0, 1], terms, allowed, 10**9, probe, -1)
    # (idf and the mean length were taken when the search began, before the write: close, not equal;
    # a mix of the two contents is far off)
    np.testing.assert_allclose(probed, after[2], rtol=1e-3)
    np.testing.assert_allclose(scores, np.sort(after[1])[::-1][:1], rtol=1e-3)


def test_a_content_replaced_before_the_best_are_read_is_read_whole_and_probed() -> None:
    """As above, with the best read before the probes: the pass runs again, and the probes read its
    sums."""
    rng = np.random.default_rng(1)
    index, texts, terms = _replaced_index(rng, 1500)
    allowed = rng.random(1500) < 0.9
    full = index.bm25([0, 1], terms, allowed, 10**9, np.empty(0, np.int64), -1)
    top = int(full[0][np.argmax(full[1])])
    sums = index.sums([0, 1], terms, allowed, 10**9, 1)
    assert sums.deferred
    index.add(top, top % 2, texts[top] + " zzz")  # replaced: the same words and one more
    _, scores, probes = sums.best(1)
    probe = np.array([top], np.int64)
    probed = probes(probe)
    after = index.bm25([0, 1], terms, allowed, 10**9, probe, -1)
    np.testing.assert_allclose(probed, after[2], rtol=1e-3)
    np.testing.assert_allclose(scores, np.sort(after[1])[::-1][:1], rtol=1e-3)
    for scratch in kw_kernels._free:
        assert not scratch.acc.any()


def test_a_content_replaced_between_the_best_and_the_probes_is_probed_whole() -> None:
    """The probes are read after the best (once the vector search beside has its rows): a row replaced
    in between is probed as the index stands then, not as neither of its contents."""
    rng = np.random.default_rng(1)
    index, texts, terms = _replaced_index(rng, 1500)
    allowed = np.ones(1500, np.bool_)
    row = int(next(r for r in range(1500) if r not in index._view[1].rows[: index._view[1].filled]))
    probe = np.array([row], np.int64)
    before = index.bm25([0, 1], terms, allowed, 10**9, probe, 1)
    assert before[2][0] > 0  # (a row in a sorted segment, holding the terms)
    sums = index.sums([0, 1], terms, allowed, 10**9, 1)
    assert sums.deferred
    _, _, probes = sums.best(1)
    index.add(row, row % 2, texts[row] + " zzz")  # replaced: the same words and one more
    probed = probes(probe)
    after = index.bm25([0, 1], terms, allowed, 10**9, probe, 1)
    np.testing.assert_allclose(probed, after[2], rtol=1e-3)
    for scratch in kw_kernels._free:
        assert not scratch.acc.any()


def test_deferred_passes_given_up_or_read_leave_the_scratch_clean() -> None:
    rng = np.random.default_rng(2)
    index, _, terms = _replaced_index(rng, 1500)
    allowed = np.ones(1500, np.bool_)
    want = index.bm25([0, 1], terms, allowed, 10**9, np.empty(0, np.int64), -1)
    for depth in (1, 5):
        given_up = index.sums([0, 1], terms, allowed, 10**9, depth)
        assert given_up.deferred
        given_up.release()
        given_up.release()  # (twice: nothing more)
        read = index.sums([0, 1], terms, allowed, 10**9, depth)
        read.collect(np.array([3, 4], np.int64), 0)  # probes only
    for scratch in kw_kernels._free:
        assert not scratch.acc.any()
    got = index.bm25([0, 1], terms, allowed, 10**9, np.empty(0, np.int64), -1)
    np.testing.assert_allclose(got[1][np.argsort(got[0])], want[1][np.argsort(want[0])], rtol=1e-5)
    assert kernels._jit.topk(np.ones(3, np.float32), 0).shape == (0,)


def test_segments_merged_away_are_not_kept_alive_by_the_last_search() -> None:
    import gc
    import weakref

    rng = np.random.default_rng(3)
    index, _, terms = _replaced_index(rng, 600)
    allowed = np.ones(600, np.bool_)
    index.sums([0, 1], terms, allowed, 10**9, 5).release()  # packs the segments of the moment
    old = [weakref.ref(seg.rows) for seg in index._view[0]]
    index.compact(allowed)  # one new segment
    gc.collect()
    assert all(r() is None for r in old)
    got = index.bm25([0, 1], terms, allowed, 10**9, np.empty(0, np.int64), 5)
    assert got[0].shape == (5,)


def test_galloping_seek_matches_searchsorted() -> None:
    rng = np.random.default_rng(4)
    for size in (0, 1, 5, 40, 3000):
        rows = np.unique(rng.integers(0, 10 * size + 5, size=size)).astype(np.int32)
        n = rows.shape[0]
        for _ in range(200):
            i = int(rng.integers(0, n + 1))
            hi = int(rng.integers(i, n + 1))
            r = int(rng.integers(-2, 10 * size + 8))
            want = i + int(np.searchsorted(rows[i:hi], r))
            assert kw_kernels._seek(rows, i, hi, r) == want


def test_the_heap_keeps_the_best_with_ties_to_the_lower_row() -> None:
    rng = np.random.default_rng(6)
    for depth in (1, 3, 17):
        scores = rng.integers(0, 6, size=80).astype(np.float64)  # many ties
        rows = rng.permutation(80).astype(np.int64)
        hs, hr = np.empty(depth), np.empty(depth, np.int64)
        n = 0
        for s, r in zip(scores.tolist(), rows.tolist(), strict=True):
            n = kw_kernels._push(hs, hr, n, s, r)
        order = np.lexsort((rows, -scores))[:depth]  # NumPy: best score, then lower row
        got = sorted(zip(hs[:n].tolist(), hr[:n].tolist(), strict=True), key=lambda p: (-p[0], p[1]))
        assert got == list(zip(scores[order].tolist(), rows[order].tolist(), strict=True))


def test_sources_not_in_row_order_are_read_in_full_with_the_same_answer() -> None:
    rng = np.random.default_rng(13)
    n = 200
    sources = _random_sources(rng, n, 12)  # (rows in no order within a key)
    assert not all(s.by_row for s in sources if isinstance(s, kw_kernels.Postings))
    wanted = np.arange(12, dtype=np.int32)
    weights = rng.random(12) + 0.3
    row_gen = rng.integers(1, 3, size=n + 10).astype(np.int32)
    allowed = np.ones(n, np.bool_)
    sums = kw_kernels.accumulate(sources, wanted, weights, row_gen, allowed, 20.0, depth=5)
    assert not sums.deferred
    _, scores, _ = sums.collect(None, 5)
    want = reference_bm25(sources, wanted, weights, row_gen, allowed, 20.0)
    np.testing.assert_allclose(scores, np.sort(want[1])[::-1][:5], rtol=1e-5)


def test_a_snapshot_with_keys_out_of_row_order_is_restored_in_order() -> None:
    """Snapshots from before segments held each key's rows in order (and a delta holding replaced
    content) restore as segments a search reads row by row, with the same answers."""
    rng = np.random.default_rng(14)
    index, _, terms = _replaced_index(rng, 800)
    allowed = np.ones(800, np.bool_)
    none = np.empty(0, np.int64)
    want = index.bm25([0, 1], terms, allowed, 10**9, none, -1)
    state = index.state()
    shuffled = []
    for keys, starts, rows, tfs, gens, lens in state["segments"]:
        order = np.concatenate(
            [
                lo + rng.permutation(hi - lo)
                for lo, hi in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)
            ]
        ).astype(np.int64)
        shuffled.append((keys, starts, rows[order], tfs[order], gens[order], lens[order]))
    assert any(not kw_kernels.postings(*seg).by_row for seg in shuffled)
    restored = KeywordIndex.restore({**state, "segments": shuffled})
    assert all(seg.by_row for seg in restored._view[0])
    got = restored.bm25([0, 1], terms, allowed, 10**9, none, -1)
    np.testing.assert_array_equal(np.sort(got[0]), np.sort(want[0]))
    np.testing.assert_allclose(got[1][np.argsort(got[0])], want[1][np.argsort(want[0])], rtol=1e-5)
    best = restored.sums([0, 1], terms, allowed, 10**9, 5)
    assert best.deferred
    np.testing.assert_allclose(best.collect(None, 5)[1], np.sort(want[1])[::-1][:5], rtol=1e-5)


def test_equal_rows_in_the_delta_and_a_segment_tie_to_the_lower_row() -> None:
    """A row summed in float32 (the delta) and one summed in float64 (a segment), equal content:
    equal scores as returned, so the lower row comes first."""
    k1, b, avgdl, length = 1.2, 0.75, 10.0, 5
    rng = np.random.default_rng(0)
    for _ in range(10000):  # an idf whose term float32 rounds down
        w = float(rng.random() + 0.5)
        t = w * (k1 + 1.0) / (1.0 + k1 * (1.0 - b + b * length / avgdl))
        if float(np.float32(t)) < t:
            break
    one = np.array([5], np.int32)
    seg = kw_kernels.postings(one, np.array([0, 1], np.int64), np.array([7], np.int32), np.ones(1, np.float32),
                              np.ones(1, np.int32), np.array([length], np.uint16))  # fmt: skip
    delta = kw_kernels.appended(one, np.array([3], np.int32), np.ones(1, np.float32), np.ones(1, np.int32),
                                np.array([length], np.uint16), 1)  # fmt: skip
    row_gen, allowed = np.ones(10, np.int32), np.ones(10, np.bool_)
    for depth in (1, 2):
        sums = kw_kernels.accumulate([seg, delta], one, np.array([w]), row_gen, allowed, avgdl, depth=depth)
        assert sums.deferred
        rows, scores, _ = sums.collect(None, depth)
        assert rows.tolist() == [3, 7][:depth]
        assert scores[0] == scores[-1]


def test_bm25_parameters_outside_their_range_are_refused() -> None:
    one = np.array([0], np.int32)
    seg = kw_kernels.postings(one, np.array([0, 1], np.int64), one, np.ones(1, np.float32), np.ones(1, np.int32),
                              np.ones(1, np.uint16))  # fmt: skip
    for k1, b in ((-0.1, 0.75), (1.2, -0.5), (1.2, 1.5), (float("nan"), 0.75)):
        with pytest.raises(ValueError, match="k1 must be"):
            kw_kernels.accumulate(
                [seg], one, np.ones(1), np.ones(2, np.int32), np.ones(2, np.bool_), 1.0, k1, b
            )


def test_a_deferred_read_out_racing_a_replacement_sees_the_row_whole() -> None:
    """A replacement publishes the row's new postings, then its generation: a search whose pass starts
    in between and whose read-out lands before the write ends must still see the row (one of its two
    contents), not lose it. The interleaving is forced by hooks on the index's attributes."""
    ctx: dict = {}
    probe = np.array([0], np.int64)
    allowed = np.ones(1000, np.bool_)

    class Hooked(KeywordIndex):
        armed = False

        def __setattr__(self, name: str, value: object) -> None:
            if name == "_bumps" and Hooked.armed and "sums" in ctx:
                ctx["out"] = ctx.pop("sums").collect(probe, 5)  # the read-out before the write ends
            object.__setattr__(self, name, value)
            if name == "_view" and Hooked.armed and "sums" not in ctx and "out" not in ctx:
                ctx["sums"] = keyword_sums(self, [0], "alpha", allowed, 10**9, 5)  # the pass starts

    index = Hooked(delta_size=64)
    index.add(0, 0, "alpha alpha alpha beta")
    for r in range(1, 300):
        index.add(r, 0, f"word{r % 17} other{r % 5}" + (" alpha" if r % 10 == 0 else ""))
    r = 300
    while index._view[1].filled + 5 > index.delta_size:  # (room for row 0's new content: no flush)
        index.add(r, 0, f"filler{r}")
        r += 1
    assert all(int(row) != 0 for row in index._view[1].rows[: index._view[1].filled])  # in a segment
    Hooked.armed = True
    index.add(0, 0, "alpha alpha alpha beta gamma")  # replaced: its new postings go to the delta
    Hooked.armed = False
    rows, _, probed = ctx["out"]
    assert 0 in rows.tolist() and probed[0] > 0
    after = keyword_sums(index, [0], "alpha", allowed, 10**9, 5).collect(probe, 5)
    assert after[0][0] == 0 and after[2][0] > 0
