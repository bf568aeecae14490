"""Server-side embedders, chosen by configuration, behind an LRU cache.

- ``builtin`` (default): ``HashEmbedder``, deterministic feature hashing, no download.
- ``sentence_transformers``: a sentence-transformers model loaded from a local path at start-up
  (``local.py``; ``pip install 'tiermem[sentence-transformers]'``; nothing is fetched from a hub).
- ``openai``: any OpenAI-compatible ``/embeddings`` HTTP endpoint (Ollama, vLLM, TEI, hosted APIs),
  in batches, with retries and a circuit breaker (``remote.py``); the API key, if any, is read from
  the environment variable named by ``embedder_api_key_env``.

Vectors leave the cache at unit length, whatever length the embedder answered with (stored vectors
are compared by inner product; one of length 0 stays as it came). Failures are ``EmbedderError``s
(``base.py``): the engine then stores the memory without a vector (findable by keyword), and the
maintenance pass retries the embedding later.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from tiermem.server.embedding import local
from tiermem.server.embedding.base import Embedded, Embedder, EmbedderError, EmbedderSettingError, one
from tiermem.server.embedding.hashing import HashEmbedder
from tiermem.server.embedding.local import SentenceTransformerEmbedder
from tiermem.server.embedding.remote import OpenAIEmbedder
from tiermem.server.model import validation as check

__all__ = [
    "CachedEmbedder",
    "Embedded",
    "Embedder",
    "EmbedderError",
    "HashEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "build",
]

# Defaults of the settings ServerConfig does not carry (yet): see build().
OPENAI_BATCH_SIZE = 64  # texts per request
OPENAI_CONCURRENCY = 4  # requests in flight at once, per embedder
OPENAI_ATTEMPTS = 3  # tries per request (timeouts, connection errors, 5xx, 429), within the timeout
BREAKER_FAILURES = 3  # failed calls in a row that open the circuit breaker
BREAKER_COOLDOWN_SECONDS = 30.0  # how long an open breaker fails calls at once
ST_BATCH_SIZE = 32  # texts per sentence-transformers forward pass


class CachedEmbedder:
    """An LRU cache of embeddings by text digest, in front of any embedder."""

    def __init__(self, inner: Embedder, size: int) -> None:
        self.inner = inner
        self.model = inner.model
        self.size = size
        self._cache: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # The dimension of the embedder's space, once it has one (None: any): an answer of another
        # (an endpoint whose model changed under the same name) is a failure, and not kept.
        self.dimension: Callable[[], int | None] = lambda: None

    def embed(self, text: str) -> np.ndarray:
        return one(self.embed_many([text])[0])

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        """Cached vectors from the cache; the others (each distinct text once) from the embedder."""
        out: list[Embedded | None] = [None] * len(texts)
        missing: dict[bytes, list[int]] = {}  # digest -> positions of that text
        with self._lock:
            for i, text in enumerate(texts):
                key = _digest(text)
                vec = self._cache.get(key)
                if vec is None:
                    missing.setdefault(key, []).append(i)
                    continue
                self._cache.move_to_end(key)
                self.hits += 1
                out[i] = vec
            self.misses += sum(len(at) for at in missing.values())
        if missing:
            answers = self.inner.embed_many([texts[at[0]] for at in missing.values()])
            dim = self.dimension()
            for (key, at), answer in zip(missing.items(), answers, strict=True):
                if not isinstance(answer, EmbedderError) and dim is not None and len(answer) != dim:
                    answer = EmbedderError(
                        f"the embedder answered a vector of dimension {len(answer)}, but space "
                        f"{self.model!r} has dimension {dim}"
                    )
                if not isinstance(answer, EmbedderError):
                    answer = _unit(answer)
                    answer.setflags(write=False)
                    self._keep(key, answer)
                for i in at:
                    out[i] = answer
        return [x for x in out if x is not None]

    def _keep(self, key: bytes, vec: np.ndarray) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._cache[key] = vec
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def _unit(vec: np.ndarray) -> np.ndarray:
    """``vec`` at unit length: stored vectors are compared by inner product (cosine), and an
    endpoint or model may answer at any length. One without a direction (length 0) stays as it
    came: it matches nothing by similarity."""
    out = check.unit(np.asarray(vec, np.float32))
    return vec if out is None else out


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def space_of(kind: str, model: str, builtin_model: str) -> str:
    """The embedding space the configured embedder writes (its model's name)."""
    if kind == "builtin":
        return builtin_model
    return local.space_of(model) if kind == "sentence_transformers" else model


def build(
    kind: str,
    *,
    model: str,
    url: str,
    api_key_env: str,
    timeout: float,
    dimension: int,
    builtin_model: str,
    cache_size: int,
    batch_size: int | None = None,
    concurrency: int = OPENAI_CONCURRENCY,
    breaker_failures: int = BREAKER_FAILURES,
    breaker_cooldown_seconds: float = BREAKER_COOLDOWN_SECONDS,
) -> CachedEmbedder:
    """The configured embedder behind its cache. ``timeout`` bounds one embedding call of the
    ``openai`` embedder, its retries included; ``batch_size`` is texts per request (``openai``,
    default 64) or per forward pass (``sentence_transformers``, default 32)."""
    if kind == "builtin":
        inner: Embedder = HashEmbedder(dimension, builtin_model)
    elif kind == "openai":
        inner = OpenAIEmbedder(
            url,
            model,
            os.environ.get(api_key_env, ""),
            timeout,
            batch_size=batch_size or OPENAI_BATCH_SIZE,
            concurrency=concurrency,
            attempts=OPENAI_ATTEMPTS,
            breaker_failures=breaker_failures,
            breaker_cooldown_seconds=breaker_cooldown_seconds,
        )
    elif kind == "sentence_transformers":
        inner = SentenceTransformerEmbedder(model, batch_size=batch_size or ST_BATCH_SIZE)
    else:
        raise EmbedderSettingError(f"embedder must be builtin, openai or sentence_transformers, not {kind!r}")
    return CachedEmbedder(inner, cache_size)
