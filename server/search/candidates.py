"""The candidate search of a ranking with too many allowed rows to score them all: every row that
could enter the exact top ``limit`` is scored (up to HNSW recall), and no other.

A = the HNSW top-K by similarity in each index. Every row x outside A is at most sim_K similar, so
its score is at most w(x) * (alpha*sim_K + prior(x)), where prior = beta*recency + gamma*decayed
importance and w is its tier x scope weight. Priors are bounded from above by ``PriorBounds``
(cached, one cheap pass); rows whose bound beats the limit-th score found so far are B. A large B is
searched again by HNSW restricted to B, which lowers sim_K for the rest of B (a few levels). What is
left gets its true similarity (a dot product, no exponentials), which tightens its bound; the rows
still above the bar are scored exactly. So a memory with modest similarity but high recency and
importance is not lost because the ANN stage missed it.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, wait
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from tiermem import kernels
from tiermem.server.config import Tuning
from tiermem.server.index.columns import ColumnsView
from tiermem.server.index.spaces import Index, Space
from tiermem.server.search.bounds import PriorBounds
from tiermem.server.search.observer import SearchObserver
from tiermem.server.search.query import RankingParams
from tiermem.server.search.ranking import Scored, Scorer, concat_scored, in_space
from tiermem.server.search.source import SearchSource

T = TypeVar("T")


def wait_out(pending: Future[Any]) -> None:
    """Wait for ``pending`` to end, whatever it ended with; an interrupt meanwhile (see
    ``outlast``) is raised once it has."""
    with suppress(Exception):  # (the job's own error: the caller raises its own)
        outlast(pending)


def outlast(pending: Future[T]) -> T:
    """``pending``'s result, waited for through an interrupt too (KeyboardInterrupt on the main
    thread of an embedded engine), which is raised once the job is done: a helper's job reads what
    its caller holds, and the caller lets go of it as soon as this returns."""
    interrupted: BaseException | None = None
    while True:
        try:
            wait([pending])
            break
        except BaseException as e:  # (the job still runs: wait on, raise this after)
            interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted
    return pending.result()


@dataclass(frozen=True)
class Beside:
    """Helper threads for a search's HNSW searches of several tiers (``ann``): ``submit(job)``
    runs ``job`` on one when a core is spare and returns its Future, else None (run it in line);
    only indexes of ``min_entries`` or more are worth the handoff (``Tuning.tiers_beside_min_entries``)."""

    submit: Callable[[Callable[[], Any]], Future[Any] | None]
    min_entries: int


def ann(
    sp: Space,
    query: np.ndarray,
    mask: np.ndarray,
    k: int,
    ef_search: int,
    view: ColumnsView | None = None,
    count: int = -1,
    beside: Beside | None = None,
) -> tuple[np.ndarray, np.ndarray | None, float]:
    """The HNSW top-``k`` by similarity among the allowed rows of each index of the space:
    (rows, their similarities, sim_bound). No allowed row outside ``rows`` is more similar than
    ``sim_bound`` (up to HNSW recall); -inf when every allowed row was returned. Similarities
    are None (the caller looks them up) when an index's allowed rows are returned without them
    (a short filtered answer) or a row came back twice; with ``view``, rows the view no longer
    has in this space are left out when similarities are returned.

    With ``view`` and ``count`` (the allowed rows, all in this space), per-index allowed counts
    let an index that holds exactly the allowed rows search without a per-request selector.

    The caller's thread holds every index of the space for reading. With ``beside``, of the
    indexes with ``beside.min_entries`` or more, all but the largest are searched on a helper
    thread (FAISS releases the GIL) while this thread searches the largest, when a core is spare."""
    items = list(sp.indexes.items())
    indexes = [index for _, index in items]
    counts = [-1] * len(indexes)
    if view is not None and count >= 0:
        if len(indexes) == 1:
            counts = [count]
        else:
            per_tier = kernels.tier_counts(mask, view.tier).tolist()
            counts = [per_tier[t] for t, _ in items]
    answers = _searched(indexes, counts, beside, lambda i, n: i.search(query, k, mask, ef_search, n))
    found: list[np.ndarray] = []
    sims: list[np.ndarray] = []  # of every index's rows, unless one answered with rows only
    sim_bound = -np.inf
    for index, (got, got_sims, bound) in zip(indexes, answers, strict=True):
        if bound != bound:  # NaN: filtered HNSW came back short (selective filter)
            found.append(index.allowed_rows(mask))  # score this index's allowed rows exactly
            continue
        found.append(got)
        sims.append(got_sims)
        sim_bound = max(sim_bound, bound)
    if not found:
        return np.empty(0, np.int64), np.empty(0, np.float32), sim_bound
    return (*_distinct(found, sims, sp, view), sim_bound)


def _searched(
    indexes: list[Index],
    counts: list[int],
    beside: Beside | None,
    search: Callable[[Index, int], tuple[np.ndarray, np.ndarray, float]],
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """``search(index, allowed count)`` of each index, in order: the large ones after the largest
    on a helper thread when ``beside`` has one (see ``ann``)."""
    helped: list[int] = []
    pending = None
    # Only what this thread holds can be lent (an index created since the caller took its holds
    # is searched here, under a hold of its own); an index with no allowed row costs no helper.
    if beside is not None and beside.min_entries > 0:
        least = beside.min_entries
        large = [i for i, ix in enumerate(indexes) if ix.n >= least and counts[i] != 0 and ix.held_here()]
        helped = sorted(large, key=lambda i: indexes[i].n)[:-1]  # (all but the largest)
        if helped:

            def job() -> list[tuple[np.ndarray, np.ndarray, float]]:
                out = []
                for i in helped:
                    with indexes[i].lent():  # (under the caller's hold, which outlasts the job)
                        out.append(search(indexes[i], counts[i]))
                return out

            pending = beside.submit(job)
            if pending is None:
                helped = []
    answers: list[Any] = [None] * len(indexes)
    try:
        for i, index in enumerate(indexes):
            if i not in helped:
                answers[i] = search(index, counts[i])
    except BaseException:
        if pending is not None:
            wait_out(pending)  # (the holds it borrows end with the caller's)
        raise
    if pending is not None:
        for i, answer in zip(helped, outlast(pending), strict=True):
            answers[i] = answer
    return answers


def _distinct(
    found: list[np.ndarray], sims: list[np.ndarray], sp: Space, view: ColumnsView | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The rows found, sorted and distinct, with their similarities when every index gave them."""
    # A row moving to another tier's index can show up in both for a moment, with the same
    # vector. A stable argsort, not np.unique: its overhead is large next to a similarity search.
    rows = found[0] if len(found) == 1 else np.concatenate(found)
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    rel = None
    if len(sims) == len(found):
        rel = (sims[0] if len(sims) == 1 else np.concatenate(sims))[order]
    if rows.shape[0] > 1:
        first = np.concatenate(([True], rows[1:] != rows[:-1]))
        if not first.all():
            # A row twice: moving between indexes, or re-embedded (its new entry added before
            # the old one is killed, maybe with another vector). The ranking looks its vector
            # up where the view has it, as for any row without a similarity.
            rows, rel = rows[first], None
    if rel is not None and view is not None:
        # As ``similarities``: only rows the view still has in this space keep a similarity.
        kept = in_space(view.vpos[rows], sp.id)
        if not kept.all():
            rows, rel = rows[kept], rel[kept]
    return rows, rel


def similarity_depth(limit: int) -> int:
    """How deep HNSW searches when similarity alone ranks: the exact top ``limit`` up to its recall."""
    return max(2 * limit, 32)


def by_similarity(a: RankingParams, row_w: np.ndarray | None) -> bool:
    """Whether ``a`` ranks by similarity alone (no recency, importance or row weights): then a
    candidate search is one HNSW search ``similarity_depth(a.limit)`` deep, every row it finds scored."""
    return a.beta == 0 and a.gamma == 0 and a.alpha > 0 and row_w is None


class CandidateSearch:
    """One ranking's candidate search (see the module docstring). ``scorer`` scores rows exactly
    (its view, space and query are the search's); ``a.limit`` is the top to make exact."""

    def __init__(
        self,
        source: SearchSource,
        priors: PriorBounds,
        observer: SearchObserver,
        scorer: Scorer,
        a: RankingParams,
        beside: Beside | None = None,
    ) -> None:
        assert scorer.space is not None and scorer.query is not None
        self.source, self.priors, self.observer = source, priors, observer
        self.scorer, self.params = scorer, a
        self.view: ColumnsView = scorer.view
        self.space: Space = scorer.space
        self.query: np.ndarray = scorer.query
        self.tuning: Tuning = source.config.tuning
        self.parts: list[Scored] = []
        self.best = np.empty(0, np.float32)  # the running top scores, best first
        self.k = 0  # the depth of each HNSW search
        self.beside = beside  # (see ann)

    def run(self, mask: np.ndarray, count: int) -> Scored:
        """Score every row of ``mask`` (``count`` rows, all in the space) that could enter the top."""
        a = self.params
        similar = by_similarity(a, self.scorer.row_w)
        # When priors count, a deeper A lowers sim_K, so the cheap ceiling below settles more
        # rankings at once and B is smaller; the deeper HNSW search costs more (Tuning.prior_k).
        self.k = similarity_depth(a.limit) if similar else min(max(8 * a.limit, self.tuning.prior_k), 2048)
        a_rows, a_sims, sim_bound = self._ann(mask, count)
        first = self.scorer(a_rows, rel=a_sims)
        self.parts = [first]
        if sim_bound == -np.inf or similar:
            return first  # nothing outside A can beat A's scores
        self.best = first.score[kernels.topk(first.score, a.limit)]
        todo = mask.copy()
        todo[a_rows] = False  # scored: never count a row twice
        b = self._bounded_rows(todo, sim_bound)
        if b is not None:
            self._score_chunks(*b)
        return concat_scored(self.parts)

    def bar(self) -> float:
        """A row outside the scored ones must have a bound above this to enter the top."""
        return float(self.best[-1]) if self.best.shape[0] == self.params.limit else -np.inf

    def _add(self, part: Scored) -> None:
        self.parts.append(part)
        merged = np.concatenate([self.best, part.score])
        self.best = merged[kernels.topk(merged, self.params.limit)]

    def _ann(self, mask: np.ndarray, count: int = -1) -> tuple[np.ndarray, np.ndarray | None, float]:
        self.observer.hnsw_search()
        ef_search = self.source.config.hnsw_ef_search
        return ann(self.space, self.query, mask, self.k, ef_search, self.view, count, self.beside)

    def _weight_range(self) -> tuple[float, float]:
        """The extreme row weights: a row's score is at most w * x, which is largest at the highest
        weight when x >= 0 and at the lowest when x < 0 (small beta/gamma, dissimilar rows)."""
        if self.scorer.row_w is None:
            return 1.0, 1.0
        a = self.params
        w_max = max([*a.tier_w.values(), 1.0]) * max([*a.scope_w.values(), 1.0])
        w_min = min([*a.tier_w.values(), 1.0]) * min([*a.scope_w.values(), 1.0])
        return w_max, w_min

    def _bounded_rows(
        self, todo: np.ndarray, sim_bound: float
    ) -> tuple[np.ndarray, np.ndarray, float] | None:
        """B (rows, bounds) and the similarity bound it assumed, after up to ``deepen_levels``
        deeper HNSW searches among B; None when nothing left can enter the top."""
        a, levels = self.params, self.tuning.deepen_levels
        w_max, w_min = self._weight_range()
        b_rows = np.empty(0, np.int64)
        b_bound = np.empty(0, np.float32)
        for level in range(levels + 1):
            if a.min_similarity is not None and sim_bound < a.min_similarity:
                return None  # nothing left is similar enough to be returned
            base = a.alpha * sim_bound if a.alpha > 0 else 0.0
            # Cheap ceiling: recency <= 1 and decayed importance <= the highest importance.
            x = base + a.beta + a.gamma * self.source.columns.max_importance
            if (w_max if x >= 0 else w_min) * x + 1e-5 <= self.bar():
                return None
            b_rows, b_bound = self.priors.bounded(self.view, todo, a, base, self.bar(), self.scorer.row_w)
            if b_rows.shape[0] <= self.tuning.deeper_search_min_rows or level == levels or a.alpha == 0:
                # (with alpha = 0 similarity does not count: a deeper search cannot lower a bound)
                break
            # Deepen: the most similar rows among B. The rest of B is at most as similar as they are.
            todo = np.zeros(self.view.n, np.bool_)
            todo[b_rows] = True
            deeper, deeper_sims, sim_bound = self._ann(todo)
            self._add(self.scorer(deeper, rel=deeper_sims))
            todo[deeper] = False
            if sim_bound == -np.inf:
                return None  # every row of B was returned
        return b_rows, b_bound, sim_bound

    def _score_chunks(self, b_rows: np.ndarray, b_bound: np.ndarray, sim_bound: float) -> None:
        """B's bounds assumed sim_K. Best bound first, a chunk at a time: its true similarities (dot
        products, no exponentials) tighten each bound to w * (alpha*sim + prior bound); rows still
        above the bar are scored exactly (with those similarities), which raises the bar; rows
        whose bound the bar has passed are dropped before the next chunk."""
        a, scorer = self.params, self.scorer
        sim_k = np.float32(sim_bound if a.alpha > 0 else 0.0)
        alpha = np.float32(a.alpha)
        size = self.tuning.first_score_chunk
        while b_rows.shape[0]:
            top, rest = kernels.split_top(b_bound, self.bar(), size)  # rows whose bound the bar passed: gone
            if not top.shape[0]:
                break
            chunk, chunk_bound = b_rows[top], b_bound[top]
            b_rows, b_bound = b_rows[rest], b_bound[rest]
            size = min(2 * size, self.tuning.score_chunk)
            self.observer.chunk_scored(chunk)
            if a.alpha == 0:  # similarity does not count: the prior bound is as tight as it gets
                self._add(scorer(chunk[chunk_bound > self.bar()]))
                continue
            kept, sims = scorer.similarities(chunk)  # (rows that left the space: dropped)
            got = chunk[kept]
            w = scorer.row_w[got] if scorer.row_w is not None else np.float32(1.0)
            tight = chunk_bound[kept] + w * alpha * (sims - sim_k)
            sel = tight > self.bar()
            if sel.any():
                self._add(scorer(got[sel], rel=sims[sel]))
