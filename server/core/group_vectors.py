"""The vectors of memories created in the commit group being written, for similarity
deduplication before they reach the indexes (writer thread only; cleared at each commit)."""

from __future__ import annotations

import numpy as np


class GroupVectors:
    """Unit vectors (with record ids and vector keys) of one namespace and model, at most ``limit``:
    each lookup compares against all of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.keys: list[tuple[int, int]] = []
        self._vecs = np.empty((8, 0), np.float32)

    def add(self, rid: int, vk: int, vec: np.ndarray) -> None:
        n = len(self.keys)
        if n >= self.limit:
            return
        if n == 0:  # (one model, one dimension: checked before)
            self._vecs = np.empty((8, vec.shape[0]), np.float32)
        elif n == self._vecs.shape[0]:
            self._vecs = np.concatenate([self._vecs, np.empty_like(self._vecs)])
        norm = float(np.linalg.norm(vec))
        self._vecs[n] = vec / norm if norm > 0 else vec
        self.keys.append((rid, vk))

    def similar(self, vec: np.ndarray, at_least: float) -> list[tuple[int, int]]:
        """(rid, vk) of the vectors at least ``at_least`` similar to ``vec`` (cosine), most similar first."""
        n = len(self.keys)
        if n == 0:
            return []
        norm = float(np.linalg.norm(vec))
        sims = self._vecs[:n] @ (vec / norm if norm > 0 else vec).astype(np.float32)
        hits = np.flatnonzero(sims >= at_least)
        order = hits[np.argsort(-sims[hits], kind="stable")]
        return [self.keys[i] for i in order.tolist()]
