"""An embedding space: one model name, one dimension, one HNSW index per tier."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiermem.server.index.vector_index import VectorIndex


@dataclass
class Space:
    id: int
    model: str
    dim: int
    indexes: dict[int, VectorIndex] = field(default_factory=dict)
