"""Plain data types that cross layers: search and list filters, feedback items, and the packed
location of a memory's vector. No I/O, no imports from the rest of the server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A row's vector location packed in one int64 so a concurrent reader never sees half of a move:
# space id (bits 52..62) | tier (48..51) | FAISS internal id (0..47).
TIER_SHIFT = 48
SPACE_SHIFT = 52
INTERNAL_MASK = (1 << TIER_SHIFT) - 1


NO_VECTOR = np.empty(0, np.float32)  # a memory stored while the embedder failed


def location(space: int, tier: int, internal: Any) -> Any:
    """The packed location of one internal id (int) or of many (int64 array)."""
    return (space << SPACE_SHIFT) | (tier << TIER_SHIFT) | internal


@dataclass
class Filter:
    tiers: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    tags_any: list[str] = field(default_factory=list)
    tags_all: list[str] = field(default_factory=list)
    source: str = ""
    topic: str = ""
    created_after: float | None = None
    created_before: float | None = None
    where: str = ""
    compiled: Any = None  # the compiled ``where`` (filters.compile_where), set by index.masks.check_filter


@dataclass
class FeedbackItem:
    id: str
    predicted_relevance: float | None = None
    actual_usefulness: float | None = None
    success: bool = False
