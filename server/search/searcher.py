"""The read path: ``Searcher.search`` ranks memories for a query, with strategies, scopes and exact
candidate sets.

A search is checked and its query embedded (``query.py``), then waits for its turn (``Turns``),
then ranks: rows allowed by the request (namespaces, filter, space, alive, unexpired) come from the
source's ``allowed_rows``; few rows are all scored exactly (``ranking.py``), many go through the
candidate search (``candidates.py``, with ``bounds.py``); hybrid searches fuse a keyword ranking
(``keywords.py``).

Concurrency: searches run on the callers' threads, ``search_concurrency`` ranking at a time; a
ranking holds its space's indexes for reading from its first lookup to its last.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import Generic, TypeVar

import numpy as np

from tiermem import kernels
from tiermem.server.config import TIERS
from tiermem.server.cores import usable_cores
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.index.columns import ColumnsView
from tiermem.server.index.spaces import Index, Space
from tiermem.server.model.errors import DeadlineExceeded
from tiermem.server.model.types import Filter
from tiermem.server.search.bounds import PriorBounds
from tiermem.server.search.candidates import (
    Beside,
    CandidateSearch,
    ann,
    by_similarity,
    outlast,
    similarity_depth,
)
from tiermem.server.search.fused import Candidates, FusedWeights, rank_fused
from tiermem.server.search.keywords import KeywordScores, bm25, fuse, keyword_pass
from tiermem.server.search.observer import SearchObserver
from tiermem.server.search.query import (
    COMPREHENSIVE,
    DEFAULT_RRF_K,
    FAST_FIRST,
    FUSED,
    IMPORTANCE,
    RECENCY,
    SIMILARITY,
    STRATEGY_NAMES,
    WEIGHTED,
    CheckedQuery,
    Hybrid,
    RankingParams,
    SearchHit,
    SearchQuery,
    check_hybrid,
    check_query,
    query_vector,
)
from tiermem.server.search.ranking import Ranked, Scored, Scorer, collect_hits, row_weights
from tiermem.server.search.source import PolicyTables, SearchSource

__all__ = [
    "COMPREHENSIVE",
    "FAST_FIRST",
    "IMPORTANCE",
    "RECENCY",
    "SIMILARITY",
    "STRATEGY_NAMES",
    "WEIGHTED",
    "SearchHit",
    "SearchHits",
    "SearchQuery",
    "Searcher",
    "Turns",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

KEYWORD_ONLY = (
    "query_text could not be embedded (the server's embedder is unavailable): "
    "results are ranked by keyword match only"
)


class SearchHits(list[SearchHit]):
    """A search's hits, best first, with what the caller should know about how they were found:
    ``keyword_only`` when the query text could not be embedded (the embedder failed) and the
    memories were matched by keywords alone; ``warnings`` says so in words."""

    def __init__(self, hits: list[SearchHit], keyword_only: bool = False) -> None:
        super().__init__(hits)
        self.keyword_only = keyword_only
        self.warnings = [KEYWORD_ONLY] if keyword_only else []


PATIENCE_SECONDS = 0.05  # how often a search waiting for its turn asks whether its caller still waits


class Turns:
    """Rankings take turns, ``size`` at a time: more than the cores only contend for them and for
    the GIL (see ServerConfig.search_concurrency)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._slots = threading.BoundedSemaphore(size)
        self._busy = 0  # rankings and their helpers running
        self._waiting = 0  # rankings waiting for a turn
        self._helpers = 0  # of those running, helpers
        self._count = threading.Lock()

    def claim(self, calls: int = 0) -> bool:
        """Take a core for a ranking's helper thread if one is spare (fewer rankings and helpers
        run, or wait for a turn, than there are turns; and fewer ``calls`` in flight in the
        process, when the caller knows them, and helpers); ``release`` gives it back. A ranking
        waiting, or a call on its way to or from one, means the load fills the cores: a helper
        would only take one from the next search."""
        with self._count:
            got = max(self._busy + self._waiting, calls + self._helpers) < self.size
            self._busy += got
            self._helpers += got
        return got

    def release(self) -> None:
        with self._count:
            self._busy -= 1
            self._helpers -= 1

    @contextmanager
    def take(self, wanted: Callable[[], bool] | None = None) -> Iterator[None]:
        """Hold a turn; ``wanted`` is asked once it is taken, and every ``PATIENCE_SECONDS`` while
        it waits: False raises DeadlineExceeded (a caller gone, or past its deadline, frees its
        handler thread then, not when a turn comes)."""
        with self._count:
            self._waiting += 1
        got = False
        try:
            if wanted is None:
                got = self._slots.acquire()
            else:
                while not (got := self._slots.acquire(timeout=PATIENCE_SECONDS)) and wanted():
                    pass
            if not got or (wanted is not None and not wanted()):
                raise DeadlineExceeded(
                    "the caller's deadline passed or it went away while the search waited for its turn"
                )
        except BaseException:
            with self._count:
                self._waiting -= 1
            if got:
                self._slots.release()
            raise
        with self._count:  # (waiting to running in one step: no moment counts as a spare core)
            self._waiting -= 1
            self._busy += 1
        try:
            yield
        finally:
            with self._count:
                self._busy -= 1
            self._slots.release()


class _Lent(Generic[T]):
    """A job handed to a helper thread with a spare core, which it gives back when done. The pool
    queues a job before it starts a thread for it: if that start fails, ``cancel`` makes sure the
    job never runs later (the holds it would borrow end with its caller)."""

    def __init__(self, job: Callable[[], T], release: Callable[[], None]) -> None:
        self._job, self._release = job, release
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" or "cancelled"
        self._done = threading.Event()

    def run(self) -> T | None:
        with self._lock:
            if self._state == "cancelled":
                return None
            self._state = "running"
        try:
            return self._job()
        finally:
            self._release()
            self._done.set()

    def cancel(self) -> None:
        """Give the core back if no thread began the job; else wait until it ends."""
        with self._lock:
            began = self._state == "running"
            self._state = "cancelled" if not began else self._state
        if began:
            self._done.wait()
        else:
            self._release()


def _no_calls() -> int:
    return 0


RECENT_CALLS_WEIGHT = 0.125  # of the latest search in the running mean of calls in flight, at least
RECENT_CALLS_SECONDS = 0.05  # ... and more the longer since the search before (all of it after idling)
A_TURN_FREE = 0.75  # a search has a helper while that mean is at most the turns less this (2: 1.25)


class Searcher:
    """Ranks the memories of ``source`` (the engine) for search queries."""

    def __init__(self, source: SearchSource) -> None:
        self.source = source
        self._observer = SearchObserver()
        self.priors = PriorBounds(source, self._observer)
        # Embedding a query text (maybe a remote call) happens before a search takes its turn.
        self.turns = Turns(source.config.search_concurrency or usable_cores())
        # Vector searches beside keyword passes (a helper needs a spare turn: fewer than the turns)
        self._beside: ThreadPoolExecutor | None = ThreadPoolExecutor(
            max(1, self.turns.size - 1), thread_name_prefix="tiermem-beside"
        )
        self._beside_lock = threading.Lock()
        # The calls in flight in the serving process, this search's own included (the transport's
        # count of calls in its handlers, when it sets one; 0: not known, the turns decide alone),
        # and their mean as recent searches found them: a helper is had only while the process
        # serves about one call at a time (with its clients on the same cores, a helper's extra
        # work cost searches a second from two calls at once up)
        self.calls: Callable[[], int] = _no_calls
        self._recent_calls = 0.0
        self._calls_noted = 0.0  # (monotonic time of the mean's last update)
        # Several tiers' HNSW searches of one ranking at once, on a spare core (candidates.ann)
        self._tiers_beside = Beside(self._lend, source.config.tuning.tiers_beside_min_entries)

    @property
    def observer(self) -> SearchObserver:
        return self._observer

    @observer.setter
    def observer(self, observer: SearchObserver) -> None:
        self._observer = observer
        self.priors.observer = observer

    def search(
        self, q: SearchQuery, include_embedding: bool = False, wanted: Callable[[], bool] | None = None
    ) -> SearchHits:
        """Rank memories for ``q``. ``wanted``, when given, is asked once the search has its turn:
        False (the caller's deadline passed while it waited, or it went away) skips the ranking."""
        self._note_calls()
        checked = check_query(q, self.source.config, self.source.check_filter)
        hybrid = None
        if q.hybrid or (checked.strategy == FUSED and q.text):
            # (the fused strategy matches the text's keywords unasked; checked before embedding, so
            # that bad hybrid options are refused whether or not the embedder answers)
            hybrid = check_hybrid(q, reciprocal=checked.strategy != FUSED)
        keyword_only = False
        try:
            unused = checked.strategy in (RECENCY, IMPORTANCE) and hybrid is None and q.min_similarity is None
            query, sp = query_vector(
                q, self.source, checked.alpha > 0 or q.min_similarity is not None, unused
            )
        except EmbedderError as e:
            if not q.text:
                raise
            # The embedder is down: memories stay findable by keyword, and the answer says so.
            logger.warning("embedder failed, searching by keyword only: %s", e)
            query, sp, keyword_only = None, None, True
            rrf_k = hybrid.rrf_k if hybrid is not None and checked.strategy != FUSED else DEFAULT_RRF_K
            hybrid = Hybrid(q.text, rrf_k, 0.0, 1.0)
        with self.turns.take(wanted):
            # Ranked at the time it runs, not the time it queued.
            now = self.source.clock() if checked.as_of is None else checked.as_of
            hits = self._rank_strategy(checked, checked.params(now, hybrid), query, sp, include_embedding)
        return SearchHits(hits, keyword_only)

    def _rank_strategy(
        self,
        checked: CheckedQuery,
        a: RankingParams,
        query: np.ndarray | None,
        sp: Space | None,
        include_embedding: bool,
    ) -> list[SearchHit]:
        flt = checked.filter
        if a.strategy != FAST_FIRST:
            return self._rank(a, flt, query, sp, include_embedding)
        hits: list[SearchHit] = []  # FAST first, falling through to slower tiers until the limit is met
        for t in [t for t in TIERS if not flt.tiers or t in flt.tiers]:
            if len(hits) >= a.limit:
                break
            sub = replace(a, limit=a.limit - len(hits))
            hits += self._rank(sub, flt, query, sp, include_embedding, only_tier=t)
        return hits

    def _allowed(
        self, view: ColumnsView, a: RankingParams, flt: Filter, sp: Space | None, only_tier: int
    ) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(rows to rank, rows to match keywords in, how many of each)."""
        src = self.source
        in_space = sp is not None and a.hybrid is None  # keywords also find vectorless memories
        space = sp.id if in_space and sp else -1
        names, now = list(a.scope_w), src.clock()
        mask, count = src.shared_allowed_rows(view, names, flt, now, space)  # (not to be changed)
        if only_tier:
            mask, count = kernels.mask_equal(mask, view.tier, only_tier)
        keyword_mask, keyword_count = mask, count
        if sp is not None and not in_space:  # (a new mask: the keyword one stays as it is)
            if only_tier:
                mask, count = kernels.mask_equal(keyword_mask, view.space, sp.id)
            else:
                mask, count = src.shared_allowed_rows(view, names, flt, now, sp.id, within=keyword_mask)
        return mask, keyword_mask, count, keyword_count

    def _viewed(
        self, a: RankingParams, flt: Filter, sp: Space | None, only_tier: int, by_keywords: bool
    ) -> tuple[ColumnsView, tuple[np.ndarray, np.ndarray, int, int], np.ndarray | None] | None:
        """A view of the columns, ``_allowed``'s masks over it and the rows' weights; None when no
        row is allowed (nor, when keywords alone may find rows, any keyword row)."""
        view = self.source.columns.view()
        allowed = self._allowed(view, a, flt, sp, only_tier)
        if allowed[2] == 0 and not (by_keywords and allowed[3] > 0):
            return None
        return view, allowed, row_weights(view, a, self.source.columns.namespaces)

    def _rank(
        self,
        a: RankingParams,
        flt: Filter,
        query: np.ndarray | None,
        sp: Space | None,
        include_embedding: bool,
        only_tier: int = 0,
    ) -> list[SearchHit]:
        src = self.source
        # Keywords alone may find memories a vector search cannot (no vector yet, or none in the
        # query's space): under the fused strategy, and fused by rank into the others (hybrid).
        by_keywords = a.hybrid is not None and a.hybrid.keyword_weight > 0
        if query is not None and sp is None and not by_keywords:
            return []
        viewed = self._viewed(a, flt, sp, only_tier, by_keywords)
        if viewed is None:
            return []
        tables = src.policy_tables()
        with ExitStack() as held:
            # The space's indexes are held for reading through the ranking: during a backlog
            # drain a search waits for one chunk of the indexer's adds, not once per lookup.
            holding = list(sp.indexes.values()) if sp is not None else []
            for index in holding:
                held.enter_context(index.reading())
            if not src.columns.is_live(viewed[0]):
                # The columns grew since the view: rows an index relocated meanwhile (compaction,
                # a follower's newer snapshot) have their new locations only in the new arrays.
                # Under the holds no index relocates rows, so a view taken now stays right.
                viewed = self._viewed(a, flt, sp, only_tier, by_keywords)
                if viewed is None:
                    return []
            view, (mask, keyword_mask, count, keyword_count), row_w = viewed
            if a.strategy == FUSED:
                allowed = (mask, count, keyword_mask, keyword_count)
                return collect_hits(
                    src,
                    view,
                    self._fused(view, a, allowed, query, sp, tables, row_w, holding),
                    a,
                    flt,
                    only_tier,
                    include_embedding,
                )
            scorer = Scorer(view, sp, query, a, row_w, tables, src.columns.namespaces)
            pending: Future[Scored | None] | None = None  # the candidate search on a helper thread
            fused_limit = similarity_depth(a.limit) if a.hybrid else a.limit  # (each list fused this deep)
            if query is not None and sp is None:  # nothing in the query's space: keywords alone find rows
                scored = scorer(np.empty(0, np.int64))
            elif query is None or count <= src.config.exact_search_max_rows:
                scored = scorer(np.flatnonzero(mask))
            else:
                self._observer.candidate_search()
                # (by similarity alone, the search for a.limit finds the fused list's rows already)
                deeper = fused_limit != a.limit and not by_similarity(a, row_w)
                ranking = replace(a, limit=fused_limit) if deeper else a
                search = CandidateSearch(
                    src, self.priors, self._observer, scorer, ranking, self._tiers_beside
                )
                if by_keywords and self._beside_helps(count):  # (its keyword pass runs here meanwhile)
                    pending = self._lend_holding(lambda: search.run(mask, count), holding)
                if pending is None:
                    scored = search.run(mask, count)
            if a.hybrid is not None:
                if pending is not None:
                    time.sleep(0)  # (the GIL given up once: the helper reaches its search now, see _both)
                try:
                    keywords = bm25(
                        src, view, keyword_mask, keyword_count, list(a.scope_w), a.hybrid.text, fused_limit
                    )
                finally:
                    if pending is not None:  # (done before this search lets the indexes go)
                        helped = outlast(pending)
                        assert helped is not None  # (only a cancelled job answers None)
                        scored = helped
                ranked = fuse(keywords, a.hybrid, scored, fused_limit, scorer)
            else:
                ranked = Ranked(scored, scored.score)
        return collect_hits(src, view, ranked, a, flt, only_tier, include_embedding)

    def _fused(
        self,
        view: ColumnsView,
        a: RankingParams,
        allowed: tuple[np.ndarray, int, np.ndarray, int],
        query: np.ndarray | None,
        sp: Space | None,
        tables: PolicyTables,
        row_w: np.ndarray | None,
        holding: list[Index],
    ) -> Ranked:
        """The fused ranking (fused.py): the most similar rows (exact, or HNSW at a similarity search's
        depth: deeper did not change what ranks first) and the best keyword matches, each signal
        normalized over them. ``holding``: the space's indexes this search holds for reading."""
        src = self.source
        mask, count, keyword_mask, keyword_count = allowed
        depth = similarity_depth(a.limit)  # (each list as deep as a similarity search's HNSW one)
        # (asked for similarities and the scoring columns only: its weights go unused)
        scorer = Scorer(view, sp, query, a, None, tables, src.columns.namespaces)
        if a.hybrid is None and query is None:  # no signal of relevance asked: every allowed row ranks
            everything = Candidates(np.flatnonzero(mask), None)
            no_relevance = FusedWeights(a.alpha, a.beta, a.gamma, 0.0, 0.0)
            return rank_fused(everything, None, count, scorer, no_relevance, row_w, a.min_similarity)
        by_vector = query is not None and sp is not None and (a.hybrid is None or a.hybrid.vector_weight > 0)
        by_keywords = a.hybrid is not None and a.hybrid.keyword_weight > 0
        vector: Candidates | None
        keywords: KeywordScores | None
        both = None
        if by_vector and by_keywords and self._beside_helps(count):
            both = self._both(scorer, a, allowed, depth, holding)
        if both is not None:
            vector, keywords = both
        else:
            vector = self._most_similar(scorer, mask, count, depth) if by_vector else None
            keywords = None
            if by_keywords:
                assert a.hybrid is not None
                probe = np.empty(0, np.int64) if vector is None else vector.rows  # (their keyword scores)
                names, text = list(a.scope_w), a.hybrid.text
                keywords = bm25(src, view, keyword_mask, keyword_count, names, text, depth, probe)
        shares = (1.0, 0.0) if a.hybrid is None else (a.hybrid.vector_weight, a.hybrid.keyword_weight)
        weights = FusedWeights(a.alpha, a.beta, a.gamma, *shares)
        return rank_fused(vector, keywords, depth, scorer, weights, row_w, a.min_similarity)

    def _beside_helps(self, count: int) -> bool:
        """Whether a search with keywords over ``count`` rows (fused, or hybrid on a weighted sum)
        runs its vector search on a helper thread beside its keyword pass: when it searches HNSW."""
        min_rows = self.source.config.tuning.beside_min_rows
        return 0 < min_rows <= count and count > self.source.config.exact_search_max_rows

    def _both(
        self,
        scorer: Scorer,
        a: RankingParams,
        allowed: tuple[np.ndarray, int, np.ndarray, int],
        depth: int,
        holding: list[Index],
    ) -> tuple[Candidates, KeywordScores] | None:
        """``_most_similar`` on a helper thread and the keyword pass's best on this one, at once (both
        release the GIL for most of their time); the vector rows' keyword scores are probed after.
        None when no helper can be had (no core spare, or the searcher closed): the caller runs
        them in line."""
        assert a.hybrid is not None
        mask, count, keyword_mask, keyword_count = allowed

        pending = self._lend_holding(  # (first: the keyword pass's set-up overlaps it)
            lambda: self._most_similar(scorer, mask, count, depth), holding
        )
        if pending is None:
            return None
        # The GIL given up once: the helper reaches the GIL-free HNSW search now, not only once the
        # keyword pass's Python set-up here has run.
        time.sleep(0)
        try:
            sums = keyword_pass(
                self.source, keyword_mask, keyword_count, list(a.scope_w), a.hybrid.text, depth
            )
            rows, scores, probe = sums.best(depth)
            sims = scorer.relevance(rows, np.nan)  # (while the vector search may still run)
        finally:
            vector = outlast(pending)  # (the helper is done before this search lets the indexes go)
        assert vector is not None  # (only a cancelled job answers None, and its Future is nobody's)
        return vector, KeywordScores(rows, scores, probe(vector.rows), sims)

    def _note_calls(self) -> None:
        """The calls in flight into their running mean: by a weight growing with the time since
        the last search, so a server idle after a busy spell finds a core spare again at once."""
        calls, now = self.calls(), time.monotonic()
        mean, weight = self._recent_calls, RECENT_CALLS_WEIGHT
        idle = now - self._calls_noted
        if idle > 0:
            weight = max(weight, -math.expm1(-idle / RECENT_CALLS_SECONDS))
        self._recent_calls, self._calls_noted = mean + (calls - mean) * weight, now

    def _lend_holding(self, job: Callable[[], T], holding: list[Index]) -> Future[T | None] | None:
        """``_lend`` of ``job``, which reads the indexes this search's thread holds (``holding``) under
        its hold: the caller waits for the Future before it lets them go."""

        def lent_job() -> T:
            with ExitStack() as lent:
                for index in holding:  # (this search's thread holds them for reading until it has these)
                    lent.enter_context(index.lent())
                return job()

        return self._lend(lent_job)

    def _lend(self, job: Callable[[], T]) -> Future[T | None] | None:
        """``job`` on a helper thread holding a spare core until it ends (``Beside.submit``);
        None when no core is spare or the searcher closed: the caller runs it in line."""
        with self._beside_lock:
            if (
                self._beside is None
                or self._recent_calls > self.turns.size - A_TURN_FREE
                or not self.turns.claim(self.calls())
            ):
                return None
            lent = _Lent(job, self.turns.release)
            try:
                return self._beside.submit(lent.run)
            except BaseException as e:  # no thread could be started (it may be queued: see _Lent)
                lent.cancel()
                if isinstance(e, RuntimeError):
                    return None
                raise

    def close(self) -> None:
        """Stop the helper threads; later searches run in line."""
        with self._beside_lock:
            helper, self._beside = self._beside, None
        if helper is not None:
            helper.shutdown(wait=True)

    def _most_similar(self, scorer: Scorer, mask: np.ndarray, count: int, depth: int) -> Candidates:
        """The ``depth`` allowed rows most similar to the query, best first, with their similarities."""
        src = self.source
        if count <= src.config.exact_search_max_rows:
            rows = np.flatnonzero(mask)
        else:
            self._observer.candidate_search()
            self._observer.hnsw_search()
            assert scorer.space is not None and scorer.query is not None
            k, ef = similarity_depth(scorer.params.limit), src.config.hnsw_ef_search
            rows, sims, _ = ann(
                scorer.space, scorer.query, mask, k, ef, scorer.view, count, self._tiers_beside
            )
            if sims is not None:
                return Candidates(rows, sims).best(depth)
        kept, sims = scorer.similarities(rows)  # (rows that left the space: dropped)
        return Candidates(rows[kept], sims).best(depth)
