"""First throughput benchmark: store and search RPS with p50/p99 latency over real gRPC.

The server runs as a separate process (``python -m tiermem.server``) on 127.0.0.1, with LMDB in a
temporary directory and fsync on (every acknowledged write is durable). The load comes from Python
threads in this process, on the same machine: on 2 cores the client costs about as much CPU as the
server, so the figures are a floor for what a remote client would see. Figures are printed and, with
``--json``, written to a file; nothing is asserted.

    python bench/throughput.py                   # 20,000 memories, 384 dims
    python bench/throughput.py --n 100000 --json bench/results/throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from common import clustered_vectors, start_server

from tiermem.client import MemoryClient

MODEL = "bench-384"


def run_load(fn: Callable[[int], None], concurrency: int, seconds: float) -> dict[str, float]:
    """Call fn(i) from ``concurrency`` threads for ``seconds``; returns ops/s and latency percentiles (ms)."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    stop = time.perf_counter() + seconds
    counter = iter(range(10**12))
    lock = threading.Lock()

    def worker(w: int) -> None:
        lat = latencies[w]
        while time.perf_counter() < stop:
            with lock:
                i = next(counter)
            t0 = time.perf_counter()
            fn(i)
            lat.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    elapsed = time.perf_counter() - t0
    all_lat = np.array([x for lat in latencies for x in lat]) * 1000
    return {
        "ops": int(all_lat.shape[0]),
        "ops_per_s": all_lat.shape[0] / elapsed,
        "p50_ms": float(np.percentile(all_lat, 50)) if all_lat.size else float("nan"),
        "p99_ms": float(np.percentile(all_lat, 99)) if all_lat.size else float("nan"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="memories to load (default 20000)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each timed phase")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args()

    vectors, centres = clustered_vectors(args.n, args.dim, clusters=max(10, args.n // 1000), seed=args.seed)
    rng = np.random.default_rng(args.seed + 1)
    queries = centres[rng.integers(0, centres.shape[0], 256)] + 0.05 * rng.standard_normal(
        (256, args.dim)
    ).astype(np.float32)
    results: dict[str, object] = {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "params": vars(args) | {"json": str(args.json) if args.json else None},
        "note": "client threads and server share this machine's cores",
    }
    with tempfile.TemporaryDirectory(prefix="tiermem-bench-") as tmp:
        # The lifecycle pass would move most of the loaded memories between tiers while the load runs
        # (seed capacities: SLOW keeps 200 per namespace): measure the request path alone.
        proc, target = start_server(Path(tmp) / "data", {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"})
        try:
            with MemoryClient(target, timeout=120) as client:
                client.wait_ready()
                ns = "bench"
                t0 = time.perf_counter()
                for start in range(0, args.n, args.batch):
                    chunk = vectors[start : start + args.batch]
                    client.create_batch(
                        [
                            {
                                "namespace": ns,
                                "content": f"memory {start + j}",
                                "embedding": v,
                                "embedding_model": MODEL,
                                "importance": float((start + j) % 10) / 10,
                            }
                            for j, v in enumerate(chunk)
                        ]
                    )
                elapsed = time.perf_counter() - t0
                results["ingest_batched"] = {
                    "memories": args.n,
                    "batch": args.batch,
                    "seconds": elapsed,
                    "memories_per_s": args.n / elapsed,
                }
                print(
                    f"ingest (batches of {args.batch}): {args.n} memories in {elapsed:.1f} s = "
                    f"{args.n / elapsed:,.0f}/s"
                )

                extra = vectors[rng.integers(0, args.n, 4096)]

                def store(i: int) -> None:
                    client.create(ns, f"single {i}", embedding=extra[i % 4096], embedding_model=MODEL)

                def search(i: int) -> None:
                    client.search(ns, queries[i % 256], embedding_model=MODEL, limit=10)

                for name, fn, conc in (
                    ("store_c1", store, 1),
                    (f"store_c{args.concurrency}", store, args.concurrency),
                    ("search_c1", search, 1),
                    (f"search_c{args.concurrency}", search, args.concurrency),
                ):
                    r = run_load(fn, conc, args.seconds)
                    results[name] = r
                    print(
                        f"{name:>12}: {r['ops_per_s']:8,.0f} ops/s  p50 {r['p50_ms']:6.2f} ms  "
                        f"p99 {r['p99_ms']:6.2f} ms  ({r['ops']} ops)"
                    )
                stats = client.stats()
                results["server"] = {
                    "memories": stats.memory_count,
                    "writes_committed": stats.writes_committed,
                    "commit_groups": stats.commit_groups,
                }
                print(
                    f"server: {stats.memory_count} memories, {stats.writes_committed} writes in "
                    f"{stats.commit_groups} commits (group commit ratio "
                    f"{stats.writes_committed / max(1, stats.commit_groups):.1f})"
                )
        finally:
            proc.terminate()
            proc.wait(timeout=120)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
