"""Benchmark suite: tiermem against its ceilings (empty gRPC, in-process FAISS), in one command.

The server runs as a separate process (``python -m tiermem.server``, bench/common.py) on 127.0.0.1 with
LMDB in a temporary directory, fsync on, and the background lifecycle off
(TIERMEM_MAINTENANCE_INTERVAL_SECONDS=0, as in bench/recall.py: the default policy would demote or evict
most of the memories while we measure). The load comes from worker processes (multiprocessing, spawn),
each with its own channel and a few threads; concurrency = processes x threads. Every timed load runs for
``--seconds`` between a start and an end time shared by the workers; an op counts when it starts inside
that window. Client processes share the machine's cores with the server, so on a small machine the
figures are a floor for what remote clients would see.

Phases:
  1. empty-RPC ceiling: grpc.health.v1.Health/Check on the same server, concurrency 1 and 16.
  2. ingest: BatchCreateMemories of ``--n`` clustered vectors in batches of 256 (model "bench-384",
     explicit embeddings); single CreateMemory at concurrency 1 and 16.
  3. search k=10 by vector (read_only) at concurrency 1 and 16, queries near cluster centres;
     BatchSearchMemories of 16 queries per call at concurrency 1.
  4. 90/10 search/create mix at concurrency 16.
  5. in-process FAISS ceilings (server defaults: IndexHNSWFlat M=32, efConstruction=128, efSearch=64,
     inner product): add in batches of 256 and single-query search with 1 and 2 threads.
  6. server RSS (VmRSS) after the batch ingest, per memory, against vector + HNSW links.

    python bench/suite.py                                   # 100,000 memories, 384 dims, 5 s per load
    python bench/suite.py --n 20000 --seconds 3 --out bench/results

Writes ``<out>/suite.json`` and ``<out>/suite.md`` and prints the Markdown. Nothing is asserted: the
issue's targets are printed next to the ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import sys
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from common import clustered_vectors, start_server

MODEL = "bench-384"
NAMESPACE = "bench"
BATCH = 256
K = 10
BATCH_SEARCH = 16
HNSW_M, HNSW_EFC, HNSW_EFS = 32, 128, 64  # ServerConfig defaults
HEALTH_SERVICE = "tiermem.v1.MemoryService"
NOT_MEASURED = (
    "Chroma comparison",
    "plots",
    "start-up time with 1M memories",
    "recall (see bench/recall.py)",
)


# -- worker processes --------------------------------------------------------------------------------
# Each worker process owns one channel and serves load tasks from its own queue, so a load of P
# processes x T threads always runs in P distinct processes.


def _worker_main(target: str, tasks: Any, results: Any) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(
        target,
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
    )
    grpc.channel_ready_future(channel).result(timeout=60)
    stub = pb_grpc.MemoryServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    pid = os.getpid()
    while True:
        task = tasks.get()
        if task is None:
            break
        try:
            results.put(_run_task(task, stub, health, pb, health_pb2, grpc, pid))
        except Exception as e:  # reported to the parent, which fails the run
            results.put({"error": f"{type(e).__name__}: {e}"})
    channel.close()


def _run_task(
    task: dict[str, Any], stub: Any, health: Any, pb: Any, health_pb2: Any, grpc: Any, pid: int
) -> Any:
    op: str = task["op"]
    threads: int = task["threads"]
    start_at: float = task["start_at"]
    end_at: float = task["end_at"]
    timeout = 60.0
    queries = task.get("queries")
    writes = task.get("writes")
    search_reqs = []
    if queries is not None:
        for q in queries:
            r = pb.SearchMemoriesRequest(
                namespaces=[NAMESPACE], embedding_model=MODEL, limit=K, read_only=True
            )
            r.query_embedding.extend(q.tolist())
            search_reqs.append(r)
    batch_reqs = [
        pb.BatchSearchMemoriesRequest(searches=search_reqs[i : i + BATCH_SEARCH])
        for i in range(0, len(search_reqs) - BATCH_SEARCH + 1, BATCH_SEARCH)
    ]
    write_vecs = [w.tolist() for w in writes] if writes is not None else []
    health_req = health_pb2.HealthCheckRequest(service=HEALTH_SERVICE)

    def call(kind: str, tid: int, i: int) -> None:
        if kind == "health":
            health.Check(health_req, timeout=timeout)
        elif kind == "search":
            stub.SearchMemories(search_reqs[i % len(search_reqs)], timeout=timeout)
        elif kind == "batch_search":
            stub.BatchSearchMemories(batch_reqs[i % len(batch_reqs)], timeout=timeout)
        elif kind == "create":
            m = pb.Memory(
                namespace=NAMESPACE,
                content=f"single {task['tag']} {pid} {tid} {i}",  # unique: no content dedup
                embedding=write_vecs[(i * 7 + tid) % len(write_vecs)],
                embedding_model=MODEL,
            )
            stub.CreateMemory(pb.CreateMemoryRequest(memory=m), timeout=timeout)
        else:
            raise ValueError(kind)

    lat: list[dict[str, list[float]]] = [{} for _ in range(threads)]
    errors = [0] * threads

    def thread(tid: int) -> None:
        rng = np.random.default_rng(hash((pid, tid, task["tag"])) % 2**32)
        out = lat[tid]
        i = int(rng.integers(0, 1 << 20))
        for _ in range(3):  # warm-up, before the window
            kind = "search" if op == "mix" else op
            call(kind, tid, i)
            i += 1
        while time.time() < start_at:
            time.sleep(0.0005)
        while True:
            now = time.time()
            if now >= end_at:
                break
            kind = op if op != "mix" else ("search" if rng.random() < task["read_fraction"] else "create")
            t0 = time.perf_counter()
            try:
                call(kind, tid, i)
            except grpc.RpcError:
                errors[tid] += 1
                continue
            out.setdefault(kind, []).append(time.perf_counter() - t0)
            i += 1

    ts = [threading.Thread(target=thread, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    merged: dict[str, np.ndarray] = {}
    for d in lat:
        for kind, xs in d.items():
            merged[kind] = np.concatenate([merged.get(kind, np.empty(0)), np.array(xs)])
    return {"latencies": merged, "errors": sum(errors)}


class LoadPool:
    """``procs`` spawned worker processes, each with its own channel and task queue."""

    def __init__(self, target: str, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.queues = [ctx.Queue() for _ in range(procs)]
        self.procs = [
            ctx.Process(target=_worker_main, args=(target, q, self.results), daemon=True) for q in self.queues
        ]
        for p in self.procs:
            p.start()

    def run(self, op: str, procs: int, threads: int, seconds: float, tag: str, **data: Any) -> dict[str, Any]:
        if procs > len(self.procs):
            raise ValueError(f"{procs} processes asked, {len(self.procs)} started")
        # A common window; the lead time covers message transfer, request building and warm-up.
        start_at = time.time() + 0.3 + 0.01 * threads
        task = {
            "op": op,
            "threads": threads,
            "start_at": start_at,
            "end_at": start_at + seconds,
            "tag": tag,
            **data,
        }
        for q in self.queues[:procs]:
            q.put(task)
        outs = []
        for _ in range(procs):
            try:
                out = self.results.get(timeout=seconds + 300)
            except queue.Empty:
                raise RuntimeError(f"load {op} timed out") from None
            if "error" in out:
                raise RuntimeError(f"load {op} failed in a worker: {out['error']}")
            outs.append(out)
        lat: dict[str, np.ndarray] = {}
        for out in outs:
            for kind, xs in out["latencies"].items():
                lat[kind] = np.concatenate([lat.get(kind, np.empty(0)), xs])
        return {"latencies": lat, "errors": sum(o["errors"] for o in outs), "seconds": seconds}

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)


def summarize(lat_s: np.ndarray, seconds: float, per_op: int = 1) -> dict[str, Any]:
    ms = lat_s * 1000
    pct = (lambda q: float(np.percentile(ms, q))) if ms.size else (lambda q: float("nan"))
    return {
        "ops": int(ms.size),
        "ops_per_s": ms.size * per_op / seconds,
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
    }


# -- report ------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "?"

    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "grpcio": version("grpcio"),
        "faiss": version("faiss-cpu"),
        "numba": version("numba"),
        "numpy": np.__version__,
    }


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def fmt(x: float, digits: int = 2) -> str:
    return "-" if x is None or x != x else f"{x:,.{digits}f}"


def markdown(res: dict[str, Any]) -> str:
    m, p = res["machine"], res["params"]
    lines = [
        "# tiermem benchmark suite",
        "",
        f"- machine: {m['cpus']} cores ({m['cpus_usable']} usable), {m['cpu']}; {m['platform']}",
        f"- Python {m['python']}, grpcio {m['grpcio']}, faiss-cpu {m['faiss']}, numba {m['numba']}, "
        f"NumPy {m['numpy']}",
        f"- parameters: n={p['n']} dim={p['dim']} seconds/load={p['seconds']} seed={p['seed']} "
        f"batch={BATCH} k={K}; HNSW M={HNSW_M} efConstruction={HNSW_EFC} efSearch={HNSW_EFS} (server defaults); "
        f"fsync on; lifecycle off",
        f"- load: worker processes (spawn), each with its own channel; concurrency 1 = 1x1, "
        f"concurrency {p['concurrency']} = {p['procs']} processes x {p['concurrency'] // p['procs']} threads",
        "- note: the client processes share this machine's cores with the server (and with each other), "
        "so the figures are a floor for remote clients.",
        "",
        "| phase | measurement | concurrency | ops/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['phase']} | {r['name']} | {r['concurrency']} | {fmt(r['ops_per_s'], 0)} {r['unit']} | "
            f"{fmt(r.get('p50_ms'))} | {fmt(r.get('p95_ms'))} | {fmt(r.get('p99_ms'))} | {r.get('errors', 0)} |"
        )
    mem = res["memory"]
    lines += [
        "",
        "| memory | value |",
        "|---|---:|",
        f"| server RSS before ingest | {mem['rss_before_bytes'] / 2**20:,.1f} MiB |",
        f"| server RSS after ingest of {mem['memories']} | {mem['rss_after_bytes'] / 2**20:,.1f} MiB |",
        f"| RSS per memory (total / n) | {mem['rss_per_memory_bytes']:,.0f} B |",
        f"| RSS per memory (growth / n) | {mem['rss_growth_per_memory_bytes']:,.0f} B |",
        f"| vector + HNSW links (dim*4 + M*2*4) | {mem['vector_plus_links_bytes']:,} B |",
        "",
        "| ratio | value | issue target | meets |",
        "|---|---:|---|---|",
    ]
    for r in res["ratios"]:
        lines.append(
            f"| {r['name']} | {fmt(r['value'], 3)} | {r['target']} | {'yes' if r['meets'] else 'no'} |"
        )
    lines += ["", "Not measured in this version: " + "; ".join(NOT_MEASURED) + ".", ""]
    return "\n".join(lines)


# -- phases ------------------------------------------------------------------------------------------


def faiss_ceilings(vectors: np.ndarray, queries: np.ndarray, seconds: float) -> dict[str, Any]:
    import faiss

    dim = vectors.shape[1]
    faiss.omp_set_num_threads(1)  # as the server's engine, for adds and searches
    index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = HNSW_EFC
    t0 = time.perf_counter()
    n = vectors.shape[0]
    last = t0
    for start in range(0, n, BATCH):
        index.add(vectors[start : start + BATCH])
        if time.perf_counter() - last > 2:
            last = time.perf_counter()
            print(f"  faiss add: {start + BATCH}/{n}", flush=True)
    add_s = time.perf_counter() - t0
    out: dict[str, Any] = {"add": {"vectors": n, "seconds": add_s, "ops_per_s": n / add_s}}
    print(f"  faiss add: {n} vectors in {add_s:.1f} s = {n / add_s:,.0f}/s", flush=True)
    index.hnsw.efSearch = HNSW_EFS
    for threads in (1, 2):
        lat: list[list[float]] = [[] for _ in range(threads)]
        end = time.perf_counter() + seconds

        def run(t: int, lat: list[list[float]] = lat, end: float = end, threads: int = threads) -> None:
            i = t
            while time.perf_counter() < end:
                q = queries[i % len(queries) : i % len(queries) + 1]
                t1 = time.perf_counter()
                index.search(q, K)
                lat[t].append(time.perf_counter() - t1)
                i += threads

        ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        r = summarize(np.array([x for xs in lat for x in xs]), seconds)
        out[f"search_t{threads}"] = r
        print(
            f"  faiss search, {threads} thread(s): {r['ops_per_s']:,.0f} q/s p50 {r['p50_ms']:.3f} ms",
            flush=True,
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="memories to load (default 100000)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each timed load")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="directory for suite.json/.md")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=16, help="the high concurrency level")
    p.add_argument("--procs", type=int, default=0, help="load processes at high concurrency (default 2-4)")
    args = p.parse_args()
    if args.procs <= 0:
        args.procs = min(4, max(2, os.cpu_count() or 2))
    if args.concurrency % args.procs:
        p.error("--concurrency must be a multiple of --procs")
    threads_hi = args.concurrency // args.procs
    hi = args.concurrency

    info = machine()
    params = vars(args) | {"out": str(args.out)}
    print(
        f"machine: {info['cpus']} cores, {info['cpu']}; Python {info['python']}, grpcio {info['grpcio']}, "
        f"faiss {info['faiss']}, numba {info['numba']}",
        flush=True,
    )
    print(
        f"params: n={args.n} dim={args.dim} seconds={args.seconds} load {args.procs}x{threads_hi}", flush=True
    )

    clusters = max(10, args.n // 1000)
    vectors, centres = clustered_vectors(args.n, args.dim, clusters, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    queries = centres[rng.integers(0, clusters, 256)] + 0.5 * rng.standard_normal((256, args.dim)).astype(
        np.float32
    ) / np.sqrt(args.dim)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    writes = vectors[rng.integers(0, args.n, 1024)]

    rows: list[dict[str, Any]] = []

    def add_row(phase: str, name: str, conc: int, r: dict[str, Any], unit: str = "ops/s") -> dict[str, Any]:
        row = {"phase": phase, "name": name, "concurrency": conc, "unit": unit, **r}
        rows.append(row)
        print(
            f"  {name} c{conc}: {r['ops_per_s']:,.0f} {unit}  p50 {fmt(r.get('p50_ms'))} ms  "
            f"p95 {fmt(r.get('p95_ms'))} ms  p99 {fmt(r.get('p99_ms'))} ms  errors {r.get('errors', 0)}",
            flush=True,
        )
        return row

    def load(pool: LoadPool, phase: str, name: str, op: str, conc: int, **data: Any) -> dict[str, Any]:
        procs, threads = (1, 1) if conc == 1 else (args.procs, threads_hi)
        print(
            f"[{phase}] {name} at concurrency {conc} ({procs}x{threads}) for {args.seconds} s ...", flush=True
        )
        out = pool.run(op, procs, threads, args.seconds, tag=f"{name}{conc}", **data)
        per_op = BATCH_SEARCH if op == "batch_search" else 1
        lat = out["latencies"]
        all_lat = np.concatenate(list(lat.values())) if lat else np.empty(0)
        r = summarize(all_lat, out["seconds"], per_op) | {"errors": out["errors"]}
        if op == "mix":
            r["by_kind"] = {k: summarize(v, out["seconds"]) for k, v in lat.items()}
        return add_row(phase, name, conc, r, "queries/s" if per_op > 1 else "ops/s")

    memory: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tiermem-suite-") as tmp:
        print("starting server ...", flush=True)
        proc, target = start_server(Path(tmp) / "data", {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"})
        pool = None
        try:
            from tiermem.client import MemoryClient
            from tiermem.v1 import memory_pb2 as pb

            with MemoryClient(target, timeout=300) as client:
                client.wait_ready()
                print(f"server {target} pid {proc.pid}; starting {args.procs} load processes ...", flush=True)
                pool = LoadPool(target, args.procs)

                # 1. empty-RPC ceiling
                empty_c1 = load(pool, "empty_rpc", "health Check", "health", 1)
                empty_hi = load(pool, "empty_rpc", "health Check", "health", hi)

                # 2. ingest
                rss_before = rss_bytes(proc.pid)
                print(f"[ingest] BatchCreateMemories of {args.n} in batches of {BATCH} ...", flush=True)
                rpc_s = 0.0
                t_wall = time.perf_counter()
                last = t_wall
                for start in range(0, args.n, BATCH):
                    chunk = vectors[start : start + BATCH]
                    req = pb.BatchCreateMemoriesRequest(
                        memories=[
                            pb.Memory(
                                namespace=NAMESPACE,
                                content=f"memory {start + j}",
                                embedding=v.tolist(),
                                embedding_model=MODEL,
                                importance=float((start + j) % 10) / 10,
                            )
                            for j, v in enumerate(chunk)
                        ]
                    )
                    t0 = time.perf_counter()
                    client.stub.BatchCreateMemories(req, timeout=300)
                    rpc_s += time.perf_counter() - t0
                    if time.perf_counter() - last > 2:
                        last = time.perf_counter()
                        print(
                            f"  ingest: {start + len(chunk)}/{args.n} ({(start + len(chunk)) / rpc_s:,.0f}/s)",
                            flush=True,
                        )
                wall = time.perf_counter() - t_wall
                batch_row = add_row(
                    "ingest",
                    f"BatchCreateMemories x{BATCH}",
                    1,
                    {"memories": args.n, "seconds": rpc_s, "wall_seconds": wall, "ops_per_s": args.n / rpc_s},
                    "memories/s",
                )
                time.sleep(0.5)
                rss_after = rss_bytes(proc.pid)
                per_vec = args.dim * 4 + HNSW_M * 2 * 4
                memory = {
                    "memories": args.n,
                    "rss_before_bytes": rss_before,
                    "rss_after_bytes": rss_after,
                    "rss_per_memory_bytes": rss_after / args.n,
                    "rss_growth_per_memory_bytes": (rss_after - rss_before) / args.n,
                    "vector_plus_links_bytes": per_vec,
                }
                print(
                    f"[memory] RSS {rss_before / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB: "
                    f"{rss_after / args.n:,.0f} B/memory total, {(rss_after - rss_before) / args.n:,.0f} B growth; "
                    f"vector+links {per_vec} B: ratio {rss_after / args.n / per_vec:.2f} "
                    f"(growth {(rss_after - rss_before) / args.n / per_vec:.2f})",
                    flush=True,
                )
                create_c1 = load(pool, "ingest", "CreateMemory", "create", 1, writes=writes)
                create_hi = load(pool, "ingest", "CreateMemory", "create", hi, writes=writes)

                # 3. search
                search_c1 = load(pool, "search", f"SearchMemories k={K}", "search", 1, queries=queries)
                search_hi = load(pool, "search", f"SearchMemories k={K}", "search", hi, queries=queries)
                load(
                    pool, "search", f"BatchSearchMemories x{BATCH_SEARCH}", "batch_search", 1, queries=queries
                )

                # 4. mix
                mix = load(
                    pool,
                    "mix",
                    "90% search / 10% create",
                    "mix",
                    hi,
                    queries=queries,
                    writes=writes,
                    read_fraction=0.9,
                )
                for kind, r in mix["by_kind"].items():
                    print(
                        f"  mix {kind}: {r['ops_per_s']:,.0f} ops/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms"
                    )
                stats = client.stats()
                server_stats = {
                    "memories": stats.memory_count,
                    "writes_committed": stats.writes_committed,
                    "commit_groups": stats.commit_groups,
                }
        finally:
            if pool is not None:
                pool.close()
            proc.terminate()
            proc.wait(timeout=120)

    # 5. FAISS ceilings, with the server stopped (it would compete for the cores).
    print(f"[faiss] in-process ceilings on the same {args.n} vectors ...", flush=True)
    fa = faiss_ceilings(vectors, queries, args.seconds)
    add_row("faiss", f"index.add x{BATCH} (1 OMP thread)", 1, fa["add"], "vectors/s")
    add_row("faiss", f"index.search k={K} single query", 1, fa["search_t1"], "q/s")
    add_row("faiss", f"index.search k={K} single query", 2, fa["search_t2"], "q/s")

    R, A = empty_hi["ops_per_s"], fa["add"]["ops_per_s"]
    composed = 1 / (1 / R + 1 / A)

    def ratio(name: str, value: float, target: str, meets: bool) -> dict[str, Any]:
        return {"name": name, "value": value, "target": target, "meets": bool(meets)}

    rss_ratio = memory["rss_per_memory_bytes"] / memory["vector_plus_links_bytes"]
    growth_ratio = memory["rss_growth_per_memory_bytes"] / memory["vector_plus_links_bytes"]
    ratios = [
        ratio(
            f"search c{hi} / empty-RPC c{hi} (ops/s)",
            search_hi["ops_per_s"] / R,
            ">= 0.7",
            search_hi["ops_per_s"] / R >= 0.7,
        ),
        ratio(
            "search c1 p50 / empty-RPC c1 p50",
            search_c1["p50_ms"] / empty_c1["p50_ms"],
            "<= 1.5",
            search_c1["p50_ms"] / empty_c1["p50_ms"] <= 1.5,
        ),
        ratio("search c1 p99 (ms)", search_c1["p99_ms"], "< 2 ms", search_c1["p99_ms"] < 2),
        ratio(
            "batch ingest / FAISS add",
            batch_row["ops_per_s"] / A,
            ">= 0.8",
            batch_row["ops_per_s"] / A >= 0.8,
        ),
        ratio(
            f"create c{hi} / 1/(1/R + 1/A) = {composed:,.0f}/s",
            create_hi["ops_per_s"] / composed,
            ">= 0.9",
            create_hi["ops_per_s"] / composed >= 0.9,
        ),
        ratio("RSS per memory (total / n) / (vector + links)", rss_ratio, "< 2", rss_ratio < 2),
        ratio("RSS growth per memory / (vector + links)", growth_ratio, "< 2", growth_ratio < 2),
    ]
    _ = create_c1
    results = {
        "machine": info,
        "params": params,
        "note": "client processes share this machine's cores with the server; lifecycle off; fsync on",
        "rows": rows,
        "phases": sorted({r["phase"] for r in rows} | {"memory"}),
        "memory": memory,
        "faiss": fa,
        "composed_create_limit_per_s": composed,
        "ratios": ratios,
        "server": server_stats,
        "not_measured": list(NOT_MEASURED),
    }
    md = markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite.json").write_text(json.dumps(results, indent=2, default=float))
    (args.out / "suite.md").write_text(md)
    print()
    print(md)
    print(f"wrote {args.out / 'suite.json'} and {args.out / 'suite.md'}")


if __name__ == "__main__":
    sys.exit(main())
