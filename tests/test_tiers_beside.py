"""A ranking over a space whose memories sit in several tiers searches each tier's HNSW index; with
a spare core, the smaller ones run on a helper thread beside the largest (search/candidates.py).
The answers must be the same either way, and a failure must not leave the helper running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import create_memories, wait_indexed

from tiermem.client import MemoryClient
from tiermem.server.config import Tuning
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.search.candidates import Beside, _searched
from tiermem.server.transport.app import RunningServer

DIM = 16
PER_TIER = 400


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    v = rng.standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _helpers() -> set[threading.Thread]:
    """The search helper threads alive in this process (other tests' servers may leave some)."""
    return {t for t in threading.enumerate() if t.name.startswith("tiermem-beside")}


def _answers(port: int, queries: np.ndarray, as_of: float) -> list[list[tuple[str, float]]]:
    out = []
    with MemoryClient(f"127.0.0.1:{port}", timeout=30) as c:
        for q in queries:
            for strategy in ("similarity", None, "weighted"):  # (None: the default, fused)
                got = c.search(
                    "m",
                    q.tolist(),
                    embedding_model="t",
                    limit=10,
                    read_only=True,
                    strategy=strategy,
                    as_of=as_of,
                )
                out.append([(r.memory.id, round(r.score, 5)) for r in got])
    return out


def test_tiers_searched_beside_each_other_answer_as_in_line(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Two tiers of 400 memories, every index searched through HNSW: with a helper thread the
    three strategies answer exactly as a server that searches the tiers one after the other, and
    similarity finds the exact top 10."""
    rng = np.random.default_rng(21)
    vecs = _unit(rng, 2 * PER_TIER)
    queries = _unit(rng, 24)
    data = tmp_path / "data"
    graph = {"exact_entries": 0, "exact_per_k": 0}
    first = server_factory(
        data_dir=data,
        search_concurrency=2,
        exact_search_max_rows=0,
        tuning=Tuning(**graph, tiers_beside_min_entries=PER_TIER),
    )
    with MemoryClient(f"127.0.0.1:{first.port}", timeout=30) as c:
        for tier, lo in (("slow", 0), ("glacial", PER_TIER)):
            create_memories(c, vecs, range(lo, lo + PER_TIER), tier)
    wait_indexed(first)
    assert len(first.engine.spaces["t"].indexes) == 2
    before = _helpers()
    as_of = time.time()  # (recency as of one time in both servers)
    beside = _answers(first.port, queries, as_of)
    helpers = _helpers() - before
    assert len(helpers) == 1  # (the tiers' searches went to it)
    exact = np.argsort(-(vecs @ queries.T), axis=0, kind="stable")[:10].T
    for qi in range(len(queries)):
        assert [m for m, _ in beside[3 * qi]] == [f"m{i}" for i in exact[qi]]
    first.stop(5)  # (the snapshots it writes give the next server the same graphs)
    assert not any(t.is_alive() for t in helpers)
    before = _helpers()

    second = server_factory(
        data_dir=data,
        search_concurrency=2,
        exact_search_max_rows=0,
        tuning=Tuning(**graph, tiers_beside_min_entries=0),
    )
    wait_indexed(second)
    assert _answers(second.port, queries, as_of) == beside
    assert _helpers() <= before  # one after the other, on the search's thread


def test_a_failing_search_waits_for_its_helper() -> None:
    """When the search on the caller's thread fails, the error surfaces only after the helper's
    searches ended (they borrow the caller's holds on the indexes, which end with it)."""
    rng = np.random.default_rng(22)
    indexes = []
    for _ in range(2):
        idx = VectorIndex(DIM, 16, 64)
        idx.add(_unit(rng, 50), np.arange(50), np.arange(1, 51))
        indexes.append(idx)
    indexes[0].add(_unit(rng, 10), np.arange(50, 60), np.arange(51, 61))  # the larger: searched here
    release, ended = threading.Event(), threading.Event()
    query, allowed = _unit(rng, 1)[0], np.ones(60, np.bool_)

    def search(index: VectorIndex, count: int) -> tuple[np.ndarray, np.ndarray, float]:
        if index is indexes[0]:
            release.set()
            raise RuntimeError("planted")
        assert release.wait(10)
        threading.Event().wait(0.2)  # (the caller has raised by now, unless it waits)
        got = index.search(query, 5, allowed, 32, count)
        ended.set()
        return got

    with ThreadPoolExecutor(1) as pool:
        beside = Beside(pool.submit, 1)
        holds = [idx.reading() for idx in indexes]
        for hold in holds:
            hold.__enter__()
        try:
            with pytest.raises(RuntimeError, match="planted"):
                _searched(indexes, [-1, -1], beside, search)  # type: ignore[arg-type]
            assert ended.is_set()
        finally:
            for hold in holds:
                hold.__exit__(None, None, None)


def test_only_indexes_the_caller_holds_are_lent() -> None:
    """An index the caller does not hold (one created since it took its holds) is searched on the
    caller's thread, under a hold of its own: a helper could not borrow one."""
    rng = np.random.default_rng(23)
    indexes = []
    for n in (80, 60, 40):
        idx = VectorIndex(DIM, 16, 64)
        idx.add(_unit(rng, n), np.arange(n), np.arange(1, n + 1))
        indexes.append(idx)
    where: dict[int, str] = {}
    query, allowed = _unit(rng, 1)[0], np.ones(80, np.bool_)

    def search(index: VectorIndex, count: int) -> tuple[np.ndarray, np.ndarray, float]:
        where[indexes.index(index)] = threading.current_thread().name
        return index.search(query, 5, allowed, 32, count)

    here = threading.current_thread().name
    with ThreadPoolExecutor(1, thread_name_prefix="helper") as pool:
        beside = Beside(pool.submit, 1)
        with indexes[0].reading(), indexes[1].reading():  # not indexes[2]
            answers = _searched(indexes, [-1, -1, -1], beside, search)  # type: ignore[arg-type]
            assert where == {0: here, 1: where[1], 2: here} and where[1].startswith("helper")
            where.clear()
            _searched(indexes, [-1, 0, -1], beside, search)  # type: ignore[arg-type]
            assert where == {0: here, 1: here, 2: here}  # (no allowed row there: not worth a helper)
    for idx, (rows, _, _) in zip(indexes, answers, strict=True):
        assert rows.shape[0] == 5 and (rows < idx.n).all()


def test_a_job_cancelled_before_it_began_never_runs() -> None:
    from tiermem.server.search.searcher import _Lent

    ran, released = [], []
    lent = _Lent(lambda: ran.append(1), lambda: released.append(1))
    lent.cancel()
    assert lent.run() is None and ran == [] and released == [1]  # the core given back once
    began, finish = threading.Event(), threading.Event()

    def job() -> int:
        began.set()
        assert finish.wait(10)
        return 7

    lent2 = _Lent(job, lambda: released.append(2))
    worker = threading.Thread(target=lent2.run)
    worker.start()
    assert began.wait(10)
    threading.Timer(0.2, finish.set).start()
    lent2.cancel()  # (it began: cancel waits for it, and the job gives the core back itself)
    assert finish.is_set() and released == [1, 2]
    worker.join(10)
