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
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import SLOW, clustered_vectors, evaluate, exact_prior, machine, queries_near, start_server

from tiermem.client import MemoryClient
from tiermem.v1 import memory_pb2 as pb

MODEL = "bench-384"
NAMESPACE = "bench"
BATCH = 500
K = 10
DAY = 86400.0
SELECTIVITIES = (100, 10, 1)  # percent of the memories a search may return


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
    queries = queries_near(centres, args.queries, rng)
    prior = exact_prior(importance, created, tiers, as_of)  # the exact non-similarity part of the score

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
                            row_of=lambda mid: int(mid[1:]),
                            namespace=NAMESPACE,
                            model=MODEL,
                            k=K,
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
