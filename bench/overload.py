"""Overload: does a monitoring prober still get answers while 400 clients keep the server full?

Starts a server (a separate process) holding a few thousand memories, then keeps 400 searches in
flight (4 processes x 100 threads, each calling SearchMemories in a loop) for ``--seconds``, while
this process probes grpc.health.v1 Check and GetStats every 0.25 s with a 2 s deadline. Runs twice
in one go: with ``monitoring_reserved_rpcs`` 0 (every call shares one cap, as before the reserve)
and with the default reserve, and prints, per run, the prober's answers by status and the searches'
by status.

    python bench/overload.py [--seconds 15] [--clients 400]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import sentences, start_server, stop_server, wait_serving

PROCESSES = 4


def _load(target: str, threads: int, seconds: float, out: Any) -> None:
    import grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target)
    stub = pb_grpc.MemoryServiceStub(channel)
    codes: Counter[str] = Counter()
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def run(i: int) -> None:
        req = pb.SearchMemoriesRequest(
            namespaces=["bench"], query_text=f"question {i} about the harbour", limit=10
        )
        while time.monotonic() < end:
            try:
                stub.SearchMemories(req, timeout=5)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                codes[code] += 1

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(dict(codes))


def _probe(target: str, seconds: float) -> dict[str, Counter[str]]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(target)
    health, stub = health_pb2_grpc.HealthStub(channel), pb_grpc.MemoryServiceStub(channel)
    out: dict[str, Counter[str]] = {"health": Counter(), "stats": Counter()}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, call in (
            ("health", lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=2)),
            ("stats", lambda: stub.GetStats(pb.GetStatsRequest(), timeout=2)),
        ):
            try:
                call()
                out[name]["OK"] += 1
            except grpc.RpcError as e:
                out[name][e.code().name] += 1
        time.sleep(0.25)
    return out


def run(reserved: int, seconds: float, clients: int) -> None:
    import grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    with tempfile.TemporaryDirectory() as d:
        proc, target = start_server(Path(d), env={"TIERMEM_MONITORING_RESERVED_RPCS": str(reserved)})
        try:
            wait_serving(target, 300, proc)
            stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(target))
            texts = sentences(3000, seed=7)
            for lo in range(0, len(texts), 500):
                stub.BatchCreateMemories(
                    pb.BatchCreateMemoriesRequest(
                        memories=[pb.Memory(namespace="bench", content=t) for t in texts[lo : lo + 500]]
                    ),
                    timeout=120,
                )
            ctx = mp.get_context("spawn")
            results = ctx.Queue()
            workers = [
                ctx.Process(target=_load, args=(target, clients // PROCESSES, seconds + 2, results))
                for _ in range(PROCESSES)
            ]
            for w in workers:
                w.start()
            time.sleep(2.0)  # (the load reaches full strength)
            probes = _probe(target, seconds)
            searches: Counter[str] = Counter()
            for _ in workers:
                searches.update(results.get(timeout=120))
            for w in workers:
                w.join()
        finally:
            stop_server(proc, kill=True)
    print(f"monitoring_reserved_rpcs={reserved}, {clients} clients searching, {seconds:.0f} s:")
    for name, counts in probes.items():
        total = sum(counts.values())
        print(
            f"  prober {name:6s}: {counts.get('OK', 0)} of {total} answered; refused/failed: {dict(counts - Counter({'OK': counts.get('OK', 0)}))}"
        )
    print(f"  searches: {dict(searches)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=400)
    args = p.parse_args()
    for reserved in (0, 16):
        run(reserved, args.seconds, args.clients)


if __name__ == "__main__":
    main()
