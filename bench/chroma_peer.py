"""Chroma as a peer: the same vectors, HNSW parameters, batch size and load scheme as bench/suite.py.

Runs in the benchmark's own environment (``.venv-bench``, ``make bench-venv``), not in tiermem's: chromadb
brings its own grpcio/protobuf pins. Steps:

  1. start a Chroma HTTP server as a subprocess (``chroma run --path DIR --host 127.0.0.1 --port P``)
     and time process start -> heartbeat;
  2. create a collection with tiermem's HNSW defaults (``configuration={"hnsw": {"space": "ip",
     "max_neighbors": M, "ef_construction": EFC, "ef_search": EFS}}``), no embedding function;
  3. ingest the vectors in batches (ids "0".."n-1", a document and ``{"bucket": i % 100}`` per item, as
     tiermem's memories carry content and metadata), timed;
  4. search k at concurrency 1 and ``--concurrency`` (worker processes x threads, each process with its
     own HttpClient, a common time window), default ``include`` (documents, metadatas, distances);
  5. recall@k of sequential searches against brute-force inner product over all vectors.

    .venv-bench/bin/python bench/chroma_peer.py --vectors v.npy --queries q.npy --json chroma.json

Prints progress and writes the figures as JSON. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    Progress,
    cpu_seconds,
    free_port,
    machine,
    package_version,
    recall_against_exact,
    summarize,
    wait_ready,
)

COLLECTION = "bench"
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


def chroma_binary() -> str:
    here = Path(sys.executable).parent / "chroma"
    found = str(here) if here.exists() else shutil.which("chroma")
    if not found:
        raise RuntimeError("no 'chroma' command next to this Python or on PATH")
    return found


def start_chroma(
    path: Path, log: Path, deadline_s: float = 120
) -> tuple[subprocess.Popen[bytes], int, float]:
    """``chroma run`` on a free port; returns (process, port, seconds from start to heartbeat)."""
    port = free_port()
    with log.open("ab") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [chroma_binary(), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
        )
    url = f"http://127.0.0.1:{port}/api/v2/heartbeat"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return proc, port, time.perf_counter() - t0
        except OSError:
            pass
        if proc.poll() is not None or time.perf_counter() - t0 > deadline_s:
            proc.kill()
            raise RuntimeError(f"chroma did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def client(port: int) -> Any:
    import chromadb
    from chromadb.config import Settings

    return chromadb.HttpClient(host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False))


# -- load workers: one process per slot, each with its own client and a few threads ---------------------


def _worker_main(port: int, tasks: Any, results: Any) -> None:
    col = client(port).get_collection(COLLECTION)
    results.put({"ready": os.getpid()})  # (the pool waits for this before its first load)
    while True:
        task = tasks.get()
        if task is None:
            break
        try:
            results.put(_run_task(col, task))
        except Exception as e:  # reported to the parent
            results.put({"error": f"{type(e).__name__}: {e}"})


def _run_task(col: Any, task: dict[str, Any]) -> dict[str, Any]:
    queries: np.ndarray = task["queries"]
    k, threads = task["k"], task["threads"]
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads

    def thread(tid: int) -> None:
        i = tid * 7919 + os.getpid()
        for _ in range(3):  # warm-up, before the window
            col.query(query_embeddings=queries[i % len(queries)][None, :], n_results=k)
            i += 1
        while time.time() < task["start_at"]:
            time.sleep(0.0005)
        while time.time() < task["end_at"]:
            t0 = time.perf_counter()
            try:
                col.query(query_embeddings=queries[i % len(queries)][None, :], n_results=k)
            except Exception:
                errors[tid] += 1
                continue
            lat[tid].append(time.perf_counter() - t0)
            i += 1

    ts = [threading.Thread(target=thread, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"latencies": np.array([x for xs in lat for x in xs]), "errors": sum(errors)}


class LoadPool:
    def __init__(self, port: int, procs: int) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.queues = [ctx.Queue() for _ in range(procs)]
        self.procs = [
            ctx.Process(target=_worker_main, args=(port, q, self.results), daemon=True) for q in self.queues
        ]
        for p in self.procs:
            p.start()
        wait_ready(self.results, len(self.procs), timeout=300)

    def run(self, procs: int, threads: int, seconds: float, queries: np.ndarray, k: int) -> dict[str, Any]:
        start_at = time.time() + 1.0 + 0.02 * threads  # covers message transfer and warm-up
        task = {"threads": threads, "start_at": start_at, "end_at": start_at + seconds, "queries": queries}
        for q in self.queues[:procs]:
            q.put(task | {"k": k})
        outs = []
        for _ in range(procs):
            try:
                out = self.results.get(timeout=seconds + 300)
            except queue.Empty:
                raise RuntimeError("chroma load timed out") from None
            if "error" in out:
                raise RuntimeError(f"chroma load failed in a worker: {out['error']}")
            outs.append(out)
        lat = np.concatenate([o["latencies"] for o in outs])
        return summarize(lat, seconds) | {"errors": sum(o["errors"] for o in outs)}

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for p in self.procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()


# -- phases --------------------------------------------------------------------------------------------


def create_collection(c: Any, m: int, efc: int, efs: int) -> Any:
    return c.create_collection(
        COLLECTION,
        configuration={"hnsw": {"space": "ip", "max_neighbors": m, "ef_construction": efc, "ef_search": efs}},
        embedding_function=None,
    )


def ingest(col: Any, vectors: np.ndarray, batch: int) -> dict[str, Any]:
    n = vectors.shape[0]
    bar = Progress("  chroma ingest", n, " vec")
    rpc_s = 0.0
    t_wall = time.perf_counter()
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        ids = [str(i) for i in range(start, stop)]
        docs = [f"memory {i}" for i in range(start, stop)]
        metas = [{"bucket": i % 100} for i in range(start, stop)]
        t0 = time.perf_counter()
        col.add(ids=ids, embeddings=vectors[start:stop], documents=docs, metadatas=metas)
        rpc_s += time.perf_counter() - t0
        bar.update(stop)
    bar.close()
    wall = time.perf_counter() - t_wall
    return {"memories": n, "seconds": rpc_s, "wall_seconds": wall, "ops_per_s": n / rpc_s, "errors": 0}


def recall(col: Any, vectors: np.ndarray, queries: np.ndarray, k: int) -> dict[str, Any]:
    """Sequential searches (ids only) against brute-force inner product over every vector."""
    got, lat = [], []
    t_all = time.perf_counter()
    for q in queries:
        t0 = time.perf_counter()
        r = col.query(query_embeddings=q[None, :], n_results=k, include=[])
        lat.append(time.perf_counter() - t0)
        got.append(np.array([int(x) for x in r["ids"][0]], dtype=np.int64))
    elapsed = time.perf_counter() - t_all
    per_query = [recall_against_exact([g], q[None, :], vectors, k) for g, q in zip(got, queries, strict=True)]
    ms = np.array(lat) * 1000
    return {
        "queries": len(queries),
        "recall_at_k": float(np.mean(per_query)),
        "min_recall": float(np.min(per_query)),
        "queries_below_1": int(np.sum(np.array(per_query) < 1.0)),
        "qps": len(queries) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    vectors = np.load(args.vectors)
    queries = np.load(args.queries)
    out: dict[str, Any] = {
        "chromadb": package_version("chromadb"),
        "machine": machine(("chromadb", "hnswlib", "httpx")),
        "params": {
            "n": int(vectors.shape[0]),
            "dim": int(vectors.shape[1]),
            "batch": args.batch,
            "k": args.k,
            "seconds": args.seconds,
            "concurrency": args.concurrency,
            "procs": args.procs,
        },
    }
    log = workdir / "chroma.log"
    print(f"[chroma] chromadb {out['chromadb']}: starting 'chroma run' ...", flush=True)
    proc, port, startup = start_chroma(workdir / "chroma-data", log)
    out["startup_empty_s"] = startup
    pool = None
    try:
        c = client(port)
        col = create_collection(c, args.m, args.efc, args.efs)
        out["configuration"] = json.loads(json.dumps(col.configuration, default=str))
        print(f"  collection configuration: {out['configuration'].get('hnsw')}", flush=True)
        out["ingest"] = ingest(col, vectors, args.batch)
        print(f"  chroma ingest: {out['ingest']['ops_per_s']:,.0f} vectors/s", flush=True)
        out["count"] = col.count()
        pool = LoadPool(port, args.procs)
        hi_threads = args.concurrency // args.procs
        for conc, procs, threads in ((1, 1, 1), (args.concurrency, args.procs, hi_threads)):
            cpu0 = cpu_seconds(proc.pid)  # ('chroma run' serves from one process, on several threads)
            r = pool.run(procs, threads, args.seconds, queries, args.k)
            cpu = cpu_seconds(proc.pid) - cpu0  # (warm-up and lead time included, as in the suite)
            r |= {"server_cores": cpu / args.seconds, "server_cpu_ms_per_op": 1e3 * cpu / max(1, r["ops"])}
            out[f"search_c{conc}"] = r | {"concurrency": conc, "procs": procs, "threads": threads}
            print(
                f"  chroma search k={args.k} c{conc} ({procs}x{threads}): {r['ops_per_s']:,.0f} q/s "
                f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms errors {r['errors']}; "
                f"server {r['server_cores']:.2f} cores",
                flush=True,
            )
        out["recall"] = recall(col, vectors, queries[: args.recall_queries], args.k)
        print(f"  chroma recall@{args.k}: {out['recall']['recall_at_k']:.4f}", flush=True)
    finally:
        if pool is not None:
            pool.close()
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out["concurrency_key"] = f"search_c{args.concurrency}"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", type=Path, required=True, help=".npy of float32 (n, dim), normalized")
    p.add_argument("--queries", type=Path, required=True, help=".npy of float32 (q, dim), normalized")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--efc", type=int, default=128)
    p.add_argument("--efs", type=int, default=64)
    p.add_argument("--recall-queries", type=int, default=200)
    p.add_argument("--workdir", type=Path, help="for Chroma's data and log (default: a temporary dir)")
    args = p.parse_args()
    if args.concurrency % args.procs:
        p.error("--concurrency must be a multiple of --procs")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        out = run(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="chroma-peer-") as tmp:
            out = run(args, Path(tmp))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2, default=float))
    print(f"  wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
