"""A sentence-transformers model from a local directory as the embedder
(``pip install 'tiermem[sentence-transformers]'``; nothing is fetched from a hub).

The model is loaded, and tried on one text, when the embedder is built (at server start, before
the server reports SERVING), so a missing package or a broken model stops the start instead of
failing every create. Texts are encoded ``batch_size`` at a time, without progress bars: the
libraries' tqdm bars (loading, and one per encode at INFO level) would otherwise fill the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiermem.server.embedding.base import Embedded, EmbedderError, EmbedderSettingError, one

logger = logging.getLogger(__name__)


def space_of(path: str) -> str:
    """The space a model loaded from ``path`` writes."""
    return f"st:{os.path.basename(path.rstrip('/'))}"


class SentenceTransformerEmbedder:
    def __init__(self, path: str, model: str = "", *, batch_size: int = 32) -> None:
        if not path:
            raise EmbedderSettingError(
                "the sentence_transformers embedder needs embedder_model (a local path)"
            )
        if batch_size < 1:
            raise EmbedderSettingError("the sentence_transformers embedder needs batch_size >= 1")
        self.path = path
        self.model = model or space_of(path)
        self.batch_size = batch_size
        self._lock = threading.Lock()  # one encode at a time: the model's own threads use the cores
        self._impl: Any = _load(path)

    def embed(self, text: str) -> np.ndarray:
        return one(self.embed_many([text])[0])

    def embed_many(self, texts: Sequence[str]) -> list[Embedded]:
        if not texts:
            return []
        try:
            with self._lock:
                out = self._impl.encode(
                    list(texts),
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                )
            vectors = np.asarray(out, dtype=np.float32)
        except Exception as e:  # (whatever the model raises: the memories are embedded later)
            error = EmbedderError(f"embedding failed: {e}")
            return [error] * len(texts)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts) or not np.all(np.isfinite(vectors)):
            error = EmbedderError(f"the model at {self.path} returned invalid vectors")
            return [error] * len(texts)
        return [row.copy() for row in vectors]  # (each its own array: the cache keeps them apart)


def _load(path: str) -> Any:
    """The model, loaded from ``path`` without network access and tried on one text (ValueError:
    the server cannot start with this embedder)."""
    if not os.path.isdir(path):
        raise EmbedderSettingError(
            f"the sentence_transformers embedder needs a local model directory, not {path!r}"
        )
    _quiet_progress_bars()
    try:
        from sentence_transformers import SentenceTransformer  # optional extra
    except ImportError as e:
        raise EmbedderSettingError(
            "the sentence_transformers embedder needs sentence-transformers "
            "(pip install 'tiermem[sentence-transformers]')"
        ) from e
    try:
        impl = SentenceTransformer(path, local_files_only=True)
        impl.encode(["warm-up"], show_progress_bar=False)
    except Exception as e:
        raise EmbedderSettingError(f"cannot load the sentence-transformers model at {path}: {e}") from e
    logger.info("loaded the sentence-transformers model at %s", path)
    return impl


def _quiet_progress_bars() -> None:
    """No tqdm bars from the model libraries in the server's log (an operator's own setting of
    these variables wins)."""
    os.environ.setdefault("TQDM_DISABLE", "1")  # read by tqdm >= 4.66 when it is imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with contextlib.suppress(Exception):  # (when they are installed and already imported)
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    with contextlib.suppress(Exception):
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
