"""What every embedder offers, and how it fails.

``embed(text)`` returns one vector or raises ``EmbedderError``. ``embed_many(texts)`` embeds a batch
and never raises ``EmbedderError``: each item of its answer is the text's vector or the
``EmbedderError`` that kept it from one (an endpoint's batches may fail apart), so a caller can store
what was embedded and keep the rest for later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tiermem.server.config import UnusableSetting


class EmbedderSettingError(UnusableSetting):
    """The configured embedder cannot be set up (a model directory missing, an optional package not
    installed, settings it cannot work with): the server stops before it serves, naming it."""


class EmbedderError(Exception):
    """The embedder could not embed (unreachable, failing, or answering nonsense)."""


Embedded = np.ndarray | EmbedderError  # one item of embed_many's answer


class Embedder(Protocol):
    model: str

    def embed(self, text: str) -> np.ndarray: ...

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]: ...


def one(embedded: Embedded) -> np.ndarray:
    """The vector of an ``embed_many`` item, or its error raised."""
    if isinstance(embedded, EmbedderError):
        raise embedded
    return embedded
