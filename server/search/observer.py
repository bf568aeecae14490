"""``SearchObserver``: told about the steps of a ranking worth counting. The default ignores them;
tests give a searcher their own (``Searcher.observer``) to count the steps and to act between them.
Called on the searching thread or its helper (a candidate or vector search run beside the
keyword pass), possibly from several searches at once."""

from __future__ import annotations

import numpy as np


class SearchObserver:
    def candidate_search(self) -> None:
        """A ranking with too many allowed rows to score them all goes through HNSW candidates."""

    def hnsw_search(self) -> None:
        """The indexes of the query's space are searched by HNSW (the first search or a deeper one)."""

    def computing_bounds(self) -> None:
        """Prior bounds are computed from every row; called once the policy tables were read."""

    def bounded(self, path: str, rows: np.ndarray) -> None:
        """A bound kernel returned ``rows`` as B: ``path`` "ordered" (the sorted bounds and the change
        log) or "full_pass" (every row of the pass). Called as soon as the kernel returns."""

    def chunk_scored(self, rows: np.ndarray) -> None:
        """One chunk of B, best bound first, gets its true similarities (or exact scores)."""
