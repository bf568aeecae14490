"""Server-side embedders: an OpenAI-compatible HTTP endpoint (a real local HTTP server in the test),
the LRU cache, and memories stored while the embedder fails: findable by keyword, embedded later."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from tiermem.client import MemoryClient, UnavailableError
from tiermem.server.embedding.hashing import HashEmbedder
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

DIM = 16
REFERENCE = HashEmbedder(DIM, "reference")  # what the fake endpoint answers with


class FakeEmbeddings:
    """An OpenAI-compatible /v1/embeddings endpoint that can be switched to failing."""

    def __init__(self) -> None:
        self.failing = False
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if fake.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                data = [
                    {"index": i, "embedding": REFERENCE.embed(t).tolist()}
                    for i, t in enumerate(body["input"])
                ]
                payload = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
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

    def start(**kw: object) -> RunningServer:
        return server_factory(
            embedder="openai",
            embedder_url=endpoint.url,
            embedder_model="fake-embed",
            embedder_api_key_env="TEST_EMBEDDER_KEY",
            embedder_timeout_seconds=5.0,
            **kw,
        )

    return start


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
    with pytest.raises(ValueError, match="embedder must be"):
        server_factory(embedder="nope")


def test_sentence_transformers_embedder_loads_a_local_model(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The optional extra is not installed here: a stand-in module checks the wiring (local path,
    no hub access, encode per text)."""
    import sys
    import types

    loaded: list[tuple[str, bool]] = []

    class FakeSentenceTransformer:
        def __init__(self, path: str, local_files_only: bool = False) -> None:
            loaded.append((path, local_files_only))

        def encode(self, text: str) -> np.ndarray:
            return REFERENCE.embed(text)

    monkeypatch.setitem(
        sys.modules,
        "sentence_transformers",
        types.SimpleNamespace(SentenceTransformer=FakeSentenceTransformer),
    )
    model_dir = tmp_path / "all-MiniLM-L6-v2"
    model_dir.mkdir()
    with _client(server_factory(embedder="sentence_transformers", embedder_model=str(model_dir))) as c:
        m = c.create("ns", "sentence transformers run locally")
        assert m.embedding_model == "st:all-MiniLM-L6-v2"
        assert c.search("ns", "transformers locally")[0].memory.id == m.id
    assert loaded == [(str(model_dir), True)]  # loaded once, from the local path only
