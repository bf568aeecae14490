"""The built-in embedder: deterministic feature hashing, no model download.

Text is lower-cased and split into word tokens; each word, each pair of adjacent words and each
character trigram of a word is hashed (CRC-32 with a per-feature-type salt) to a signed position of
a ``dimension``-long vector, which is then L2-normalized. Only the first ``max_words`` words count. Texts that share words or word pieces get
a positive cosine similarity; unrelated texts are near 0. It is a lexical embedder: good enough for
tests, demos and keyword-like recall, not a semantic model. Bring real vectors (any model) by
sending ``embedding`` + ``embedding_model``.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence

import numpy as np

from tiermem.server.embedding.base import Embedded
from tiermem.server.model.text import words as text_words


class HashEmbedder:
    def __init__(self, dimension: int = 384, model: str = "tiermem-hash-v1", max_words: int = 2048) -> None:
        self.dimension = dimension
        self.model = model
        self.max_words = max_words  # longer texts are embedded by their first words (bounds CPU per call)

    def _features(self, text: str) -> list[tuple[bytes, float]]:
        words = text_words(text)[: self.max_words]
        feats: list[tuple[bytes, float]] = []
        for w in words:
            wb = w.encode()
            feats.append((b"w:" + wb, 1.0))
            padded = f"#{w}#"
            if len(padded) > 4:
                for i in range(len(padded) - 2):
                    feats.append((b"c:" + padded[i : i + 3].encode(), 0.35))
        for a, b in itertools.pairwise(words):
            feats.append((b"b:" + a.encode() + b" " + b.encode(), 0.5))
        if not feats:
            feats.append((b"t:" + text.encode(), 1.0))
        return feats

    def embed(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dimension, np.float32)
        for key, weight in self._features(text):
            h = zlib.crc32(key)
            sign = 1.0 if (h >> 31) & 1 else -1.0
            vec[h % self.dimension] += sign * weight
        norm = float(np.linalg.norm(vec))
        if norm == 0.0:  # every feature cancelled out (vanishingly rare): fall back to one bucket
            vec[zlib.crc32(text.encode()) % self.dimension] = 1.0
            return vec
        vec /= norm
        return vec

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        return [self.embed(t) for t in texts]
