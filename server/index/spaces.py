"""An embedding space: one model name, one dimension, one HNSW index per tier (a follower's may be
layered over a mapped snapshot, layered.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiermem.server.index.layered import LayeredIndex
from tiermem.server.index.vector_index import VectorIndex

Index = VectorIndex | LayeredIndex  # what a space holds per tier


@dataclass
class Space:
    id: int
    model: str
    dim: int
    indexes: dict[int, Index] = field(default_factory=dict)
