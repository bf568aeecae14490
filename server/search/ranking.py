"""Exact scoring of rows and the hits of a ranking.

score = alpha*relevance + beta*recency + gamma*decayed importance, multiplied by a per-row weight:
the tier weight (under the ``weighted`` strategy FAST > MEDIUM > SLOW > GLACIAL) times the scope
weight when a search spans a namespace and its ancestors (session before project before user).
Relevance is the cosine of the row's vector with the query, read from the HNSW storage. Recency
decays from each row's creation time, or from its last access in namespaces whose policy says so
(``recency_times``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tiermem import kernels
from tiermem.server.config import RECENCY_BASES, TIERS
from tiermem.server.index.columns import ColumnsView, Interner
from tiermem.server.index.spaces import Space
from tiermem.server.model.records import Record
from tiermem.server.model.types import INTERNAL_MASK, SPACE_SHIFT, TIER_SHIFT, Filter
from tiermem.server.search.query import RankingParams, SearchHit
from tiermem.server.search.source import PolicyTables, SearchSource

LAST_ACCESS = RECENCY_BASES["last_access"]


@dataclass
class Scored:
    """Rows scored exactly: their relevance, score, recency and decayed importance, in row order."""

    rows: np.ndarray
    rel: np.ndarray
    score: np.ndarray
    rec: np.ndarray
    imp: np.ndarray


def concat_scored(parts: list[Scored]) -> Scored:
    """Disjoint scored parts as one."""
    if len(parts) == 1:
        return parts[0]
    cat = np.concatenate
    return Scored(
        cat([p.rows for p in parts]),
        cat([p.rel for p in parts]),
        cat([p.score for p in parts]),
        cat([p.rec for p in parts]),
        cat([p.imp for p in parts]),
    )


def in_space(loc: np.ndarray, space: int) -> np.ndarray:
    """Which vector positions (the ``vpos`` column) lie in embedding space ``space``."""
    return (loc >= 0) & ((loc >> SPACE_SHIFT) == space)


def similarities(
    view: ColumnsView, sp: Space, rows: np.ndarray, query: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cosine of ``rows`` with the query, read from HNSW storage. Returns (kept, similarities):
    ``kept`` selects the rows still in the space (a row may leave it while a search runs);
    the similarities are those of ``rows[kept]``, in order."""
    loc = view.vpos[rows]
    if loc.shape[0]:
        # The common cases in few steps: every row in the space, in one tier or in HNSW.
        first = int(loc[0]) >> TIER_SHIFT  # (its space and tier; negative: no vector)
        if (
            first >= 0
            and first >> (SPACE_SHIFT - TIER_SHIFT) == sp.id
            and ((loc >> TIER_SHIFT) == first).all()
        ):
            sims = sp.indexes[first & 0xF].similarities(loc & INTERNAL_MASK, query)
            return np.ones(loc.shape[0], np.bool_), sims
        across = _across_tiers(sp, loc, query)
        if across is not None:
            return np.ones(loc.shape[0], np.bool_), across
    kept = in_space(loc, sp.id)
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


def _across_tiers(sp: Space, loc: np.ndarray, query: np.ndarray) -> np.ndarray | None:
    """The similarities of rows of several tiers in one kernel call, where this thread holds every
    index of the space (as a search does) and each row is in the space and in HNSW; else None."""
    xbs = [np.empty((0, sp.dim), np.float32)] * (max(TIERS) + 1)
    for t, index in sp.indexes.items():
        xb = index.held_storage()
        if xb is None:
            return None
        xbs[t] = xb
    return kernels.dot_rows_split(tuple(xbs), loc, TIER_SHIFT, sp.id, query)


def recency_times(view: ColumnsView, basis: np.ndarray, ns_ids: list[int] | None = None) -> np.ndarray:
    """The time each row's recency decays from, by its namespace's entry in ``basis`` (the policy
    tables' ``recency_basis``): the creation or the last-access column itself when every namespace
    concerned (``ns_ids``, else every one) uses the same, else a per-row choice between them. The
    search bounds and the scorer must read the same times for the rows they both see."""
    used = basis if ns_ids is None else basis[ns_ids]
    by_access = used == LAST_ACCESS
    if not by_access.any():
        return view.created
    if by_access.all():
        return view.accessed
    ids = np.clip(view.ns, 0, basis.shape[0] - 1)  # (rows past the view may hold any id)
    return np.where(basis[ids] == LAST_ACCESS, view.accessed, view.created)


def searched_ids(a: RankingParams, names: Interner, n: int) -> list[int]:
    """The ids (below ``n``) of the namespaces a ranking searches."""
    return [i for i in (names.get(name) for name in a.scope_w) if 0 <= i < n]


def row_weights(view: ColumnsView, a: RankingParams, names: Interner) -> np.ndarray | None:
    """tier weight x scope weight per row, or None when every weight is 1."""
    if all(w == 1.0 for w in a.tier_w.values()) and all(w == 1.0 for w in a.scope_w.values()):
        return None
    by_ns = np.ones(max(1, len(names)), np.float32)
    for name, w in a.scope_w.items():
        i = names.get(name)
        if 0 <= i < by_ns.shape[0]:
            by_ns[i] = w
    by_tier = np.ones(5, np.float32)
    for t, w in a.tier_w.items():
        by_tier[t] = w
    return kernels.row_weights(view.ns, view.tier, by_ns, by_tier)


class Scorer:
    """Scores rows of one view exactly for one ranking."""

    def __init__(
        self,
        view: ColumnsView,
        space: Space | None,
        query: np.ndarray | None,
        a: RankingParams,
        row_w: np.ndarray | None,
        tables: PolicyTables,
        names: Interner,
    ) -> None:
        self.view, self.space, self.query, self.params, self.row_w = view, space, query, a, row_w
        searched = searched_ids(a, names, tables.recency_basis.shape[0])
        self._score_args: dict[str, Any] = {
            "importance": view.importance,
            "created_at": view.created,
            "last_access": recency_times(view, tables.recency_basis, searched),
            "tier": view.tier,
            "now": a.now,
            "tau_seconds": a.tau,
            "half_life_hours": tables.score,  # (checked once, with the floor)
            "ns": view.ns,
            "floor": None,
        }

    @property
    def columns(self) -> dict[str, Any]:
        """The columns, tables and time this ranking scores rows with (``kernels.score_rows``'s
        keyword arguments but the weights)."""
        return self._score_args

    def similarities(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``similarities`` of ``rows`` with this ranking's query, in its space."""
        assert self.space is not None and self.query is not None
        return similarities(self.view, self.space, rows, self.query)

    def relevance(self, rows: np.ndarray, vectorless: float = 0.0) -> np.ndarray:
        """Similarity of each of ``rows`` with the query; ``vectorless`` for a row without a vector
        in its space (a keyword hit not embedded yet), or when the ranking has no query vector."""
        if self.query is None or self.space is None:
            return np.full(rows.shape[0], vectorless, np.float32)
        kept, sims = self.similarities(rows)
        if sims.shape[0] == rows.shape[0]:  # (every row kept)
            return sims
        out = np.full(rows.shape[0], vectorless, np.float32)
        out[kept] = sims
        return out

    def __call__(
        self, rows: np.ndarray, keep_vectorless: bool = False, rel: np.ndarray | None = None
    ) -> Scored:
        """Score ``rows`` exactly; ``rel``: their similarities when the caller has them. Rows that
        left the query's space are dropped, unless ``keep_vectorless`` (relevance 0 then)."""
        a = self.params
        if rel is not None:  # the caller computed them
            pass
        elif keep_vectorless or self.query is None or self.space is None:
            rel = self.relevance(rows)
        else:
            kept, rel = self.similarities(rows)
            rows = rows[kept]
        score, rec, imp = kernels.score_rows(
            rows, rel, alpha=a.alpha, beta=a.beta, gamma=a.gamma, **self._score_args
        )
        if self.row_w is not None:
            score = score * self.row_w[rows]
        if a.min_similarity is not None:
            score[rel < a.min_similarity] = np.nan
        return Scored(rows, rel, score, rec, imp)


@dataclass
class Ranked:
    """The scored rows of a ranking and the score that orders them (the fused one when hybrid)."""

    scored: Scored  # scored.score: the combined score before fusion
    score: np.ndarray
    vector_rank: np.ndarray | None = None  # 1-based, 0: not in the vector list (hybrid only)
    keyword_rank: np.ndarray | None = None  # 1-based, 0: not in the keyword list (hybrid only)
    keyword_score: np.ndarray | None = None  # BM25 (hybrid only)


def collect_hits(
    source: SearchSource,
    view: ColumnsView,
    ranked: Ranked,
    a: RankingParams,
    flt: Filter,
    only_tier: int,
    include_embedding: bool,
) -> list[SearchHit]:
    """The top ``a.limit`` of ``ranked`` (rows of ``view``) as hits, read from the store; rows whose record was
    deleted, moved or expired while the search ran are left out."""
    s = ranked.scored
    top = kernels.topk(ranked.score, a.limit)
    hits: list[SearchHit] = []
    with source.store.read() as txn:
        records = source.store.get_many(txn, view.rid[s.rows[top]].tolist())
        for i, record in zip(top.tolist(), records, strict=True):
            if record is None or not _still_matches(source, record, a.scope_w, flt, only_tier):
                continue
            vec = source.store.get_vector(txn, record.rid) if include_embedding else None
            hits.append(
                SearchHit(
                    record,
                    float(ranked.score[i]),
                    float(s.rel[i]),
                    float(s.rec[i]),
                    float(s.imp[i]),
                    vec,
                    tier_weight=a.tier_w.get(record.tier, 1.0),
                    scope_weight=a.scope_w.get(record.namespace, 1.0),
                    strategy=a.strategy,
                    weights=(a.alpha, a.beta, a.gamma),
                    base=float(s.score[i]),
                    vector_rank=int(ranked.vector_rank[i]) if ranked.vector_rank is not None else 0,
                    keyword_rank=int(ranked.keyword_rank[i]) if ranked.keyword_rank is not None else 0,
                    keyword_score=float(ranked.keyword_score[i]) if ranked.keyword_score is not None else 0.0,
                )
            )
    return hits


def _still_matches(
    source: SearchSource, rec: Record, namespaces: dict[str, float], flt: Filter, only_tier: int
) -> bool:
    return (
        rec.namespace in namespaces
        and not source.expired(rec)
        and (not flt.tiers or rec.tier in flt.tiers)
        and (not only_tier or rec.tier == only_tier)
        and (not flt.kinds or rec.kind in flt.kinds)
    )
