"""The default (fused) ranking through a real server: relevance first, recency and importance deciding
between memories about equally relevant; the request's text matched whenever it is given. And the
keyword index, in memory, across restarts (snapshot, replay of later changes, or a full rebuild)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import FakeClock

from tiermem.client import MemoryClient
from tiermem.server.config import ServerConfig, Tuning
from tiermem.server.core.engine import Engine
from tiermem.server.index.keyword_index import RENUMBER_MIN
from tiermem.server.model.records import NewMemory
from tiermem.server.search.query import FUSED, SearchQuery
from tiermem.server.storage import snapshots
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

DAY = 86400.0
NS = "user:ana"
FILLER = [
    "The weather was rainy all of Tuesday.",
    "Tom watched the football match with his cousins.",
    "We ordered pizza for the team lunch.",
    "The train to Leeds was twenty minutes late.",
    "Maya adopted a grey cat from the shelter.",
]


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    return c


def _top(c: MemoryClient, query: str, **kw: object) -> list[str]:
    return [r.memory.content for r in c.search(NS, query, read_only=True, limit=5, **kw)]


@pytest.fixture
def ranked(server_factory: Callable[..., RunningServer]) -> tuple[MemoryClient, FakeClock]:
    clock = FakeClock()
    c = _client(server_factory(clock=clock))
    for i, text in enumerate(FILLER):
        c.create(NS, text, importance=0.5, create_time=clock.now - (10 + i) * DAY)
    return c, clock


@pytest.mark.parametrize("newer", ["Berlin", "Paris"])
def test_recency_decides_between_a_fact_and_the_fact_that_superseded_it(
    ranked: tuple[MemoryClient, FakeClock], newer: str
) -> None:
    c, clock = ranked
    older = "Paris" if newer == "Berlin" else "Berlin"
    c.create(NS, f"Ana lives in {older}.", importance=0.5, create_time=clock.now - 40 * DAY)
    c.create(NS, f"Ana lives in {newer}.", importance=0.5, create_time=clock.now - 2 * DAY)
    top = _top(c, "Where does Ana live?")
    assert top[:2] == [f"Ana lives in {newer}.", f"Ana lives in {older}."]


@pytest.mark.parametrize("important", ["Monday", "Friday"])
def test_importance_decides_between_equally_relevant_and_recent_memories(
    ranked: tuple[MemoryClient, FakeClock], important: str
) -> None:
    c, clock = ranked
    other = "Friday" if important == "Monday" else "Monday"
    when = clock.now - 3 * DAY
    c.create(NS, f"Ana meets Bob on {other}.", importance=0.2, create_time=when)
    c.create(NS, f"Ana meets Bob on {important}.", importance=0.9, create_time=when)
    assert _top(c, "When does Ana meet Bob?")[:2] == [
        f"Ana meets Bob on {important}.",
        f"Ana meets Bob on {other}.",
    ]


def test_relevance_wins_over_recency_and_importance(ranked: tuple[MemoryClient, FakeClock]) -> None:
    c, clock = ranked
    c.create(
        NS,
        "The deploy failed because of a missing environment variable.",
        importance=0.1,
        create_time=clock.now - 60 * DAY,
    )
    c.create(NS, "Ana booked the team offsite for next spring.", importance=1.0, create_time=clock.now)
    top = _top(c, "Why did the deploy fail?")
    assert top[0] == "The deploy failed because of a missing environment variable."
    # The raw weighted sum lets recency and importance decide instead: the difference the default makes.
    raw = _top(c, "Why did the deploy fail?", strategy="comprehensive")
    assert raw[0] == "Ana booked the team offsite for next spring."


def test_a_vector_query_with_its_text_uses_the_keywords_too(
    server_factory: Callable[..., RunningServer],
) -> None:
    c = _client(server_factory(clock=FakeClock()))
    rng = np.random.default_rng(3)
    q = rng.normal(size=8)
    near = q + 0.3 * rng.normal(size=8)
    far = rng.normal(size=8)
    c.create(NS, "notes about the quarterly budget", embedding=near, embedding_model="m")
    c.create(NS, "the kubernetes cluster upgrade plan", embedding=far, embedding_model="m")
    vector_only = c.search(NS, q, embedding_model="m", read_only=True, explain=True)
    assert vector_only[0].memory.content == "notes about the quarterly budget"
    assert all(r.explanation.keyword_score == 0 for r in vector_only)
    with_text = c.search(
        NS, q, embedding_model="m", keywords="kubernetes upgrade", read_only=True, explain=True
    )
    by_content = {r.memory.content: r for r in with_text}
    assert by_content["the kubernetes cluster upgrade plan"].explanation.keyword_score > 0
    assert with_text[0].memory.content == "the kubernetes cluster upgrade plan"
    assert with_text[0].explanation.strategy == pb.SEARCH_STRATEGY_FUSED


def _engine(data: Path, clock: FakeClock) -> Engine:
    cfg = ServerConfig(
        data_dir=data,
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        snapshot_on_shutdown=False,  # a close leaves LMDB newer than the snapshot, as kill -9 does
        search_records_access=False,
    )
    return Engine(cfg, clock=clock)


def _keyword_hits(e: Engine, text: str) -> list[str]:
    q = SearchQuery(
        namespaces=[NS], text=text, strategy=FUSED, hybrid=True, vector_weight=0.0, read_only=True
    )
    return sorted(h.record.id for h in e.search(q))


def test_keyword_index_across_restarts(tmp_path: Path) -> None:
    clock = FakeClock()
    data = tmp_path / "data"
    e = _engine(data, clock)
    e.create([NewMemory(namespace=NS, content=f"alpha note {i}", id=f"a{i}") for i in range(3)])
    e.snapshot()
    # After the snapshot: a new memory, a changed content, a deleted one.
    e.create([NewMemory(namespace=NS, content="beta note", id="b0")])
    e.update(NS, "a0", NewMemory(namespace=NS, content="omega note"), ["content"])
    e.delete(NS, "a2")
    want = {"alpha": ["a1"], "omega": ["a0"], "beta": ["b0"], "note": ["a0", "a1", "b0"]}
    assert {t: _keyword_hits(e, t) for t in want} == want
    e.close()
    e = _engine(data, clock)  # the snapshot, then the records changed after it
    assert {t: _keyword_hits(e, t) for t in want} == want
    e.close()
    written = list(data.joinpath("indexes").glob("columns*"))
    assert written  # the second start-up restored a snapshot
    for path in written:
        path.unlink()
    assert snapshots.load_columns(data / "indexes", e.store.instance) is None
    e = _engine(data, clock)  # no snapshot: every record decoded and posted again
    try:
        assert {t: _keyword_hits(e, t) for t in want} == want
    finally:
        e.close()


def test_keyword_index_compacts_after_deletes(tmp_path: Path) -> None:
    cfg = ServerConfig(
        data_dir=tmp_path / "data",
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        search_records_access=False,
        tuning=Tuning(compact_min_entries=8),
    )
    e = Engine(cfg, clock=FakeClock())
    try:
        e.create([NewMemory(namespace=NS, content=f"gamma item {i} delta", id=f"g{i}") for i in range(40)])
        for i in range(34):
            e.delete(NS, f"g{i}")
        before = e.state.keywords.postings_count
        hits = _keyword_hits(e, "gamma delta")
        assert hits == sorted(f"g{i}" for i in range(34, 40))
        e.compact_indexes()
        assert e.state.keywords.postings_count < before / 4  # the deleted rows' postings are gone
        assert _keyword_hits(e, "gamma delta") == hits
    finally:
        e.close()


def test_deleted_sessions_words_are_forgotten_and_searches_unchanged(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Session namespaces come and go: once deleted, their words leave the keyword index at the
    compaction DeleteNamespace starts (held until then, they grew with every word ever stored). The
    project's searches answer the same, and again after a restart from the snapshot."""
    data = tmp_path / "words"
    running = server_factory(data_dir=data, clock=FakeClock(), tuning=Tuning(compact_min_entries=8))
    c = _client(running)
    facts = ["Ana lives in Paris", "Ana moved to Berlin in May", "the cluster upgrade is planned", *FILLER]
    for text in facts:
        c.create(NS, text)
    for s in range(60):
        rows = [
            {
                "namespace": f"{NS}/task-{s}",
                "content": " ".join(f"t{s}n{i}w{j}" for j in range(12)) + " Paris",
            }
            for i in range(20)
        ]
        c.create_batch(rows)
    queries = ["where does Ana live", "Berlin", "cluster upgrade", "Paris", "football pizza"]

    def answers() -> list[list[tuple[str, float]]]:
        return [[(r.memory.content, r.score) for r in c.search(NS, q, read_only=True)] for q in queries]

    before = answers()
    found = c.search(f"{NS}/task-3", "t3n5w2", read_only=True)
    assert found and "t3n5w2" in found[0].memory.content.split()
    words = len(running.engine.state.keywords)
    for s in range(60):
        assert c.delete_namespace(f"{NS}/task-{s}") == 20
    left = len(running.engine.state.keywords)  # the project's words, and at most a few thousand unused
    assert left <= RENUMBER_MIN + 64 and left < words / 3
    assert c.search(f"{NS}/task-3", "t3n5w2", read_only=True) == []
    assert answers() == before
    c.create(f"{NS}/task-99", "a new session about Paris and Lisbon")
    assert [r.memory.content for r in c.search(f"{NS}/task-99", "Lisbon", read_only=True)] == [
        "a new session about Paris and Lisbon"
    ]
    c.close()
    running.engine.snapshot()
    running.stop(0)
    c = _client(server_factory(data_dir=data, clock=FakeClock(), tuning=Tuning(compact_min_entries=8)))
    assert answers() == before
    assert [r.memory.content for r in c.search(f"{NS}/task-99", "Lisbon", read_only=True)] == [
        "a new session about Paris and Lisbon"
    ]
    c.close()


def test_keywords_find_memories_no_vector_search_can(server_factory: Callable[..., RunningServer]) -> None:
    """A text query while the memories carry vectors of another model only: the built-in embedder's
    space holds nothing, yet the default ranking still finds them by their words."""
    c = _client(server_factory(clock=FakeClock()))
    rng = np.random.default_rng(5)
    c.create(NS, "the kubernetes cluster upgrade plan", embedding=rng.normal(size=8), embedding_model="m")
    c.create(NS, "notes about the quarterly budget", embedding=rng.normal(size=8), embedding_model="m")
    found = c.search(NS, "kubernetes upgrade", read_only=True)
    assert [r.memory.content for r in found] == ["the kubernetes cluster upgrade plan"]
    assert c.search(NS, "kubernetes upgrade", read_only=True, strategy="comprehensive") == []


def test_a_memory_without_a_vector_in_the_querys_space_is_not_lifted_by_negative_cosines(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A keyword match with no vector in the query's space (embedded in another space, or not
    yet) has no similarity: it sits at the bottom of the normalized range. It counted as a cosine
    of 0, which stands above every negative cosine among the candidates: there it ranked first
    over a memory with the same words and a real similarity, newer as well."""
    clock = FakeClock()
    c = _client(server_factory(clock=clock))
    q = np.eye(8)[0]
    elsewhere = c.create(NS, "kafka consumer lag")  # (the built-in embedder's space, not "m")
    clock.advance(60)
    against = c.create(NS, "kafka consumer lag", embedding=-q, embedding_model="m", allow_duplicates=True)
    clock.advance(60)
    c.create(NS, "the quarterly budget", embedding=0.6 * q + 0.8 * np.eye(8)[1], embedding_model="m")
    found = c.search(NS, q.tolist(), embedding_model="m", keywords="kafka consumer lag", read_only=True)
    order = [r.memory.id for r in found]
    assert order.index(against.id) < order.index(elsewhere.id), [(r.memory.content, r.score) for r in found]
    gone = next(r for r in found if r.memory.id == elsewhere.id)
    assert gone.relevance == 0.0  # (reported as before)
    floor = c.search(
        NS, q.tolist(), embedding_model="m", keywords="kafka", read_only=True, min_similarity=0.1
    )
    assert elsewhere.id not in [r.memory.id for r in floor]  # (a floor drops it, as a cosine of 0)


def test_the_default_without_relevance_orders_by_recency_and_importance(
    ranked: tuple[MemoryClient, FakeClock],
) -> None:
    c, clock = ranked
    c.create(NS, "a minor detail", importance=0.05, create_time=clock.now)
    c.create(NS, "a decision that matters", importance=0.99, create_time=clock.now)
    by_importance = c.search(NS, None, alpha=0.0, beta=0.0, gamma=1.0, read_only=True, limit=20)
    assert len(by_importance) == len(FILLER) + 2
    assert by_importance[0].memory.content == "a decision that matters"
    assert by_importance[-1].memory.content == "a minor detail"


@pytest.mark.parametrize("strategy", [None, "similarity"])
def test_each_candidate_list_is_as_deep_as_a_similarity_search(
    server_factory: Callable[..., RunningServer], strategy: str | None
) -> None:
    """The fused default and hybrid on a weighted strategy take max(2 * limit, 32) rows of each list:
    a memory 40th by similarity is in the vector list at limit 20 (40 deep), not at limit 10 (32 deep),
    where only its keywords find it."""
    clock = FakeClock()
    c = _client(server_factory(clock=clock))
    dim, angles = 8, np.linspace(0.0, 1.2, 60)  # memory i is the (i + 1)th most similar to e0
    specs = []
    for i, theta in enumerate(angles):
        v = np.zeros(dim)
        v[0], v[1] = np.cos(theta), np.sin(theta)
        text = f"Note {i} about the harbour." + (" The zeppelin landed." if i == 39 else "")
        specs.append({"namespace": NS, "content": text, "embedding": v.tolist(), "embedding_model": "t",
                      "importance": 0.5, "create_time": clock.now - DAY})  # fmt: skip
    c.create_batch(specs)
    query = np.eye(dim)[0].tolist()

    def ranks(limit: int) -> tuple[int, int]:
        hits = c.search(NS, query, embedding_model="t", keywords="zeppelin", limit=limit, explain=True,
                        read_only=True, hybrid=strategy is not None, strategy=strategy)  # fmt: skip
        found = {h.memory.content: h.explanation for h in hits}
        x = found["Note 39 about the harbour. The zeppelin landed."]
        return x.vector_rank, x.keyword_rank

    assert ranks(10) == (0, 1)  # (keywords alone found it)
    assert ranks(20) == (40, 1)
