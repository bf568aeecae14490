"""Threads against processes: the same searches on one thread, on two threads of one engine, and on
two engine processes (each on its own copy of the data), in one run on the same data.

The server answers searches on threads of one process, so everything a search does while holding
the GIL (the ranking's Python, the gRPC layer's Python) happens one thread at a time. This measures
how much that costs on this machine, without gRPC in the way: if two processes serve nearly twice
what one thread does while two threads serve little more, the per-request Python under the GIL is
the bound, and more threads (or tuning them) will not lift it; more processes would.

    python bench/gil.py                         # 100,000 memories, 384 dims, 5 s per load
    python bench/gil.py --n 20000 --seconds 2 --json bench/results/gil.json

Searches are in-process ``Engine.search`` calls (read_only, as_of fixed), the queries near cluster
centres as in bench/suite.py; lifecycle off. Each load runs ``--seconds`` after a warm-up pass;
processes start together (a shared start time). CPU per search is the searching threads' CPU time
(``time.thread_time``), in every case.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import search_request
from suite import Data, make_data, memory_pb

MAINTENANCE_OFF = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"}


def open_engine(data_dir: Path) -> Any:
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine

    return Engine(ServerConfig.from_env(env=MAINTENANCE_OFF, data_dir=data_dir, port=0))


def build(data_dir: Path, data: Data) -> None:
    """The memories of ``data`` through the engine in batches of 256, every vector in HNSW, then a
    clean close."""
    from tiermem.server.model import validation
    from tiermem.server.transport import convert
    from tiermem.v1 import memory_pb2 as pb

    n = data.vectors.shape[0]
    eng = open_engine(data_dir)
    try:
        for start in range(0, n, 256):
            specs = []
            for i in range(start, min(n, start + 256)):
                m = memory_pb(
                    pb, data.model, i, data.vectors[i], float(data.importance[i]), float(data.created[i])
                )
                specs.append(
                    validation.new_memory(f"memories[{i}].", convert.new_memory_from_pb(m, ""), eng.config)
                )
            eng.create(specs, batch=True)
        deadline = time.monotonic() + 600
        while any(ix.pending for sp in eng.spaces.values() for ix in sp.indexes.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("indexing did not finish in 600 s")
            time.sleep(0.1)
    finally:
        eng.close()


def queries(vectors: np.ndarray, model: str, as_of: float, similarity: bool) -> list[Any]:
    """The searches of a load: one per query vector, top 10, as_of fixed."""
    from tiermem.server.transport import convert

    reqs = [
        search_request(
            q, namespace="bench", model=model, k=10, as_of=as_of, where=None, similarity=similarity
        )
        for q in vectors
    ]
    return [convert.search_from_pb(r) for r in reqs]


def _figures(outs: list[tuple[int, float]], seconds: float) -> dict[str, float]:
    """Searches a second and CPU a search from each searcher's (count, CPU seconds)."""
    count = sum(c for c, _ in outs)
    return {
        "searches_per_s": count / seconds,
        "cpu_ms_per_search": sum(c for _, c in outs) / max(1, count) * 1e3,
    }


def _loop(eng: Any, qs: list[Any], offset: int, start_at: float, seconds: float) -> tuple[int, float]:
    """Searches from start_at for seconds: (count, thread CPU seconds)."""
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    c0 = time.thread_time()
    count = 0
    while time.time() < end:
        eng.search(qs[(offset + count) % len(qs)])
        count += 1
    return count, time.thread_time() - c0


def run_threads(eng: Any, qs: list[Any], threads: int, seconds: float) -> dict[str, float]:
    out: list[tuple[int, float]] = [(0, 0.0)] * threads
    start_at = time.time() + 0.2

    def work(i: int) -> None:
        out[i] = _loop(eng, qs, 97 * i, start_at, seconds)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return _figures(out, seconds)


def _process_main(data_dir: str, qs: list[Any], ready: Any, go: Any, results: Any, i: int) -> None:
    """One engine process: open, warm up, say ready (or why not), search from the shared start."""
    from tiermem.server.index.threads import set_faiss_threads

    set_faiss_threads(1)
    eng = None
    try:
        eng = open_engine(Path(data_dir))
        for q in qs:  # warm-up
            eng.search(q)
        ready.put((i, None))
        start_at, seconds = go.get(timeout=900)
        results.put(_loop(eng, qs, 97 * i, start_at, seconds))
    except BaseException as e:
        ready.put((i, f"{type(e).__name__}: {e}"))
        raise
    finally:
        if eng is not None:
            eng.close()


def _get(q: Any, procs: list[Any], timeout: float) -> Any:
    """The next item of q; fails at once if a process died (it cannot send it any more)."""
    import queue

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a search process exited with code {dead[0].exitcode}") from None
    raise RuntimeError(f"no answer from the search processes in {timeout:.0f} s")


def run_processes(dirs: list[Path], qs: list[Any], seconds: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    gos = [ctx.Queue() for _ in dirs]
    procs = [
        ctx.Process(target=_process_main, args=(str(d), qs, ready, gos[i], results, i))
        for i, d in enumerate(dirs)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            i, error = _get(ready, procs, 600)
            if error:
                raise RuntimeError(f"search process {i} failed: {error}")
        start_at = time.time() + 0.3
        for g in gos:
            g.put((start_at, seconds))
        outs = [_get(results, procs, seconds + 120) for _ in procs]
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
    return _figures(outs, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    from tiermem.server.index.threads import set_faiss_threads

    set_faiss_threads(1)
    work = Path(tempfile.mkdtemp(prefix="tiermem-gil-"))
    try:
        first = work / "data0"
        t0 = time.perf_counter()
        data = make_data(args.n, args.dim, args.seed)
        build(first, data)
        print(f"built {args.n:,} memories ({args.dim} dims) in {time.perf_counter() - t0:.1f} s", flush=True)
        second = work / "data1"
        shutil.copytree(first, second)
        rows: list[dict[str, Any]] = []
        for similarity in (False, True):
            label = "similarity" if similarity else "default"
            qs = queries(data.queries, data.model, data.as_of, similarity)
            eng = open_engine(first)
            try:
                for q in qs:
                    eng.search(q)
                one = run_threads(eng, qs, 1, args.seconds)
                two = run_threads(eng, qs, 2, args.seconds)
            finally:
                eng.close()
            procs = run_processes([first, second], qs, args.seconds)
            for how, r in (
                ("1 thread", one),
                ("2 threads, 1 process", two),
                ("2 processes, 1 thread each", procs),
            ):
                row = {
                    "strategy": label,
                    "how": how,
                    **r,
                    "vs_1_thread": r["searches_per_s"] / one["searches_per_s"],
                }
                rows.append(row)
                print(
                    f"{label:10s} {how:28s} {r['searches_per_s']:8,.0f} searches/s  "
                    f"CPU {r['cpu_ms_per_search']:.3f} ms a search  {row['vs_1_thread']:.2f}x one thread",
                    flush=True,
                )
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps(
                    {
                        "n": args.n,
                        "dim": args.dim,
                        "seconds": args.seconds,
                        "cores": os.cpu_count(),
                        "python": platform.python_version(),
                        "rows": rows,
                    },
                    indent=2,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
