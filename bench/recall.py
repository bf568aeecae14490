"""Search quality benchmark: recall of the HNSW path and exactness of the combined score, with latency.

The server runs as a separate process (``python -m tiermem.server``) on 127.0.0.1, LMDB in a temporary
directory, fsync on, and the background lifecycle off (TIERMEM_MAINTENANCE_INTERVAL_SECONDS=0): with the
default policy it would at once demote or evict most of the SLOW memories (idle > 1 day, more than 200
per namespace), and the reference below assumes every memory stays in the tier it was created in.

The data: ``--n`` seeded, clustered, normalized vectors (as in bench/throughput.py) in one namespace,
model "bench-384", loaded with BatchCreateMemories in batches of 500. Each memory has a random
importance in [0, 1], an explicit create_time uniformly within the 30 days before ``as_of`` (so recency
and decayed importance vary), and metadata ``bucket = i % 100``; the filters
``{"metadata.bucket": {"$lt": 10}}`` and ``{"metadata.bucket": {"$lt": 1}}`` keep 10% and 1% (100% is
searched without a filter). Queries are drawn near cluster centres, not from the data.

For each selectivity, ``--queries`` sequential searches (concurrency 1, read_only so they do not change
recency, as_of fixed at the load time so server and reference agree) of two kinds:

- similarity: strategy SIMILARITY; recall@10 against exact brute force (NumPy) over the allowed vectors.
- combined: the default COMPREHENSIVE score 0.5*cos + 0.3*recency + 0.2*decayed importance; overlap of
  the top 10 with an exact NumPy scoring of every allowed memory (recency exp(-(as_of - create_time) /
  86400); importance * 0.5 ** (age_h / half_life[tier]), floored at 0.1 * importance; half-lives 1, 24,
  168, 720 h for FAST, MEDIUM, SLOW, GLACIAL).

"strict" counts the reference's top-10 ids returned; "tolerant" also accepts a returned memory whose
exact score ties the reference's 10th within 1e-5 (float32 vs float64). ``max_score_err`` is the largest
difference between a returned score and the exact score of the same memory. Latency is the RPC round
trip seen by a Python client on the same machine. Nothing is asserted; the figures are printed and, with
``--json``, written to a file.

    python bench/recall.py                     # 100,000 memories, 384 dims, 200 queries
    python bench/recall.py --n 20000 --tiers mixed --json bench/results/recall-20k-mixed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import clustered_vectors, start_server

from tiermem.client import MemoryClient
from tiermem.client.client import build_filter
from tiermem.v1 import memory_pb2 as pb

MODEL = "bench-384"
NAMESPACE = "bench"
BATCH = 500
K = 10
DAY = 86400.0
# Server defaults (ServerConfig): weights, recency tau, importance floor, half-lives by tier value.
ALPHA, BETA, GAMMA = 0.5, 0.3, 0.2
TAU = DAY
FLOOR = 0.1
HALF_LIFE_H = np.array([0.0, 1.0, 24.0, 168.0, 720.0])
SLOW = 3
SELECTIVITIES = (100, 10, 1)  # percent of the memories a search may return


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
    }


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first."""
    k = min(k, scores.shape[0])
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def request(query: np.ndarray, as_of: float, where: dict[str, Any] | None, similarity: bool) -> Any:
    req = pb.SearchMemoriesRequest(
        namespaces=[NAMESPACE],
        embedding_model=MODEL,
        limit=K,
        read_only=True,
        filter=build_filter(where=where),
    )
    req.query_embedding.extend(query.tolist())
    req.as_of.seconds = int(as_of)  # as_of is a whole second
    if similarity:
        req.strategy = pb.SEARCH_STRATEGY_SIMILARITY
    return req


def evaluate(
    stub: Any,
    queries: np.ndarray,
    vectors: np.ndarray,
    prior: np.ndarray,
    allowed: np.ndarray,
    as_of: float,
    where: dict[str, Any] | None,
    similarity: bool,
    timeout: float,
) -> dict[str, Any]:
    """Run the searches (timed) and compare each with the exact top 10 over ``allowed`` rows."""
    idx = np.flatnonzero(allowed)
    xa = vectors[idx]
    pa = prior[idx]
    reqs = [request(q, as_of, where, similarity) for q in queries]
    for r in reqs[: min(10, len(reqs))]:  # warm-up, not counted
        stub.SearchMemories(r, timeout=timeout)
    latencies, strict, tolerant, errors, short = [], [], [], [], 0
    t_all = time.perf_counter()
    responses = []
    for r in reqs:
        t0 = time.perf_counter()
        responses.append(stub.SearchMemories(r, timeout=timeout))
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t_all
    for q, resp in zip(queries, responses, strict=True):
        sims = (xa @ q).astype(np.float64)
        exact = sims if similarity else ALPHA * sims + pa
        ref = top_k(exact, K)
        ref_rows = set(idx[ref].tolist())
        kth = exact[ref[-1]]
        got = [int(res.memory.id[1:]) for res in resp.results]
        if len(got) < min(K, idx.shape[0]):
            short += 1
        pos = np.searchsorted(idx, got)  # rows -> positions in idx (idx is sorted)
        if not np.all(idx[np.minimum(pos, idx.shape[0] - 1)] == got):
            raise AssertionError("the server returned a memory the filter should have excluded")
        got_exact = exact[pos]
        strict.append(len(ref_rows.intersection(got)) / K)
        tolerant.append(min(K, int(np.sum(got_exact >= kth - 1e-5))) / K)
        errors.extend(np.abs(np.array([res.score for res in resp.results]) - got_exact).tolist())
    lat = np.array(latencies) * 1000
    return {
        "allowed": int(idx.shape[0]),
        "queries": len(reqs),
        "strict": float(np.mean(strict)),
        "tolerant": float(np.mean(tolerant)),
        "min_strict": float(np.min(strict)),
        "queries_below_1": int(np.sum(np.array(strict) < 1.0)),
        "short_results": short,
        "max_score_err": float(max(errors, default=0.0)),
        "qps": len(reqs) / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "mean_ms": float(lat.mean()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="memories to load (default 100000)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=200, help="queries per selectivity and kind")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument(
        "--tiers",
        choices=("slow", "mixed"),
        default="slow",
        help="slow: every memory in the default tier SLOW (one HNSW index); mixed: tiers 1-4 at random, "
        "set explicitly (four indexes, four half-lives)",
    )
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()
    if args.n < 100:
        p.error("--n must be at least 100 (buckets 0..99)")

    info = machine()
    params = vars(args) | {"json": str(args.json) if args.json else None, "batch": BATCH, "k": K}
    print(
        f"machine: {info['cpus']} cores ({info['cpus_usable']} usable), {info['cpu']}, "
        f"Python {info['python']}, NumPy {info['numpy']}"
    )
    print(
        f"params: n={args.n} dim={args.dim} queries={args.queries} seed={args.seed} tiers={args.tiers} "
        f"batch={BATCH} k={K}; server defaults (HNSW M=32 efC=128 efSearch=64, exact below 4096 rows)"
    )

    rng = np.random.default_rng(args.seed + 1)
    clusters = max(10, args.n // 1000)
    vectors, centres = clustered_vectors(args.n, args.dim, clusters, args.seed)
    importance = rng.random(args.n, dtype=np.float32)  # float32, as the server stores it
    as_of = float(int(time.time()))
    created = as_of - rng.random(args.n) * 30 * DAY
    bucket = np.arange(args.n) % 100
    tiers = rng.integers(1, 5, args.n) if args.tiers == "mixed" else np.full(args.n, SLOW)
    # Queries near cluster centres: noise of norm ~0.5 against a unit centre.
    queries = centres[rng.integers(0, clusters, args.queries)] + 0.5 * rng.standard_normal(
        (args.queries, args.dim)
    ).astype(np.float32) / np.sqrt(args.dim)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    queries = queries.astype(np.float32)

    age = as_of - created
    decayed = importance * 0.5 ** ((age / 3600.0) / HALF_LIFE_H[tiers])
    decayed = np.maximum(decayed, FLOOR * importance.astype(np.float64))
    prior = BETA * np.exp(-age / TAU) + GAMMA * decayed  # the exact non-similarity part of the score

    results: dict[str, Any] = {
        "machine": info,
        "params": params,
        "as_of": as_of,
        "note": "client and server share this machine's cores; latency is the sequential RPC round trip",
    }
    timeout = 120.0
    with tempfile.TemporaryDirectory(prefix="tiermem-recall-") as tmp:
        proc, target = start_server(Path(tmp) / "data", {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"})
        try:
            with MemoryClient(target, timeout=timeout) as client:
                client.wait_ready()
                t0 = time.perf_counter()
                for start in range(0, args.n, BATCH):
                    stop = min(args.n, start + BATCH)
                    client.create_batch(
                        [
                            {
                                "namespace": NAMESPACE,
                                "content": f"memory {i}",
                                "id": f"m{i}",
                                "embedding": vectors[i],
                                "embedding_model": MODEL,
                                "importance": float(importance[i]),
                                "create_time": float(created[i]),
                                "tier": int(tiers[i]),
                                "metadata": {"bucket": int(bucket[i])},
                            }
                            for i in range(start, stop)
                        ]
                    )
                load_s = time.perf_counter() - t0
                results["load"] = {"memories": args.n, "seconds": load_s, "memories_per_s": args.n / load_s}
                print(f"load: {args.n} memories in {load_s:.1f} s = {args.n / load_s:,.0f}/s")

                rows = []
                for sel in SELECTIVITIES:
                    where = None if sel == 100 else {"metadata.bucket": {"$lt": sel}}
                    allowed = bucket < sel
                    for kind in ("similarity", "combined"):
                        r = evaluate(
                            client.stub,
                            queries,
                            vectors,
                            prior,
                            allowed,
                            as_of,
                            where,
                            kind == "similarity",
                            timeout,
                        )
                        r |= {"selectivity_pct": sel, "kind": kind, "filter": where}
                        rows.append(r)
                        print(
                            f"  {sel:>3}% {kind:<10} done: {r['strict']:.4f} ({r['qps']:.0f} q/s)",
                            flush=True,
                        )
                results["searches"] = rows
                stats = client.stats()
                results["server"] = {
                    "memories": stats.memory_count,
                    "tiers": {pb.Tier.Name(t.tier): t.memory_count for t in stats.tiers},
                }
        finally:
            proc.terminate()
            proc.wait(timeout=120)

    print()
    print(
        f"{'select':>6} {'allowed':>7} {'kind':<10} {'metric':<10} {'strict':>7} {'toler':>7} "
        f"{'min':>5} {'<1':>4} {'maxerr':>8} {'QPS':>7} {'p50 ms':>7} {'p99 ms':>7}"
    )
    for r in results["searches"]:
        metric = "recall@10" if r["kind"] == "similarity" else "overlap@10"
        print(
            f"{r['selectivity_pct']:>5}% {r['allowed']:>7} {r['kind']:<10} {metric:<10} "
            f"{r['strict']:>7.4f} {r['tolerant']:>7.4f} {r['min_strict']:>5.2f} {r['queries_below_1']:>4} "
            f"{r['max_score_err']:>8.1e} {r['qps']:>7.1f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f}"
        )
    print(f"server: {results['server']['memories']} memories, by tier {results['server']['tiers']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
