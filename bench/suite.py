"""Benchmark suite: tiermem against its ceilings (empty gRPC, in-process FAISS) and a peer
(Chroma), on the same data, in one command.

The server runs as a separate process (``python -m tiermem.server``) on 127.0.0.1 with LMDB in a temporary
directory, fsync on, and the background lifecycle off (TIERMEM_MAINTENANCE_INTERVAL_SECONDS=0: the
default policy would demote or evict most of the memories while we measure). The load comes from worker
processes (bench/load.py), each with its own channel and a few threads; concurrency = processes x threads.
Client processes share the machine's cores with the server, so on a small machine the figures are a floor
for what remote clients would see.

Data: ``--n`` seeded, clustered, normalized float32 vectors (``--dim`` 384, 768 or 1536), explicit
embeddings under model "bench-<dim>"; each memory has importance uniform in [0, 1], a create_time uniform
over the 30 days before the load and metadata ``bucket = i % 100``. Queries are drawn near cluster centres,
not from the data. Exact ground truth by brute force (NumPy).

Phases, in order:
  1. empty-RPC ceiling: grpc.health.v1.Health/Check on the same server, concurrency 1 and 16.
  2. ingest: BatchCreateMemories of n in batches of 256, built before the clock starts (progress bar);
     at 10% and 30% of n a short search load at concurrency 1 and 16 (throughput and p99 against
     collection size), after the indexer has caught up (that wait counts as ingest time).
  3. server RSS after the ingest (once the server is idle), per memory, against vector + HNSW links;
     the peak RSS (VmHWM) so far beside it.
  4. search k=10 (read_only, default combined strategy) at concurrency 1, 2, 4, 8, 16; then, at
     concurrency 1 and 16, the searches the issue compares with each other (similarity alone, the
     default with the query's text, similarity + hybrid, comprehensive + hybrid, comprehensive alone)
     in alternating rounds (--rounds of --seconds / 2 each, each round starting one search later: the
     machine's speed drifts over a run, and a ratio of two loads measured minutes apart would carry the
     drift); a fixed CPU task as long as the text search's p50 at concurrency 1, alone in a load worker
     (no RPC): the machine's own tail (p99 / p50); BatchSearchMemories of 16 queries per call at
     concurrency 1.
  5. filtered search k=10 with ``where`` keeping 10% and 1% of the memories, concurrency 1 and 16.
  6. recall: sequential searches with as_of fixed, SIMILARITY strategy (recall@10 vs brute force over the
     allowed rows) and default strategy (top-10 overlap vs an exact combined scoring), unfiltered, 10%, 1%.
  7. single CreateMemory at concurrency 1 and 16; 90/10 search/create mix at concurrency 16; then
     BatchCreateMemories of n/4 more (built before the clock starts) with two calls in flight (a
     second namespace), against FAISS adding the same vectors into an index of n.
  8. start-up: kill -9 the loaded server, start on the same data dir timed to health SERVING (what was
     written since the last periodic snapshot is reloaded), SIGTERM (timed), start again timed; then one
     ConsolidateMemories pass over the namespace (timed) on that server, and a clean stop. --startup-n
     does the same on a separate data dir built with N memories.
  9. Chroma as a peer (bench/chroma_peer.py in .venv-bench, tiermem stopped): same vectors, HNSW
     parameters, batches and concurrency; ingest, search c1/c16, recall@10.
 10. the engine alone (bench/alone.py): ``Engine.search`` in the suite's process, on a copy of the
     data directory taken at a clean stop before the writes of 7 (the memories the searches above
     ran on), the server gone: similarity and the default with its text, from 1 thread and
     from --concurrency threads, in alternating rounds. What the ranking takes with no RPC.
 11. in-process FAISS ceilings (IndexHNSWFlat M=32 efConstruction=128 efSearch=64 inner product): add
     in batches of 256 on one OpenMP thread and on every core (the ingest targets and the composed
     create limit use the faster), the n/4 more into n on every core; single-query search (one OpenMP
     thread) from 1 and 2 threads.
 12. optional (``--startup-n N``): a separate data dir of N memories built through BatchCreateMemories,
     then clean and kill -9 start-ups as in 8, similarity and text searches at concurrency 1 and 16 (in
     alternating rounds, as in 4), the engine alone on that data once its server stopped (as in 10),
     and the keyword pass alone over the same texts, in process, by the kernel, tantivy and bm25s.
 13. plots: suite_size.png and suite_concurrency.png (bench/plot.py, matplotlib from .venv-bench).

    python bench/suite.py                                   # 100,000 memories, 384 dims, 5 s per load
                                                            # (compared searches: 4 rounds of 2.5 s)
    python bench/suite.py --n 20000 --seconds 3 --no-chroma --out bench/results
    python bench/suite.py --startup-n 1000000               # adds the 1M start-up (many minutes)
    python bench/suite.py --startup-only --startup-n 1000000 --no-chroma   # that phase alone

Writes ``<out>/suite.json`` and ``<out>/suite.md`` and prints the Markdown. Nothing is asserted: the
issue's targets are printed next to the ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from alone import engine_alone
from bare import BareServer
from common import (
    SLOW,
    Progress,
    clustered_chunks,
    clustered_vectors,
    cpu_of,
    evaluate,
    exact_prior,
    machine,
    queries_near,
    questions,
    rss_bytes,
    rss_parts,
    search_request,
    sentences,
    start_server_timed,
    stop_server,
    summarize,
    wait_idle,
)
from keywords import DEPTH, keyword_pass
from load import BATCH_SEARCH, NAMESPACE, K, LoadPool
from report import TARGET_STARTUP_N, compute_ratios, fmt, markdown

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BATCH = 256
HNSW_M, HNSW_EFC, HNSW_EFS = 32, 128, 64  # ServerConfig defaults
# One process for every phase but the followers': the phases before it measure what one process
# does (the bare server, the engine alone beside it); the followers phase runs the default's.
SERVER_ENV = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0", "TIERMEM_SEARCH_PROCESSES": "1"}
ALONE_FIELDS = ("ops", "ops_per_s", "p50_ms", "p95_ms", "p99_ms")  # (a row of the engine alone)
SWEEP = (1, 2, 4, 8, 16)
SELECTIVITIES = (10, 1)  # percent of the memories a filtered search may return
DAY = 86400.0
TIMEOUT = 600.0
EXTRA_NAMESPACE = "bench-extra"  # the in-flight ingest's memories (after every search phase)
SIMILARITY = 4  # tiermem.v1.SearchStrategy SEARCH_STRATEGY_SIMILARITY: relevance alone
COMPREHENSIVE = 1  # SEARCH_STRATEGY_COMPREHENSIVE: the raw weighted sum


@dataclass
class Data:
    model: str
    vectors: np.ndarray
    queries: np.ndarray
    writes: np.ndarray
    importance: np.ndarray
    created: np.ndarray
    bucket: np.ndarray
    as_of: float
    prior: np.ndarray
    texts: list[str]  # each memory's content (real-looking sentences)
    query_texts: list[str]  # the queries' text, asked with the query vectors


def model_name(dim: int) -> str:
    """The embedding model name the suite's memories and queries carry."""
    return f"bench-{dim}"


def make_data(n: int, dim: int, seed: int) -> Data:
    clusters = max(10, n // 1000)
    vectors, centres = clustered_vectors(n, dim, clusters, seed)
    rng = np.random.default_rng(seed + 1)
    queries = queries_near(centres, 256, rng)
    writes = vectors[rng.integers(0, n, 1024)]
    importance = rng.random(n, dtype=np.float32)  # float32, as the server stores it
    as_of = float(int(time.time()))
    created = as_of - rng.random(n) * 30 * DAY
    prior = exact_prior(importance, created, np.full(n, SLOW), as_of)
    texts, query_texts = sentences(n, seed + 2), questions(queries.shape[0], seed + 3)
    return Data(
        model_name(dim),
        vectors,
        queries,
        writes,
        importance,
        created,
        np.arange(n) % 100,
        as_of,
        prior,
        texts,
        query_texts,
    )


def memory_pb(
    pb: Any, model: str, i: int, vec: np.ndarray, importance: float, created: float, text: str = ""
) -> Any:
    m = pb.Memory(
        namespace=NAMESPACE,
        content=text or f"memory {i}",
        embedding=vec.tolist(),
        embedding_model=model,
        importance=importance,
    )
    m.create_time.FromNanoseconds(int(created * 1e9))
    m.metadata["bucket"].int_value = i % 100
    return m


def batch_request(pb: Any, d: Data, start: int, stop: int) -> Any:
    """A BatchCreateMemoriesRequest of the memories ``start:stop`` of ``d``, with their texts."""
    memories = [
        memory_pb(
            pb,
            d.model,
            i,
            d.vectors[i],
            float(d.importance[i]),
            float(d.created[i]),
            d.texts[i % len(d.texts)],
        )
        for i in range(start, stop)
    ]
    return pb.BatchCreateMemoriesRequest(memories=memories)


class Server:
    """A tiermem server process on a data dir; start() and stop() are timed."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir, self.log = data_dir, log
        self.env = dict(SERVER_ENV)
        self.proc: subprocess.Popen[bytes] | None = None
        self.target = ""
        self.channel: Any = None
        self.stub: Any = None

    def start(self) -> float:
        import grpc

        from tiermem.v1 import memory_pb2_grpc as pb_grpc

        self.proc, self.target, seconds = start_server_timed(self.data_dir, self.log, self.env)
        self.channel = grpc.insecure_channel(
            self.target,
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
        )
        self.stub = pb_grpc.MemoryServiceStub(self.channel)
        return seconds

    def stop(self, kill: bool = False) -> float:
        assert self.proc is not None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        seconds = stop_server(self.proc, kill=kill)
        self.proc = None
        return seconds

    def stats(self) -> Any:
        from tiermem.v1 import memory_pb2 as pb

        return self.stub.GetStats(pb.GetStatsRequest(), timeout=TIMEOUT)

    def wait_indexed(self, poll: float = 0.02) -> float:
        """Seconds until no acknowledged vector waits to enter HNSW (writes are searchable when
        acknowledged, pending ones by an exact scan; the background indexer catches up after)."""
        t0 = time.perf_counter()
        while sum(sp.pending_vectors for sp in self.stats().spaces):
            time.sleep(poll)
        return time.perf_counter() - t0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pids(self) -> list[int]:
        """The server process and its search followers, if any."""
        kids = []
        for task in Path(f"/proc/{self.pid}/task").iterdir():  # (followers are a thread's children)
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                kids += [int(c) for c in (task / "children").read_text().split()]
        return [self.pid, *kids]


class Suite:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        from tiermem.v1 import memory_pb2 as pb

        self.pb = pb
        self.args, self.tmp = args, tmp
        self.hi = args.concurrency
        self.rows: list[dict[str, Any]] = []
        self.figures: dict[str, float] = {}
        self.results: dict[str, Any] = {
            "memory": {},
            "timings": [],
            "startup": [],
            "size_curve": [],
            "concurrency_curve": [],
            "recall": [],
            "not_measured": [],
        }
        self.ids: list[str] = []
        self.row_of: dict[str, int] = {}
        self.server = Server(tmp / "data", tmp / "server.log")
        self.pool: LoadPool | None = None

    @cached_property
    def data(self) -> Data:
        """The --n memories and the queries, made when a phase first needs them (--startup-only never does)."""
        return make_data(self.args.n, self.args.dim, self.args.seed)

    # -- helpers ---------------------------------------------------------------------------------------

    def add_row(
        self, phase: str, name: str, conc: int, r: dict[str, Any], unit: str = "ops/s"
    ) -> dict[str, Any]:
        row = {"phase": phase, "name": name, "concurrency": conc, "unit": unit, **r}
        self.rows.append(row)
        print(
            f"  {name} c{conc}: {r['ops_per_s']:,.0f} {unit}  p50 {fmt(r.get('p50_ms'))} ms  "
            f"p95 {fmt(r.get('p95_ms'))} ms  p99 {fmt(r.get('p99_ms'))} ms  errors {r.get('errors', 0)}"
            + (f"  server {r['server_cores']:.2f} cores" if "server_cores" in r else ""),
            flush=True,
        )
        return row

    def shape(self, conc: int) -> tuple[int, int]:
        """(processes, threads) for a concurrency: 1x1, else up to --procs processes."""
        procs = min(self.args.procs, conc)
        if conc % procs:
            raise ValueError(f"concurrency {conc} is not a multiple of {procs} processes")
        return procs, conc // procs

    def timing(self, name: str, memories: int, seconds: float, detail: str = "") -> None:
        self.results["timings"].append(
            {"name": name, "memories": memories, "seconds": seconds, "detail": detail}
        )
        print(f"  {name}: {seconds:.3f} s ({memories:,} memories) {detail}", flush=True)

    def load(
        self, phase: str, name: str, op: str, conc: int, seconds: float | None = None, **data: Any
    ) -> dict[str, Any]:
        return self._row(phase, name, op, conc, [self._measure(phase, name, op, conc, seconds, **data)])

    def _measure(
        self, phase: str, name: str, op: str, conc: int, seconds: float | None = None, **data: Any
    ) -> dict[str, Any]:
        """One timed load: its latencies by kind, errors and seconds (``LoadPool.run``)."""
        assert self.pool is not None
        seconds = seconds or self.args.seconds
        procs, threads = self.shape(conc)
        # Steady state: background work a previous phase left (indexing, a periodic snapshot after
        # many writes, ~1.3 s of CPU at 100k) would otherwise fall into this window.
        waited = sum(wait_idle(pid) for pid in self.server.pids())
        idle = f" (server idle after {waited:.1f} s)" if waited > 1.0 else ""
        print(
            f"[{phase}] {name} at concurrency {conc} ({procs}x{threads}) for {seconds} s{idle} ...",
            flush=True,
        )
        pids = self.server.pids()
        cpu0 = cpu_of(pids)
        out = self.pool.run(
            op, procs, threads, seconds, tag=f"{phase}{name}{conc}", model=self.data.model, **data
        )
        # (its warm-up and lead time included: a few percent of a 2 s window, more of a shorter one)
        out["server_cpu_s"] = cpu_of(pids) - cpu0
        return out

    def _row(self, phase: str, name: str, op: str, conc: int, outs: list[dict[str, Any]]) -> dict[str, Any]:
        """The row of one or more timed loads of the same kind, taken together."""
        unit = "queries/s" if op == "batch_search" else "ops/s"
        return self.add_row(phase, name, conc, self._summary(op, outs), unit)

    @staticmethod
    def _summary(op: str, outs: list[dict[str, Any]]) -> dict[str, Any]:
        """``summarize`` of one or more timed loads of the same kind, taken together."""
        per_op = BATCH_SEARCH if op == "batch_search" else 1
        lat: dict[str, list[np.ndarray]] = {}
        for out in outs:
            for kind, xs in out["latencies"].items():
                lat.setdefault(kind, []).append(xs)
        by_kind = {k: np.concatenate(v) for k, v in lat.items()}
        all_lat = np.concatenate(list(by_kind.values())) if by_kind else np.empty(0)
        seconds = sum(out["seconds"] for out in outs)
        r = summarize(all_lat, seconds, per_op) | {"errors": sum(out["errors"] for out in outs)}
        cpu = sum(out["server_cpu_s"] for out in outs)  # (every load is ``_measure``'s)
        r["server_cores"] = cpu / seconds
        r["server_cpu_ms_per_op"] = 1e3 * cpu / max(1, all_lat.size * per_op)
        if len(outs) > 1:
            r["rounds"] = len(outs)
        if op == "mix":
            r["by_kind"] = {k: summarize(v, seconds) for k, v in by_kind.items()}
        return r

    def search(
        self, phase: str, name: str, conc: int, seconds: float | None = None, **data: Any
    ) -> dict[str, Any]:
        return self.load(phase, name, "search", conc, seconds, queries=self.data.queries, **data)

    def compare(
        self, phase: str, searches: list[tuple[str, str, dict[str, Any]]], figures: tuple[str, ...]
    ) -> None:
        """Search loads to compare with each other (``searches``: figure key, row name, request
        fields; names distinct), at concurrency 1 and high, each measured in alternating rounds:
        ``--rounds`` of ``round_seconds`` each, every search once a round, each round starting one
        search later (A, B, C; B, C, A; ..) so none always follows the same one. The machine's speed
        drifts over a run; loads measured one after the other, minutes apart, would carry that drift
        into their ratios. A row per search and concurrency, its rounds taken together; its
        ``figures`` (of p50, p99, ops) as ``<key>_c1_<figure>`` and ``<key>_hi_<figure>``, and with
        several rounds each round's p50 and p99 as ``<key>_<c1|hi>_p50_rounds`` and ``_p99_rounds``
        (how far a ratio, or a tail, moves between rounds of one run)."""
        rounds, seconds = self.args.rounds, self.args.round_seconds
        assert len({name for _, name, _ in searches}) == len(searches), (
            "compared searches need distinct names"
        )
        fields = {"p50": "p50_ms", "p99": "p99_ms", "ops": "ops_per_s"}
        for conc, at in ((1, "c1"), (self.hi, "hi")):
            outs: dict[str, list[dict[str, Any]]] = {name: [] for _, name, _ in searches}
            p50s: dict[str, list[float]] = {name: [] for _, name, _ in searches}  # (each round's own)
            p99s: dict[str, list[float]] = {name: [] for _, name, _ in searches}
            for rnd in range(rounds):
                first = rnd % len(searches)
                for _, name, data in searches[first:] + searches[:first]:
                    label = name if rounds == 1 else f"{name} (round {rnd + 1} of {rounds})"
                    out = self._measure(
                        phase, label, "search", conc, seconds, queries=self.data.queries, **data
                    )
                    outs[name].append(out)
                    if rounds > 1:  # (each round's own figures: how far the machine drifted between them)
                        r = self._summary("search", [out])
                        p50s[name].append(r["p50_ms"])
                        p99s[name].append(r["p99_ms"])
                        print(
                            f"    round {rnd + 1}: {r['ops_per_s']:,.0f} ops/s  p50 {fmt(r['p50_ms'])} ms",
                            flush=True,
                        )
            for key, name, _ in searches:
                row = self._row(phase, name, "search", conc, outs[name])
                self.figures |= {f"{key}_{at}_{f}": row[fields[f]] for f in figures}
                if at == "hi":  # (how many cores the server used for that rate)
                    self.figures[f"{key}_hi_cores"] = row["server_cores"]
                if rounds > 1:
                    self.figures[f"{key}_{at}_p50_rounds"] = p50s[name]
                    self.figures[f"{key}_{at}_p99_rounds"] = p99s[name]

    def machine_tail(self) -> None:
        """A fixed CPU task as long as the text search's p50 at concurrency 1, in one load worker
        alone (no RPC, the server idle): its p99 / p50 is how far this machine stretches the tail of
        a task of that length by itself, so a search's p99 at concurrency 1 can be read against it."""
        ms = self.figures.get("fused_text_c1_p50")
        if not ms:
            return
        row = self.load("machine", f"fixed CPU task of {ms:.2f} ms, no RPC", "cpu", 1, cpu_ms=ms)
        self.figures |= {"cpu_c1_p50": row["p50_ms"], "cpu_c1_p99": row["p99_ms"]}

    def keep_data(self) -> None:
        """Stop the server cleanly, copy its data directory for ``alone`` (the memories the searches
        above ran on, no server holding them), and start it again."""
        assert self.pool is not None
        self.pool.close()
        self.server.stop()
        print("[alone] copying the data directory for the engine alone ...", flush=True)
        shutil.copytree(self.server.data_dir, self.tmp / "alone-data")
        self.server.start()
        self.pool = LoadPool(self.server.target, self.args.procs)

    def alone(self) -> None:
        """``Engine.search`` in this process (``bench/alone.py``) on the copy ``keep_data`` took,
        the server gone: the same similarity and text searches from 1 thread and from --concurrency
        threads, in alternating rounds; what the ranking takes with no RPC around it."""
        copy = self.tmp / "alone-data"
        try:
            self.engine_alone_rows(copy, "alone", "alone", "")
            self.bare(copy)
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    def bare(self, data_dir: Path) -> None:
        """The same similarity and text searches at --concurrency through a bare grpcio server
        around the engine (``bench/bare.py``) on ``data_dir``, in alternating rounds: what one
        process of grpcio and this engine serves with nothing of tiermem's transport around them.
        Figures ``bare_<sim|text>_hi_ops``."""
        rounds, seconds = self.args.rounds, self.args.round_seconds
        kinds = [
            ("sim", "similarity strategy", {"strategy": SIMILARITY}),
            ("text", "default, vector + text", {"texts": self.data.query_texts}),
        ]
        names = {
            key: f"SearchMemories k={K} {name}, bare grpcio server around the engine"
            for key, name, _ in kinds
        }
        outs: dict[str, list[dict[str, Any]]] = {key: [] for key, _, _ in kinds}
        saved = self.pool, self.server
        with BareServer(data_dir) as bare:
            # (its loads timed as the server's: ``_measure`` waits for it idle and reads its CPU)
            self.pool, self.server = LoadPool(bare.target, self.args.procs), bare  # type: ignore[assignment]
            try:
                for rnd in range(rounds):
                    for key, _, data in kinds if rnd % 2 == 0 else kinds[::-1]:
                        label = f"{names[key]} (round {rnd + 1} of {rounds})"
                        outs[key].append(
                            self._measure(
                                "alone", label, "search", self.hi, seconds, queries=self.data.queries, **data
                            )
                        )
            finally:
                self.pool.close()
                self.pool, self.server = saved
        for key, _, _ in kinds:
            row = self._row("alone", names[key], "search", self.hi, outs[key])
            self.figures[f"bare_{key}_hi_ops"] = row["ops_per_s"]

    # -- phases ----------------------------------------------------------------------------------------

    def start(self) -> None:
        print("starting server ...", flush=True)
        s = self.server.start()
        self.timing("start-up, empty data dir (process start -> SERVING)", 0, s)
        print(
            f"server {self.server.target} pid {self.server.pid}; {self.args.procs} load processes", flush=True
        )
        self.pool = LoadPool(self.server.target, self.args.procs)

    def empty_rpc(self) -> None:
        r1 = self.load("empty_rpc", "health Check", "health", 1)
        rh = self.load("empty_rpc", "health Check", "health", self.hi)
        self.figures |= {"empty_c1_p50": r1["p50_ms"], "empty_hi_ops": rh["ops_per_s"]}

    def ingest(self) -> None:
        n = self.args.n
        checkpoints = sorted(
            {max(BATCH, int(n * f) // BATCH * BATCH) for f in self.args.size_points if f < 1}
        )
        before = rss_parts(self.server.pid)
        self.results["memory"]["rss_before_bytes"] = before["VmRSS"]
        self.results["memory"]["anon_before_bytes"] = before.get("RssAnon", 0)
        self.results["memory"]["file_before_bytes"] = before.get("RssFile", 0)
        reqs = self.batch_requests(n, NAMESPACE)
        print(f"[ingest] BatchCreateMemories of {n:,} in batches of {BATCH} ...", flush=True)
        bar = Progress("  ingest", n, " mem")
        rpc_s = drain_s = 0.0
        t_wall = time.perf_counter()
        for req in reqs:
            t0 = time.perf_counter()
            resp = self.server.stub.BatchCreateMemories(req, timeout=TIMEOUT)
            rpc_s += time.perf_counter() - t0
            self.ids.extend(m.id for m in resp.memories)
            stop = len(self.ids)
            bar.update(stop)
            if stop in checkpoints and stop < n:
                bar.close()
                # The indexer catches up before the searches at this size, and that time counts as
                # ingest: uncounted, it would move up to MAX_PENDING vectors per checkpoint into
                # HNSW for free.
                drain_s += self.server.wait_indexed()
                self.search_at_size(stop)
                bar = Progress("  ingest", n, " mem")
                bar.update(stop)
        del reqs
        bar.close()
        wall = time.perf_counter() - t_wall
        lag = self.server.wait_indexed()
        print(f"  every vector in HNSW {lag:.2f} s after the last acknowledgement", flush=True)
        if len(self.ids) != n or len(set(self.ids)) != n:
            raise RuntimeError(f"expected {n} distinct ids, got {len(set(self.ids))}")
        self.row_of = {mid: i for i, mid in enumerate(self.ids)}
        r = {
            "memories": n,
            "seconds": rpc_s + drain_s,
            "rpc_seconds": rpc_s,
            "checkpoint_drain_seconds": drain_s,
            "wall_seconds": wall,
            "index_lag_seconds": lag,
            "ops_per_s": n / (rpc_s + drain_s),
            "errors": 0,
        }
        self.add_row("ingest", f"BatchCreateMemories x{BATCH}", 1, r, "memories/s")
        self.figures["batch_ops"] = r["ops_per_s"]
        self.figures["batch_indexed_ops"] = n / (rpc_s + drain_s + lag)

    def batch_requests(self, count: int, namespace: str) -> list[Any]:
        """BatchCreateMemories requests for the first ``count`` memories of the data, built before a
        timed load starts (as FAISS gets its vectors ready-made): built between calls, the server
        would index the previous batch during the client's work."""
        reqs = []
        for start in range(0, count, BATCH):
            req = batch_request(self.pb, self.data, start, min(count, start + BATCH))
            for m in req.memories:
                m.namespace = namespace
            reqs.append(req)
        return reqs

    def search_at_size(self, memories: int) -> None:
        """Short search loads at this collection size (the size curve)."""
        point: dict[str, Any] = {"memories": memories}
        for conc in (1, self.hi):
            r = self.search(
                "search_vs_size", f"SearchMemories k={K} at {memories:,}", conc, self.args.size_seconds
            )
            point[f"c{conc}"] = {k: r[k] for k in ("ops_per_s", "p50_ms", "p95_ms", "p99_ms", "errors")}
        self.results["size_curve"].append(point)

    def memory(self) -> None:
        # What the server holds once idle: read 0.5 s after the indexer caught up, its anonymous
        # memory was up to ~26 MiB (~270 B a memory at 100k) above what it held a second later
        # (freed without CPU to speak of; which buffer was not identified). The peak (VmHWM) is
        # reported beside it.
        wait_idle(self.server.pid)
        time.sleep(0.5)
        n = self.args.n
        mem = self.results["memory"]
        parts = rss_parts(self.server.pid)
        rss_after = parts["VmRSS"]
        per_vec = self.args.dim * 4 + HNSW_M * 2 * 4
        anon_growth = (parts.get("RssAnon", 0) - mem["anon_before_bytes"]) / n
        file_growth = (parts.get("RssFile", 0) - mem["file_before_bytes"]) / n
        mem |= {
            "anon_after_bytes": parts.get("RssAnon", 0),
            "file_after_bytes": parts.get("RssFile", 0),
            "anon_growth_per_memory_bytes": anon_growth,
            "file_growth_per_memory_bytes": file_growth,
            "memories": n,
            "rss_after_bytes": rss_after,
            "rss_per_memory_bytes": rss_after / n,
            "rss_growth_per_memory_bytes": (rss_after - mem["rss_before_bytes"]) / n,
            "vector_plus_links_bytes": per_vec,
            "peak_rss_bytes": parts.get("VmHWM", 0),
        }
        self.figures["rss_ratio"] = mem["rss_per_memory_bytes"] / per_vec
        self.figures["rss_growth_ratio"] = mem["rss_growth_per_memory_bytes"] / per_vec
        self.figures["anon_growth_ratio"] = anon_growth / per_vec
        print(
            f"[memory] RSS {mem['rss_before_bytes'] / 2**20:.1f} -> {rss_after / 2**20:.1f} MiB: "
            f"{rss_after / n:,.0f} B/memory total, {mem['rss_growth_per_memory_bytes']:,.0f} B growth; "
            f"vector+links {per_vec} B; growth split: anonymous {anon_growth:,.0f} B, "
            f"file-backed (LMDB pages, libraries) {file_growth:,.0f} B; peak RSS so far "
            f"{parts.get('VmHWM', 0) / 2**20:.1f} MiB",
            flush=True,
        )

    def search_phase(self) -> None:
        name = f"SearchMemories k={K}"
        by_conc = {}
        for conc in sorted({*SWEEP, self.hi}):
            by_conc[conc] = self.search("search", name, conc)
        self.compared_searches()
        self.machine_tail()
        self.load(
            "search", f"BatchSearchMemories x{BATCH_SEARCH}", "batch_search", 1, queries=self.data.queries
        )
        self.results["concurrency_curve"] = [
            {"concurrency": c, **{k: r[k] for k in ("ops_per_s", "p50_ms", "p95_ms", "p99_ms", "errors")}}
            for c, r in sorted(by_conc.items())
        ]
        c1, chi = by_conc[1], by_conc[self.hi]
        self.figures |= {
            "search_c1_p50": c1["p50_ms"],
            "search_c1_p99": c1["p99_ms"],
            "search_hi_ops": chi["ops_per_s"],
        }
        self.results["size_curve"].append(
            {
                "memories": self.args.n,
                **{
                    f"c{c}": {k: r[k] for k in ("ops_per_s", "p50_ms", "p95_ms", "p99_ms", "errors")}
                    for c, r in ((1, c1), (self.hi, chi))
                },
            }
        )

    def compared_searches(self) -> None:
        """Searches ranked by similarity alone (strategy SIMILARITY: the like-for-like comparison
        with a plain vector search, Chroma and FAISS) and those the issue compares with them: the
        default with the query's text (similarity and the text's keywords, fused), hybrid (reciprocal
        rank fusion with the similarity and the comprehensive rankings) and the comprehensive
        ranking alone (what hybrid on it costs at least), in alternating rounds (``compare``)."""
        texts = self.data.query_texts
        searches = [
            ("sim", "similarity strategy", {"strategy": SIMILARITY}),
            ("fused_text", "default, vector + text", {"texts": texts}),
            ("sim_hybrid", "similarity + hybrid", {"texts": texts, "hybrid": True, "strategy": SIMILARITY}),
            ("hybrid", "comprehensive + hybrid", {"texts": texts, "hybrid": True, "strategy": COMPREHENSIVE}),
            ("comprehensive", "comprehensive, vector only", {"strategy": COMPREHENSIVE}),
        ]
        named = [(key, f"SearchMemories k={K} {name}", extra) for key, name, extra in searches]
        self.compare("search", named, ("p50", "p99", "ops"))

    def filtered_search(self) -> None:
        for sel in SELECTIVITIES:
            where = json.dumps({"metadata.bucket": {"$lt": sel}})
            for conc in (1, self.hi):
                self.search("filtered_search", f"SearchMemories k={K} where keeps {sel}%", conc, where=where)

    def followers(self) -> None:
        """Searches with search followers (``--search-processes`` N; 0, the default: the server's
        default, one process per core up to AUTO_PROCESSES_MOST) against one process, on the same data, the same connections and in alternating rounds (N, 1, N, 1: the machine's
        speed drifts): the server is restarted each round; load processes open
        ``--connections`` connections each, spread evenly over the server's processes (see
        ``load._balanced_channels``). Per round: the empty RPC, default-score searches at
        concurrency 1 and high, similarity searches and searches with their text at high. Then the
        server is restarted as it was."""
        from tiermem.server.config import ServerConfig
        from tiermem.server.transport.follower import processes

        setting = self.args.search_processes
        n = setting or processes(ServerConfig()).search_processes
        if n <= 1:
            return
        assert self.pool is not None
        self.pool.close()
        per_vec = self.args.dim * 4 + HNSW_M * 2 * 4
        got: dict[int, list[dict[str, float]]] = {n: [], 1: []}
        for rnd, procs in enumerate((n, 1, n, 1), start=1):
            print(f"[followers] round {rnd}: restarting the server with {procs} process(es) ...", flush=True)
            self.server.stop()
            self.server.env = SERVER_ENV | {"TIERMEM_SEARCH_PROCESSES": str(setting if procs > 1 else 1)}
            s = self.server.start()
            self.timing(f"start-up with {procs} search process(es) (clean stop before)", self.args.n, s)
            self.pool = LoadPool(
                self.server.target, self.args.procs, connections=self.args.connections, processes=procs
            )
            if procs > 1 and rnd == 1:
                time.sleep(0.5)
                pids = self.server.pids()
                parts = []
                for pid in pids:
                    with contextlib.suppress(OSError):  # (a follower exiting meanwhile)
                        parts.append(rss_parts(pid))
                anon = sum(x.get("RssAnon", 0) for x in parts)
                rss = sum(x.get("VmRSS", 0) for x in parts)
                # Growth as for one process (``memory``): less what each process held on the empty
                # data directory (a follower's own start-up holds about what the leader's did).
                growth = anon - len(parts) * self.results["memory"]["anon_before_bytes"]
                self.results["memory"] |= {
                    "followers_anon_bytes": anon,
                    "followers_anon_growth_bytes": growth,
                    "followers_rss_bytes": rss,
                    "followers": n,
                    "followers_default": not setting,
                }
                self.figures["fol_anon_ratio"] = anon / self.args.n / per_vec
                self.figures["fol_anon_growth_ratio"] = growth / self.args.n / per_vec
                print(
                    f"[followers] {len(pids)} processes: anonymous {anon / 2**20:.1f} MiB "
                    f"({anon / self.args.n:,.0f} B/memory; growth {growth / self.args.n:,.0f} B/memory), "
                    f"RSS {rss / 2**20:.1f} MiB",
                    flush=True,
                )
            name = f"{procs} process{'es' if procs > 1 else ''}, {self.args.connections} connections per load process, round {rnd}: "
            rh = self.load("followers", name + "health Check", "health", self.hi)
            r1 = self.search("followers", name + f"SearchMemories k={K}", 1)
            rs = self.search("followers", name + f"SearchMemories k={K}", self.hi)
            rm = self.search(
                "followers", name + f"SearchMemories k={K} similarity strategy", self.hi, strategy=SIMILARITY
            )
            rt = self.search(
                "followers",
                name + f"SearchMemories k={K} default, vector + text",
                self.hi,
                texts=self.data.query_texts,
            )
            got[procs].append(
                {
                    "empty_hi_ops": rh["ops_per_s"],
                    "search_c1_p50": r1["p50_ms"],
                    "search_c1_p99": r1["p99_ms"],
                    "search_hi_ops": rs["ops_per_s"],
                    "sim_hi_ops": rm["ops_per_s"],
                    "text_hi_ops": rt["ops_per_s"],
                    "text_hi_cores": rt["server_cores"],
                }
            )
            self.pool.close()
        for procs, prefix in ((n, "fol_"), (1, "fol1_")):
            for key in got[procs][0]:
                self.figures[prefix + key] = float(np.mean([r[key] for r in got[procs]]))
        self.server.stop()
        self.server.env = dict(SERVER_ENV)
        self.server.start()
        self.pool = LoadPool(self.server.target, self.args.procs)

    def recall(self) -> None:
        d = self.data
        print(f"[recall] {self.args.recall_queries} sequential queries per row ...", flush=True)
        queries = d.queries[: self.args.recall_queries]
        for sel in (100, *SELECTIVITIES):
            where = None if sel == 100 else {"metadata.bucket": {"$lt": sel}}
            for kind in ("similarity", "combined"):
                r = evaluate(
                    self.server.stub,
                    queries,
                    d.vectors,
                    d.prior,
                    d.bucket < sel,
                    d.as_of,
                    where,
                    kind == "similarity",
                    TIMEOUT,
                    row_of=self.row_of.__getitem__,
                    namespace=NAMESPACE,
                    model=d.model,
                    k=K,
                )
                r |= {"selectivity_pct": sel, "kind": kind, "filter": where}
                self.results["recall"].append(r)
                key = ("recall_" if kind == "similarity" else "overlap_") + str(sel)
                self.figures[key] = r["strict"]
                print(
                    f"  {sel:>3}% {kind:<10} strict {r['strict']:.4f} tolerant {r['tolerant']:.4f} "
                    f"({r['qps']:,.0f} q/s, p50 {r['p50_ms']:.2f} ms)",
                    flush=True,
                )

    def writes(self) -> None:
        w = self.data.writes
        self.load("ingest", "CreateMemory", "create", 1, writes=w)
        r = self.load("ingest", "CreateMemory", "create", self.hi, writes=w)
        self.figures["create_hi_ops"] = r["ops_per_s"]
        mix = self.load(
            "mix",
            "90% search / 10% create",
            "mix",
            self.hi,
            queries=self.data.queries,
            writes=w,
            read_fraction=0.9,
        )
        for kind, r in mix["by_kind"].items():
            print(f"  mix {kind}: {r['ops_per_s']:,.0f} ops/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms")
        st = self.server.stats()
        self.results["server"] = {
            "memories": st.memory_count,
            "writes_committed": st.writes_committed,
            "commit_groups": st.commit_groups,
        }

    def ingest_in_flight(self) -> None:
        """BatchCreateMemories with two calls in flight (a bulk loader with two streams): while the
        server indexes one batch it receives and validates the next. Into a second namespace, so the
        index already holds n: compared with FAISS adding the same vectors into an index of n."""
        extra = self.extra_n()
        if not extra:
            return
        print(f"[ingest] BatchCreateMemories of {extra:,} more, 2 calls in flight ...", flush=True)
        reqs = self.batch_requests(extra, EXTRA_NAMESPACE)
        reqs.reverse()  # popped from the end: in order
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker() -> None:
            while True:
                with lock:
                    if not reqs or errors:
                        return
                    req = reqs.pop()
                try:
                    self.server.stub.BatchCreateMemories(req, timeout=TIMEOUT)
                except BaseException as e:  # reported after the join
                    with lock:
                        errors.append(e)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"in-flight ingest failed: {errors[0]}")
        lag = self.server.wait_indexed()
        print(f"  every vector in HNSW {lag:.2f} s after the last acknowledgement", flush=True)
        self.figures["batch_c2_indexed_ops"] = extra / (wall + lag)
        r = {
            "memories": extra,
            "seconds": wall,
            "index_lag_seconds": lag,
            "ops_per_s": extra / wall,
            "errors": 0,
        }
        self.add_row(
            "ingest", f"BatchCreateMemories x{BATCH}, 2 in flight, into {self.args.n:,}", 2, r, "memories/s"
        )
        self.figures["batch_c2_ops"] = r["ops_per_s"]

    def extra_n(self) -> int:
        """Memories added by ingest_in_flight: a quarter of n, whole batches."""
        return (self.args.n // 4) // BATCH * BATCH

    def restarts_and_consolidation(self) -> None:
        """kill -9 and clean stop, each with a timed start-up, then one consolidation pass."""
        assert self.pool is not None
        self.pool.close()
        self.pool = None
        count = self.server.stats().memory_count
        print(f"[startup] {count:,} memories: kill -9, start, SIGTERM, start ...", flush=True)
        st = self.restart_cycle(self.server, count)
        self.results["memory"] |= {
            "rss_after_restart_bytes": st.pop("rss_after_restart_bytes"),
            "restart_memories": count,
        }
        self.results["startup"].append(st)
        self.consolidation(st["memories"])
        self.timing("shutdown (SIGTERM -> exit) after consolidation", st["memories"], self.server.stop())

    def restart_cycle(self, server: Server, count: int) -> dict[str, Any]:
        """kill -9 the loaded server (records written since its last periodic snapshot are reloaded
        from the change log, vectors added since are indexed again), time the start; then a clean
        stop (drain, snapshot) and a timed start from it."""
        server.stop(kill=True)
        killed = server.start()
        n_killed = server.stats().memory_count
        self.timing("start-up after kill -9 (process start -> SERVING)", n_killed, killed)
        shutdown = server.stop()
        self.timing("shutdown (SIGTERM -> exit: drain, snapshot, close)", count, shutdown)
        clean = server.start()
        n_clean = server.stats().memory_count
        rss = rss_bytes(server.pid)
        self.timing("start-up from clean shutdown (process start -> SERVING)", n_clean, clean)
        if not n_clean == n_killed == count:
            print(f"  WARNING: memory counts differ: before {count}, kill -9 {n_killed}, clean {n_clean}")
        return {
            "memories": count,
            "shutdown_s": shutdown,
            "clean_start_s": clean,
            "kill9_start_s": killed,
            "memories_after_clean": n_clean,
            "memories_after_kill9": n_killed,
            "rss_after_restart_bytes": rss,
        }

    def consolidation(self, memories: int) -> None:
        """One ConsolidateMemories pass over the namespace, while one client searches it (default
        strategy, one search at a time): what a user sees of the pass is those searches' latency."""
        import grpc

        pb = self.pb
        print(
            f"[consolidation] ConsolidateMemories over namespace {NAMESPACE!r}, "
            "with one client searching meanwhile ...",
            flush=True,
        )
        reqs = [
            search_request(
                q, namespace=NAMESPACE, model=self.data.model, k=K, as_of=None, where=None, similarity=False
            )
            for q in self.data.queries
        ]
        done = threading.Event()
        lat: list[float] = []
        failed: list[str] = []

        searching = threading.Event()

        def searches() -> None:
            i = 0
            while not done.is_set():
                t = time.perf_counter()
                try:
                    self.server.stub.SearchMemories(reqs[i % len(reqs)], timeout=TIMEOUT)
                except grpc.RpcError as e:
                    failed.append(str(e.code()))
                else:
                    lat.append(time.perf_counter() - t)
                if not searching.is_set():  # the first one, before the pass: not counted
                    lat.clear()
                    failed.clear()
                    searching.set()
                i += 1

        searcher = threading.Thread(target=searches, name="searches-during-consolidation", daemon=True)
        searcher.start()
        searching.wait(timeout=TIMEOUT)
        # The pass starts once the searches run, and the search in flight when it ends counts too:
        # at least one search overlaps it, however short it is.
        try:
            t0 = time.perf_counter()
            r = self.server.stub.ConsolidateMemories(
                pb.ConsolidateMemoriesRequest(namespace=NAMESPACE, max_reported_moves=1), timeout=TIMEOUT
            )
            seconds = time.perf_counter() - t0
        finally:
            done.set()
            searcher.join()
        during = summarize(np.array(lat), seconds) | {
            "errors": len(failed),
            "max_ms": max(lat) * 1000 if lat else float("nan"),
        }
        self.add_row("consolidation", "SearchMemories during the pass (default strategy)", 1, during)
        print(f"  longest search during the pass: {fmt(during['max_ms'])} ms", flush=True)
        out = {
            "seconds": seconds,
            "promoted": r.promoted,
            "demoted": r.demoted,
            "evicted": r.evicted,
            "deleted": r.deleted,
            "over_capacity": r.over_capacity,
            "skipped": r.skipped,
            "plan_seconds": r.plan_seconds,
            "apply_seconds": r.apply_seconds,
            "max_search_pause_seconds": r.max_search_pause_seconds,
            "searches_during": during,
        }
        self.results["consolidation"] = out
        moved = r.promoted + r.demoted + r.evicted + r.deleted
        self.timing(
            "ConsolidateMemories pass (one RPC, default policy)",
            memories,
            seconds,
            f"{moved:,} moves (promoted {r.promoted:,}, demoted {r.demoted:,}, evicted {r.evicted:,}, "
            f"deleted {r.deleted:,}); plan {r.plan_seconds * 1000:.1f} ms, apply {r.apply_seconds:.2f} s, "
            f"longest index lock against searches {r.max_search_pause_seconds * 1000:.1f} ms; "
            f"{during['ops']:,} searches meanwhile: p50 {fmt(during['p50_ms'])} ms, "
            f"p99 {fmt(during['p99_ms'])} ms, longest {fmt(during['max_ms'])} ms",
        )

    def chroma(self) -> None:
        a = self.args
        py = a.chroma_python
        if a.chroma is False:
            self.results["chroma"] = {"error": "not run (--no-chroma)."}
            self.results["not_measured"].append("Chroma comparison (--no-chroma)")
            return
        if not py.exists():
            msg = f"not run: {py} does not exist (make bench-venv creates it)."
            print(f"[chroma] {msg}", flush=True)
            self.results["chroma"] = {"error": msg}
            self.results["not_measured"].append("Chroma comparison (no .venv-bench)")
            return
        vec, qs, out = self.tmp / "vectors.npy", self.tmp / "queries.npy", self.tmp / "chroma.json"
        np.save(vec, self.data.vectors)
        np.save(qs, self.data.queries)
        cmd = [
            str(py),
            str(BENCH / "chroma_peer.py"),
            *("--vectors", str(vec), "--queries", str(qs), "--json", str(out)),
            *("--seconds", str(a.seconds), "--concurrency", str(self.hi), "--procs", str(a.procs)),
            *("--batch", str(BATCH), "--k", str(K), "--recall-queries", str(a.recall_queries)),
            *("--m", str(HNSW_M), "--efc", str(HNSW_EFC), "--efs", str(HNSW_EFS)),
            *("--workdir", str(self.tmp / "chroma")),
        ]
        print(f"[chroma] {' '.join(shlex.quote(c) for c in cmd[:2])} ... (tiermem stopped)", flush=True)
        try:
            rc = subprocess.run(cmd, timeout=a.chroma_timeout, cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        if rc != 0 or not out.exists():
            msg = f"not measured: bench/chroma_peer.py failed (exit {rc}); its output is above."
            print(f"[chroma] {msg}", flush=True)
            self.results["chroma"] = {"error": msg}
            self.results["not_measured"].append("Chroma comparison (the peer failed)")
            return
        c = json.loads(out.read_text())
        self.results["chroma"] = c
        ing = c["ingest"]
        self.add_row("chroma", f"collection.add x{BATCH} (HTTP)", 1, ing, "vectors/s")
        for key in ("search_c1", c["concurrency_key"]):
            r = c[key]
            self.add_row("chroma", f"collection.query k={K} (HTTP)", r["concurrency"], r)
        self.figures |= {
            "chroma_ingest_ops": ing["ops_per_s"],
            "chroma_search_hi_ops": c[c["concurrency_key"]]["ops_per_s"],
            "chroma_search_hi_cores": c[c["concurrency_key"]]["server_cores"],
        }
        self.results["recall"].append(
            {
                "selectivity_pct": 100,
                "kind": "similarity (Chroma)",
                "allowed": c["count"],
                "queries": c["recall"]["queries"],
                "strict": c["recall"]["recall_at_k"],
                "tolerant": c["recall"]["recall_at_k"],
                "min_strict": c["recall"]["min_recall"],
                "queries_below_1": c["recall"]["queries_below_1"],
                "qps": c["recall"]["qps"],
                "p50_ms": c["recall"]["p50_ms"],
                "p99_ms": c["recall"]["p99_ms"],
            }
        )

    def faiss(self) -> None:
        print(f"[faiss] in-process ceilings on the same {self.args.n:,} vectors ...", flush=True)
        fa = faiss_ceilings(self.data.vectors, self.data.queries, self.args.seconds, self.extra_n())
        self.results["faiss"] = fa
        self.add_row("faiss", f"index.add x{BATCH} (1 OMP thread)", 1, fa["add_t1"], "vectors/s")
        self.add_row(
            "faiss", f"index.add x{BATCH} ({fa['add']['threads']} OMP threads)", 1, fa["add"], "vectors/s"
        )
        if fa.get("add_into_n"):
            self.add_row(
                "faiss",
                f"index.add x{BATCH} of {fa['add_into_n']['vectors']:,} more, into {self.args.n:,}"
                f" ({fa['add']['threads']} OMP threads)",
                1,
                fa["add_into_n"],
                "vectors/s",
            )
            self.figures["faiss_add_into_n_ops"] = fa["add_into_n"]["ops_per_s"]
        self.add_row("faiss", f"index.search k={K} single query", 1, fa["search_t1"], "q/s")
        self.add_row("faiss", f"index.search k={K} single query", 2, fa["search_t2"], "q/s")
        # The faster of FAISS's two add rates (every core is faster at 100k; not always on tiny data).
        r, a = self.figures["empty_hi_ops"], max(fa["add"]["ops_per_s"], fa["add_t1"]["ops_per_s"])
        self.figures["faiss_add_ops"] = a
        self.figures["faiss_add_t1_ops"] = fa["add_t1"]["ops_per_s"]
        self.figures["composed_create_limit"] = 1 / (1 / r + 1 / a)
        # The same composition for search: an RPC plus an HNSW search, sharing the two cores.
        self.figures["composed_search_limit"] = 1 / (1 / r + 1 / fa["search_t2"]["ops_per_s"])
        self.figures["composed_search_c1_p50"] = self.figures["empty_c1_p50"] + fa["search_t1"]["p50_ms"]

    def startup_big(self) -> None:
        """--startup-n: build a separate data dir through BatchCreateMemories, then time start-ups."""
        n = self.args.startup_n
        if n <= 0:
            print(
                "[startup-n] not run (--startup-n 0): start-up with 1,000,000 memories not measured",
                flush=True,
            )
            self.results["not_measured"].append(
                "start-up with 1,000,000 memories (run with --startup-n 1000000; takes many minutes)"
            )
            return
        if n < TARGET_STARTUP_N:
            self.results["not_measured"].append(f"start-up with 1,000,000 memories (--startup-n was {n:,})")
        pb, dim = self.pb, self.args.dim
        server = Server(self.tmp / f"data-{n}", self.tmp / f"server-{n}.log")
        server.start()
        print(f"[startup-n] building {n:,} memories in {server.data_dir} ...", flush=True)
        rng = np.random.default_rng(self.args.seed + 2)
        texts = sentences(n, self.args.seed + 4)  # real-looking text, as at --n
        now = time.time()
        bar = Progress(f"  build {n:,}", n, " mem")
        t0 = time.perf_counter()
        try:
            # Two calls in flight: the next batch is sent while the server indexes the previous one.
            with ThreadPoolExecutor(2) as pool:
                inflight: deque[tuple[Future[Any], int]] = deque()
                for start, chunk in clustered_chunks(
                    n, dim, max(10, n // 1000), self.args.seed + 3, 16 * BATCH
                ):
                    imp = rng.random(chunk.shape[0], dtype=np.float32)
                    created = now - rng.random(chunk.shape[0]) * 30 * DAY
                    for j in range(0, chunk.shape[0], BATCH):
                        req = pb.BatchCreateMemoriesRequest(
                            memories=[
                                memory_pb(
                                    pb,
                                    model_name(dim),
                                    start + i,
                                    chunk[i],
                                    float(imp[i]),
                                    float(created[i]),
                                    texts[start + i],
                                )
                                for i in range(j, min(j + BATCH, chunk.shape[0]))
                            ]
                        )
                        call = pool.submit(server.stub.BatchCreateMemories, req, timeout=TIMEOUT)
                        inflight.append((call, start + min(j + BATCH, chunk.shape[0])))
                        while len(inflight) >= 2:
                            done, upto = inflight.popleft()
                            done.result()
                            bar.update(upto)
                for done, upto in inflight:
                    done.result()
                    bar.update(upto)
            bar.close()
            build = time.perf_counter() - t0
            self.timing(f"build {n:,} memories through BatchCreateMemories", n, build, f"{n / build:,.0f}/s")
            st = self.restart_cycle(server, server.stats().memory_count)
            st["built"] = n  # (memories sent: an exact duplicate of a content is stored once)
            st.pop("rss_after_restart_bytes")
            self.results["startup"].append(st)
            self.big_searches(server, n)
        finally:
            if server.proc is not None:
                server.stop()
        self.big_alone(server.data_dir, n)
        self.big_keywords(texts)

    def big_alone(self, data_dir: Path, n: int) -> None:
        """On the --startup-n data, its server stopped: the engine alone, as ``alone`` runs it at --n.
        Text against similarity here is what the ranking itself costs at this size, before the RPC
        around each search (the same for both) brings the ratio toward 1."""
        print(f"[startup-n] the engine alone, in process, on the {n:,} memories ...", flush=True)
        self.engine_alone_rows(data_dir, "startup", "big_alone", f", {n:,} memories")

    def engine_alone_rows(self, data_dir: Path, phase: str, prefix: str, suffix: str) -> None:
        """``bench/alone.py`` on ``data_dir`` (no server holding it), from 1 thread and from
        --concurrency threads: a row each in ``phase`` (names ending in ``suffix``) and figures
        ``<prefix>_<kind>_<c1|hi>_...``."""
        d = self.data
        seconds, rounds = self.args.round_seconds, self.args.rounds
        res = engine_alone(data_dir, d.queries, d.query_texts, d.model, seconds, rounds, self.hi)
        names = {"sim": "similarity strategy", "text": "default, vector + text"}
        for key, r in res.items():
            name = f"Engine.search k={K} {names[key.split('_')[0]]}, in process, no RPC{suffix}"
            self.add_row(phase, name, r["threads"], {k: r[k] for k in ALONE_FIELDS})
            self.figures |= {
                f"{prefix}_{key}_p50": r["p50_ms"],
                f"{prefix}_{key}_p99": r["p99_ms"],
                f"{prefix}_{key}_ops": r["ops_per_s"],
                f"{prefix}_{key}_p50_rounds": r["p50_rounds"],
            }

    def big_keywords(self, texts: list[str]) -> None:
        """On the --startup-n texts, the server stopped: the keyword pass alone, in this process, by the
        server's kernel and by tantivy and bm25s when installed (bench/keywords.py), for the same
        questions. A search with text runs this pass beside its similarity search, so the fastest of
        them bounds what the default with text can cost over similarity at this size."""
        n = len(texts)
        print(f"[startup-n] the keyword pass alone, in process, over the {n:,} texts ...", flush=True)
        by_engine = keyword_pass(texts, self.data.query_texts, rounds=2)
        for name, r in by_engine.items():
            row = {"ops_per_s": 1e3 / r["mean"], "p50_ms": r["p50"], "p99_ms": r["p99"], "errors": 0}
            self.add_row(
                "startup", f"keyword pass alone (in process, best {DEPTH}), {name}, {n:,} memories", 1, row
            )
        self.figures["big_keyword_p50"] = min(r["p50"] for r in by_engine.values())

    def big_searches(self, server: Server, n: int) -> None:
        """On the --startup-n data: similarity searches and the default with the query's text, at
        concurrency 1 and high, as at --n (the same queries and texts)."""
        # After the restarts, the vectors the last index snapshot lacked are still being indexed
        # (searched exactly until then, which a steady-state figure must not include).
        lag = server.wait_indexed(poll=0.5)
        print(f"[startup-n] waited {lag:.1f} s for every vector to be indexed", flush=True)
        self.results["startup"][-1]["indexed_after_s"] = round(lag, 2)
        pool = LoadPool(server.target, self.args.procs)
        saved = self.pool, self.server
        self.pool, self.server = pool, server
        try:
            searches = [
                ("big_sim", "similarity strategy", {"strategy": SIMILARITY}),
                ("big_fused_text", "default, vector + text", {"texts": self.data.query_texts}),
            ]
            named = [
                (key, f"SearchMemories k={K} {name}, {n:,} memories", extra) for key, name, extra in searches
            ]
            self.compare("startup", named, ("p50",))
        finally:
            self.pool, self.server = saved
            pool.close()

    def finish(self, info: dict[str, Any], command: str) -> dict[str, Any]:
        a = self.args
        results = {
            "command": command,
            "machine": info,
            "params": vars(a)
            | {
                "out": str(a.out),
                "chroma_python": str(a.chroma_python),
                "batch": BATCH,
                "k": K,
                "hnsw": {"M": HNSW_M, "efConstruction": HNSW_EFC, "efSearch": HNSW_EFS},
            },
            "note": "client processes share this machine's cores with the server; lifecycle off; fsync on",
            "rows": self.rows,
            "phases": sorted({r["phase"] for r in self.rows} | {"memory", "recall", "startup"}),
            "figures": self.figures,
            **self.results,
        }
        if "consolidation" in self.results:
            results["phases"] = sorted({*results["phases"], "consolidation"})
        results["ratios"] = compute_ratios(results)
        return results


def faiss_ceilings(
    vectors: np.ndarray, queries: np.ndarray, seconds: float, extra: int = 0
) -> dict[str, Any]:
    import faiss

    dim = vectors.shape[1]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    n = vectors.shape[0]
    out: dict[str, Any] = {}
    # Adds on one OpenMP thread (what the server's indexer uses while searches run), then on every
    # core (FAISS's default, and what the indexer uses for bulk moves): the ingest targets are
    # measured against the faster of the two.
    for key, threads in (("add_t1", 1), ("add", cores)):
        faiss.omp_set_num_threads(threads)
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EFC
        bar = Progress(f"  faiss add ({threads} thr)", n, " vec")
        t0 = time.perf_counter()
        for start in range(0, n, BATCH):
            index.add(vectors[start : start + BATCH])
            bar.update(min(n, start + BATCH))
        add_s = time.perf_counter() - t0
        bar.close()
        out[key] = {"vectors": n, "seconds": add_s, "ops_per_s": n / add_s, "threads": threads}
    if extra:  # the vectors the server got with two calls in flight, added on top of the n
        t0 = time.perf_counter()
        for start in range(0, extra, BATCH):
            index.add(vectors[start : min(extra, start + BATCH)])
        extra_s = time.perf_counter() - t0
        out["add_into_n"] = {"vectors": extra, "seconds": extra_s, "ops_per_s": extra / extra_s}
    faiss.omp_set_num_threads(1)  # single-query searches, one per thread, as the server's
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
        out[f"search_t{threads}"] = summarize(np.array([x for xs in lat for x in xs]), seconds)
    return out


def make_plots(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """suite_size.png and suite_concurrency.png by bench/plot.py, with matplotlib from wherever it is."""
    if args.plots is False:
        results["plots_note"] = "not made (--no-plots)."
        return
    candidates = [args.chroma_python, Path(sys.executable)]
    for py in candidates:
        if not py.exists():
            continue
        probe = subprocess.run([str(py), "-c", "import matplotlib"], capture_output=True)
        if probe.returncode != 0:
            continue
        r = subprocess.run(
            [str(py), str(BENCH / "plot.py"), str(args.out / "suite.json")], capture_output=True, text=True
        )
        print(r.stdout, end="")
        if r.returncode == 0:
            results["plots"] = ["suite_size.png", "suite_concurrency.png"]
        else:
            results["plots_note"] = f"bench/plot.py failed: {r.stderr.strip()[-500:]}"
        return
    results["plots_note"] = "not made: matplotlib not found (make bench-venv installs it in .venv-bench)."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=100_000, help="memories to load (default 100000)")
    p.add_argument("--dim", type=int, default=384, help="384 (default), 768 or 1536")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each timed load")
    p.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="alternating rounds of the searches compared with each other, --seconds / 2 each (1: one "
        "load of --seconds each, one after the other)",
    )
    p.add_argument(
        "--size-seconds", type=float, default=0.0, help="load duration at size checkpoints (seconds/2)"
    )
    p.add_argument(
        "--size-points",
        default="0.1,0.3",
        help="fractions of n where the ingest pauses for a short search load",
    )
    p.add_argument("--recall-queries", type=int, default=200, help="sequential queries per recall row")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="directory for suite.json/.md")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--concurrency", type=int, default=16, help="the high concurrency level")
    p.add_argument("--procs", type=int, default=0, help="load processes at high concurrency (default 2-4)")
    p.add_argument(
        "--startup-n", type=int, default=0, help="also build N memories and time start-ups (e.g. 1000000)"
    )
    p.add_argument(
        "--startup-only",
        action="store_true",
        help="run only the --startup-n phase (no server loads, Chroma or FAISS; their ratios are n/a)",
    )
    p.add_argument(
        "--chroma",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the Chroma peer (default: when --chroma-python exists)",
    )
    p.add_argument("--chroma-python", type=Path, default=ROOT / ".venv-bench" / "bin" / "python")
    p.add_argument("--chroma-timeout", type=float, default=1800)
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=None, help="write PNG plots")
    p.add_argument(
        "--search-processes",
        type=int,
        default=0,
        help="also measure searches with this many server processes (search followers; 0: the server's "
        "default, one per core up to 4; 1: skip)",
    )
    p.add_argument(
        "--connections", type=int, default=4, help="connections per load process in the followers phase"
    )
    args = p.parse_args()
    if args.procs <= 0:
        args.procs = min(4, max(2, os.cpu_count() or 2))
    if args.concurrency % args.procs:
        p.error("--concurrency must be a multiple of --procs")
    if args.n < 100:
        p.error("--n must be at least 100 (buckets 0..99)")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.startup_only and args.startup_n <= 0:
        p.error("--startup-only needs --startup-n N")
    args.size_seconds = args.size_seconds or args.seconds / 2
    args.round_seconds = args.seconds if args.rounds == 1 else args.seconds / 2  # (a compared search's round)
    args.size_points = [float(x) for x in args.size_points.split(",") if x.strip()]
    return args


def run_phases(suite: Suite) -> None:
    """Every phase of the suite but --startup-only's, in order (see the module docstring)."""
    try:
        suite.start()
        suite.empty_rpc()
        suite.ingest()
        suite.memory()
        suite.search_phase()
        suite.filtered_search()
        suite.recall()
        suite.followers()
        suite.keep_data()
        suite.writes()
        suite.ingest_in_flight()
        suite.restarts_and_consolidation()
    finally:
        if suite.pool is not None:
            suite.pool.close()
        if suite.server.proc is not None:
            suite.server.stop()
    suite.chroma()
    suite.alone()
    suite.faiss()
    suite.startup_big()


def main() -> None:
    args = parse_args()
    command = " ".join(shlex.quote(a) for a in ["python", "bench/suite.py", *sys.argv[1:]])
    info = machine()
    print(
        f"machine: {info['cpus']} cores, {info['cpu']}; Python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["packages"].items()),
        flush=True,
    )
    print(
        f"params: n={args.n} dim={args.dim} seconds={args.seconds} load {args.procs} processes, "
        f"concurrency up to {args.concurrency}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tiermem-suite-") as tmp:
        suite = Suite(args, Path(tmp))
        if args.startup_only:
            suite.startup_big()
        else:
            run_phases(suite)
        results = suite.finish(info, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "suite.json").write_text(json.dumps(results, indent=2, default=float))
    make_plots(args, results)
    (args.out / "suite.json").write_text(json.dumps(results, indent=2, default=float))
    md = markdown(results)
    (args.out / "suite.md").write_text(md)
    print()
    print(md)
    print(f"wrote {args.out / 'suite.json'} and {args.out / 'suite.md'}")


if __name__ == "__main__":
    sys.exit(main())
