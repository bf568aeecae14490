"""Search quality against exact NumPy references (a small in-suite version of bench/recall.py).

5,000 clustered 32-dim memories with random importance, create times spread over 30 days and a
``bucket`` metadata field (i % 100), so filters keep 100%, 10% and 1%. ``exact_search_max_rows=100``
sends the 100% (5,000 rows) and 10% (500 rows) searches through filtered HNSW and the 1% (50 rows)
through exact scoring. For each selectivity:

- recall@10 of similarity-only search (strategy SIMILARITY) vs brute force over the allowed vectors;
- overlap@10 of the default combined score (0.5*cos + 0.3*recency + 0.2*decayed importance, as_of
  fixed) vs an exact scoring of every allowed memory.

Searches are read_only (and the server records accesses otherwise), so recency stays that of
create_time; each returned score is also checked against the exact score of the same memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import FakeClock

from tiermem.client import MemoryClient
from tiermem.client.client import build_filter
from tiermem.server.config import Tuning
from tiermem.server.index.vector_index import VectorIndex
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

N, DIM, CLUSTERS, QUERIES, K = 5000, 32, 50, 100, 10
NS, MODEL = "recall", "test-32"
T0 = 1_700_000_000.0
DAY = 86400.0
ALPHA, BETA, GAMMA, FLOOR = 0.5, 0.3, 0.2, 0.1
HALF_LIFE_H = np.array([0.0, 1.0, 24.0, 168.0, 720.0])
TARGET = 0.95


def _data(seed: int, tiers: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLUSTERS, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    x = centres[rng.integers(0, CLUSTERS, N)] + 1.4 * rng.standard_normal((N, DIM)).astype(
        np.float32
    ) / np.sqrt(DIM)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = centres[rng.integers(0, CLUSTERS, QUERIES)] + 0.5 * rng.standard_normal((QUERIES, DIM)).astype(
        np.float32
    ) / np.sqrt(DIM)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    importance = rng.random(N, dtype=np.float32)
    created = T0 - rng.random(N) * 30 * DAY
    tier = rng.integers(1, 5, N) if tiers == "mixed" else np.full(N, 3)  # 3 = SLOW, the default
    age = T0 - created
    decayed = np.maximum(importance * 0.5 ** (age / 3600 / HALF_LIFE_H[tier]), FLOOR * importance)
    return {
        "x": x.astype(np.float32),
        "q": q.astype(np.float32),
        "importance": importance,
        "created": created,
        "tier": tier,
        "prior": BETA * np.exp(-age / DAY) + GAMMA * decayed,
        "bucket": np.arange(N) % 100,
    }


def _measure(
    c: MemoryClient, d: dict[str, np.ndarray], sel: int, similarity: bool
) -> tuple[float, float, float]:
    """(mean strict overlap with the exact top 10, mean overlap tolerating 1e-5 ties, max score error)."""
    where: dict[str, Any] | None = None if sel == 100 else {"metadata.bucket": {"$lt": sel}}
    idx = np.flatnonzero(d["bucket"] < sel)
    strict, tolerant, err = [], [], 0.0
    for q in d["q"]:
        req = pb.SearchMemoriesRequest(
            namespaces=[NS], embedding_model=MODEL, limit=K, read_only=True, filter=build_filter(where=where)
        )
        req.query_embedding.extend(q.tolist())
        req.as_of.seconds = int(T0)
        # The comprehensive strategy promises the exact top k of the raw weighted sum: measured here.
        req.strategy = pb.SEARCH_STRATEGY_SIMILARITY if similarity else pb.SEARCH_STRATEGY_COMPREHENSIVE
        results = c.stub.SearchMemories(req, timeout=30).results
        sims = (d["x"][idx] @ q).astype(np.float64)
        exact = sims if similarity else ALPHA * sims + d["prior"][idx]
        ref = np.argsort(-exact, kind="stable")[:K]
        got = np.array([int(r.memory.id[1:]) for r in results], np.int64)
        pos = np.searchsorted(idx, got)
        assert len(got) == K and np.all(idx[np.minimum(pos, idx.shape[0] - 1)] == got), "filter violated"
        strict.append(len(set(idx[ref].tolist()) & set(got.tolist())) / K)
        tolerant.append(min(K, int(np.sum(exact[pos] >= exact[ref[-1]] - 1e-5))) / K)
        err = max(err, float(np.max(np.abs(np.array([r.score for r in results]) - exact[pos]))))
    return float(np.mean(strict)), float(np.mean(tolerant)), err


# "slow": every memory in the default tier SLOW (one index). "mixed": tiers 1-4 set explicitly (four
# indexes, four half-lives); ~5 s more, so it runs with the slow tests.
@pytest.mark.parametrize("tiers", ["slow", pytest.param("mixed", marks=pytest.mark.slow)])
def test_recall_and_combined_overlap(
    server_factory: Callable[..., RunningServer], tiers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _data(seed=11, tiers=tiers)
    # Count which path each search took: HNSW answers, and HNSW answers too short (exact fallback).
    calls = {"hnsw": 0, "fallback": 0}
    search, allowed_rows = VectorIndex.search, VectorIndex.allowed_rows

    def counted_search(self: VectorIndex, *a: Any, **kw: Any) -> Any:
        calls["hnsw"] += 1
        return search(self, *a, **kw)

    def counted_allowed_rows(self: VectorIndex, *a: Any, **kw: Any) -> Any:
        calls["fallback"] += 1
        return allowed_rows(self, *a, **kw)

    monkeypatch.setattr(VectorIndex, "search", counted_search)
    monkeypatch.setattr(VectorIndex, "allowed_rows", counted_allowed_rows)
    server = server_factory(
        clock=FakeClock(T0),
        exact_search_max_rows=100,
        search_records_access=True,  # read_only must hold
        # The graph path is what this measures: no exact scans of small indexes (exact_entries).
        tuning=Tuning(exact_entries=0, exact_per_k=0),
    )
    with MemoryClient(f"127.0.0.1:{server.port}", timeout=60) as c:
        c.wait_ready()
        for lo in range(0, N, 500):
            c.create_batch(
                [
                    {
                        "namespace": NS,
                        "content": f"memory {i}",
                        "id": f"m{i}",
                        "embedding": d["x"][i],
                        "embedding_model": MODEL,
                        "importance": float(d["importance"][i]),
                        "create_time": float(d["created"][i]),
                        "tier": int(d["tier"][i]),
                        "metadata": {"bucket": int(d["bucket"][i])},
                    }
                    for i in range(lo, lo + 500)
                ]
            )
        figures: dict[str, dict[str, float]] = {}
        for sel in (100, 10, 1):
            for kind in ("similarity", "combined"):
                before = dict(calls)
                strict, tolerant, err = _measure(c, d, sel, kind == "similarity")
                figures[f"{sel}% {kind}"] = {
                    "strict": strict,
                    "tolerant": tolerant,
                    "max_score_err": err,
                    "hnsw_index_searches": calls["hnsw"] - before["hnsw"],
                    "exact_fallbacks": calls["fallback"] - before["fallback"],
                }
    print(f"\nrecall ({tiers} tiers, n={N}, dim={DIM}, {QUERIES} queries; strict/tolerant, HNSW calls):")
    for name, f in figures.items():
        print(
            f"  {name:<16} {f['strict']:.4f} / {f['tolerant']:.4f}  max score err {f['max_score_err']:.1e}"
            f"  HNSW index searches {f['hnsw_index_searches']}, exact fallbacks {f['exact_fallbacks']}"
        )
    for sel in (100, 10):  # these went through HNSW, not the exact path (1% has 50 rows < 100)
        for kind in ("similarity", "combined"):
            f = figures[f"{sel}% {kind}"]
            assert f["hnsw_index_searches"] >= QUERIES and f["exact_fallbacks"] < f["hnsw_index_searches"]
    assert figures["1% similarity"]["hnsw_index_searches"] == 0
    low = {k: v for k, v in figures.items() if v["strict"] < TARGET}
    assert not low, f"below {TARGET}: {low}"
    bad_scores = {k: v for k, v in figures.items() if v["max_score_err"] > 1e-4}
    assert not bad_scores, f"returned scores differ from the exact ones: {bad_scores}"
