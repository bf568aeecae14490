"""The read path: ranking memories for a query, with strategies, scopes and exact candidate sets.

score = alpha*relevance + beta*recency + gamma*importance (seed 002), multiplied by a per-row weight:
the tier weight under the ``weighted`` strategy (FAST > MEDIUM > SLOW > GLACIAL, seed 000) times the
scope weight when a search spans a namespace and its ancestors (session before project before user).

Rows allowed by the request (namespaces, filter, space, alive, unexpired) come from a kernel over the
columns. Few rows: every one is scored exactly. Many rows: see ``_candidates``: the HNSW top-K by
similarity (searched with the allowed rows as an ID selector) plus every row whose exactly computed
weighted prior could still lift it into the top. So a memory with modest similarity but high recency
and importance is not lost because the ANN stage missed it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tiermem import kernels
from tiermem.server.config import TIERS, usable_cores
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.model import validation as check
from tiermem.server.model.errors import DeadlineExceeded, InvalidArgument, NotFound
from tiermem.server.model.records import Record
from tiermem.server.model.text import term_counts
from tiermem.server.model.types import INTERNAL_MASK, SPACE_SHIFT, TIER_SHIFT, Filter

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine
    from tiermem.server.index.spaces import Space

logger = logging.getLogger(__name__)

# Values of tiermem.v1.SearchStrategy.
COMPREHENSIVE, WEIGHTED, FAST_FIRST, SIMILARITY, RECENCY, IMPORTANCE = 1, 2, 3, 4, 5, 6
STRATEGY_NAMES = {
    COMPREHENSIVE: "comprehensive",
    WEIGHTED: "weighted",
    FAST_FIRST: "fast_first",
    SIMILARITY: "similarity",
    RECENCY: "recency",
    IMPORTANCE: "importance",
}
DEFAULT_TIER_WEIGHTS = {1: 1.0, 2: 0.85, 3: 0.7, 4: 0.55}
DEFAULT_SCOPE_WEIGHTS = (1.0, 0.8, 0.6, 0.4)  # the namespace itself, its parent, grandparent, ...

Parts = tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class SearchQuery:
    namespaces: list[str]
    embedding: Any = None
    embedding_model: str = ""
    text: str = ""
    filter: Filter | None = None
    limit: int = 0
    min_similarity: float | None = None
    alpha: float | None = None
    beta: float | None = None
    gamma: float | None = None
    recency_tau_seconds: float | None = None
    as_of: float | None = None
    strategy: int = 0
    tier_weights: dict[int, float] = field(default_factory=dict)
    include_ancestors: bool = False
    scope_weights: list[float] = field(default_factory=list)
    read_only: bool = False
    hybrid: bool = False  # fuse with keyword (BM25) ranking of query_text
    rrf_k: float = 60.0
    vector_weight: float = 1.0
    keyword_weight: float = 1.0


@dataclass
class SearchHit:
    record: Record
    score: float
    relevance: float
    recency: float
    importance: float
    vector: np.ndarray | None = None
    tier_weight: float = 1.0
    scope_weight: float = 1.0
    strategy: int = COMPREHENSIVE
    weights: tuple[float, float, float] = (0.0, 0.0, 0.0)  # alpha, beta, gamma used
    vector_rank: int = 0  # 1-based rank in the vector (combined score) list; 0: not in it
    keyword_rank: int = 0  # 1-based rank in the keyword (BM25) list; 0: not in it
    keyword_score: float = 0.0  # BM25
    base: float = 0.0  # the combined score before fusion (score is the fused one when hybrid)


def ancestors(namespace: str) -> list[str]:
    """The namespace and its ancestors, nearest first: "a/b/c" -> ["a/b/c", "a/b", "a"]."""
    parts = namespace.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


class Priors(NamedTuple):
    """Cached prior bounds (see ``PriorBounds``): valid at times >= t0 with recency tau ``tau`` and
    config ``version``, for rows whose generation still equals ``gen0``."""

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
    # The best rows (an eighth, at least SORTED_MIN) by their prior bound beta*rec + gamma*imp under
    # these weights, best first, and those bounds; None when not kept (bounds for one search only).
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
    are older than ``MAX_AGE`` seconds (they loosen as time passes), the rows grew by a tenth, or
    more than max(MIN_STALE, STALE_SHARE of the rows) rows changed since (each changed row is
    bounded trivially, and a burst of changes such as a consolidation pass's tier moves would
    otherwise leave tens of thousands of rows to score until the next refresh).

    Cached bounds also keep the rows sorted by prior bound under the configured beta and gamma
    (one sort per refresh), so a search with those weights reads only the rows whose bound beats
    its bar, plus the rows changed since (``Columns.changed_since``), instead of every row.
    """

    MAX_AGE = 30.0
    MIN_STALE = 1024
    STALE_SHARE = 0.01
    SORTED_MIN = 65536
    SORTED_SHARE = 0.125

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._cached: Priors | None = None
        self._lock = threading.Lock()

    def get(self, view: ColumnsView, now: float, tau: float) -> Priors:
        """Bounds valid at ``now`` with ``tau``; gen0, rec and imp cover at most view.n rows
        (``Priors.order`` may name rows past them: rows the view does not have)."""
        eng = self.engine
        c = self._cached
        cols = eng.columns
        version = eng.config_version
        valid = c is not None and c.t0 <= now and c.tau == tau and c.version == version and c.columns is cols
        fresh = (
            c is not None
            and now - c.t0 <= self.MAX_AGE
            and view.n <= 1.1 * c.gen0.shape[0] + 1024
            and cols.changes - c.changes <= max(self.MIN_STALE, self.STALE_SHARE * view.n)
        )
        if valid and fresh and c is not None:
            return self._fit(c, view)
        cacheable = tau == eng.config.recency_tau_seconds
        if not cacheable or not self._lock.acquire(blocking=False):
            if valid and c is not None:
                return self._fit(c, view)  # another search is refreshing them
            return self._compute(view, now, tau)
        try:
            p = self._compute(view, now, tau)
            if p.changes < 0:
                return p  # a view growth froze: bounds for this search only, not for live views
            self._cached = self._sorted(p, eng.config.beta, eng.config.gamma)
            return self._cached
        finally:
            self._lock.release()

    def _sorted(self, p: Priors, beta: float, gamma: float) -> Priors:
        """``p`` with its best SORTED_SHARE of rows (at least SORTED_MIN) sorted by prior bound
        under these weights. A full sort cost 10 ms at 100k rows and 125 ms at 1M; searches rarely
        walk past the first few thousand."""
        prior = np.float32(beta) * p.rec + np.float32(gamma) * p.imp
        n = prior.shape[0]
        m = min(n, max(self.SORTED_MIN, int(n * self.SORTED_SHARE)))
        tail = -math.inf
        if m < n:
            part = np.argpartition(-prior, m)
            tail = float(prior[part[m]])
            top = part[:m]
            order = top[np.argsort(-prior[top], kind="stable")]
        else:
            order = np.argsort(-prior, kind="stable")
        return p._replace(order=order, prior=prior[order], tail=tail, beta=beta, gamma=gamma)

    @staticmethod
    def _fit(c: Priors, view: ColumnsView) -> Priors:
        """Cached bounds cut to ``view``: a search may hold a view older (shorter) than the one the
        bounds were computed from. Rows are never reused, so the first view.n rows still apply."""
        n = min(view.n, c.gen0.shape[0])
        return c._replace(gen0=c.gen0[:n], rec=c.rec[:n], imp=c.imp[:n])

    def _compute(self, view: ColumnsView, now: float, tau: float) -> Priors:
        eng = self.engine
        cols = eng.columns
        version = eng.config_version  # before the tables: bounds are never labelled newer than them
        # The generations first: a row changing meanwhile moves past them (and is logged from
        # ``changes`` on), so bounds computed from half-written fields are not used for it. A
        # view that growth left frozen has its own generations, and no log (changes -1).
        changes, gen0 = cols.generations(view)
        rows = np.arange(view.n, dtype=np.int64)
        _, rec, imp = kernels.score_rows(
            rows,
            np.zeros(view.n, np.float32),
            importance=view.importance,
            created_at=view.created,
            last_access=view.accessed,
            tier=view.tier,
            now=now,
            tau_seconds=tau,
            half_life_hours=eng.tables().half_life,
            floor=eng.config.importance_floor,
            alpha=0.0,
            beta=0.0,
            gamma=0.0,
            ns=view.ns,
        )
        return Priors(now, tau, version, gen0, rec, imp, cols, changes)


class Searcher:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.priors = PriorBounds(engine)
        # Rankings take turns, config.search_concurrency at a time (see ServerConfig); embedding a
        # query text (maybe a remote call) happens before a search takes its turn.
        self._turns = threading.BoundedSemaphore(engine.config.search_concurrency or usable_cores())

    def search(
        self, q: SearchQuery, include_embedding: bool = False, wanted: Callable[[], bool] | None = None
    ) -> list[SearchHit]:
        """Rank memories for ``q``. ``wanted``, when given, is asked once the search has its turn:
        False (the caller's deadline passed while it waited, or it went away) skips the ranking."""
        eng, cfg = self.engine, self.engine.config

        flt = eng.check_filter(q.filter or Filter())
        if not q.namespaces:
            raise InvalidArgument("namespaces", "must name at least one namespace")
        if len(q.namespaces) > 64:
            raise InvalidArgument("namespaces", "names more than 64 namespaces")
        for i, ns in enumerate(q.namespaces):
            check.namespace(f"namespaces[{i}]", ns)
        if q.limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        limit = min(q.limit or 10, cfg.max_search_limit)
        strategy = q.strategy or COMPREHENSIVE
        if strategy not in STRATEGY_NAMES:
            raise InvalidArgument("strategy", "is not a search strategy")
        alpha = _weight("alpha", q.alpha, cfg.alpha)
        beta = _weight("beta", q.beta, cfg.beta)
        gamma = _weight("gamma", q.gamma, cfg.gamma)
        if strategy in (SIMILARITY, RECENCY, IMPORTANCE):  # single-signal orderings (seed 004)
            alpha, beta, gamma = (
                float(strategy == SIMILARITY),
                float(strategy == RECENCY),
                float(strategy == IMPORTANCE),
            )
        tau = cfg.recency_tau_seconds if q.recency_tau_seconds is None else q.recency_tau_seconds
        if not (math.isfinite(tau) and tau > 0):
            raise InvalidArgument("recency_tau_seconds", "must be a finite number > 0")
        if q.min_similarity is not None and not (-1.0 <= q.min_similarity <= 1.0):
            raise InvalidArgument("min_similarity", "must be in [-1, 1]")
        tier_w = dict(DEFAULT_TIER_WEIGHTS) if strategy == WEIGHTED else dict.fromkeys(TIERS, 1.0)
        for t, w in q.tier_weights.items():
            check.tier("tier_weights", t)
            tier_w[t] = _weight("tier_weights", w, 1.0)
        for i, w in enumerate(q.scope_weights):
            _weight(f"scope_weights[{i}]", w, 1.0)
        as_of = None if q.as_of is None else check.finite_time("as_of", q.as_of)

        # Scopes: each named namespace at weight 1 (or scope_weights[0]); with include_ancestors its
        # ancestors too, weighted by distance. A namespace reached twice keeps its best weight.
        scope_w: dict[str, float] = {}
        weights = list(q.scope_weights) or list(DEFAULT_SCOPE_WEIGHTS)
        for ns in q.namespaces:
            chain = ancestors(ns) if q.include_ancestors else [ns]
            for depth, name in enumerate(chain):
                w = weights[min(depth, len(weights) - 1)] if (q.include_ancestors or q.scope_weights) else 1.0
                scope_w[name] = max(scope_w.get(name, 0.0), w)

        hybrid = None
        try:
            query, sp = self._query(q, needed=alpha > 0 or q.min_similarity is not None)
        except EmbedderError as e:
            if not q.text:
                raise
            # The embedder is down: memories stay findable by keyword (seed 003).
            logger.warning("embedder failed, searching by keyword only: %s", e)
            query, sp = None, None
            hybrid = (q.text, q.rrf_k, 0.0, 1.0)
        if q.hybrid and hybrid is None:
            if not q.text:
                raise InvalidArgument(
                    "query_text", "is required for hybrid search (its keywords are matched)"
                )
            if not (math.isfinite(q.rrf_k) and q.rrf_k >= 0):
                raise InvalidArgument("hybrid.rrf_k", "must be a finite number >= 0")
            hybrid = (
                q.text,
                q.rrf_k,
                _weight("hybrid.vector_weight", q.vector_weight, 1.0),
                _weight("hybrid.keyword_weight", q.keyword_weight, 1.0),
            )
        with self._turns:
            if wanted is not None and not wanted():
                raise DeadlineExceeded(
                    "the caller's deadline passed or it went away while the search waited for its turn"
                )
            # Ranked at the time it runs, not the time it queued.
            now = eng.clock() if as_of is None else as_of
            args = _Args(
                limit, alpha, beta, gamma, tau, now, q.min_similarity, tier_w, scope_w, strategy, hybrid
            )
            if strategy != FAST_FIRST:
                return self._rank(args, flt, query, sp, include_embedding)
            hits: list[SearchHit] = []  # FAST first, falling through to slower tiers until the limit is met
            for t in [t for t in TIERS if not flt.tiers or t in flt.tiers]:
                if len(hits) >= limit:
                    break
                sub = replace(args, limit=limit - len(hits))
                hits += self._rank(sub, flt, query, sp, include_embedding, only_tier=t)
            return hits

    def _query(self, q: SearchQuery, needed: bool) -> tuple[np.ndarray | None, Space | None]:
        """The query vector and its space; (None, None) when the ordering needs no query."""
        eng, cfg = self.engine, self.engine.config
        if q.embedding is not None:
            model = check.model("embedding_model", q.embedding_model)
            query = check.vector("query_embedding", q.embedding, cfg)
        elif q.text:
            check.text("query_text", q.text, cfg.max_content_bytes)
            model, query = eng.embedder.model, eng.embedder.embed(q.text)
        elif needed:
            raise InvalidArgument("query_embedding", "a query_embedding or a query_text is required")
        else:
            return None, None
        sp = eng.spaces.get(model)
        if sp is None:
            if model == eng.embedder.model:
                return query, None  # nothing embedded yet: no results
            raise NotFound(f"no memories in embedding space {model!r}", reason="EMBEDDING_SPACE_NOT_FOUND")
        if query.shape[0] != sp.dim:
            raise InvalidArgument(
                "query_embedding",
                f"has dimension {query.shape[0]}, but embedding space {model!r} has dimension {sp.dim}",
                reason="EMBEDDING_DIMENSION_MISMATCH",
            )
        return query, sp

    def _rank(
        self,
        a: _Args,
        flt: Filter,
        query: np.ndarray | None,
        sp: Space | None,
        include_embedding: bool,
        only_tier: int = 0,
    ) -> list[SearchHit]:
        eng = self.engine
        if query is not None and sp is None:
            return []
        view = eng.columns.view()
        in_space = sp is not None and a.hybrid is None  # keywords also find vectorless memories
        mask, count = eng.mask(view, list(a.scope_w), flt, eng.clock(), sp.id if in_space and sp else -1)
        if only_tier:
            mask &= view.tier == only_tier
            count = -1
        keyword_mask = mask.copy() if a.hybrid is not None else mask
        if sp is not None and not in_space:
            mask &= view.space == sp.id
            count = -1
        if count < 0:
            count = int(mask.sum())
        if count == 0:
            return []
        tables = eng.tables()
        row_w = self._row_weights(view, a)
        score_args = {
            "importance": view.importance,
            "created_at": view.created,
            "last_access": view.accessed,
            "tier": view.tier,
            "now": a.now,
            "tau_seconds": a.tau,
            "half_life_hours": tables.half_life,
            "ns": view.ns,
            "floor": eng.config.importance_floor,
        }

        def rank(rows: np.ndarray, keep_vectorless: bool = False, rel: np.ndarray | None = None) -> Parts:
            """Score ``rows`` exactly; ``rel``: their similarities when the caller has them."""
            if rel is not None:  # the caller computed them
                pass
            elif query is None or sp is None:
                rel = np.zeros(rows.shape[0], np.float32)
            else:
                kept, sims = self._similarities(view, sp, rows, query)
                if keep_vectorless:  # keyword hits without a vector yet rank with relevance 0
                    rel = np.zeros(rows.shape[0], np.float32)
                    rel[kept] = sims
                else:
                    rows, rel = rows[kept], sims
            score, rec, imp = kernels.score_rows(
                rows, rel, alpha=a.alpha, beta=a.beta, gamma=a.gamma, **score_args
            )
            if row_w is not None:
                score = score * row_w[rows]
            if a.min_similarity is not None:
                score[rel < a.min_similarity] = np.nan
            return rows, rel, (score, rec, imp)

        fused_limit = max(5 * a.limit, 50) if a.hybrid else a.limit
        ranking = a if fused_limit == a.limit else replace(a, limit=fused_limit)
        # Keyword scores first: they read LMDB (the store's gate), which must not wait while this
        # search holds the indexes (the indexer would wait behind it, and every new search behind that).
        keywords = self._bm25(view, keyword_mask, a.hybrid[0]) if a.hybrid is not None else None
        with ExitStack() as held:
            # The space's indexes are held for reading through the ranking: during a backlog
            # drain a search waits for one chunk of the indexer's adds, not once per lookup.
            for index in list(sp.indexes.values()) if sp is not None else []:
                held.enter_context(index.reading())
            if query is None or sp is None or count <= eng.config.exact_search_max_rows:
                rows, rel, (score, rec, imp) = rank(np.flatnonzero(mask))
            else:
                rows, rel, (score, rec, imp) = self._candidates(
                    view, sp, query, mask, count, ranking, row_w, rank
                )
            base = score
            v_rank = k_rank = kw = None
            if keywords is not None:
                rows, rel, base, rec, imp, score, v_rank, k_rank, kw = self._fuse(
                    keywords, a, rows, rel, score, rec, imp, fused_limit, rank
                )
        top = kernels.topk(score, a.limit)
        hits: list[SearchHit] = []
        with eng.store.read() as txn:
            records = eng.store.get_many(txn, view.rid[rows[top]].tolist())
            for i, record in zip(top.tolist(), records, strict=True):
                if record is None or not self._still_matches(record, a.scope_w, flt, only_tier):
                    continue  # deleted, moved or expired while the search ran
                vec = eng.store.get_vector(txn, record.rid) if include_embedding else None
                hits.append(
                    SearchHit(
                        record,
                        float(score[i]),
                        float(rel[i]),
                        float(rec[i]),
                        float(imp[i]),
                        vec,
                        tier_weight=a.tier_w.get(record.tier, 1.0),
                        scope_weight=a.scope_w.get(record.namespace, 1.0),
                        strategy=a.strategy,
                        weights=(a.alpha, a.beta, a.gamma),
                        base=float(base[i]),
                        vector_rank=int(v_rank[i]) if v_rank is not None else 0,
                        keyword_rank=int(k_rank[i]) if k_rank is not None else 0,
                        keyword_score=float(kw[i]) if kw is not None else 0.0,
                    )
                )
        return hits

    def _fuse(
        self,
        keywords: tuple[np.ndarray, np.ndarray],
        a: _Args,
        rows: np.ndarray,
        rel: np.ndarray,
        score: np.ndarray,
        rec: np.ndarray,
        imp: np.ndarray,
        depth: int,
        rank: Callable[..., Parts],
    ) -> tuple[np.ndarray, ...]:
        """Reciprocal rank fusion of the vector (combined score) list and the keyword (BM25) list,
        each cut at ``depth``: fused = w_v / (k + rank_v) + w_k / (k + rank_k) (seed 000)."""
        assert a.hybrid is not None
        _, k, w_vec, w_kw = a.hybrid
        v_order = kernels.topk(score, depth)
        v_rows = rows[v_order]
        kw_rows, kw_scores = keywords
        k_order = kernels.topk(kw_scores, depth)
        k_rows = kw_rows[k_order]
        extra = np.setdiff1d(k_rows, v_rows)
        e_rows, e_rel, (e_score, e_rec, e_imp) = rank(extra, True)
        all_rows = np.concatenate([v_rows, e_rows])
        pos = {int(r): i for i, r in enumerate(all_rows.tolist())}
        n = all_rows.shape[0]
        v_rank = np.zeros(n, np.int64)
        v_rank[: v_rows.shape[0]] = np.arange(1, v_rows.shape[0] + 1)
        k_rank = np.zeros(n, np.int64)
        kw_of = np.zeros(n, np.float32)
        for r, (row, s) in enumerate(zip(k_rows.tolist(), kw_scores[k_order].tolist(), strict=True), start=1):
            i = pos.get(row)
            if i is not None:
                k_rank[i], kw_of[i] = r, s
        fused = np.zeros(n, np.float32)
        fused[v_rank > 0] += w_vec / (k + v_rank[v_rank > 0])
        fused[k_rank > 0] += w_kw / (k + k_rank[k_rank > 0])
        fused[fused <= 0] = np.nan  # in neither weighted list: not a result
        cat = np.concatenate
        return (
            all_rows,
            cat([rel[v_order], e_rel]),
            cat([score[v_order], e_score]),
            cat([rec[v_order], e_rec]),
            cat([imp[v_order], e_imp]),
            fused,
            v_rank,
            k_rank,
            kw_of,
        )

    def _bm25(
        self, view: ColumnsView, mask: np.ndarray, text: str, k1: float = 1.2, b: float = 0.75
    ) -> tuple[np.ndarray, np.ndarray]:
        """BM25 of every allowed row containing a term of ``text``: (rows, scores). Terms in more
        than max_keyword_postings memories are skipped (they carry almost no information)."""
        eng = self.engine
        n_docs = int(mask.sum())
        if n_docs == 0:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        lengths = view.words
        avgdl = max(1.0, float(lengths[mask].mean()))
        acc: dict[int, float] = {}
        rows_of = eng.columns.rows
        with eng.store.read() as txn:
            for term in term_counts(text):
                posts = eng.store.term_postings(txn, term, eng.config.max_keyword_postings)
                if not posts:
                    continue
                found = [
                    (row, tf)
                    for row, tf in ((rows_of.get(rid, -1), tf) for rid, tf in posts)
                    if 0 <= row < view.n and mask[row]
                ]
                if not found:
                    continue
                df = len(found)
                idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
                for row, tf in found:
                    dl = float(lengths[row])
                    acc[row] = acc.get(row, 0.0) + idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        rows = np.fromiter(acc.keys(), np.int64, len(acc))
        return rows, np.fromiter(acc.values(), np.float32, len(acc))

    def _row_weights(self, view: ColumnsView, a: _Args) -> np.ndarray | None:
        """tier weight x scope weight per row, or None when every weight is 1."""
        if all(w == 1.0 for w in a.tier_w.values()) and all(w == 1.0 for w in a.scope_w.values()):
            return None
        names = self.engine.columns.namespaces
        by_ns = np.ones(max(1, len(names)), np.float32)
        for name, w in a.scope_w.items():
            i = names.get(name)
            if 0 <= i < by_ns.shape[0]:
                by_ns[i] = w
        by_tier = np.ones(5, np.float32)
        for t, w in a.tier_w.items():
            by_tier[t] = w
        return kernels.row_weights(view.ns, view.tier, by_ns, by_tier)

    def _ann(
        self,
        sp: Space,
        query: np.ndarray,
        mask: np.ndarray,
        k: int,
        view: ColumnsView | None = None,
        count: int = -1,
    ) -> tuple[np.ndarray, np.ndarray | None, float]:
        """The HNSW top-``k`` by similarity among the allowed rows of each index of the space:
        (rows, their similarities, sim_bound). No allowed row outside ``rows`` is more similar than
        ``sim_bound`` (up to HNSW recall); -inf when every allowed row was returned. Similarities
        are None (the caller looks them up) when an index's allowed rows are returned without them
        (a short filtered answer) or a row came back twice; with ``view``, rows the view no longer
        has in this space are left out when similarities are returned.

        With ``view`` and ``count`` (the allowed rows, all in this space), per-index allowed counts
        let an index that holds exactly the allowed rows search without a per-request selector."""
        indexes = list(sp.indexes.items())
        counts = [-1] * len(indexes)
        if view is not None and count >= 0:
            if len(indexes) == 1:
                counts = [count]
            else:
                per_tier = kernels.tier_counts(mask, view.tier).tolist()
                counts = [per_tier[t] for t, _ in indexes]
        found: list[np.ndarray] = []
        sims: list[np.ndarray] = []  # of every index's rows, unless one answered with rows only
        sim_bound = -np.inf
        for (_, index), n_allowed in zip(indexes, counts, strict=True):
            got, got_sims, bound = index.search(query, k, mask, self.engine.config.hnsw_ef_search, n_allowed)
            if bound != bound:  # NaN: filtered HNSW came back short (selective filter)
                found.append(index.allowed_rows(mask))  # score this index's allowed rows exactly
                continue
            found.append(got)
            sims.append(got_sims)
            sim_bound = max(sim_bound, bound)
        if not found:
            return np.empty(0, np.int64), np.empty(0, np.float32), sim_bound
        # Sorted and distinct (a row moving to another tier's index can show up in both for a moment,
        # with the same vector); np.unique's own overhead was ~10% of a similarity search.
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
            # As ``_similarities``: only rows the view still has in this space keep a similarity.
            kept = _in_space(view.vpos[rows], sp.id)
            if not kept.all():
                rows, rel = rows[kept], rel[kept]
        return rows, rel, sim_bound

    PRIOR_K = 64  # least HNSW depth of the first search when recency/importance/weights enter the score
    # Rows left whose bound beats the bar: up to this many get their true similarity (one dot
    # product each, best bound first, a chunk at a time) rather than a deeper, filtered HNSW search
    # among them (~0.6 ms at 100k), which made the slowest queries slow. 32,768 against 16,384,
    # same top 10: p99 -30 to -40% in-process at 100k and 1M, p50 about the same in the server
    # (the figures: CHANGELOG).
    EXACT_ROWS = 32768
    CHUNK = 1024
    # The first chunk; later ones double up to CHUNK. 100k clustered memories with recency and
    # importance spread, in-process: with queries near stored memories B held ~6k rows and 256
    # settled ~90% of searches (1.81-1.84 -> 1.32-1.54 ms a search against 1,024); with queries
    # near cluster centres (bench/suite.py) B held ~11k and 256 was slower (medians over 8 rounds
    # in one process: 2.25 vs 2.03 ms). The suite's workload decides: 1,024.
    FIRST_CHUNK = 1024
    DEEPEN_LEVELS = 3  # HNSW searches restricted to the rows whose bound still beats the bar

    def _candidates(
        self,
        view: ColumnsView,
        sp: Space,
        query: np.ndarray,
        mask: np.ndarray,
        count: int,
        a: _Args,
        row_w: np.ndarray | None,
        rank: Callable[..., Parts],
    ) -> Parts:
        """Score every row that could enter the exact top ``limit`` (up to HNSW recall); returns the
        scored rows (rows, relevance, (score, recency, importance)).

        A = the HNSW top-K by similarity in each index. Every row x outside A is at most sim_K
        similar, so its score is at most w(x) * (alpha*sim_K + prior(x)), where prior = beta*recency
        + gamma*decayed importance and w is its tier x scope weight. Priors are bounded from above by
        ``PriorBounds`` (cached, one cheap pass); rows whose bound beats the limit-th score found so
        far are B. A large B is searched again by HNSW restricted to B, which lowers sim_K for the
        rest of B (a few levels). What is left gets its true similarity (a dot product, no
        exponentials), which tightens its bound; the rows still above the bar are scored exactly.
        """
        by_similarity = a.beta == 0 and a.gamma == 0 and a.alpha > 0 and row_w is None
        # When priors count, a deeper A lowers sim_K, so the cheap ceiling below settles more
        # rankings at once and B is smaller; the deeper HNSW search costs more. At 100k, top 10,
        # in-process: depth 80 (PRIOR_K 64) against 128 took 0.77 vs 0.88 ms a search with queries
        # near stored memories and every memory as recent and important, 1.35 vs 1.52 ms with
        # recency and importance spread, but 2.14 vs 2.03 ms (medians over 8 rounds) with the
        # suite's queries near cluster centres while B was found by a pass over every row. Since
        # B comes from the sorted bounds (reading only rows above the bar), the suite's queries
        # too: 1.16 vs 1.24 ms (8 rounds, same top 10 for 256 of 256), cache-cold 1.78 vs 1.85
        # and 2.09 vs 2.22 ms (6 rounds each), and in the server at concurrency 1 the ranking's
        # CPU p50 1.68 / 1.76 / 1.98 vs 1.93 / 1.76 / 2.07 ms (alternating): 64.
        k = max(2 * a.limit, 32) if by_similarity else min(max(8 * a.limit, self.PRIOR_K), 2048)
        a_rows, a_sims, sim_bound = self._ann(sp, query, mask, k, view, count)
        parts = [rank(a_rows, rel=a_sims)]
        if sim_bound == -np.inf or by_similarity:
            return parts[0]  # nothing outside A can beat A's scores
        best = parts[0][2][0][kernels.topk(parts[0][2][0], a.limit)]  # the running top scores, best first

        def bar() -> float:  # a row outside the scored ones must have a bound above this to enter the top
            return float(best[-1]) if best.shape[0] == a.limit else -np.inf

        def add(part: Parts) -> None:
            nonlocal best
            parts.append(part)
            merged = np.concatenate([best, part[2][0]])
            best = merged[kernels.topk(merged, a.limit)]

        # The extreme row weights: a row's score is at most w * x, which is largest at the highest
        # weight when x >= 0 and at the lowest when x < 0 (small beta/gamma, dissimilar rows).
        w_max, w_min = 1.0, 1.0
        if row_w is not None:
            w_max = max([*a.tier_w.values(), 1.0]) * max([*a.scope_w.values(), 1.0])
            w_min = min([*a.tier_w.values(), 1.0]) * min([*a.scope_w.values(), 1.0])
        todo = mask.copy()
        todo[a_rows] = False  # scored: never count a row twice
        b_rows = np.empty(0, np.int64)
        b_bound = np.empty(0, np.float32)
        for level in range(self.DEEPEN_LEVELS + 1):
            if a.min_similarity is not None and sim_bound < a.min_similarity:
                return _concat(parts)  # nothing left is similar enough to be returned
            base = a.alpha * sim_bound if a.alpha > 0 else 0.0
            # Cheap ceiling: recency <= 1 and decayed importance <= the highest importance.
            x = base + a.beta + a.gamma * self.engine.columns.max_importance
            if (w_max if x >= 0 else w_min) * x + 1e-5 <= bar():
                return _concat(parts)
            b_rows, b_bound = self._bounded(view, todo, a, base, bar(), row_w)
            if b_rows.shape[0] <= self.EXACT_ROWS or level == self.DEEPEN_LEVELS or a.alpha == 0:
                # (with alpha = 0 similarity does not count: a deeper search cannot lower a bound)
                break
            # Deepen: the most similar rows among B. The rest of B is at most as similar as they are.
            todo = np.zeros(view.n, np.bool_)
            todo[b_rows] = True
            deeper, deeper_sims, sim_bound = self._ann(sp, query, todo, k, view)
            add(rank(deeper, rel=deeper_sims))
            todo[deeper] = False
            if sim_bound == -np.inf:
                return _concat(parts)  # every row of B was returned
        # B's bounds assumed sim_K. Best bound first, a chunk at a time: its true similarities (dot
        # products, no exponentials) tighten each bound to w * (alpha*sim + prior bound); rows still
        # above the bar are scored exactly (with those similarities), which raises the bar; rows
        # whose bound the bar has passed are dropped before the next chunk.
        sim_k = np.float32(sim_bound if a.alpha > 0 else 0.0)
        alpha = np.float32(a.alpha)
        size = self.FIRST_CHUNK
        while b_rows.shape[0]:
            top, rest = kernels.split_top(b_bound, bar(), size)  # rows whose bound the bar passed: gone
            if not top.shape[0]:
                break
            chunk, chunk_bound = b_rows[top], b_bound[top]
            b_rows, b_bound = b_rows[rest], b_bound[rest]
            size = min(2 * size, self.CHUNK)
            if a.alpha == 0:  # similarity does not count: the prior bound is as tight as it gets
                add(rank(chunk[chunk_bound > bar()]))
                continue
            kept, sims = self._similarities(view, sp, chunk, query)  # (rows that left the space: dropped)
            got = chunk[kept]
            w = row_w[got] if row_w is not None else np.float32(1.0)
            tight = chunk_bound[kept] + w * alpha * (sims - sim_k)
            sel = tight > bar()
            if sel.any():
                add(rank(got[sel], rel=sims[sel]))
        return _concat(parts)

    def _bounded(
        self, view: ColumnsView, todo: np.ndarray, a: _Args, base: float, bar: float, row_w: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """B: the rows of ``todo`` whose score bound w * (base + prior bound) beats ``bar`` (rows,
        bounds); may clear ``todo``. With cached bounds sorted for these weights, only the rows
        above the bar and those changed since are read (``kernels.ordered_bounds``); otherwise
        every row is (``kernels.prior_bounds``)."""
        p = self.priors.get(view, a.now, a.tau)
        cols = p.columns
        logged = None
        if p.order is not None and p.changes >= 0 and cols.is_live(view):
            logged = cols.changed_since(p.changes)
        if logged is None or row_w is not None or a.beta != p.beta or a.gamma != p.gamma or bar == -math.inf:
            # (no bar yet: every row is in B, and the walk would only precede a full pass)
            return self._prior_bounds(view, todo, p, a, base, bar, row_w)
        assert p.order is not None and p.prior is not None
        log, end = logged
        before = todo.copy()  # for a full pass from the start, should the log wrap
        common = {"n0": p.gen0.shape[0], "importance": view.importance, "log": log}
        weights = {"beta": a.beta, "gamma": a.gamma, "base": base, "bar": bar}
        rows, bounds = kernels.ordered_bounds(
            todo, order=p.order, prior=p.prior, log_from=p.changes, log_to=end, **common, **weights
        )
        parts = [(rows, bounds)]
        # Rows whose change began while the walk ran are logged past ``end``: the walk may have
        # taken one with its cached bound (it reads no generation), which the change may have
        # outgrown: such rows get the trivial bound, and the others of them (still in ``todo``)
        # come from the log's later positions.
        later = cols.changed_since(p.changes)
        if later is not None and later[1] > end:
            moved = log[np.arange(end, later[1]) % log.shape[0]]
            walked = np.isin(rows, moved)
            if walked.any():
                trivial = (
                    np.float32(base)
                    + np.float32(a.beta)
                    + np.float32(a.gamma) * view.importance[rows[walked]]
                    + np.float32(1e-5)
                )
                bounds[walked] = np.maximum(bounds[walked], trivial)
            empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float32)
            parts.append(
                kernels.ordered_bounds(
                    todo, order=empty_i, prior=empty_f, log_from=end, log_to=later[1], **common, **weights
                )
            )
            later = cols.changed_since(p.changes)
        if later is None:
            # The log wrapped: entries read may have been overwritten, so which rows changed is
            # not known: a full pass over every row of the original ``todo``.
            return self._prior_bounds(view, before, p, a, base, bar, row_w)
        if base + p.tail + 1e-5 > bar:
            # Rows left out of the sorted part may beat the bar: a full pass over the rows not
            # bounded yet (todo).
            parts.append(self._prior_bounds(view, todo, p, a, base, bar, row_w))
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([q[0] for q in parts]), np.concatenate([q[1] for q in parts])

    @staticmethod
    def _prior_bounds(
        view: ColumnsView,
        todo: np.ndarray,
        p: Priors,
        a: _Args,
        base: float,
        bar: float,
        row_w: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        return kernels.prior_bounds(
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

    def _still_matches(self, rec: Record, namespaces: dict[str, float], flt: Filter, only_tier: int) -> bool:
        return (
            rec.namespace in namespaces
            and not self.engine.expired(rec)
            and (not flt.tiers or rec.tier in flt.tiers)
            and (not only_tier or rec.tier == only_tier)
            and (not flt.kinds or rec.kind in flt.kinds)
        )

    def _similarities(
        self, view: ColumnsView, sp: Space, rows: np.ndarray, query: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Cosine of ``rows`` with the query, read from HNSW storage. Returns (kept, similarities):
        ``kept`` selects the rows still in the space (a row may leave it while a search runs);
        the similarities are those of ``rows[kept]``, in order."""

        loc = view.vpos[rows]
        kept = _in_space(loc, sp.id)
        if not kept.all():
            loc = loc[kept]
        tiers = (loc >> TIER_SHIFT) & 0xF
        if tiers.shape[0] and tiers.min() == tiers.max():  # one tier: no per-tier split
            return kept, sp.indexes[int(tiers[0])].similarities(loc & INTERNAL_MASK, query)
        sims = np.empty(loc.shape[0], np.float32)
        for t in np.unique(tiers).tolist():
            sel = tiers == t
            sims[sel] = sp.indexes[t].similarities(loc[sel] & INTERNAL_MASK, query)
        return kept, sims


@dataclass(frozen=True)
class _Args:
    """The resolved parameters of one ranking."""

    limit: int
    alpha: float
    beta: float
    gamma: float
    tau: float
    now: float
    min_similarity: float | None
    tier_w: dict[int, float]
    scope_w: dict[str, float]
    strategy: int
    hybrid: tuple[str, float, float, float] | None = None  # keywords, rrf k, vector and keyword weights


def _in_space(loc: np.ndarray, space: int) -> np.ndarray:
    """Which vector positions (the ``vpos`` column) lie in embedding space ``space``."""

    return (loc >= 0) & ((loc >> SPACE_SHIFT) == space)


def _concat(parts: list[Parts]) -> Parts:
    """Disjoint scored parts as one."""
    if len(parts) == 1:
        return parts[0]
    cat = np.concatenate
    return (
        cat([p[0] for p in parts]),
        cat([p[1] for p in parts]),
        (cat([p[2][0] for p in parts]), cat([p[2][1] for p in parts]), cat([p[2][2] for p in parts])),
    )


def _weight(name: str, value: float | None, default: float) -> float:
    if value is None:
        return default
    if not (math.isfinite(value) and value >= 0):
        raise InvalidArgument(name, "must be a finite number >= 0")
    return float(value)
