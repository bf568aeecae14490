"""Load generation for bench/suite.py: worker processes, each with its own gRPC channel and a few threads.

A load of P processes x T threads always runs in P distinct processes (spawned once, reused across
loads). Every timed load runs between a start and an end time shared by the workers; an op counts when it
starts inside that window. Ops: ``health`` (grpc.health.v1 Check, the empty-RPC ceiling), ``search``
(SearchMemories k, read_only, optionally with a ``where`` filter), ``batch_search`` (BatchSearchMemories),
``create`` (CreateMemory with an explicit embedding), ``mix`` (search or create at random) and ``cpu`` (no
RPC: a fixed CPU task of about ``cpu_ms``, how far the machine alone stretches a task's tail).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from typing import Any

import numpy as np
from common import wait_ready

MODEL = "bench-384"
NAMESPACE = "bench"
K = 10
BATCH_SEARCH = 16
HEALTH_SERVICE = "tiermem.v1.MemoryService"


# -- worker processes --------------------------------------------------------------------------------
# Each worker process owns one channel and serves load tasks from its own queue, so a load of P
# processes x T threads always runs in P distinct processes.


def _worker_main(target: str, tasks: Any, results: Any, connections: int = 1, processes: int = 1) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    options = [
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ]
    if connections > 1:  # a connection each (channels with equal options otherwise share one)
        options.append(("grpc.use_local_subchannel_pool", 1))
        channels = _balanced_channels(grpc, pb, pb_grpc, target, options, connections, processes)
    else:
        channels = [grpc.insecure_channel(target, options=options)]
    for channel in channels:
        grpc.channel_ready_future(channel).result(timeout=60)
    stubs = [pb_grpc.MemoryServiceStub(c) for c in channels]
    healths = [health_pb2_grpc.HealthStub(c) for c in channels]
    pid = os.getpid()
    results.put({"ready": pid})  # (the pool waits for this before its first load)
    while True:
        task = tasks.get()
        if task is None:
            break
        try:
            results.put(_run_task(task, stubs, healths, pb, health_pb2, grpc, pid))
        except Exception as e:  # reported to the parent, which fails the run
            results.put({"error": f"{type(e).__name__}: {e}"})
    for channel in channels:
        channel.close()


def _balanced_channels(
    grpc: Any, pb: Any, pb_grpc: Any, target: str, options: list[Any], connections: int, processes: int
) -> list[Any]:
    """``connections`` connections spread evenly over the server's processes (search followers
    share the port, and the kernel gives each new connection to one of them at random: 8 would
    split 6:2 or worse 29% of the time). A search's trailing metadata names the process that
    ranked it (none: a single process); connections are opened until each of the ``processes``
    has its share (or 8x as many were tried), then taken in turn from each process."""
    by_pid: dict[str, list[Any]] = {}
    probe = pb.SearchMemoriesRequest(namespaces=["bench-probe"], query_text="probe", read_only=True)
    for _ in range(8 * connections):
        channel = grpc.insecure_channel(target, options=options)
        grpc.channel_ready_future(channel).result(timeout=60)
        _, call = pb_grpc.MemoryServiceStub(channel).SearchMemories.with_call(probe, timeout=60)
        pid = dict(call.trailing_metadata() or ()).get("tiermem-search-process", "one")
        by_pid.setdefault(pid, []).append(channel)
        if len(by_pid) >= processes and all(len(v) >= -(-connections // processes) for v in by_pid.values()):
            break
    groups = [by_pid[k] for k in sorted(by_pid)]
    chosen = [g[i] for i in range(connections) for g in groups if i < len(g)][:connections]
    for g in groups:
        for channel in g:
            if channel not in chosen:
                channel.close()
    return chosen


def _run_task(
    task: dict[str, Any], stubs: list[Any], healths: list[Any], pb: Any, health_pb2: Any, grpc: Any, pid: int
) -> Any:
    op: str = task["op"]
    threads: int = task["threads"]
    start_at: float = task["start_at"]
    end_at: float = task["end_at"]
    timeout = 60.0
    queries = task.get("queries")
    model = task.get("model", MODEL)
    writes = task.get("writes")
    search_reqs = []
    texts = task.get("texts")
    if queries is not None:
        for qi, q in enumerate(queries):
            r = pb.SearchMemoriesRequest(
                namespaces=[NAMESPACE], embedding_model=model, limit=K, read_only=True
            )
            if task.get("where"):
                r.filter.where = task["where"]
            if task.get("strategy"):
                r.strategy = task["strategy"]
            if texts:  # the query's text too: keywords (the default strategy, or hybrid)
                r.query_text = texts[qi % len(texts)]
            if task.get("hybrid"):
                r.hybrid.enabled = True
            r.query_embedding.extend(q.tolist())
            search_reqs.append(r)
    batch_reqs = [
        pb.BatchSearchMemoriesRequest(searches=search_reqs[i : i + BATCH_SEARCH])
        for i in range(0, len(search_reqs) - BATCH_SEARCH + 1, BATCH_SEARCH)
    ]
    write_vecs = [w.tolist() for w in writes] if writes is not None else []
    cpu_units = _cpu_units(task["cpu_ms"]) if op == "cpu" else 0
    health_req = health_pb2.HealthCheckRequest(service=HEALTH_SERVICE)

    def call(kind: str, tid: int, i: int) -> None:
        stub, health = stubs[tid % len(stubs)], healths[tid % len(healths)]  # thread t: connection t mod C
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
                embedding_model=model,
            )
            stub.CreateMemory(pb.CreateMemoryRequest(memory=m), timeout=timeout)
        elif kind == "cpu":
            _cpu_task(cpu_units)
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


# A fixed CPU task: products of a 256 x 384 float32 matrix (384 KiB, cache-resident) with one of
# its rows, in a Python loop, like a search's mix of small NumPy calls and Python; no I/O, no RPC.
_CPU_MATRIX = np.random.default_rng(0).standard_normal((256, 384)).astype(np.float32)


def _cpu_task(units: int) -> float:
    s = 0.0
    for u in range(units):
        s += float((_CPU_MATRIX @ _CPU_MATRIX[u & 255]).max())
    return s


def _cpu_units(ms: float) -> int:
    """How many units make the fixed task last about ``ms`` here: estimated from short runs, then
    rescaled by the median of runs of the estimate (the cost of a unit drifts with the run's length)."""
    units = 32
    for runs in (20, 7):
        took = []
        for _ in range(runs):
            t0 = time.perf_counter()
            _cpu_task(units)
            took.append(time.perf_counter() - t0)
        units = max(1, round(units * ms / 1e3 / float(np.median(took))))
    return units


class LoadPool:
    """``procs`` spawned worker processes, each with its own task queue and ``connections`` channels
    (connections) that its threads take in turn: more than one lets the kernel spread a process's
    calls over a server's processes (search followers share one port)."""

    def __init__(self, target: str, procs: int, connections: int = 1, processes: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.queues = [ctx.Queue() for _ in range(procs)]
        self.procs = [
            ctx.Process(
                target=_worker_main, args=(target, q, self.results, connections, processes), daemon=True
            )
            for q in self.queues
        ]
        for p in self.procs:
            p.start()
        try:
            wait_ready(self.results, len(self.procs), timeout=120)
        except RuntimeError:
            self.close()
            raise

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
