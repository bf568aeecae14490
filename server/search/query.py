"""What a search asks and what it gets back: ``SearchQuery``, ``SearchHit``, the strategies, and the
checks that turn a query into the resolved parameters of its ranking (``RankingParams``).

Checks run in a fixed order (filter, namespaces, limit, strategy, weights, tau, min_similarity, tier
and scope weights, as_of, query text; then hybrid settings, then the query vector): the first failing one names
the field in the error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tiermem.server.config import TIERS, ServerConfig
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument, NotFound
from tiermem.server.model.records import Record
from tiermem.server.model.types import Filter

if TYPE_CHECKING:
    from tiermem.server.index.spaces import Space
    from tiermem.server.search.source import SearchSource

# Values of tiermem.v1.SearchStrategy.
COMPREHENSIVE, WEIGHTED, FAST_FIRST, SIMILARITY, RECENCY, IMPORTANCE, FUSED = 1, 2, 3, 4, 5, 6, 7
STRATEGY_NAMES = {
    FUSED: "fused",
    COMPREHENSIVE: "comprehensive",
    WEIGHTED: "weighted",
    FAST_FIRST: "fast_first",
    SIMILARITY: "similarity",
    RECENCY: "recency",
    IMPORTANCE: "importance",
}
DEFAULT_TIER_WEIGHTS = {1: 1.0, 2: 0.85, 3: 0.7, 4: 0.55}
DEFAULT_SCOPE_WEIGHTS = (1.0, 0.8, 0.6, 0.4)  # the namespace itself, its parent, grandparent, ...
MAX_NAMESPACES = 64  # namespaces one search may name
MAX_SCOPE_WEIGHTS = 128  # a namespace of 256 characters has at most 128 levels
DEFAULT_RRF_K = 60.0  # reciprocal rank fusion's k where a request names none (the usual choice)


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
    rrf_k: float = DEFAULT_RRF_K
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


@dataclass(frozen=True)
class Hybrid:
    """Keyword ranking fused with the vector ranking: by reciprocal rank (``hybrid`` on a weighted-sum
    strategy) or, under the fused strategy, as the keyword share of relevance."""

    text: str  # the keywords
    rrf_k: float
    vector_weight: float
    keyword_weight: float


@dataclass(frozen=True)
class RankingParams:
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
    hybrid: Hybrid | None = None


@dataclass(frozen=True)
class CheckedQuery:
    """A query's parameters, checked and resolved; the ranking time is set when its turn comes."""

    filter: Filter
    limit: int
    strategy: int
    alpha: float
    beta: float
    gamma: float
    tau: float
    min_similarity: float | None
    tier_w: dict[int, float]
    scope_w: dict[str, float]
    as_of: float | None

    def params(self, now: float, hybrid: Hybrid | None) -> RankingParams:
        return RankingParams(
            self.limit,
            self.alpha,
            self.beta,
            self.gamma,
            self.tau,
            now,
            self.min_similarity,
            self.tier_w,
            self.scope_w,
            self.strategy,
            hybrid,
        )


def ancestors(namespace: str) -> list[str]:
    """The namespace and its ancestors, nearest first: "a/b/c" -> ["a/b/c", "a/b", "a"]."""
    parts = namespace.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]


MAX_WEIGHT = 1e6  # products of a search's weights stay far inside float32 (no infinite scores)
MAX_RRF_K, MIN_HYBRID_WEIGHT = 1e6, 1e-6  # and fused shares far from float32's smallest


def weight(name: str, value: float | None, default: float) -> float:
    """A weight from a request: ``default`` when unset, else a number in [0, MAX_WEIGHT]."""
    if value is None:
        return default
    if not (math.isfinite(value) and 0 <= value <= MAX_WEIGHT):
        raise InvalidArgument(name, f"must be a number in [0, {MAX_WEIGHT:g}]")
    return float(value)


def check_query(
    q: SearchQuery, config: ServerConfig, check_filter: Callable[[Filter], Filter]
) -> CheckedQuery:
    """Check ``q`` (everything but its query vector and hybrid settings) and resolve its defaults."""
    flt = check_filter(q.filter or Filter())
    _check_namespaces(q.namespaces)
    if q.limit < 0:
        raise InvalidArgument("limit", "must not be negative")
    strategy = q.strategy or FUSED
    if strategy not in STRATEGY_NAMES:
        raise InvalidArgument("strategy", "is not a search strategy")
    alpha, beta, gamma = _signal_weights(q, config, strategy)
    tau = config.recency_tau_seconds if q.recency_tau_seconds is None else q.recency_tau_seconds
    if not (math.isfinite(tau) and tau > 0):
        raise InvalidArgument("recency_tau_seconds", "must be a finite number > 0")
    if q.min_similarity is not None and not (-1.0 <= q.min_similarity <= 1.0):
        raise InvalidArgument("min_similarity", "must be in [-1, 1]")
    tier_w = _tier_weights(q, strategy)
    if len(q.scope_weights) > MAX_SCOPE_WEIGHTS:
        raise InvalidArgument(
            "scope_weights",
            f"has more than {MAX_SCOPE_WEIGHTS} weights (one a namespace level)",
            reason="FIELD_TOO_LARGE",
        )
    for i, w in enumerate(q.scope_weights):
        weight(f"scope_weights[{i}]", w, 1.0)
    as_of = None if q.as_of is None else check.finite_time("as_of", q.as_of)
    if q.text:  # (matched as keywords beside a vector too, so checked whether or not it is embedded)
        check.text("query_text", q.text, config.max_content_bytes)
    limit = min(q.limit or 10, config.max_search_limit)
    return CheckedQuery(
        flt, limit, strategy, alpha, beta, gamma, tau, q.min_similarity, tier_w, scope_weights(q), as_of
    )


def _check_namespaces(namespaces: list[str]) -> None:
    if not namespaces:
        raise InvalidArgument("namespaces", "must name at least one namespace")
    if len(namespaces) > MAX_NAMESPACES:
        raise InvalidArgument("namespaces", f"names more than {MAX_NAMESPACES} namespaces")
    for i, ns in enumerate(namespaces):
        check.namespace(f"namespaces[{i}]", ns)


def _signal_weights(q: SearchQuery, config: ServerConfig, strategy: int) -> tuple[float, float, float]:
    """alpha, beta, gamma: the request's or the configured ones; one signal alone for the
    single-signal strategies."""
    fused = strategy == FUSED
    alpha = weight("alpha", q.alpha, 1.0 if fused else config.alpha)
    beta = weight("beta", q.beta, config.fused_beta if fused else config.beta)
    gamma = weight("gamma", q.gamma, config.fused_gamma if fused else config.gamma)
    if strategy in (SIMILARITY, RECENCY, IMPORTANCE):
        return float(strategy == SIMILARITY), float(strategy == RECENCY), float(strategy == IMPORTANCE)
    return alpha, beta, gamma


def _tier_weights(q: SearchQuery, strategy: int) -> dict[int, float]:
    tier_w = dict(DEFAULT_TIER_WEIGHTS) if strategy == WEIGHTED else dict.fromkeys(TIERS, 1.0)
    # The request's entries in order (a tier once each), so a bad one is named by its position.
    for i, (t, w) in enumerate(q.tier_weights.items()):
        check.tier(f"tier_weights[{i}].tier", t)
        tier_w[t] = weight(f"tier_weights[{i}].weight", w, 1.0)
    return tier_w


def scope_weights(q: SearchQuery) -> dict[str, float]:
    """Each named namespace at weight 1 (or scope_weights[0]); with include_ancestors its ancestors
    too, weighted by distance. A namespace reached twice keeps its best weight."""
    scope_w: dict[str, float] = {}
    weights = list(q.scope_weights) or list(DEFAULT_SCOPE_WEIGHTS)
    for ns in q.namespaces:
        chain = ancestors(ns) if q.include_ancestors else [ns]
        for depth, name in enumerate(chain):
            w = weights[min(depth, len(weights) - 1)] if (q.include_ancestors or q.scope_weights) else 1.0
            scope_w[name] = max(scope_w.get(name, 0.0), w)
    return scope_w


def check_hybrid(q: SearchQuery, reciprocal: bool = True) -> Hybrid:
    """The hybrid settings of a query that asked for hybrid search; ``reciprocal``: fused by
    reciprocal rank (the weighted-sum strategies), not as shares of relevance (the fused one)."""
    if not q.text:
        raise InvalidArgument("query_text", "is required for hybrid search (its keywords are matched)")
    if not (math.isfinite(q.rrf_k) and 0 <= q.rrf_k <= (MAX_RRF_K if reciprocal else math.inf)):
        bound = f"in [0, {MAX_RRF_K:g}]" if reciprocal else "a finite number >= 0"
        raise InvalidArgument("hybrid.rrf_k", f"must be {bound}")
    weights = {
        "hybrid.vector_weight": weight("hybrid.vector_weight", q.vector_weight, 1.0),
        "hybrid.keyword_weight": weight("hybrid.keyword_weight", q.keyword_weight, 1.0),
    }
    for name, w in weights.items():
        # (fused scores are float32: a smaller share, or rrf_k past MAX_RRF_K, rounds to 0 and
        # drops every row as if it were in neither ranking)
        if reciprocal and 0 < w < MIN_HYBRID_WEIGHT:
            raise InvalidArgument(name, f"must be 0 or at least {MIN_HYBRID_WEIGHT:g}")
    if not any(weights.values()):
        raise InvalidArgument("hybrid.keyword_weight", "vector_weight and keyword_weight cannot both be 0")
    return Hybrid(q.text, q.rrf_k, *weights.values())


def query_vector(
    q: SearchQuery, source: SearchSource, needed: bool, text_unused: bool = False
) -> tuple[np.ndarray | None, Space | None]:
    """The query vector and its space; (None, None) when the ordering needs no query. The space is
    None with a vector when the embedder's own space, or a declared one, holds nothing yet (no
    results). ``text_unused``: a ranking no similarity enters (RECENCY, IMPORTANCE, no hybrid):
    the text is not embedded, only named the space."""
    cfg = source.config
    if q.embedding is not None:
        model = check.model("embedding_model", q.embedding_model)
        query = check.vector("query_embedding", q.embedding, cfg)
    elif q.text:  # (its size and characters checked with the rest of the query)
        model = source.embedder.model
        if q.embedding_model and q.embedding_model != model:  # (it would search another space)
            raise InvalidArgument(
                "embedding_model",
                f"names the space of query_embedding, which is empty: query_text is embedded by the "
                f"server's embedder, into {model!r}; send the query's vector to search {q.embedding_model!r}",
            )
        if text_unused:  # (not embedded, so a failing embedder changes nothing: the text names the space)
            sp = source.spaces.get(model)
            return (None, sp) if sp is not None else (np.zeros(0, np.float32), None)
        query = source.embedder.embed(q.text)
    elif needed:
        raise InvalidArgument("query_embedding", "a query_embedding or a query_text is required")
    else:
        return None, None
    sp = source.spaces.get(model)
    if sp is None:
        declared = cfg.declared_spaces.get(model)
        if declared is not None:  # (a shared space exists, empty, before any vector of it)
            check.same_dimension("query_embedding", model, query.shape[0], declared)
        if declared is not None or model == source.embedder.model:
            return query, None
        raise NotFound(f"no memories in embedding space {model!r}", reason="EMBEDDING_SPACE_NOT_FOUND")
    check.same_dimension("query_embedding", model, query.shape[0], sp.dim)
    return query, sp
