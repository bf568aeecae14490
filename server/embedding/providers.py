"""Server-side embedders, chosen by configuration, behind an LRU cache.

- ``builtin`` (default): ``HashEmbedder``, deterministic feature hashing, no download.
- ``sentence_transformers``: a sentence-transformers model loaded from a local path
  (``pip install 'tiermem[sentence-transformers]'``; nothing is fetched from a hub).
- ``openai``: any OpenAI-compatible ``/embeddings`` HTTP endpoint (Ollama, vLLM, TEI, hosted APIs);
  the API key, if any, is read from the environment variable named by ``embedder_api_key_env``.

Failures raise ``EmbedderError``: the engine then stores the memory without a vector (findable by
keyword), and the maintenance pass retries the embedding later.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from typing import Any, Protocol

import numpy as np

from tiermem.server.embedding.hashing import HashEmbedder


class EmbedderError(Exception):
    """The embedder could not embed (unreachable, failing, or answering nonsense)."""


class Embedder(Protocol):
    model: str

    def embed(self, text: str) -> np.ndarray: ...


class OpenAIEmbedder:
    """POSTs {"model", "input": [text]} to ``<url>/embeddings`` and reads data[0].embedding."""

    def __init__(self, url: str, model: str, api_key: str = "", timeout: float = 10.0) -> None:
        if not url or not model:
            raise ValueError("the openai embedder needs embedder_url and embedder_model")
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/embeddings") else "/embeddings")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout

    def embed(self, text: str) -> np.ndarray:
        body = json.dumps({"model": self.model, "input": [text]}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                payload = json.loads(response.read())
            vector = np.asarray(payload["data"][0]["embedding"], dtype=np.float32)
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise EmbedderError(f"embedding endpoint {self.url} failed: {e}") from e
        if vector.ndim != 1 or vector.shape[0] == 0 or not np.all(np.isfinite(vector)):
            raise EmbedderError(f"embedding endpoint {self.url} returned an invalid vector")
        return vector


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local directory (loaded once, on first use)."""

    def __init__(self, path: str, model: str = "") -> None:
        if not path:
            raise ValueError("the sentence_transformers embedder needs embedder_model (a local path)")
        self.path = path
        self.model = model or f"st:{os.path.basename(path.rstrip('/'))}"
        self._impl: Any = None
        self._lock = threading.Lock()

    def embed(self, text: str) -> np.ndarray:
        with self._lock:
            if self._impl is None:
                try:
                    from sentence_transformers import SentenceTransformer  # optional extra
                except ImportError as e:
                    raise EmbedderError(
                        "sentence-transformers is not installed "
                        "(pip install 'tiermem[sentence-transformers]')"
                    ) from e
                try:
                    self._impl = SentenceTransformer(self.path, local_files_only=True)
                except Exception as e:
                    raise EmbedderError(f"cannot load the model at {self.path}: {e}") from e
        try:
            return np.asarray(self._impl.encode(text), dtype=np.float32)
        except Exception as e:
            raise EmbedderError(f"embedding failed: {e}") from e


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

    def embed(self, text: str) -> np.ndarray:
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        with self._lock:
            vec = self._cache.get(key)
            if vec is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return vec
            self.misses += 1
        vec = self.inner.embed(text)
        vec.setflags(write=False)
        if self.size > 0:
            with self._lock:
                self._cache[key] = vec
                while len(self._cache) > self.size:
                    self._cache.popitem(last=False)
        return vec


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
) -> CachedEmbedder:
    if kind == "builtin":
        inner: Embedder = HashEmbedder(dimension, builtin_model)
    elif kind == "openai":
        inner = OpenAIEmbedder(url, model, os.environ.get(api_key_env, ""), timeout)
    elif kind == "sentence_transformers":
        inner = SentenceTransformerEmbedder(model)
    else:
        raise ValueError(f"embedder must be builtin, openai or sentence_transformers, not {kind!r}")
    return CachedEmbedder(inner, cache_size)
