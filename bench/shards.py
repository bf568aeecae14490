"""Searches/s against the number of local tenant shards on one host (docs/scaling.md): N
``--sharded`` server processes behind one HAProxy, the same multi-tenant data, the same search load.

Tenant shards on one host share nothing and copy nothing, so N of them should use N cores where one
process, held to about one core by the GIL for searching, cannot. The aim: N shards at 0.7N x the
searches/s of one, up to the core count, with the memory per memory unchanged.

First, for each N = 1 .. ``--max-shards`` (default: the cores this process may run on, at least 2):

  1. N ``python -m tiermem.server --sharded`` processes on free loopback ports, each with its own
     data dir (fsync on, background lifecycle off as in bench/suite.py), and HAProxy in front with
     the configuration of ``tiermem.client.haproxy.config`` (``haproxy -db -f cfg``): tenants placed
     by consistent hashing of their routing key, or with ``--placement even`` pinned by its map
     file to shard i mod N (tenant i), as tenants placed by hand are.
  2. the shards' anonymous memory (RssAnon of /proc/PID/status, summed) once they are idle.
  3. load through the proxy with ``MemoryClient(proxy, sharded=True)``: ``--n`` memories (seeded,
     clustered, normalized 384-dim vectors, real-looking sentences from bench/common.py) split
     evenly among ``--tenants`` tenants (``user:t000/agent:bench`` ...), by BatchCreateMemories of at
     most 256 of one tenant's memories; then the shards' indexers catch up, and once idle their
     anonymous memory is read again: (after - before) / n is the growth per memory.

Every configuration stays up, idle while the others are measured. Then ``--rounds`` rounds, in
alternating order (1..max, max..1, ...: the machine's speed drifts, as in the suite's followers
phase), each N in turn:

  4. ``--seconds`` of searches through its proxy from ``--procs`` separate client processes with
     ``--concurrency`` calls in flight in all (threads spread over the processes, one connection
     each): each search is for a random tenant, with a query vector near a cluster centre and a
     question as its text, default strategy, limit 10, read_only (as in the suite), with the
     tenant's routing key. An op counts when it starts inside the window shared by the processes.
     The CPU used in the window by the shards, HAProxy, the client processes and every other
     process on the machine is recorded too.

Each figure of the table is the median over the rounds. At the end every HAProxy is killed and
every shard stopped (SIGTERM).

The client processes and HAProxy share the machine's cores with the shards, so on a small machine
the figures are a floor for what remote clients would see, and a larger N also takes cores from the
load generator. Nothing is asserted: the 0.7 target is printed next to the ratios.

    python bench/shards.py                                  # 20,000 memories, 64 tenants, 2 x 10 s each
    python bench/shards.py --max-shards 4 --json bench/results/shards.json
    python bench/shards.py --n 300 --tenants 6 --seconds 1 --max-shards 2 --rounds 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    DAY,
    clustered_vectors,
    cpu_seconds,
    free_port,
    machine,
    queries_near,
    questions,
    rss_parts,
    sentences,
    stop_server,
    summarize,
    wait_idle,
    wait_serving,
)

from tiermem.server.cores import usable_cores

BATCH = 256
DIM = 384
K = 10
TARGET = 0.7  # searches/s of N shards / (N x one shard), up to the core count
TIMEOUT = 600.0
QUERIES = 1024
# The lifecycle would move memories meanwhile; one process a shard (the shards share the cores).
SERVER_ENV = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0", "TIERMEM_SEARCH_PROCESSES": "1"}


# -- data ----------------------------------------------------------------------------------------------


@dataclass
class Data:
    """The --n memories, memory i owned by tenant i % tenants, and the queries, each for a tenant."""

    model: str
    tenants: list[str]  # top-level scopes: the routing keys
    vectors: np.ndarray
    texts: list[str]
    importance: np.ndarray
    created: np.ndarray
    queries: np.ndarray
    query_texts: list[str]
    query_tenant: np.ndarray  # the tenant each query is asked for (uniform at random)

    def namespace(self, tenant: int) -> str:
        return f"{self.tenants[tenant]}/agent:bench"


def make_data(n: int, tenants: int, seed: int) -> Data:
    vectors, centres = clustered_vectors(n, DIM, max(10, n // 1000), seed)
    rng = np.random.default_rng(seed + 1)
    queries = queries_near(centres, QUERIES, rng)
    as_of = time.time()
    return Data(
        model=f"bench-{DIM}",
        tenants=[f"user:t{t:03d}" for t in range(tenants)],
        vectors=vectors,
        texts=sentences(n, seed + 2),
        importance=rng.random(n, dtype=np.float32),
        created=as_of - rng.random(n) * 30 * DAY,
        queries=queries,
        query_texts=questions(QUERIES, seed + 3),
        query_tenant=rng.integers(0, tenants, QUERIES),
    )


def tenant_batches(data: Data, pb: Any) -> list[list[Any]]:
    """Memory messages in batches of at most BATCH, each batch one tenant's only."""
    n, tenants = data.vectors.shape[0], len(data.tenants)
    batches = []
    for t in range(tenants):
        rows = range(t, n, tenants)
        for start in range(0, len(rows), BATCH):
            batch = []
            for i in rows[start : start + BATCH]:
                m = pb.Memory(
                    namespace=data.namespace(t),
                    content=data.texts[i],
                    embedding=data.vectors[i].tolist(),
                    embedding_model=data.model,
                    importance=float(data.importance[i]),
                )
                m.create_time.FromNanoseconds(int(data.created[i] * 1e9))
                batch.append(m)
            batches.append(batch)
    return batches


# -- processes: shards and the proxy --------------------------------------------------------------------


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise SystemExit("bench/shards.py needs haproxy (make proxy-toolchain)")
    return found


def log_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@dataclass
class Shard:
    name: str
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes]
    target: str


def start_shards(base: Path, count: int) -> list[Shard]:
    """``count`` ``--sharded`` server processes started side by side, each SERVING on its own port."""
    shards = []
    for i in range(count):
        name, port = f"s{i}", free_port()
        data_dir, log = base / name, base / f"{name}.log"
        data_dir.mkdir(parents=True)
        cmd = [sys.executable, "-m", "tiermem.server", "--port", str(port), "--data-dir", str(data_dir)]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [*cmd, "--sharded", "--log-level", "INFO"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **SERVER_ENV},
            )
        shards.append(Shard(name, data_dir, log, proc, f"127.0.0.1:{port}"))
    try:
        for s in shards:
            try:
                wait_serving(s.target, TIMEOUT, s.proc)
            except RuntimeError as e:
                raise RuntimeError(f"shard {s.name}: {e}; log tail:\n{log_tail(s.log)}") from None
    except BaseException:
        stop_all(shards, None)
        raise
    return shards


def start_proxy(
    binary: str, base: Path, shards: list[Shard], pinned: dict[str, str]
) -> tuple[subprocess.Popen[bytes], str]:
    """HAProxy with tiermem's configuration in front of ``shards``, with the scopes of ``pinned``
    routed to their shard by its map (the others by consistent hashing); returns (process, address)."""
    from tiermem.client import haproxy

    listen = f"127.0.0.1:{free_port()}"
    map_file, admin_socket, cfg, log = (
        base / f for f in ("routes.map", "admin.sock", "haproxy.cfg", "h.log")
    )
    map_file.write_text("".join(f"{scope} {haproxy.backend_of(shard)}\n" for scope, shard in pinned.items()))
    cfg.write_text(haproxy.config({s.name: s.target for s in shards}, listen, map_file, admin_socket))
    with log.open("ab") as out:
        proc = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not admin_socket.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if proc.poll() is not None or not admin_socket.exists():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"haproxy did not start; its log:\n{log_tail(log)}")
    return proc, listen


def stop_all(shards: list[Shard], proxy: subprocess.Popen[bytes] | None) -> None:
    """Kill the proxy, stop every shard cleanly (SIGTERM), or kill it if that fails."""
    if proxy is not None and proxy.poll() is None:
        proxy.kill()
        proxy.wait()
    for s in shards:
        if s.proc.poll() is None:
            try:
                stop_server(s.proc, timeout=120)
            except (RuntimeError, subprocess.TimeoutExpired):
                s.proc.kill()
                s.proc.wait()


def anon_bytes(shards: list[Shard]) -> int:
    return sum(rss_parts(s.proc.pid).get("RssAnon", 0) for s in shards)


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: all but idle
    and iowait), whoever used them."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_indexed(clients: Any) -> float:
    """Seconds until no shard has an acknowledged vector waiting to enter HNSW."""
    t0 = time.perf_counter()
    while sum(sp.pending_vectors for st in clients.stats()["shards"].values() for sp in st.spaces):
        time.sleep(0.05)
    return time.perf_counter() - t0


# -- the search load: client processes -------------------------------------------------------------------


def _search_worker(proxy: str, work: dict[str, Any], threads: int, go: Any, results: Any, seed: int) -> None:
    """One client process: one connection to the proxy, ``threads`` threads making searches of
    random tenants between the start and end times it is sent; reports latencies, errors and the
    CPU seconds it used in the window."""
    import grpc

    from tiermem.client.routing import ROUTE_HEADER, top_scope
    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    try:
        channel = grpc.insecure_channel(proxy, options=[("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(channel).result(timeout=60)
        stub = pb_grpc.MemoryServiceStub(channel)
        calls = []
        for q, text, ns in zip(work["queries"], work["texts"], work["namespaces"], strict=True):
            req = pb.SearchMemoriesRequest(
                namespaces=[ns], embedding_model=work["model"], limit=K, read_only=True, query_text=text
            )
            req.query_embedding.extend(q.tolist())
            calls.append((req, ((ROUTE_HEADER, top_scope(ns)),)))
        for req, md in calls[: 3 * threads]:  # warm-up (each shard's first searches), not counted
            stub.SearchMemories(req, timeout=TIMEOUT, metadata=md)
    except Exception as e:  # reported to the parent, which fails the run
        results.put({"error": f"{type(e).__name__}: {e}"})
        return
    results.put({"ready": os.getpid()})
    start_at, end_at = go.get()
    lat: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads

    def run(tid: int) -> None:
        rng = np.random.default_rng((seed, tid))
        order = rng.permutation(len(calls))
        i = 0
        while time.time() < start_at:
            time.sleep(0.0005)
        while time.time() < end_at:
            req, md = calls[order[i % len(order)]]
            i += 1
            t0 = time.perf_counter()
            try:
                stub.SearchMemories(req, timeout=60.0, metadata=md)
            except grpc.RpcError:
                errors[tid] += 1
                continue
            lat[tid].append(time.perf_counter() - t0)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = time.process_time()  # every thread of this process
    for t in ts:
        t.join()
    cpu = time.process_time() - cpu0
    channel.close()
    results.put(
        {"latencies": np.array([x for xs in lat for x in xs]), "errors": sum(errors), "cpu_seconds": cpu}
    )


def search_load(
    proxy: str,
    data: Data,
    procs: int,
    concurrency: int,
    seconds: float,
    shard_pids: dict[str, int],
    proxy_pid: int,
    seed: int,
) -> dict[str, Any]:
    """``seconds`` of searches from ``procs`` client processes, ``concurrency`` in flight in all;
    the CPU seconds the shards (by name), the proxy, the clients and every other process use in the
    window are measured too."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    work = {
        "model": data.model,
        "queries": data.queries,
        "texts": data.query_texts,
        "namespaces": [data.namespace(int(t)) for t in data.query_tenant],
    }
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    gos = [ctx.Queue() for _ in range(procs)]
    workers = [
        ctx.Process(target=_search_worker, args=(proxy, work, threads, go, results, seed + i), daemon=True)
        for i, (threads, go) in enumerate(zip(shares, gos, strict=True))
    ]
    for w in workers:
        w.start()
    try:
        for _ in workers:
            out = results.get(timeout=300)
            if "error" in out:
                raise RuntimeError(f"a search client failed: {out['error']}")
        start_at = time.time() + 0.3
        for go in gos:
            go.put((start_at, start_at + seconds))
        time.sleep(max(0.0, start_at - time.time()))
        watch = {**shard_pids, "proxy": proxy_pid}
        cpu0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
        busy0 = machine_busy_seconds()
        time.sleep(max(0.0, start_at + seconds - time.time()))
        used = {name: cpu_seconds(pid) - cpu0[name] for name, pid in watch.items()}
        busy = machine_busy_seconds() - busy0
        outs = []
        for _ in workers:
            out = results.get(timeout=seconds + 300)
            if "error" in out:
                raise RuntimeError(f"a search client failed: {out['error']}")
            outs.append(out)
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()
                w.join(timeout=10)
    lat = np.concatenate([o["latencies"] for o in outs])
    cpu = {
        "shards": sum(used[name] for name in shard_pids),
        "proxy": used["proxy"],
        "clients": sum(o["cpu_seconds"] for o in outs),
    }
    ours = sum(cpu.values())
    cpu["others"] = max(0.0, busy - ours)  # other processes on the machine (and this one's bookkeeping)
    r = summarize(lat, seconds)
    return r | {
        "errors": sum(o["errors"] for o in outs),
        "cores_used": {group: s / seconds for group, s in cpu.items()},
        "cores_by_shard": {name: used[name] / seconds for name in shard_pids},
        "cpu_ms_per_search": ours / max(1, r["ops"]) * 1000,  # shards + haproxy + clients
    }


# -- one configuration: N shards behind a proxy, loaded --------------------------------------------------


@dataclass
class Config:
    """N shards and their proxy, loaded with the data; ``row`` gathers its figures."""

    count: int
    shards: list[Shard]
    proxy: subprocess.Popen[bytes] | None = None
    listen: str = ""
    row: dict[str, Any] = field(default_factory=dict)

    def stop(self) -> None:
        stop_all(self.shards, self.proxy)


def set_up(data: Data, count: int, base: Path, binary: str, placement: str) -> Config:
    """Start ``count`` shards and HAProxy, load the data through the proxy, and read the shards'
    anonymous memory before and after (idle both times). ``placement`` "hash": tenants placed by
    the proxy's consistent hashing; "even": tenant i pinned to shard i mod N by the proxy's map."""
    from tiermem.client import MemoryClient
    from tiermem.client.shards import Shards
    from tiermem.v1 import memory_pb2 as pb

    n = data.vectors.shape[0]
    print(f"[N={count}] starting {count} shard(s) and haproxy ...", flush=True)
    t0 = time.perf_counter()
    config = Config(count, start_shards(base, count))
    try:
        pinned = {}
        if placement == "even":
            pinned = {t: config.shards[i % count].name for i, t in enumerate(data.tenants)}
        config.proxy, config.listen = start_proxy(binary, base, config.shards, pinned)
        print(f"  shards up in {time.perf_counter() - t0:.1f} s; proxy {config.listen}", flush=True)
        for s in config.shards:
            wait_idle(s.proc.pid)
        anon_before = anon_bytes(config.shards)
        batches = tenant_batches(data, pb)
        with MemoryClient(config.listen, sharded=True, timeout=TIMEOUT) as client:
            client.wait_ready()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max(2, count)) as pool:  # calls in flight: as many as shards
                stored = sum(len(ms) for ms in pool.map(client.create_batch, batches))
            load_s = time.perf_counter() - t0
        if stored != n:
            raise RuntimeError(f"stored {stored} of {n} memories")
        with Shards({s.name: s.target for s in config.shards}, timeout=TIMEOUT) as direct:
            lag = wait_indexed(direct)
            per_shard = {name: st.memory_count for name, st in direct.stats()["shards"].items()}
        if sum(per_shard.values()) != n:
            raise RuntimeError(f"the shards hold {per_shard}, not {n} memories")
        for s in config.shards:  # idle, then a moment more (as the suite's memory phase)
            wait_idle(s.proc.pid)
        time.sleep(0.5)
        anon_after = anon_bytes(config.shards)
    except BaseException:
        config.stop()
        raise
    print(
        f"  loaded {n:,} memories of {len(data.tenants)} tenants in {load_s:.1f} s "
        f"({n / load_s:,.0f}/s; indexed {lag:.1f} s later); memories per shard: "
        + ", ".join(f"{k} {v:,}" for k, v in per_shard.items()),
        flush=True,
    )
    print(
        f"  shards' anonymous memory {anon_before / 2**20:.1f} -> {anon_after / 2**20:.1f} MiB: "
        f"{(anon_after - anon_before) / n:,.0f} B a memory",
        flush=True,
    )
    config.row = {
        "shards": count,
        "busiest_shard_share": max(per_shard.values()) / n,
        "memories_per_shard": per_shard,
        "load_seconds": load_s,
        "index_lag_seconds": lag,
        "anon_before_bytes": anon_before,
        "anon_after_bytes": anon_after,
        "anon_per_memory_bytes": (anon_after - anon_before) / n,
        "rounds": [],
    }
    return config


def search_window(args: argparse.Namespace, data: Data, config: Config, rnd: int) -> None:
    """One timed search load through ``config``'s proxy; its figures go to the config's rounds."""
    assert config.proxy is not None
    procs = min(args.procs, args.concurrency)
    print(
        f"[round {rnd}] N={config.count}: searching for {args.seconds:g} s at concurrency "
        f"{args.concurrency} from {procs} client processes ...",
        flush=True,
    )
    pids = {s.name: s.proc.pid for s in config.shards}
    seed = args.seed * 1000 + rnd * 100 + config.count
    r = search_load(config.listen, data, procs, args.concurrency, args.seconds, pids, config.proxy.pid, seed)
    cores = r["cores_used"]
    print(
        f"  {r['ops_per_s']:,.0f} searches/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
        f"errors {r['errors']}; cores used: shards {cores['shards']:.2f} ("
        + ", ".join(f"{k} {v:.2f}" for k, v in r["cores_by_shard"].items())
        + f"), haproxy {cores['proxy']:.2f}, "
        f"clients {cores['clients']:.2f}, other processes {cores['others']:.2f}; "
        f"{r['cpu_ms_per_search']:.2f} ms of CPU a search",
        flush=True,
    )
    config.row["rounds"].append({"round": rnd, **r})


def summarize_rounds(row: dict[str, Any]) -> None:
    """A configuration's figures: the median over its rounds of each."""
    rounds = row["rounds"]

    def median(key: str) -> float:
        return float(np.median([r[key] for r in rounds]))

    row |= {
        "searches_per_s": median("ops_per_s"),
        "p50_ms": median("p50_ms"),
        "p99_ms": median("p99_ms"),
        "cpu_ms_per_search": median("cpu_ms_per_search"),
        "errors": sum(r["errors"] for r in rounds),
        "cores_used": {
            k: float(np.median([r["cores_used"][k] for r in rounds])) for k in rounds[0]["cores_used"]
        },
    }


# -- report --------------------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    one = rows[0]["searches_per_s"] if rows and rows[0]["shards"] == 1 else float("nan")
    lines = [
        f"| N | searches/s | by round | x N=1 | / N (target {TARGET}) | p50 ms | p99 ms | anon B/memory "
        "| busiest shard | CPU ms/search | cores: shards / haproxy / clients / others |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        ratio = r["searches_per_s"] / one
        c = r["cores_used"]
        by_round = ", ".join(f"{x['ops_per_s']:,.0f}" for x in r["rounds"])
        lines.append(
            f"| {r['shards']} | {r['searches_per_s']:,.0f} | {by_round} | {ratio:.2f} | {ratio / r['shards']:.2f} "
            f"| {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['anon_per_memory_bytes']:,.0f} "
            f"| {r['busiest_shard_share']:.0%} | {r['cpu_ms_per_search']:.2f} "
            f"| {c['shards']:.2f} / {c['proxy']:.2f} / {c['clients']:.2f} / {c['others']:.2f} |"
        )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="memories in all (default 20000)")
    p.add_argument("--tenants", type=int, default=64, help="tenants sharing them (default 64)")
    p.add_argument("--seconds", type=float, default=10.0, help="search load per N (default 10)")
    p.add_argument(
        "--max-shards", type=int, default=0, help="N runs 1..this (default: the usable cores, at least 2)"
    )
    p.add_argument("--concurrency", type=int, default=16, help="searches in flight in all (default 16)")
    p.add_argument("--procs", type=int, default=0, help="client processes (default 2-4, as the suite)")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="search windows per N, in alternating order (1..N, N..1, ...); the median is reported",
    )
    p.add_argument(
        "--placement",
        choices=("hash", "even"),
        default="hash",
        help="tenants placed by HAProxy's consistent hashing (default), or pinned evenly by its map",
    )
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args()
    args.max_shards = args.max_shards or max(2, usable_cores())
    args.procs = args.procs or min(4, max(2, os.cpu_count() or 2))
    if min(args.max_shards, args.tenants, args.concurrency, args.rounds) < 1 or args.seconds <= 0:
        p.error("--max-shards, --tenants, --concurrency, --rounds and --seconds must be positive")
    if args.n < args.tenants:
        p.error("--n must be at least --tenants")
    return args


def main() -> None:
    args = parse_args()
    command = " ".join(shlex.quote(a) for a in ["python", "bench/shards.py", *sys.argv[1:]])
    binary = haproxy_binary()
    info = machine()
    version = subprocess.run([binary, "-v"], capture_output=True, text=True).stdout.splitlines()[:1]
    cores = usable_cores()
    print(
        f"machine: {info['cpus']} cores ({cores} usable by this process), {info['cpu']}; "
        f"Python {info['python']}; {version[0] if version else 'haproxy'}",
        flush=True,
    )
    print(
        f"params: n={args.n:,} tenants={args.tenants} ({args.placement} placement) dim={DIM} "
        f"shards 1..{args.max_shards} "
        f"seconds={args.seconds:g} x {args.rounds} rounds, concurrency {args.concurrency} from "
        f"{min(args.procs, args.concurrency)} client processes",
        flush=True,
    )
    print(
        f"note: the client processes and haproxy run on the same {cores} cores as the shards",
        flush=True,
    )
    data = make_data(args.n, args.tenants, args.seed)
    configs: list[Config] = []
    with tempfile.TemporaryDirectory(prefix="tiermem-shards-") as tmp:
        try:
            # Every configuration is loaded first and stays up (idle) while the others are measured,
            # so that the rounds can alternate: the machine's speed drifts.
            for count in range(1, args.max_shards + 1):
                configs.append(set_up(data, count, Path(tmp) / f"n{count}", binary, args.placement))
            for rnd in range(1, args.rounds + 1):
                for config in configs if rnd % 2 else configs[::-1]:
                    search_window(args, data, config, rnd)
        finally:
            for config in configs:
                config.stop()
    rows = [config.row for config in configs]
    for r in rows:
        summarize_rounds(r)
    one = rows[0]["searches_per_s"]
    for r in rows:
        r["ratio_to_one"] = r["searches_per_s"] / one
        r["ratio_per_shard"] = r["ratio_to_one"] / r["shards"]
    print()
    print(
        f"Searches/s against local tenant shards behind HAProxy ({args.n:,} memories of {args.tenants} "
        f"tenants ({args.placement} placement), {DIM} dims; default strategy, k={K}, read_only; concurrency {args.concurrency}; "
        f"{args.seconds:g} s per N and round; medians of {args.rounds} round(s))"
    )
    print()
    print(table(rows))
    print()
    print(
        f"{cores} usable cores, shared by the shards, haproxy and the load generator "
        f"({min(args.procs, args.concurrency)} client processes); target: / N >= {TARGET} up to "
        "the core count.\nanon B/memory: the shards' RssAnon growth over the load / memories; busiest "
        "shard: its share of the memories (and of the searches); CPU ms/search: "
        "shards + haproxy + clients; cores: used in the search window (others: every other "
        "process on the machine).",
        flush=True,
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        results = {
            "command": command,
            "machine": info | {"haproxy": version[0] if version else "?"},
            "params": vars(args) | {"json": str(args.json), "dim": DIM, "k": K, "batch": BATCH},
            "note": "the client processes and haproxy share the machine's cores with the shards; "
            "lifecycle off; fsync on; searches read_only",
            "target_ratio_per_shard": TARGET,
            "rows": rows,
        }
        args.json.write_text(json.dumps(results, indent=2, default=float))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
