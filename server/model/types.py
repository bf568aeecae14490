"""Plain data types that cross layers: search and list filters, feedback items, and the packed
location of a memory's vector. No I/O, no imports from the rest of the server."""

from __future__ import annotations

import bisect
import functools
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


@dataclass(frozen=True)
class Under:
    """The namespaces named in ``exact``, and those below each of them (``name/...``): what an API
    key covers, as a predicate and as ranges of a sorted list of names (its figures are then read
    by bisection, not by asking about every namespace the server knows)."""

    exact: frozenset[str]

    @functools.cached_property
    def below(self) -> tuple[str, ...]:
        return tuple(p + "/" for p in self.exact)

    def __call__(self, namespace: str) -> bool:
        return namespace in self.exact or namespace.startswith(self.below)

    def spans(self, names: list[str]) -> list[tuple[int, int]]:
        """The index ranges [i, j) of sorted ``names`` covered: in order, apart."""
        found = []
        for p in self.exact:
            i = bisect.bisect_left(names, p)
            if i < len(names) and names[i] == p:
                found.append((i, i + 1))
            # "p/" up to "p0" ("0" is the character after "/")
            found.append((bisect.bisect_left(names, p + "/"), bisect.bisect_left(names, p + "0")))
        out: list[tuple[int, int]] = []
        for i, j in sorted(f for f in found if f[0] < f[1]):
            if out and i <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], j))
            else:
                out.append((i, j))
        return out

    def within(self, names: list[str]) -> set[str]:
        """The names of sorted ``names`` covered."""
        return {n for i, j in self.spans(names) for n in names[i:j]}


def insort_new(names: list[str], name: str) -> None:
    """``name`` into sorted ``names`` unless already there."""
    i = bisect.bisect_left(names, name)
    if i == len(names) or names[i] != name:
        names.insert(i, name)


def remove_sorted(names: list[str], name: str) -> None:
    """``name`` out of sorted ``names`` if there."""
    i = bisect.bisect_left(names, name)
    if i < len(names) and names[i] == name:
        del names[i]
