"""What searches share, skip or overlap to save time: recent row masks (reused while no row changed),
the keyword postings that cannot reach a fused search's best matches, and a large fused search's
vector search run on a spare core beside its keyword pass. None may change an answer: real engines
over real LMDB files and FAISS indexes."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import FakeClock

from tiermem.kernels import keywords as kw_kernels
from tiermem.server.config import ServerConfig, Tuning
from tiermem.server.core.engine import Engine
from tiermem.server.model.records import NewMemory
from tiermem.server.model.text import keyword_terms
from tiermem.server.model.types import Filter
from tiermem.server.search import searcher as searcher_module
from tiermem.server.search.candidates import CandidateSearch
from tiermem.server.search.query import COMPREHENSIVE, FUSED, SIMILARITY, SearchQuery
from tiermem.server.search.searcher import Turns
from tiermem.server.transport.app import RunningServer

NS = "team:search"
DIM = 8
WORDS = ["deploy", "budget", "kubernetes", "holiday", "invoice", "garden", "rocket", "piano"]


def _engine(data: Path, clock: FakeClock, **config: object) -> Engine:
    cfg = ServerConfig(
        data_dir=data,
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        search_records_access=False,
        **config,  # type: ignore[arg-type]
    )
    return Engine(cfg, clock=clock)


def _memory(i: int, rng: np.random.Generator, **kw: object) -> NewMemory:
    words = " ".join(WORDS[j] for j in rng.choice(len(WORDS), 3, replace=False))
    vec = rng.normal(size=DIM).astype(np.float32)
    return NewMemory(
        namespace=NS,
        content=f"note {i} about {words}",
        id=f"m{i}",
        embedding=vec / np.linalg.norm(vec),
        embedding_model="m",
        **kw,  # type: ignore[arg-type]
    )


def _ids(e: Engine, q: SearchQuery) -> list[str]:
    return [h.record.id for h in e.search(q)]


def _query(rng: np.random.Generator, text: str = "", **kw: object) -> SearchQuery:
    vec = rng.normal(size=DIM).astype(np.float32)
    return SearchQuery(
        namespaces=[NS],
        embedding=vec,
        embedding_model="m",
        text=text,
        limit=100,
        read_only=True,
        **kw,  # type: ignore[arg-type]
    )


def _shared_mask_is_current(e: Engine, flt: Filter | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The shared mask, checked against one computed afresh; returns it with a second reading."""
    flt = flt or Filter()
    view = e.columns.view()
    now = e.clock()
    first, count = e.state.shared_allowed_rows(view, [NS], flt, now)
    fresh, fresh_count = e.state.allowed_rows(view, [NS], flt, now)
    assert np.array_equal(first, fresh) and count == fresh_count
    again, _ = e.state.shared_allowed_rows(e.columns.view(), [NS], flt, now)
    return first, again


def test_searches_share_a_mask_until_a_row_changes(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    clock = FakeClock()
    e = _engine(tmp_path / "data", clock)
    try:
        e.create([_memory(i, rng) for i in range(30)], batch=True)
        first, again = _shared_mask_is_current(e)
        assert again is first  # nothing changed: the same mask serves both
        view, now, space = e.columns.view(), e.clock(), e.spaces["m"].id
        in_space, n_space = e.state.shared_allowed_rows(view, [NS], Filter(), now, space, within=first)
        want, n_want = e.state.allowed_rows(view, [NS], Filter(), now, space)
        assert np.array_equal(in_space, want) and n_space == n_want == 30  # narrowed, not a new pass
        assert e.state.shared_allowed_rows(view, [NS], Filter(), now, space)[0] is in_space
        q = _query(rng)
        assert sorted(_ids(e, q)) == sorted(f"m{i}" for i in range(30))

        e.create([_memory(30, rng)])  # a new row
        after_create, _ = _shared_mask_is_current(e)
        assert after_create is not first and after_create.shape[0] == 31
        assert "m30" in _ids(e, q)

        row = e.columns.rows[e.get(NS, "m5")[0].rid]
        assert after_create[row]
        e.delete(NS, "m5")  # a row gone
        after_delete, _ = _shared_mask_is_current(e)
        assert not after_delete[row]
        assert "m5" not in _ids(e, q)

        row7 = e.columns.rows[e.get(NS, "m7")[0].rid]
        old_tier = int(e.columns.view().tier[row7])
        new_tier = 4 if old_tier != 4 else 1

        def in_tier(t: int) -> list[str]:
            return _ids(e, SearchQuery(**{**q.__dict__, "filter": Filter(tiers=[t])}))

        assert "m7" in in_tier(old_tier) and "m7" not in in_tier(new_tier)
        e.update(NS, "m7", NewMemory(namespace=NS, content="", tier=new_tier), ["tier"])  # moved
        _shared_mask_is_current(e, Filter(tiers=[new_tier]))
        assert "m7" not in in_tier(old_tier) and "m7" in in_tier(new_tier)
    finally:
        e.close()


def test_a_shared_mask_is_packed_to_bits_once_and_only_while_it_is_shared(tmp_path: Path) -> None:
    """The keyword pass reads a shared mask as bits: packed once per mask, None for a mask that is not
    shared, and not kept once the cache has let the mask go."""
    rng = np.random.default_rng(5)
    e = _engine(tmp_path / "data", FakeClock())
    try:
        e.create([_memory(i, rng) for i in range(30)], batch=True)
        mask, _ = _shared_mask_is_current(e)
        bits = e.state.shared_mask_bits(mask)
        assert bits is not None and np.array_equal(bits, np.packbits(mask, bitorder="little"))
        assert e.state.shared_mask_bits(mask) is bits  # (packed once)
        fresh, _ = e.state.allowed_rows(e.columns.view(), [NS], Filter(), e.clock())
        assert e.state.shared_mask_bits(fresh) is None  # not shared: the pass packs its own
        row = e.columns.rows[e.get(NS, "m5")[0].rid]
        e.delete(NS, "m5")
        after, _ = _shared_mask_is_current(e)
        after_bits = e.state.shared_mask_bits(after)
        assert after_bits is not None and not (after_bits[row >> 3] >> (row & 7)) & 1
        assert "m5" not in _ids(e, _query(rng, "note about deploy budget kubernetes"))
        assert e.state.shared_mask_bits(mask) is None  # replaced: no longer shared
        gone = weakref.ref(mask)
        del mask, bits
        gc.collect()
        assert gone() is None  # the replaced mask is not kept alive by its bits
    finally:
        e.close()


def test_a_mask_is_not_shared_once_a_memory_can_expire(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    clock = FakeClock()
    e = _engine(tmp_path / "data", clock)
    try:
        e.create([_memory(i, rng) for i in range(10)], batch=True)
        e.create([_memory(10, rng, expire_at=clock.now + 60)])
        q = _query(rng)
        assert "m10" in _ids(e, q)
        shared, _ = _shared_mask_is_current(e)
        clock.advance(120)  # nothing written, yet the memory has expired
        assert "m10" not in _ids(e, q)
        first, again = _shared_mask_is_current(e)
        assert again is not first and not np.array_equal(first, shared)
    finally:
        e.close()


def test_fused_searches_rank_alike_with_the_best_first_keyword_pass_and_the_full_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keyword pass of a fused search reads row by row for its best matches only, skipping the rows
    that cannot reach them (a rare word's matches outscore anything a common word alone could add):
    the same best matches and scores as the pass that reads every posting, and so the same hits.
    The two add a memory's terms in another order, so a score may differ in its last float32 bit:
    where memories tie at the cut, either may keep a different one of them (then the hits may
    differ too, and only the keyword matches are compared)."""
    rng = np.random.default_rng(8)
    clock = FakeClock()
    e = _engine(tmp_path / "data", clock)
    try:
        batch = [_memory(i, rng) for i in range(600)]  # (their postings fill sorted segments)
        for i, m in enumerate(batch):  # a rare word in 120 of them, a common one in most
            extra = (" zebra" if i % 5 == 0 else "") + (" deploy" if i % 7 else "")
            batch[i] = replace(m, content=m.content + extra)
        e.create(batch, batch=True)
        names = [e.columns.namespaces.get(NS)]
        allowed = np.ones(len(e.columns), np.bool_)
        texts = ["zebra deploy " + WORDS[j % len(WORDS)] for j in range(12)]
        depth = 32  # (a fused search's for limit 10)

        def best(text: str) -> tuple[np.ndarray, np.ndarray]:
            sums = e.state.keywords.sums(names, list(keyword_terms(text)), allowed, 10**6, depth=depth)
            rows, scores, _ = sums.collect(np.empty(0, np.int64), depth)
            return rows, scores

        def answers() -> list[list[tuple[str, float]]]:
            qrng = np.random.default_rng(9)
            out = []
            for text in texts:
                q = SearchQuery(**{**_query(qrng, text=text, strategy=FUSED).__dict__, "limit": 10})
                out.append([(h.record.id, h.score) for h in e.search(q)])
            return out

        assert e.state.keywords.sums(names, ["zebra", "deploy"], allowed, 10**6, depth=depth).deferred
        pruned_best, pruned = [best(t) for t in texts], answers()
        monkeypatch.setattr(kw_kernels, "MAX_PACKED", 0)  # every posting read
        full_best, full = [best(t) for t in texts], answers()
        alike = 0
        for (r1, s1), (r2, s2), a, b in zip(pruned_best, full_best, pruned, full, strict=True):
            assert r1.shape[0] == r2.shape[0] == depth
            np.testing.assert_allclose(s1, s2, rtol=1e-6)  # the same scores, rank by rank
            apart = np.setxor1d(r1, r2)  # (rows only one of them kept: tied at the cut)
            cut = float(s1[-1])
            for r in apart.tolist():
                held = s1[r1 == r] if r in r1 else s2[r2 == r]
                assert abs(float(held[0]) - cut) <= 1e-6 * cut
            if apart.shape[0] == 0:
                alike += 1
                assert [i for i, _ in a] == [i for i, _ in b]
                np.testing.assert_allclose([s for _, s in a], [s for _, s in b], rtol=1e-5)
        assert alike >= 4  # (the hits compared for most questions)
        assert all(len(a) > 0 for a in pruned)
    finally:
        e.close()


def test_a_space_mask_narrowed_from_a_mask_a_write_outdated_is_not_shared(tmp_path: Path) -> None:
    """A text search narrows its keyword mask to the vector space; a write between the two must not
    leave the narrowed (outdated) mask to later searches."""
    rng = np.random.default_rng(12)
    e = _engine(tmp_path / "data", FakeClock())
    try:
        e.create([_memory(i, rng, tier=1) for i in range(20)], batch=True)
        vec = e.get(NS, "m7", include_embedding=True)[1]
        flt = Filter(tiers=[4])
        q = SearchQuery(
            namespaces=[NS], embedding=vec, embedding_model="m", text="zzzz", hybrid=True,
            limit=10, read_only=True, filter=flt,
        )  # fmt: skip
        assert _ids(e, q) == []
        shared = e.state.shared_allowed_rows
        moved: list[bool] = []

        def move_between(*a: object, within: np.ndarray | None = None, **kw: object) -> object:
            if within is not None and not moved:  # after the keyword mask, before the space's
                moved.append(True)
                e.update(NS, "m7", NewMemory(namespace=NS, content="", tier=4), ["tier"])
            return shared(*a, within=within, **kw)  # type: ignore[arg-type]

        e.state.shared_allowed_rows = move_between  # type: ignore[method-assign]
        e.search(q)
        e.state.shared_allowed_rows = shared  # type: ignore[method-assign]
        assert moved
        assert _ids(e, q) == ["m7"]
    finally:
        e.close()


def test_a_helper_thread_takes_a_spare_turn_only() -> None:
    """A ranking's helper runs only while fewer rankings and helpers run than there are turns (each
    wants a core)."""
    turns = Turns(2)
    with turns.take():
        first = turns.claim()
        assert first
        second = turns.claim()
        assert not second  # (a ranking and its helper: both turns busy)
        turns.release()
        with turns.take():
            third = turns.claim()
            assert not third  # two rankings
        again = turns.claim()
        assert again  # given back
        turns.release()
    one = Turns(1)
    with one.take():
        none = one.claim()
        assert not none  # (one core: no helper)


def test_no_helper_thread_while_a_ranking_waits_for_its_turn() -> None:
    """Under a load that fills the turns a ranking's helper would only take a core from the next
    ranking: while one is on its way to a turn (here: its turn's slot free, its deadline being
    asked), no helper is had; once it runs, and after, the count is as before. A ranking that gave
    up (its deadline passed) counts as neither."""
    import threading

    from tiermem.server.model.errors import DeadlineExceeded

    turns = Turns(2)
    with turns.take():
        asked, go = threading.Event(), threading.Event()

        def wanted() -> bool:  # (called with the slot taken, before the ranking runs)
            asked.set()
            return go.wait(5)

        def second() -> None:
            with turns.take(wanted):
                pass

        t = threading.Thread(target=second, daemon=True)
        t.start()
        assert asked.wait(5)
        refused = turns.claim()
        assert not refused  # one ranking runs, one is about to: no core spare
        go.set()
        t.join(5)
        assert not t.is_alive()
        spare = turns.claim()
        assert spare  # the second came and went: one ranking, one core spare
        turns.release()
        with pytest.raises(DeadlineExceeded), turns.take(lambda: False):
            pass
        assert (turns._busy, turns._waiting) == (1, 0)
    assert (turns._busy, turns._waiting) == (0, 0)


def test_a_helper_only_while_the_process_serves_about_one_call_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the transport's count of calls in flight (``Searcher.calls``), a search has a helper
    only while recent searches found about one call in flight (their own): two at once take the
    cores already. After an idle spell the count found then counts whole. The same answers."""
    import types

    rng = np.random.default_rng(41)
    e = _beside_engine(tmp_path / "data", rng)
    clock = [1000.0]  # (the searcher's monotonic time, moved by the test alone)
    monkeypatch.setattr(
        searcher_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0], sleep=time.sleep)
    )
    claims: list[bool] = []
    real_claim = e.searcher.turns.claim

    def claim(calls: int = 0) -> bool:
        got = real_claim(calls)
        claims.append(got)
        return got

    e.searcher.turns.claim = claim  # type: ignore[method-assign]
    q = _query(rng, text="deploy budget", strategy=FUSED)

    def searches(n: int) -> list[list[tuple[str, float]]]:
        out = []
        for _ in range(n):
            clock[0] += 0.002  # (searches 2 ms apart: the latest weighs 1/8)
            out.append([(h.record.id, h.score) for h in e.search(q)])
        return out

    try:
        alone = searches(3)
        assert claims == [True] * 3  # (no count: the turns decide)
        claims.clear()
        e.searcher.calls = lambda: 2  # two calls in flight
        busy = searches(20)
        assert not any(claims)  # two calls: no turn spare for a helper ...
        assert len(claims) == 7  # ... and once the running mean passed 1.25, none asked for
        claims.clear()
        e.searcher.calls = lambda: 1  # this search's call alone
        later = searches(20)
        assert 5 <= len(claims) <= 12 and all(claims)  # (asked again once the mean came back)
        e.searcher.calls = lambda: 2
        searches(20)
        claims.clear()
        e.searcher.calls = lambda: 1
        clock[0] += 1.0  # a second idle
        after_idle = searches(1)
        assert claims == [True]  # (the count after the idle spell counts whole)
        assert all(a == alone[0] for a in alone + busy + later + after_idle)
        _settled(e)
    finally:
        e.close()


def test_a_served_search_finds_its_own_call_in_flight(server_factory: Callable[..., RunningServer]) -> None:
    """Through a real server the searcher's count of calls in flight is the handlers': a search
    finds its own call there (and a helper's rule then sees one call at a time); idle, none."""
    from tiermem.client import MemoryClient

    running = server_factory()
    searcher = running.engine.searcher
    real, seen = searcher.calls, []

    def calls() -> int:
        seen.append(real())
        return seen[-1]

    def idle() -> bool:  # (a call leaves the count once its response is on its way)
        deadline = time.monotonic() + 5
        while real() != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return real() == 0

    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.create(NS, "a note about the deploy budget", id="m1")
        assert idle()
        searcher.calls = calls
        c.search(NS, "deploy budget", read_only=True)
    assert seen == [1]
    assert idle()


def test_fused_searches_rank_alike_with_the_vector_search_beside_the_keyword_pass(tmp_path: Path) -> None:
    """A fused search of HNSW runs its vector search on a helper thread while its keyword pass reads
    its best here (by default; ``Tuning.beside_min_rows``, when a core is spare): the same hits and scores
    as one after the other. The helper reads the indexes under the search's hold, so searches go on
    while the indexer takes their write lock again and again."""
    import threading

    rng = np.random.default_rng(21)
    data = tmp_path / "data"
    batch = [_memory(i, rng) for i in range(800)]
    for i, m in enumerate(batch):  # a rare word in some, a common one in most
        extra = (" zebra" if i % 9 == 0 else "") + (" deploy" if i % 4 else "")
        batch[i] = replace(m, content=m.content + extra)

    def answers(e: Engine) -> list[list[tuple[str, float, int, int]]]:
        qrng = np.random.default_rng(22)
        out = []
        for j in range(16):
            text = "zebra deploy " + WORDS[j % len(WORDS)]
            q = SearchQuery(**{**_query(qrng, text=text, strategy=FUSED).__dict__, "limit": 10})
            out.append([(h.record.id, h.score, h.vector_rank, h.keyword_rank) for h in e.search(q)])
        return out

    small = {"exact_search_max_rows": 64, "search_concurrency": 2}  # (HNSW at this size)
    e = _engine(data, FakeClock(), **small)
    try:
        e.create(batch, batch=True)
    finally:
        e.close()  # (both below start from its snapshots: the same postings, the same graph)
    e = _engine(data, FakeClock(), **small)  # (by default: every search of HNSW, a core spare)
    try:
        assert _helpers() == 0
        beside = answers(e)
        assert _helpers() == 1  # (the searches did run beside)
    finally:
        e.close()
    assert _helpers() == 0  # stopped with the engine
    e = _engine(data, FakeClock(), tuning=Tuning(beside_min_rows=0), **small)
    try:
        in_line = answers(e)
        assert _helpers() == 0
    finally:
        e.close()
    _assert_alike(beside, in_line)

    e = _engine(data, FakeClock(), tuning=Tuning(beside_min_rows=1), **small)
    stop = threading.Event()
    done: list[int] = []

    def write() -> None:  # new memories: the indexer takes the write lock for each chunk of adds
        i = 10_000
        while not stop.is_set():
            e.create([_memory(i + j, rng) for j in range(8)], batch=True)
            i += 8

    def search() -> None:
        qrng = np.random.default_rng(23)
        for j in range(60):
            e.search(_query(qrng, text="zebra deploy", strategy=FUSED))
            done.append(j)

    try:
        w = threading.Thread(target=write, daemon=True)
        w.start()
        s = threading.Thread(target=search, daemon=True)  # daemon: a deadlock fails the test
        s.start()
        s.join(120)
        stop.set()
        w.join(30)
        assert not s.is_alive(), f"searches stopped after {len(done)} of 60 beside the writes: deadlock"
        assert len(done) == 60
    finally:
        stop.set()
        e.close()


@pytest.mark.parametrize("strategy", [SIMILARITY, COMPREHENSIVE])
def test_hybrid_searches_rank_alike_with_their_candidate_search_beside_the_keyword_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, strategy: int
) -> None:
    """Hybrid on a weighted-sum strategy runs its candidate search on a helper thread while its
    keyword pass runs here, by default, when it searches HNSW and a core is spare: the same hits,
    scores and ranks as one after the other. A candidate search failing on the helper fails the
    search with its error and leaves no turn, hold or scratch behind."""
    import threading

    rng = np.random.default_rng(31)
    data = tmp_path / "data"
    batch = [_memory(i, rng) for i in range(600)]
    for i, m in enumerate(batch):  # a rare word in some, a common one in most
        extra = (" zebra" if i % 7 == 0 else "") + (" deploy" if i % 3 else "")
        batch[i] = replace(m, content=m.content + extra)
    small = {"exact_search_max_rows": 64, "search_concurrency": 2}  # (HNSW at this size)

    def answers(e: Engine) -> list[list[tuple[str, float, int, int]]]:
        qrng = np.random.default_rng(32)
        out = []
        for j in range(12):
            text = "zebra deploy " + WORDS[j % len(WORDS)]
            q = SearchQuery(
                **{**_query(qrng, text=text, strategy=strategy).__dict__, "hybrid": True, "limit": 10}
            )
            out.append([(h.record.id, h.score, h.vector_rank, h.keyword_rank) for h in e.search(q)])
        return out

    e = _engine(data, FakeClock(), **small)
    try:
        e.create(batch, batch=True)
    finally:
        e.close()  # (both below start from its snapshots: the same postings, the same graph)
    e = _engine(data, FakeClock(), tuning=Tuning(beside_min_rows=0), **small)
    try:
        in_line = answers(e)
        assert _helpers() == 0
    finally:
        e.close()
    e = _engine(data, FakeClock(), **small)
    try:
        beside = answers(e)
        assert _helpers() == 1  # (the candidate searches did run beside)
        with monkeypatch.context() as m:

            def fails(*a: object) -> None:
                raise RuntimeError("the helper's candidate search failed")

            m.setattr(CandidateSearch, "run", fails)
            q = SearchQuery(
                **{**_query(rng, text="zebra deploy", strategy=strategy).__dict__, "hybrid": True}
            )
            with pytest.raises(RuntimeError, match="candidate search failed"):
                e.search(q)
        _settled(e)
        real_run, finished = CandidateSearch.run, []

        def slow_run(self: CandidateSearch, *a: object) -> object:  # (still searching when bm25 fails)
            time.sleep(0.2)
            out = real_run(self, *a)  # type: ignore[arg-type]
            finished.append(threading.current_thread().name)
            return out

        def bm25_fails(*a: object, **kw: object) -> None:
            raise ValueError("the keyword pass failed")

        with monkeypatch.context() as m:
            m.setattr(CandidateSearch, "run", slow_run)
            m.setattr(searcher_module, "bm25", bm25_fails)
            with pytest.raises(ValueError, match="keyword pass failed"):
                e.search(q)
            assert len(finished) == 1 and finished[0].startswith("tiermem-beside")  # (waited for)
        _settled(e)
        assert answers(e) == beside
    finally:
        e.close()
    _assert_alike(beside, in_line)
    assert any(h[3] > 0 for a in beside for h in a)  # (keywords ranked some of them)


def test_a_search_interrupted_while_its_helper_runs_keeps_its_holds_until_the_helper_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedded engine searching on the main thread gets KeyboardInterrupt while its helper still
    searches: the interrupt is raised once the helper is done, so the indexes it reads stay held
    (a writer cannot change them under it), and nothing is left behind."""
    import signal
    import threading

    rng = np.random.default_rng(9)
    e = _beside_engine(tmp_path / "data", rng)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    indexes = [ix for sp in e.spaces.values() for ix in sp.indexes.values()]
    seen: list[list[int]] = []
    real_similar = e.searcher._most_similar
    real_run = CandidateSearch.run

    def slow(real: Callable[..., object], *a: object) -> object:
        time.sleep(0.6)  # (the interrupt comes at 0.2 s)
        seen.append([ix._lock._readers for ix in indexes])
        return real(*a)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for strategy, target, name, patched in (
            (FUSED, e.searcher, "_most_similar", lambda *a: slow(real_similar, *a)),
            (SIMILARITY, CandidateSearch, "run", lambda self, *a: slow(real_run, self, *a)),
        ):
            q = SearchQuery(
                **{**_query(rng, text="deploy budget", strategy=strategy).__dict__, "hybrid": True}
            )
            want = [(h.record.id, h.score) for h in e.search(q)]
            with monkeypatch.context() as m:
                m.setattr(target, name, patched)
                timer = threading.Timer(
                    0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
                )
                timer.start()
                try:
                    with pytest.raises(KeyboardInterrupt):
                        e.search(q)
                finally:
                    timer.join()
            assert len(seen) == 1 and all(r >= 1 for r in seen.pop())  # (held while the helper read)
            _settled(e)
            assert all(ix._lock._readers == 0 for ix in indexes)
            assert [(h.record.id, h.score) for h in e.search(q)] == want
    finally:
        signal.signal(signal.SIGINT, previous)
        e.close()


def _helpers() -> int:
    """The searchers' helper threads alive in this process."""
    import threading

    return sum(t.name.startswith("tiermem-beside") for t in threading.enumerate())


def _assert_alike(
    beside: list[list[tuple[str, float, int, int]]], in_line: list[list[tuple[str, float, int, int]]]
) -> None:
    """The same hits, ranks and scores (to float32 rounding), ten each, beside and in line."""
    assert [[h[0] for h in a] for a in beside] == [[h[0] for h in a] for a in in_line]
    assert [[h[2:] for h in a] for a in beside] == [[h[2:] for h in a] for a in in_line]
    for a, b in zip(beside, in_line, strict=True):
        np.testing.assert_allclose([h[1] for h in a], [h[1] for h in b], rtol=1e-6)
    assert all(len(a) == 10 for a in beside)


def _beside_engine(data: Path, rng: np.random.Generator) -> Engine:
    small = {"exact_search_max_rows": 64, "search_concurrency": 2}  # (HNSW at this size)
    e = _engine(data, FakeClock(), tuning=Tuning(beside_min_rows=1), **small)
    e.create([_memory(i, rng) for i in range(300)], batch=True)
    return e


def _settled(e: Engine) -> None:
    """No turn, helper, index read or dirty keyword scratch left behind by the searches before."""
    turns = e.searcher.turns
    assert turns._busy == 0 and turns._waiting == 0 and turns._helpers == 0
    assert all(ix._lock._readers == 0 for sp in e.spaces.values() for ix in sp.indexes.values())
    assert not any(scratch.acc.any() for scratch in kw_kernels._free)


def test_a_search_beside_that_fails_on_either_thread_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The vector search failing on the helper, or the keyword read-out here: the search fails with
    that error, the helper is waited for, turns, index holds and keyword scratch are given back, and
    the next search answers as before."""
    rng = np.random.default_rng(5)
    e = _beside_engine(tmp_path / "data", rng)
    try:
        q = _query(rng, text="deploy budget", strategy=FUSED)
        want = [(h.record.id, h.score) for h in e.search(q)]
        assert len(want) > 0

        def vector_fails(*a: object) -> None:
            raise RuntimeError("the helper's vector search failed")

        def keywords_fail(*a: object) -> None:
            raise ValueError("the keyword read-out failed")

        for target, name, fault, error in (
            (e.searcher, "_most_similar", vector_fails, RuntimeError),
            (kw_kernels.Sums, "best", keywords_fail, ValueError),
        ):
            real_similar = e.searcher._most_similar
            finished: list[str] = []

            def slow_similar(
                *a: object, real: Callable[..., object] = real_similar, done: list[str] = finished
            ) -> object:  # (still searching when the read-out fails)
                time.sleep(0.2)
                out = real(*a)
                done.append("vector search")
                return out

            with monkeypatch.context() as m:
                m.setattr(e.searcher, "_most_similar", slow_similar)
                m.setattr(target, name, fault)
                with pytest.raises(error):
                    e.search(q)
            assert finished == ([] if error is RuntimeError else ["vector search"])  # (waited for)
            _settled(e)
            assert [(h.record.id, h.score) for h in e.search(q)] == want
    finally:
        e.close()


def test_searches_after_the_helpers_stopped_run_in_line(tmp_path: Path) -> None:
    """A search that comes after the searcher's helpers stopped (an engine closing while calls are
    still in flight) runs its two steps in line: the same answer, no helper started again."""
    import threading

    rng = np.random.default_rng(6)
    e = _beside_engine(tmp_path / "data", rng)
    try:
        q = _query(rng, text="deploy budget", strategy=FUSED)
        want = [(h.record.id, h.score) for h in e.search(q)]
        e.searcher.close()
        assert [(h.record.id, h.score) for h in e.search(q)] == want
        assert not any(t.name.startswith("tiermem-beside") for t in threading.enumerate())
        _settled(e)
    finally:
        e.close()


def test_the_helper_reads_only_the_indexes_its_search_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index created for a new tier after the search took its holds (the writer adding to it) is
    not lent to the helper: its search there waits for the writer, as the search's own would."""
    import threading

    rng = np.random.default_rng(5)
    e = _beside_engine(tmp_path / "data", rng)
    release = threading.Event()
    seen: list[tuple[str, bool]] = []
    try:
        sp = e.spaces["m"]
        real_helps = e.searcher._beside_helps

        def helps_after_a_new_index(*a: object, **kw: object) -> object:  # (before the helper starts)
            index = e.state.index(sp, 1)  # (the first memory of a new tier gets its index)
            held = threading.Event()

            def writer() -> None:
                with index._lock.write():
                    held.set()
                    release.wait(0.3)

            threading.Thread(target=writer, daemon=True).start()
            held.wait(5)
            real_search = index.search

            def search(*args: object, **kwargs: object) -> object:
                out = real_search(*args, **kwargs)  # type: ignore[arg-type]
                # (which thread searched it, and was the writer still at it then?)
                seen.append((threading.current_thread().name, index._lock._writer))
                return out

            index.search = search  # type: ignore[method-assign]
            return real_helps(*a, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(e.searcher, "_beside_helps", helps_after_a_new_index)
        e.search(_query(rng, text="deploy budget", strategy=FUSED))
        assert len(seen) == 1
        assert seen[0][0].startswith("tiermem-beside")  # (searched by the helper)
        assert seen[0][1] is False  # it waited for the writer
    finally:
        release.set()
        e.close()
