"""What the searcher needs from the object it ranks over (the engine), declared here so search
never imports the layer above it. The engine passes itself when it builds its ``Searcher``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from tiermem.kernels import ScoreTables
from tiermem.server.config import ServerConfig
from tiermem.server.embedding.providers import Embedder
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.index.keyword_index import KeywordIndex
from tiermem.server.index.spaces import Space
from tiermem.server.model.records import Record
from tiermem.server.model.types import Filter
from tiermem.server.storage.store import Store


class PolicyTables(Protocol):
    """Per-namespace lifecycle tables, indexed by namespace id (then tier)."""

    @property
    def recency_basis(self) -> np.ndarray: ...  # recency from creation (1) or last access (2), (namespaces,)

    @property
    def score(self) -> ScoreTables: ...  # importance half-lives (namespaces, 5) and floors, checked


class SearchSource(Protocol):
    """The memories a search ranks: their records, columns, vectors and per-namespace policy.

    ``config`` and ``columns`` are read at each use: either may be replaced while the server runs."""

    @property
    def config(self) -> ServerConfig: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def store(self) -> Store: ...

    @property
    def columns(self) -> Columns: ...

    @property
    def embedder(self) -> Embedder: ...

    @property
    def keywords(self) -> KeywordIndex: ...  # the rows' keyword postings

    @property
    def spaces(self) -> Mapping[str, Space]: ...  # embedding spaces by model name

    @property
    def config_version(self) -> int: ...  # moves whenever a namespace's settings change

    def allowed_rows(
        self, view: ColumnsView, namespaces: list[str], flt: Filter, now: float, space: int = -1
    ) -> tuple[np.ndarray, int]:
        """Rows allowed by namespaces and filter (and in embedding space ``space`` when >= 0),
        alive and unexpired at ``now``: (bool mask over the view's rows, count)."""
        ...

    def shared_allowed_rows(
        self,
        view: ColumnsView,
        namespaces: list[str],
        flt: Filter,
        now: float,
        space: int = -1,
        within: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """``allowed_rows``, maybe shared with other searches: the caller must not change the mask.
        ``within``: the same request's mask without a space, to narrow instead of a new pass."""
        ...

    def shared_mask_bits(self, mask: np.ndarray) -> np.ndarray | None:
        """A mask ``shared_allowed_rows`` gave out, packed 8 rows a byte (computed once); None for
        any other."""
        ...

    def check_filter(self, flt: Filter) -> Filter:
        """``flt`` checked, with its ``where`` compiled."""
        ...

    def policy_tables(self) -> PolicyTables: ...

    def expired(self, rec: Record) -> bool: ...
