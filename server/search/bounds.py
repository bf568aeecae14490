"""Upper bounds of every row's recency and decayed importance (``PriorBounds``), shared by the
searches, and B: the rows whose score bound still beats a ranking's bar (``PriorBounds.bounded``).

Concurrency: any number of searches read the cached bounds at once (they are never changed in
place, only replaced); one search at a time refreshes them (the others use the old ones, or compute
their own when those are not valid for them). Rows change under a search: each row's generation
(``gen`` column) and the columns' change log tell which cached bounds no longer hold.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

import numpy as np

from tiermem import kernels
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.search.observer import SearchObserver
from tiermem.server.search.query import RankingParams
from tiermem.server.search.ranking import recency_times
from tiermem.server.search.source import SearchSource


@dataclass(frozen=True)
class Priors:
    """Prior bounds valid at times >= t0 with recency tau ``tau`` and config ``version``, for rows
    whose generation still equals ``gen0``."""

    t0: float
    tau: float
    version: int
    gen0: np.ndarray
    rec: np.ndarray  # upper bounds of recency
    imp: np.ndarray  # upper bounds of decayed importance
    columns: Columns  # the Columns they were computed from
    # columns.changes when gen0 was copied: rows changed since are logged from here (-1: gen0 is
    # a frozen view's, which the log does not cover)
    changes: int
    # The best rows (a share, at least a minimum: Tuning.bounds_sorted_*) by their prior bound
    # beta*rec + gamma*imp under these weights, best first, and those bounds; None when not kept
    # (bounds for one search only).
    order: np.ndarray | None = None
    prior: np.ndarray | None = None
    tail: float = -math.inf  # the highest prior bound of a row left out of ``order`` (-inf: none)
    beta: float = 0.0
    gamma: float = 0.0


class PriorBounds:
    """Upper bounds of every row's recency and decayed importance, shared by searches.

    Both only fall as time passes, so values computed at t0 bound them at any ``now >= t0`` for as
    long as the row does not change; a row that changes moves its generation (``gen`` column) and
    falls back to the trivial bound (see ``kernels.prior_bounds``). Computing the exact priors of
    every row costs two exponentials per row; these bounds cost one cached pass, redone when they
    are older than ``Tuning.bounds_max_age_seconds`` (they loosen as time passes), the rows grew by
    a tenth, or more than max(``bounds_min_stale``, ``bounds_stale_share`` of the rows) rows changed
    since (each changed row is bounded trivially, and a burst of changes such as a consolidation
    pass's tier moves would otherwise leave tens of thousands of rows to score until the next
    refresh).

    Cached bounds also keep the rows sorted by prior bound under the configured beta and gamma
    (one sort per refresh), so a search with those weights reads only the rows whose bound beats
    its bar, plus the rows changed since (``Columns.changed_since``), instead of every row.
    """

    def __init__(self, source: SearchSource, observer: SearchObserver) -> None:
        self.source = source
        self.observer = observer
        self._cached: Priors | None = None
        self._lock = threading.Lock()

    @property
    def cached(self) -> Priors | None:
        """The bounds kept for later searches, if any."""
        return self._cached

    def get(self, view: ColumnsView, now: float, tau: float) -> Priors:
        """Bounds valid at ``now`` with ``tau``; gen0, rec and imp cover at most view.n rows
        (``Priors.order`` may name rows past them: rows the view does not have)."""
        src = self.source
        tuning = src.config.tuning
        c = self._cached
        cols = src.columns
        version = src.config_version
        valid = c is not None and c.t0 <= now and c.tau == tau and c.version == version and c.columns is cols
        fresh = (
            c is not None
            and now - c.t0 <= tuning.bounds_max_age_seconds
            and view.n <= 1.1 * c.gen0.shape[0] + 1024
            and cols.changes - c.changes <= max(tuning.bounds_min_stale, tuning.bounds_stale_share * view.n)
        )
        if valid and fresh and c is not None:
            return self._fit(c, view)
        cacheable = tau == src.config.recency_tau_seconds
        if not cacheable or not self._lock.acquire(blocking=False):
            if valid and c is not None:
                return self._fit(c, view)  # another search is refreshing them
            return self._compute(view, now, tau)
        try:
            p = self._compute(view, now, tau)
            if p.changes < 0:
                return p  # a view growth froze: bounds for this search only, not for live views
            self._cached = self._sorted(p, src.config.beta, src.config.gamma)
            return self._cached
        finally:
            self._lock.release()

    def _sorted(self, p: Priors, beta: float, gamma: float) -> Priors:
        """``p`` with its best share of rows (at least a minimum) sorted by prior bound under these
        weights: searches rarely walk past the first few thousand, and a full sort grows with n."""
        tuning = self.source.config.tuning
        prior = np.float32(beta) * p.rec + np.float32(gamma) * p.imp
        n = prior.shape[0]
        m = min(n, max(tuning.bounds_sorted_min, int(n * tuning.bounds_sorted_share)))
        tail = -math.inf
        if m < n:
            part = np.argpartition(-prior, m)
            tail = float(prior[part[m]])
            top = part[:m]
            order = top[np.argsort(-prior[top], kind="stable")]
        else:
            order = np.argsort(-prior, kind="stable")
        return replace(p, order=order, prior=prior[order], tail=tail, beta=beta, gamma=gamma)

    @staticmethod
    def _fit(c: Priors, view: ColumnsView) -> Priors:
        """Cached bounds cut to ``view``: a search may hold a view older (shorter) than the one the
        bounds were computed from. Rows are never reused, so the first view.n rows still apply."""
        n = min(view.n, c.gen0.shape[0])
        return replace(c, gen0=c.gen0[:n], rec=c.rec[:n], imp=c.imp[:n])

    def _compute(self, view: ColumnsView, now: float, tau: float) -> Priors:
        src = self.source
        cols = src.columns
        version = src.config_version  # before the tables: bounds are never labelled newer than them
        # The generations first: a row changing meanwhile moves past them (and is logged from
        # ``changes`` on), so bounds computed from half-written fields are not used for it. A
        # view that growth left frozen has its own generations, and no log (changes -1).
        changes, gen0 = cols.generations(view)
        tables = src.policy_tables()
        self.observer.computing_bounds()
        rows = np.arange(view.n, dtype=np.int64)
        _, rec, imp = kernels.score_rows(
            rows,
            np.zeros(view.n, np.float32),
            importance=view.importance,
            created_at=view.created,
            last_access=recency_times(view, tables.recency_basis),  # (the scorer's times, for its rows)
            tier=view.tier,
            now=now,
            tau_seconds=tau,
            half_life_hours=tables.score,
            floor=None,
            alpha=0.0,
            beta=0.0,
            gamma=0.0,
            ns=view.ns,
        )
        return Priors(now, tau, version, gen0, rec, imp, cols, changes)

    def bounded(
        self,
        view: ColumnsView,
        todo: np.ndarray,
        a: RankingParams,
        base: float,
        bar: float,
        row_w: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """B: the rows of ``todo`` whose score bound w * (base + prior bound) beats ``bar`` (rows,
        bounds); may clear ``todo``. With cached bounds sorted for these weights, only the rows
        above the bar and those changed since are read (``kernels.ordered_bounds``); otherwise
        every row is (``kernels.prior_bounds``)."""
        p = self.get(view, a.now, a.tau)
        cols = p.columns
        logged = None
        if p.order is not None and p.changes >= 0 and cols.is_live(view):
            logged = cols.changed_since(p.changes)
        if logged is None or row_w is not None or a.beta != p.beta or a.gamma != p.gamma or bar == -math.inf:
            # (no bar yet: every row is in B, and the walk would only precede a full pass)
            return self._full_pass(view, todo, p, a, base, bar, row_w)
        assert p.order is not None and p.prior is not None
        log, end = logged
        before = todo.copy()  # for a full pass from the start, should the log wrap
        walk = _Walk(view, todo, p, log, a.beta, a.gamma, base, bar)
        rows, bounds = walk.bounds(p.order, p.prior, p.changes, end)
        self.observer.bounded("ordered", rows)
        parts = [(rows, bounds)]
        # Rows whose change began while the walk ran are logged past ``end``: the walk may have
        # taken one with its cached bound (it reads no generation), which the change may have
        # outgrown: such rows get the trivial bound, and the others of them (still in ``todo``)
        # come from the log's later positions.
        later = cols.changed_since(p.changes)
        if later is not None and later[1] > end:
            walk.lift_moved(rows, bounds, end, later[1])
            empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float32)
            parts.append(walk.bounds(empty_i, empty_f, end, later[1]))
            self.observer.bounded("ordered", parts[-1][0])
            later = cols.changed_since(p.changes)
        if later is None:
            # The log wrapped: entries read may have been overwritten, so which rows changed is
            # not known: a full pass over every row of the original ``todo``.
            return self._full_pass(view, before, p, a, base, bar, row_w)
        if base + p.tail + 1e-5 > bar:
            # Rows left out of the sorted part may beat the bar: a full pass over the rows not
            # bounded yet (todo).
            parts.append(self._full_pass(view, todo, p, a, base, bar, row_w))
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([q[0] for q in parts]), np.concatenate([q[1] for q in parts])

    def _full_pass(
        self,
        view: ColumnsView,
        todo: np.ndarray,
        p: Priors,
        a: RankingParams,
        base: float,
        bar: float,
        row_w: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        rows, bounds = kernels.prior_bounds(
            todo,
            gen=view.gen,
            gen0=p.gen0,
            rec_ub=p.rec,
            imp_ub=p.imp,
            importance=view.importance,
            beta=a.beta,
            gamma=a.gamma,
            base=base,
            bar=bar,
            row_w=row_w,
        )
        self.observer.bounded("full_pass", rows)
        return rows, bounds


@dataclass
class _Walk:
    """One walk of the sorted bounds and the change log (``kernels.ordered_bounds``)."""

    view: ColumnsView
    todo: np.ndarray
    p: Priors
    log: np.ndarray
    beta: float
    gamma: float
    base: float
    bar: float

    def bounds(
        self, order: np.ndarray, prior: np.ndarray, log_from: int, log_to: int
    ) -> tuple[np.ndarray, np.ndarray]:
        return kernels.ordered_bounds(
            self.todo,
            order=order,
            prior=prior,
            log_from=log_from,
            log_to=log_to,
            n0=self.p.gen0.shape[0],
            importance=self.view.importance,
            log=self.log,
            beta=self.beta,
            gamma=self.gamma,
            base=self.base,
            bar=self.bar,
        )

    def lift_moved(self, rows: np.ndarray, bounds: np.ndarray, start: int, end: int) -> None:
        """Walked rows logged between ``start`` and ``end`` get at least the trivial bound."""
        moved = self.log[np.arange(start, end) % self.log.shape[0]]
        walked = np.isin(rows, moved)
        if walked.any():
            trivial = (
                np.float32(self.base)
                + np.float32(self.beta)
                + np.float32(self.gamma) * self.view.importance[rows[walked]]
                + np.float32(1e-5)
            )
            bounds[walked] = np.maximum(bounds[walked], trivial)
