"""Hybrid keyword + vector search (BM25 over the in-memory keyword index, reciprocal rank fusion) and
store-time deduplication."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import FakeClock, queued_behind_a_held_write

from tiermem.client import InvalidArgumentError, MemoryClient
from tiermem.client.errors import from_rpc_error
from tiermem.server.model.text import keyword_terms, words
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

DOCS = [
    "The SLA breach happened at 3am on the payments API",
    "service level agreement was violated overnight",
    "we had pizza for lunch with the team",
    "SLA review meeting moved to Friday, SLA dashboard updated",
    "deploy pipeline failed because of a missing env var",
    "the payments API latency doubled after the deploy",
] + [f"routine status note number {i} about nothing much" for i in range(24)]


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    return c


def _bm25(docs: dict[str, str], query: str, k1: float = 1.2, b: float = 0.75) -> dict[str, float]:
    """Okapi BM25 with idf = ln(1 + (N - df + 0.5) / (df + 0.5)), written from the formula, over the
    server's terms (stemmed, no stop words) with a memory's length in words."""
    terms = {i: keyword_terms(t) for i, t in docs.items()}
    lengths = {i: len(words(t)) for i, t in docs.items()}
    n = len(docs)
    avgdl = sum(lengths.values()) / n
    out: dict[str, float] = {}
    for term in keyword_terms(query):
        df = sum(term in t for t in terms.values())
        if not df:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, t in terms.items():
            tf = t[term]
            if tf:
                norm = k1 * (1 - b + b * lengths[i] / avgdl)
                out[i] = out.get(i, 0.0) + idf * tf * (k1 + 1) / (tf + norm)
    return out


def _hybrid(c: MemoryClient, query: str, **opts: float) -> list[pb.SearchResult]:
    req = pb.SearchMemoriesRequest(
        namespaces=["ns"],
        query_text=query,
        limit=10,
        explain=True,
        read_only=True,
        hybrid=pb.HybridOptions(enabled=True, **opts),
        strategy=pb.SEARCH_STRATEGY_COMPREHENSIVE,  # reciprocal rank fusion with the weighted sum
    )
    return list(c.stub.SearchMemories(req).results)


@pytest.fixture
def loaded(server_factory: Callable[..., RunningServer]) -> tuple[MemoryClient, dict[str, str]]:
    c = _client(server_factory(clock=FakeClock()))  # a fixed clock: recency identical across searches
    ids = {c.create("ns", t).id: t for t in DOCS}
    return c, ids


def test_keyword_ranking_is_bm25_and_fusion_is_rrf(loaded: tuple[MemoryClient, dict[str, str]]) -> None:
    c, docs = loaded
    results = _hybrid(c, "SLA breach", rrf_k=60)
    expected = _bm25(docs, "SLA breach")
    keyword = sorted(
        (r for r in results if r.explanation.keyword_rank), key=lambda r: r.explanation.keyword_rank
    )
    assert [r.memory.id for r in keyword] == sorted(expected, key=lambda i: -expected[i])
    for r in keyword:
        assert r.explanation.keyword_score == pytest.approx(expected[r.memory.id], rel=1e-4)
    for r in results:
        e = r.explanation
        want = (1 / (60 + e.vector_rank) if e.vector_rank else 0) + (
            1 / (60 + e.keyword_rank) if e.keyword_rank else 0
        )
        assert r.score == pytest.approx(want, rel=1e-5)
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)
    # The exact-term documents lead: they are in both lists.
    assert {results[0].memory.content, results[1].memory.content} == {DOCS[0], DOCS[3]}


def test_fusion_weights_and_keyword_only(loaded: tuple[MemoryClient, dict[str, str]]) -> None:
    c, docs = loaded
    only_kw = _hybrid(c, "payments API", vector_weight=0)
    expected = _bm25(docs, "payments API")
    assert [r.memory.id for r in only_kw] == sorted(expected, key=lambda i: -expected[i])
    only_vec = _hybrid(c, "payments API", keyword_weight=0)
    plain = c.stub.SearchMemories(
        pb.SearchMemoriesRequest(namespaces=["ns"], query_text="payments API", limit=10, read_only=True)
    ).results
    assert [r.memory.id for r in only_vec] == [r.memory.id for r in plain]


@pytest.mark.parametrize("strategy", ["similarity", "comprehensive", "weighted", "fast_first", "fused"])
def test_keyword_hits_count_where_no_allowed_memory_has_a_vector_in_the_querys_space(
    server_factory: Callable[..., RunningServer], strategy: str
) -> None:
    """A memory found by its keywords alone is a result whatever the vector side finds: also when
    the filter (or the namespace) leaves no memory with a vector in the query's space. It was
    dropped then, under every strategy but the fused one."""
    c = _client(server_factory(clock=FakeClock()))
    note = c.create("h", "zorp blick quarterly report", kind="note")  # in the built-in embedder's space
    lunch = c.create(
        "h", "unrelated text about lunch", kind="fact", embedding=[1, 0, 0, 0], embedding_model="m4"
    )
    opts = dict(embedding_model="m4", keywords="zorp", hybrid=True, read_only=True, strategy=strategy)
    assert note.id in [h.memory.id for h in c.search("h", [1, 0, 0, 0], **opts)]
    assert [h.memory.id for h in c.search("h", [1, 0, 0, 0], kinds=["note"], **opts)] == [note.id]
    c.delete("h", lunch.id)
    assert [h.memory.id for h in c.search("h", [1, 0, 0, 0], **opts)] == [note.id]


@pytest.mark.parametrize("strategy", ["similarity", "comprehensive", "weighted", "fast_first", "fused"])
def test_a_text_search_whose_space_holds_nothing_finds_by_keywords_alone(
    server_factory: Callable[..., RunningServer], strategy: str
) -> None:
    """Every memory brings its own vector, none of the server's embedder: a hybrid text search (its
    vector in an empty space) returns what its keywords match, not every memory."""
    c = _client(server_factory(clock=FakeClock()))
    zorp = c.create("h", "zorp blick quarterly report", embedding=[1, 0, 0, 0], embedding_model="m4")
    c.create("h", "unrelated text about lunch", embedding=[0, 1, 0, 0], embedding_model="m4")
    found = c.search("h", "zorp", hybrid=True, read_only=True, strategy=strategy)
    assert [h.memory.id for h in found] == [zorp.id]


def test_keyword_index_follows_updates_and_deletes(
    loaded: tuple[MemoryClient, dict[str, str]], server_factory: Callable[..., RunningServer]
) -> None:
    c, docs = loaded
    sla = next(i for i, t in docs.items() if t.startswith("SLA review"))
    c.update("ns", sla, content="quarterly planning notes")
    assert sla not in {r.memory.id for r in _hybrid(c, "SLA", vector_weight=0)}
    assert sla in {r.memory.id for r in _hybrid(c, "quarterly planning", vector_weight=0)}
    breach = next(i for i, t in docs.items() if "breach" in t)
    c.delete("ns", breach)
    assert _hybrid(c, "breach", vector_weight=0) == []


@pytest.mark.parametrize(
    "strategy",
    [pb.SEARCH_STRATEGY_SIMILARITY, pb.SEARCH_STRATEGY_COMPREHENSIVE, pb.SEARCH_STRATEGY_FUSED],
)
def test_min_similarity_drops_keyword_hits_below_it(
    loaded: tuple[MemoryClient, dict[str, str]], strategy: int
) -> None:
    """The floor holds for the keyword list's rows too: a memory found by its words but less similar
    than min_similarity is not a result, whichever strategy fuses the lists."""
    c, _ = loaded

    def search(floor: float | None) -> list[pb.SearchResult]:
        req = pb.SearchMemoriesRequest(
            namespaces=["ns"], query_text="SLA breach payments", limit=10, read_only=True, explain=True,
            hybrid=pb.HybridOptions(enabled=True), strategy=strategy, min_similarity=floor,
        )  # fmt: skip
        return list(c.stub.SearchMemories(req).results)

    plain = search(None)
    keyword_hits = sorted(r.relevance for r in plain if r.explanation.keyword_rank)
    assert len(keyword_hits) >= 2
    floor = (keyword_hits[0] + keyword_hits[-1]) / 2  # some keyword hits on each side of it
    assert any(r.relevance < floor for r in plain)
    kept = search(floor)
    assert kept and all(r.relevance >= floor for r in kept)
    assert {r.memory.id for r in plain if r.relevance >= floor} <= {r.memory.id for r in kept}


def _search(c: MemoryClient, req: pb.SearchMemoriesRequest) -> pb.SearchMemoriesResponse:
    try:
        return c.stub.SearchMemories(req)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def test_hybrid_needs_query_text_and_valid_options(loaded: tuple[MemoryClient, dict[str, str]]) -> None:
    c, _ = loaded
    with pytest.raises(InvalidArgumentError) as info:
        _search(
            c,
            pb.SearchMemoriesRequest(
                namespaces=["ns"],
                query_embedding=[1.0] * 384,
                embedding_model="tiermem-hash-v1",
                hybrid=pb.HybridOptions(enabled=True),
            ),
        )
    assert info.value.fields == ["query_text"]
    # (out of range, and values whose float32 fused shares would round to 0: no results at all)
    for opts, field in (
        ({"rrf_k": -1}, "hybrid.rrf_k"),
        ({"rrf_k": 1e46}, "hybrid.rrf_k"),
        ({"vector_weight": -1}, "hybrid.vector_weight"),
        ({"vector_weight": 1e-46}, "hybrid.vector_weight"),
        ({"keyword_weight": 1e-46}, "hybrid.keyword_weight"),
        ({"vector_weight": 0, "keyword_weight": 0}, "hybrid.keyword_weight"),
    ):
        with pytest.raises(InvalidArgumentError) as info:
            _search(
                c,
                pb.SearchMemoriesRequest(
                    namespaces=["ns"],
                    query_text="x",
                    strategy=pb.SEARCH_STRATEGY_COMPREHENSIVE,  # (fused by reciprocal rank)
                    hybrid=pb.HybridOptions(enabled=True, **opts),
                ),
            )
        assert info.value.fields == [field]
    for opts, field in (
        ({"rrf_k": -1}, "hybrid.rrf_k"),
        ({"vector_weight": 0, "keyword_weight": 0}, "hybrid.keyword_weight"),
    ):
        with pytest.raises(InvalidArgumentError) as info:  # (whatever the strategy)
            _search(
                c,
                pb.SearchMemoriesRequest(
                    namespaces=["ns"], query_text="x", hybrid=pb.HybridOptions(enabled=True, **opts)
                ),
            )
        assert info.value.fields == [field]

    # The fused strategy takes the weights as shares of relevance and no rrf_k: not bounded there.
    loose = pb.HybridOptions(enabled=True, rrf_k=1e7, vector_weight=1e-7, keyword_weight=1e-7)
    assert _search(c, pb.SearchMemoriesRequest(namespaces=["ns"], query_text="x", hybrid=loose)).results
    # At the limits, every strategy still ranks what matches.
    for strategy in (pb.SEARCH_STRATEGY_FUSED, pb.SEARCH_STRATEGY_COMPREHENSIVE):
        edge = pb.HybridOptions(enabled=True, rrf_k=1e6, vector_weight=1e-6, keyword_weight=1e-6)
        got = _search(
            c, pb.SearchMemoriesRequest(namespaces=["ns"], query_text="x", strategy=strategy, hybrid=edge)
        )
        assert len(got.results) > 0, strategy


def _a_batch_repeating_itself(c: MemoryClient, namespace: str) -> None:
    """Within one batch the second copy reinforces the first."""
    batch = c.stub.BatchCreateMemories(
        pb.BatchCreateMemoriesRequest(
            memories=[
                pb.Memory(namespace=namespace, content="standup at 9"),
                pb.Memory(namespace=namespace, content="Standup at 9"),
            ]
        )
    )
    assert list(batch.deduplicated) == [False, True] and batch.memories[0].id == batch.memories[1].id


def test_exact_duplicates_reinforce_instead_of_adding(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    running = server_factory(data_dir=tmp_path / "d")
    with _client(running) as c:
        first = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(
                    namespace="ns", content="The  user prefers DARK mode", importance=0.4, tags=["ui"]
                )
            )
        )
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(
                    namespace="ns", content="the user prefers dark   mode", importance=0.9, tags=["prefs"]
                )
            )
        )
        assert again.deduplicated and not first.deduplicated
        assert again.memory.id == first.memory.id
        assert again.memory.importance == pytest.approx(0.9)  # raised, never lowered
        assert again.memory.access_count == 1
        assert list(again.memory.tags) == ["ui", "prefs"]
        lower = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content="THE USER PREFERS DARK MODE", importance=0.1)
            )
        )
        assert lower.deduplicated and lower.memory.importance == pytest.approx(0.9)
        # Other namespaces, explicit ids and allow_duplicates store new memories.
        other = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns2", content="the user prefers dark mode"))
        )
        assert not other.deduplicated
        forced = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content="the user prefers dark mode"), allow_duplicates=True
            )
        )
        assert not forced.deduplicated and forced.memory.id != first.memory.id
        named = c.create("ns", "the user prefers dark mode", id="explicit")
        assert named.id == "explicit"
        _a_batch_repeating_itself(c, "ns")
        assert c.stats("ns").memory_count == 4  # dark mode x3 (first, forced, explicit) + standup
    running.stop(0)
    running = server_factory(data_dir=tmp_path / "d")  # the content index is durable
    with _client(running) as c:
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="standup AT 9"))
        )
        assert again.deduplicated


def test_a_duplicate_of_another_kind_is_stored_and_a_protected_namespace_is_reinforced_only_with_confirm(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Deduplication matches memories of the same kind: a summary or a reflection worded as an
    observation is stored as itself (it was swallowed: no summary, the reflection's accumulator
    never reset). In a protected namespace a duplicate reinforces what it duplicates only with
    confirm, and otherwise changes nothing."""
    from tiermem.client import FailedPreconditionError

    with _client(server_factory()) as c:
        c.create("ns", "Deploy failed on Friday.", importance=0.9)
        c.create("ns", "ana wants short answers", importance=0.9)
        assert c.reflection_candidates("ns").accumulated_importance == pytest.approx(1.8)
        summary = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content="deploy failed on friday.", kind="summary")
            )
        )
        reflection = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content="Ana wants short answers", kind="reflection")
            )
        )
        assert not summary.deduplicated and summary.memory.kind == "summary"
        assert not reflection.deduplicated and reflection.memory.kind == "reflection"
        assert c.reflection_candidates("ns").accumulated_importance == 0.0
        assert sorted(m.kind for m in c.list_memories("ns")) == [
            "observation",
            "observation",
            "reflection",
            "summary",
        ]
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content="ANA WANTS SHORT ANSWERS", kind="reflection")
            )
        )
        assert again.deduplicated and again.memory.id == reflection.memory.id  # (the same kind still is)
        # The reflection stored after it does not hide the observation of the same words.
        observed = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="ana wants SHORT answers"))
        )
        assert observed.deduplicated and observed.memory.kind == "observation"
        c.delete("ns", reflection.memory.id)  # (its entry went; the observation's stays)
        assert c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="ana wants short answers"))
        ).deduplicated
        # A batch repeating itself in a protected namespace changes nothing stored before it.
        c.update_namespace_config("kept2", protected=True)
        _a_batch_repeating_itself(c, "kept2")

        c.create("kept", "obs p", id="p", importance=0.1)
        c.update_namespace_config("kept", protected=True)
        with pytest.raises(FailedPreconditionError) as e:
            c.create("kept", "OBS P", importance=0.9, tags=["new"])
        assert e.value.reason == "NAMESPACE_PROTECTED" and "'p'" in str(e.value)
        [p] = c.list_memories("kept")
        assert (round(p.importance, 6), list(p.tags), p.access_count) == (0.1, [], 0)
        confirmed = c.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="kept", content="OBS P", importance=0.9, tags=["new"]),
                confirm=True,
            )
        )
        assert confirmed.deduplicated and confirmed.memory.importance == pytest.approx(0.9)


def test_near_duplicates_in_one_batch_and_one_commit_group(
    server_factory: Callable[..., RunningServer],
) -> None:
    """With dedup_similarity, a near copy of a memory created earlier in the same batch, or in a
    write committed in the same group (not in any index yet), reinforces it; an unrelated memory,
    another namespace or another model does not."""
    from typing import Any

    running = server_factory()
    rng = np.random.default_rng(11)
    v = rng.normal(size=8)
    near = [v + 0.01 * rng.normal(size=8) for _ in range(2)]
    far = rng.normal(size=8)

    def mem(content: str, vec: np.ndarray, ns: str = "ns", model: str = "m8") -> pb.Memory:
        return pb.Memory(
            namespace=ns, content=content, embedding=list(vec), embedding_model=model, importance=0.2
        )

    with _client(running) as c:
        batch = c.stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(
                memories=[
                    mem("original", v),
                    mem("unrelated", far),
                    mem("near copy", near[0]),
                    mem("near copy elsewhere", near[0], ns="ns2"),
                    mem("near copy, other model", near[0], model="n8"),
                    pb.Memory(
                        **{
                            **dict(namespace="ns", content="near copy 2", embedding=list(near[1])),
                            "embedding_model": "m8",
                            "importance": 0.7,
                        }
                    ),
                ],
                dedup_similarity=0.99,
            )
        )
        assert list(batch.deduplicated) == [False, False, True, False, False, True]
        ids = [m.id for m in batch.memories]
        assert ids[2] == ids[5] == ids[0] and len({ids[0], ids[1], ids[3], ids[4]}) == 4
        assert c.stats("ns").memory_count == 3  # original, unrelated, the other model's
        got = c.get("ns", ids[0])
        assert got.access_count == 2 and got.importance == pytest.approx(0.7)
        # Every item that is this memory answers with its final state, the first one too.
        for i in (0, 2, 5):
            assert batch.memories[i].SerializeToString(deterministic=True) == got.SerializeToString(
                deterministic=True
            ), i
        # The reinforced importance is what searches rank by, too.
        hit = c.search("ns", list(v), embedding_model="m8", limit=1, read_only=True)[0]
        assert hit.memory.id == ids[0] and hit.importance == pytest.approx(0.7, rel=1e-3)

        # Calls queued behind a held write commit in one group, in order.
        eng = running.engine

        def one_group(calls: list[Callable[[], Any]]) -> list[Any]:
            out, groups = queued_behind_a_held_write(eng.writer, calls)
            assert groups == 2  # the held write, then the calls together
            return out

        def create(content: str, vec: np.ndarray) -> Callable[[], pb.CreateMemoryResponse]:
            req = pb.CreateMemoryRequest(memory=mem(content, vec), dedup_similarity=0.99)
            return lambda: c.stub.CreateMemory(req)

        # The second of two creates in one group finds the first.
        w = rng.normal(size=8)
        out = one_group([create("queued 0", w), create("queued 1", w + 0.01 * rng.normal(size=8))])
        assert [r.deduplicated for r in out] == [False, True]
        assert out[0].memory.id == out[1].memory.id
        assert c.stats("ns").memory_count == 4
        # A memory whose vector an update in the same group changed is no longer a near copy.
        u = rng.normal(size=8)
        first = c.create("ns", "to be changed", embedding=u, embedding_model="m8")
        out = one_group(
            [
                lambda: c.update("ns", first.id, embedding=list(rng.normal(size=8)), embedding_model="m8"),
                create("near the old vector", u + 0.01 * rng.normal(size=8)),
            ]
        )
        assert not out[1].deduplicated and out[1].memory.id != first.id


def test_near_duplicates_by_similarity(server_factory: Callable[..., RunningServer]) -> None:
    with _client(server_factory()) as c:
        rng = np.random.default_rng(3)
        v = rng.normal(size=8)
        base = c.create("ns", "original", embedding=v, embedding_model="m8")
        close = v + 0.01 * rng.normal(size=8)
        far = rng.normal(size=8)
        cos = float(np.dot(v, close) / np.linalg.norm(v) / np.linalg.norm(close))
        assert cos > 0.99

        def create(content: str, vec: np.ndarray, threshold: float | None) -> pb.CreateMemoryResponse:
            req = pb.CreateMemoryRequest(
                memory=pb.Memory(namespace="ns", content=content, embedding=list(vec), embedding_model="m8")
            )
            if threshold is not None:
                req.dedup_similarity = threshold
            return c.stub.CreateMemory(req)

        assert not create("near copy", close, None).deduplicated  # no threshold: exact content only
        hit = create("near copy 2", close, 0.99)
        assert hit.deduplicated and hit.memory.id in {base.id} | {m.id for m in c.list_memories("ns")}
        assert not create("unrelated", far, 0.99).deduplicated
        # Of the same kind only: a fact nearer than the observation is passed over for it.
        req = pb.CreateMemoryRequest(
            memory=pb.Memory(
                namespace="k", content="a", kind="observation", embedding=list(v), embedding_model="m8"
            )
        )
        first = c.stub.CreateMemory(req).memory
        req.memory.content, req.memory.kind, req.memory.embedding[:] = "b", "fact", list(close)
        req.dedup_similarity = 0.99
        assert not c.stub.CreateMemory(req).deduplicated
        req.memory.content, req.memory.kind = "c", "observation"
        near = c.stub.CreateMemory(req)
        assert near.deduplicated and near.memory.id == first.id
        with pytest.raises(InvalidArgumentError) as info:
            c.create("ns", "x", dedup_similarity=1.5)
        assert info.value.fields == ["dedup_similarity"]


def test_the_content_index_holds_one_entry_a_memory_whatever_its_updates(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A content update moves the memory's entry in the exact-duplicate index (the old one stayed:
    one more entry for every update, never reclaimed); the old content no longer finds it, the
    new one does."""
    running = server_factory()
    store = running.engine.state.store

    def entries() -> int:
        with store.read() as txn:
            return int(txn.stat(store.contents)["entries"])

    with _client(running) as c:
        m = c.create("ns", "version 0 of the note")
        for i in range(1, 11):
            c.update("ns", m.id, content=f"version {i} of the note")
        assert entries() == 1
        assert not c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="version 3 of the note"))
        ).deduplicated
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="VERSION 10 of the note"))
        )
        assert again.deduplicated and again.memory.id == m.id
        assert entries() == 2
        c.delete_namespace("ns")
        assert entries() == 0


def test_every_copy_is_found_by_deduplication_and_an_old_index_is_built_again(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Copies of one content and kind (allow_duplicates, a client id, an import) are each in the
    exact-duplicate index: deleting any of them leaves the others found, the oldest first. A data
    directory an earlier version wrote (one memory a content, by words alone before that) gets the
    index built from its records at its next open, the old one dropped."""
    import hashlib

    import lmdb

    from tiermem.server.storage.keys import normalize

    def create(c: MemoryClient, content: str, **kw: object) -> pb.CreateMemoryResponse:
        return c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content=content, **kw))
        )

    data = tmp_path / "d"
    running = server_factory(data)
    with _client(running) as c:
        first = c.create("ns", "ana likes tea")
        copies = [
            c.stub.CreateMemory(
                pb.CreateMemoryRequest(
                    memory=pb.Memory(namespace="ns", content="Ana likes tea"), allow_duplicates=True
                )
            ).memory.id
            for _ in range(2)
        ]
        c.create("ns", "ANA LIKES TEA", id="client-copy")  # (a client id: stored beside it)
        c.delete("ns", copies[0])
        again = create(c, "ANA likes tea")
        assert again.deduplicated and again.memory.id == first.id
        c.delete("ns", first.id)  # (the oldest copy left is found)
        again = create(c, "ana  likes tea")
        assert again.deduplicated and again.memory.id == copies[1]
        c.delete("ns", copies[1])
        assert create(c, "ana likes TEA").memory.id == "client-copy"
        c.delete("ns", "client-copy")
        assert not create(c, "ana likes tea").deduplicated  # (none left: stored)
        reflection = create(c, "ana likes tea", kind="reflection").memory.id
    running.stop(None)
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:  # (as an earlier version left it: one entry, the reflection's)
        meta = env.open_db(b"meta", txn=txn)
        txn.drop(env.open_db(b"content_rids", txn=txn, dupsort=True, dupfixed=True), delete=True)
        txn.delete(b"content_rids", db=meta)
        old = env.open_db(b"contents", txn=txn)
        key = b"ns\x00" + hashlib.blake2b(normalize("ana likes tea").encode(), digest_size=16).digest()
        txn.put(key, txn.get(b"ns\x00" + reflection.encode(), db=env.open_db(b"ids", txn=txn)), db=old)
    env.close()
    running = server_factory(data)
    with _client(running) as c:
        again = create(c, "Ana Likes Tea")
        assert again.deduplicated and again.memory.kind == "observation"
        assert sorted(m.kind for m in c.list_memories("ns")) == ["observation", "reflection"]
    with pytest.raises(lmdb.NotFoundError):
        running.engine.state.store.env.open_db(b"contents", create=False)
    # Opened by an earlier version again, which sets its flag and stores memories only in its own
    # index (here: this index emptied): the next open builds this one again.
    with _client(running) as c:
        later = c.create("ns", "bo likes coffee").id
    running.stop(None)
    env = lmdb.open(str(data / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        txn.put(b"contents_by_kind", b"1", db=meta)
        txn.drop(env.open_db(b"content_rids", txn=txn, dupsort=True, dupfixed=True), delete=False)
        env.open_db(b"contents", txn=txn)
    env.close()
    running = server_factory(data)
    with _client(running) as c:
        again = create(c, "BO likes coffee")
        assert again.deduplicated and again.memory.id == later
    with pytest.raises(lmdb.NotFoundError):
        running.engine.state.store.env.open_db(b"contents", create=False)


def test_an_upgrade_at_open_grows_a_map_with_no_room_left(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A directory that grew past ``map_size`` while serving opens with a map of exactly the pages
    in use. The one-time build of the exact-duplicate index at its first open by this version needs
    more: the map grows (up to ``max_map_size``) instead of the start-up failing; beyond
    ``max_map_size`` the start-up fails with a message naming it, having built nothing."""
    import lmdb

    from tiermem.server.model.errors import StorageError

    data = tmp_path / "d"
    running = server_factory(data)
    with _client(running) as c:
        for i in range(0, 3000, 500):
            c.create_batch(
                [{"namespace": "ns", "content": f"note {j} about the launch"} for j in range(i, i + 500)]
            )
    running.stop(None)
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, map_size=1 << 30)
    with env.begin(write=True) as txn:  # (as an earlier version left it, then its pages filled)
        meta = env.open_db(b"meta", txn=txn)
        txn.drop(env.open_db(b"content_rids", txn=txn, dupsort=True, dupfixed=True), delete=True)
        txn.delete(b"content_rids", db=meta)
        env.open_db(b"contents", txn=txn)
    for i in range(3):  # (the pages the drop freed become reusable, and the filler takes them)
        with env.begin(write=True) as txn:
            txn.put(b"aged", bytes(i))
    with env.begin(write=True) as txn:
        filler = env.open_db(b"filler", txn=txn)
        for i in range(4000):
            txn.put(i.to_bytes(4, "big"), bytes(1000), db=filler)
    in_use = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    env.close()
    with pytest.raises(StorageError, match="max_map_size"):
        server_factory(data, map_size=1 << 20, max_map_size=in_use)
    env = lmdb.open(str(data / "lmdb"), max_dbs=16, map_size=1 << 30)
    with env.begin() as txn:  # (the build wrote nothing: the old index stands, the new one is empty)
        assert txn.stat(env.open_db(b"contents", txn=txn, create=False))["entries"] == 0
        assert txn.stat(env.open_db(b"content_rids", txn=txn, create=False, dupsort=True))["entries"] == 0
        assert txn.get(b"content_rids", db=env.open_db(b"meta", txn=txn, create=False)) is None
    env.close()
    running = server_factory(data, map_size=1 << 20, max_map_size=1 << 30)
    with _client(running) as c:
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="Note 7 about the LAUNCH"))
        )
        assert again.deduplicated
        assert sum(1 for _ in c.list_memories("ns", page_size=1000)) == 3000
    with pytest.raises(lmdb.NotFoundError):
        running.engine.state.store.env.open_db(b"contents", create=False)


def test_an_expired_copy_does_not_hide_a_live_one_from_deduplication(
    server_factory: Callable[..., RunningServer],
) -> None:
    """An expired memory (not swept yet) of the same words and kind is passed over: a later create
    reinforces the oldest live copy, in separate calls and within one batch."""
    running = server_factory()
    with _client(running) as c:

        def create(content: str, **kw: object) -> pb.CreateMemoryResponse:
            m = pb.Memory(namespace="r", content=content, **kw)  # type: ignore[arg-type]
            return c.stub.CreateMemory(pb.CreateMemoryRequest(memory=m))

        gone = pb.Memory(namespace="r", content="ping")
        gone.expire_time.FromSeconds(978307200)  # (2001: expired at once)
        c.stub.CreateMemory(pb.CreateMemoryRequest(memory=gone))
        live = create("ping")
        assert not live.deduplicated
        again = create("PING")
        assert again.deduplicated and again.memory.id == live.memory.id
        batch = c.stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(
                memories=[pb.Memory(namespace="r", content="ping ") for _ in range(2)]
            )
        )
        assert [m.id for m in batch.memories] == [live.memory.id] * 2
        assert [m.id for m in c.list_memories("r")] == [live.memory.id]


def test_a_duplicate_whose_tags_would_pass_the_limit_is_refused_and_changes_nothing(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Reinforcing merges the duplicate's tags into the memory's: past max_tags the merge was cut
    and the caller's new tags were lost without a word. It is INVALID_ARGUMENT on the duplicate's
    tags now, and nothing of the create (or of its batch) is stored."""
    c = _client(server_factory(max_tags=8))
    first = c.create("ns", "the deploy runbook lives in the wiki", tags=[f"t{i}" for i in range(6)])
    merged = c.create("ns", "The deploy runbook lives in the WIKI", tags=["t0", "new1", "new2"])
    assert merged.id == first.id and list(merged.tags) == [*(f"t{i}" for i in range(6)), "new1", "new2"]
    with pytest.raises(InvalidArgumentError) as refused:
        c.create("ns", "the deploy runbook lives in the wiki", tags=["new3"])
    assert refused.value.fields == ["memory.tags"] and refused.value.reason == "FIELD_TOO_LARGE"
    assert "9 tags, the limit is 8" in refused.value.message
    with pytest.raises(InvalidArgumentError) as refused:
        c.create_batch(
            [
                {"namespace": "ns", "content": "a fresh memory of the batch"},
                {"namespace": "ns", "content": "the deploy runbook lives in the wiki", "tags": ["a", "b"]},
            ]
        )
    assert refused.value.fields == ["memories[1].tags"]
    kept = c.get("ns", first.id)
    assert list(kept.tags) == list(merged.tags) and kept.access_count == merged.access_count == 1
    assert [m.content for m in c.list_memories("ns")] == [first.content]
    again = c.create("ns", "the deploy runbook lives in the wiki", tags=["new2"])  # (within the limit)
    assert again.id == first.id and again.access_count == 2
