"""FAISS's OpenMP thread count, set in one place: one thread while searches run on gRPC threads
(OpenMP would oversubscribe the cores), every usable core for bulk work before serving."""

from __future__ import annotations

import faiss

from tiermem.server.cores import usable_cores


def set_faiss_threads(n: int | None = None) -> None:
    """Use ``n`` OpenMP threads for FAISS (None: every core this process may run on)."""
    faiss.omp_set_num_threads(usable_cores() if n is None else max(1, n))
