"""Shared by the benchmarks: seeded data that behaves like text embeddings, server processes, a progress
bar, latency summaries and the exact references that recall is measured against.

This module imports only the standard library and NumPy at module level, so bench/chroma_peer.py can use
it from the benchmark's own environment (.venv-bench), where tiermem is not installed.
"""

from __future__ import annotations

import contextlib
import os
import platform
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import numpy as np

HEALTH_SERVICE = "tiermem.v1.MemoryService"
DAY = 86400.0
# Server defaults (ServerConfig): weights, recency tau, importance floor, half-lives by tier value.
ALPHA, BETA, GAMMA = 0.5, 0.3, 0.2
TAU = DAY
FLOOR = 0.1
HALF_LIFE_H = np.array([0.0, 1.0, 24.0, 168.0, 720.0])
SLOW = 3


# -- data --------------------------------------------------------------------------------------------


def clustered_vectors(n: int, dim: int, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded, clustered, normalized float32 vectors and their cluster centres."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(0, clusters, n)
    x = centres[labels] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32) / np.sqrt(dim) * 4
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), centres


def clustered_chunks(
    n: int, dim: int, clusters: int, seed: int, chunk: int
) -> Iterator[tuple[int, np.ndarray]]:
    """The same kind of vectors as ``clustered_vectors``, made ``chunk`` at a time (for 1M and more)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        x = centres[rng.integers(0, clusters, m)]
        x = x + 0.35 * rng.standard_normal((m, dim)).astype(np.float32) / np.sqrt(dim) * 4
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield start, x.astype(np.float32)


def queries_near(centres: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Queries near cluster centres (noise of norm ~0.5 against a unit centre), not drawn from the data."""
    dim = centres.shape[1]
    q = centres[rng.integers(0, centres.shape[0], count)] + 0.5 * rng.standard_normal((count, dim)).astype(
        np.float32
    ) / np.sqrt(dim)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q.astype(np.float32)


# -- progress ----------------------------------------------------------------------------------------


class Progress:
    """A one-line ``\\r`` bar on stderr when it is a terminal, a line every few seconds otherwise."""

    def __init__(self, label: str, total: int, unit: str = "", stream: IO[str] | None = None) -> None:
        self.label, self.total, self.unit = label, max(1, total), unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.interval = 0.2 if self.tty else 5.0
        self.t0 = self.last = time.monotonic()
        self.done = 0

    def _line(self, done: int) -> str:
        elapsed = max(1e-9, time.monotonic() - self.t0)
        frac = min(1.0, done / self.total)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        bar = "#" * int(frac * 30)
        return (
            f"{self.label} [{bar:<30}] {done:,}/{self.total:,} {frac * 100:5.1f}% "
            f"{rate:,.0f}{self.unit}/s {elapsed:.0f}s eta {eta:.0f}s"
        )

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        if self.tty:
            self.stream.write("\r" + self._line(done) + "\x1b[K")
        else:
            self.stream.write("  " + self._line(done) + "\n")
        self.stream.flush()

    def close(self) -> None:
        line = self._line(self.done)
        self.stream.write(("\r" + line + "\x1b[K\n") if self.tty else ("  " + line + "\n"))
        self.stream.flush()


# -- server processes --------------------------------------------------------------------------------


def wait_ready(results: Any, workers: int, timeout: float) -> None:
    """Wait until each of ``workers`` spawned load workers has put ``{"ready": pid}`` on ``results``.
    A load's window is set when it is sent: a worker still importing or connecting then (seconds
    on a busy machine) would miss it and count nothing."""
    for _ in range(workers):
        try:
            msg = results.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"load workers not ready after {timeout:.0f} s") from None
        if "ready" not in msg:
            raise RuntimeError(f"a load worker failed before it was ready: {msg}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(data_dir: Path, port: int) -> list[str]:
    """The arguments a benchmark's server runs with (after its command)."""
    return [
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-level",
        "INFO",  # start-up says what it loaded, re-added and compacted (the server logs no requests)
    ]


def _server_cmd(data_dir: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "tiermem.server", *server_args(data_dir, port)]


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``python -m tiermem.server`` on 127.0.0.1 port 0 (a separate process); returns (process, target)."""
    proc = subprocess.Popen(
        _server_cmd(data_dir, 0),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on ([^:]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, f"{m.group(1)}:{m.group(2)}"
    raise RuntimeError("server did not start")


def wait_serving(target: str, deadline_s: float, proc: subprocess.Popen[Any] | None = None) -> None:
    """Poll grpc.health.v1 Check(HEALTH_SERVICE) until SERVING (the server reports it after loading).

    A channel whose connection was refused (the port not open yet) waits out gRPC's reconnect
    backoff (1 s, then 1.6x per try) before it tries again: one channel for the whole wait made a
    start-up look up to about twice as long as it was. Each try uses a new channel."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    end = time.monotonic() + deadline_s
    req = health_pb2.HealthCheckRequest(service=HEALTH_SERVICE)
    while True:
        with grpc.insecure_channel(target) as channel:
            try:
                stub = health_pb2_grpc.HealthStub(channel)
                if stub.Check(req, timeout=1.0).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before SERVING")
        if time.monotonic() > end:
            raise RuntimeError(f"server not SERVING after {deadline_s} s")
        time.sleep(0.01)


def start_server_timed(
    data_dir: Path, log: Path, env: dict[str, str] | None = None, deadline_s: float = 1800
) -> tuple[subprocess.Popen[bytes], str, float]:
    """Start a server on a free port and time process start -> health SERVING; returns (proc, target, s)."""
    port = free_port()
    target = f"127.0.0.1:{port}"
    with log.open("ab") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            _server_cmd(data_dir, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        wait_serving(target, deadline_s, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise RuntimeError(f"server on {data_dir} did not come up; log tail:\n{tail}") from None
    return proc, target, time.perf_counter() - t0


def stop_server(proc: subprocess.Popen[Any], kill: bool = False, timeout: float = 600) -> float:
    """SIGTERM (clean: drain, snapshot, close) or SIGKILL, then wait; returns the seconds until exit."""
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    status = proc.wait(timeout=timeout)
    if not kill and status != 0:  # a clean stop that was not one would spoil the timings after it
        raise RuntimeError(f"server {proc.pid} exited with {status} on SIGTERM")
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` have used (a process gone meanwhile counts nothing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def wait_idle(pid: int, window: float = 0.5, busy: float = 0.1, limit: float = 60.0) -> float:
    """Wait until a process uses under ``busy`` cores over ``window`` seconds (its background work
    done: HNSW indexing, a periodic snapshot); returns the seconds waited (at most ``limit``)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        c0 = cpu_seconds(pid)
        time.sleep(window)
        if cpu_seconds(pid) - c0 < busy * window:
            break
    return time.perf_counter() - t0


def rss_bytes(pid: int) -> int:
    return rss_parts(pid)["VmRSS"]


def rss_parts(pid: int) -> dict[str, int]:
    """VmRSS and its parts in bytes: RssAnon (the process's own memory: heap, FAISS, columns) and
    RssFile (file pages mapped in: shared libraries and LMDB's data file, page cache the kernel can
    reclaim); VmHWM, the highest VmRSS the process has had."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(line.split()[1]) * 1024
    if "VmRSS" not in out:
        raise RuntimeError("no VmRSS")
    return out


# -- machine and figures -----------------------------------------------------------------------------


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def machine(
    packages: tuple[str, ...] = ("grpcio", "faiss-cpu", "numba", "lmdb", "protobuf"),
) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "memory_bytes": mem_total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "packages": {p: package_version(p) for p in packages},
    }


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


# -- exact references ----------------------------------------------------------------------------------


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores, best first."""
    k = min(k, scores.shape[0])
    part = np.argpartition(-scores, k - 1)[:k]
    return part[np.argsort(-scores[part], kind="stable")]


def exact_prior(importance: np.ndarray, created: np.ndarray, tiers: np.ndarray, as_of: float) -> np.ndarray:
    """The exact non-similarity part of the default score: 0.3*recency + 0.2*decayed importance.

    Recency exp(-(as_of - create_time) / 86400) (no access since creation); importance * 0.5 ** (age_h /
    half_life[tier]), floored at 0.1 * importance; half-lives 1, 24, 168, 720 h for FAST..GLACIAL.
    """
    age = as_of - created
    decayed = importance * 0.5 ** ((age / 3600.0) / HALF_LIFE_H[tiers])
    decayed = np.maximum(decayed, FLOOR * importance.astype(np.float64))
    return BETA * np.exp(-age / TAU) + GAMMA * decayed


def recall_against_exact(got: list[np.ndarray], queries: np.ndarray, vectors: np.ndarray, k: int) -> float:
    """Mean recall@k of ``got`` (row indices per query) against brute-force inner product."""
    hits = 0
    for q, g in zip(queries, got, strict=True):
        ref = top_k(vectors @ q, k)
        hits += len(set(ref.tolist()).intersection(np.asarray(g).tolist()))
    return hits / (k * len(got)) if got else float("nan")


def search_request(
    query: np.ndarray,
    *,
    namespace: str,
    model: str,
    k: int,
    as_of: float | None,
    where: dict[str, Any] | None,
    similarity: bool,
) -> Any:
    """A read_only SearchMemoriesRequest; SIMILARITY ranks by cosine only, else COMPREHENSIVE (the
    raw weighted sum, whose exact top k the recall measures compare with)."""
    from tiermem.client.client import build_filter
    from tiermem.v1 import memory_pb2 as pb

    req = pb.SearchMemoriesRequest(
        namespaces=[namespace],
        embedding_model=model,
        limit=k,
        read_only=True,
        filter=build_filter(where=where),
    )
    req.query_embedding.extend(query.tolist())
    if as_of is not None:
        req.as_of.seconds = int(as_of)  # as_of is a whole second
    req.strategy = pb.SEARCH_STRATEGY_SIMILARITY if similarity else pb.SEARCH_STRATEGY_COMPREHENSIVE
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
    *,
    row_of: Callable[[str], int],
    namespace: str,
    model: str,
    k: int = 10,
) -> dict[str, Any]:
    """Run sequential searches (timed) and compare each with the exact top k over ``allowed`` rows.

    similarity: recall@k against brute force over the allowed vectors; combined: overlap of the top k
    with an exact scoring ALPHA*cos + prior. "strict" counts the reference's top-k rows returned;
    "tolerant" also accepts a returned row whose exact score ties the reference's k-th within 1e-5.
    ``row_of`` maps a returned memory id to its row in ``vectors``.
    """
    idx = np.flatnonzero(allowed)
    xa = vectors[idx]
    pa = prior[idx]
    reqs = [
        search_request(
            q, namespace=namespace, model=model, k=k, as_of=as_of, where=where, similarity=similarity
        )
        for q in queries
    ]
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
        ref = top_k(exact, k)
        ref_rows = set(idx[ref].tolist())
        kth = exact[ref[-1]]
        got = [row_of(res.memory.id) for res in resp.results]
        if len(got) < min(k, idx.shape[0]):
            short += 1
        pos = np.searchsorted(idx, got)  # rows -> positions in idx (idx is sorted)
        if not np.all(idx[np.minimum(pos, idx.shape[0] - 1)] == got):
            raise AssertionError("the server returned a memory the filter should have excluded")
        got_exact = exact[pos]
        strict.append(len(ref_rows.intersection(got)) / k)
        tolerant.append(min(k, int(np.sum(got_exact >= kth - 1e-5))) / k)
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


# -- real-looking text: what agents store (who did what, where, when), with a skewed vocabulary ------
_FIRST = [
    "Maya",
    "Tom",
    "Lena",
    "Omar",
    "Ana",
    "Bob",
    "Priya",
    "Jonas",
    "Chen",
    "Sara",
    "Diego",
    "Nina",
    "Ravi",
    "Ines",
    "Kofi",
    "Mei",
    "Lucas",
    "Hana",
    "Ivan",
    "Zoe",
    "Amir",
    "Clara",
    "Felix",
    "Yuki",
    "Noah",
    "Elena",
    "Sam",
    "Aisha",
    "Leo",
    "Marta",
    "Hugo",
    "Freya",
    "Tariq",
    "Julia",
    "Ben",
    "Olga",
    "Malik",
    "Rosa",
    "Theo",
    "Anya",
]
_LAST = [
    "Silva",
    "Meyer",
    "Okafor",
    "Tanaka",
    "Novak",
    "Rossi",
    "Haddad",
    "Larsen",
    "Kowalski",
    "Moreau",
    "Gupta",
    "Fischer",
    "Costa",
    "Ivanova",
    "Park",
    "Nguyen",
    "Brennan",
    "Alvarez",
    "Weber",
    "Kim",
    "Dubois",
    "Sato",
    "Jensen",
    "Mendes",
    "Lindqvist",
    "Farouk",
    "Petrov",
    "Byrne",
    "Santos",
    "Walsh",
]
_VERBS = [
    "visited",
    "booked",
    "fixed",
    "cancelled",
    "reviewed",
    "planned",
    "bought",
    "lost",
    "found",
    "painted",
    "cooked",
    "shipped",
    "deployed",
    "migrated",
    "repaired",
    "returned",
    "finished",
    "started",
    "postponed",
    "discussed",
    "signed",
    "rewrote",
    "tested",
    "cleaned",
    "sold",
    "borrowed",
    "ordered",
    "photographed",
    "measured",
    "approved",
    "rejected",
    "renamed",
    "moved",
    "packed",
    "wrote",
    "read",
    "learned",
    "taught",
    "organised",
    "recorded",
]
_ADJ = [
    "old",
    "new",
    "small",
    "large",
    "broken",
    "shiny",
    "quarterly",
    "annual",
    "urgent",
    "noisy",
    "quiet",
    "red",
    "blue",
    "green",
    "wooden",
    "digital",
    "shared",
    "private",
    "weekly",
    "late",
    "early",
    "spare",
    "second",
    "final",
    "draft",
    "rough",
    "detailed",
    "cheap",
    "expensive",
    "vintage",
]
_NOUNS = [
    "report",
    "budget",
    "invoice",
    "contract",
    "roadmap",
    "bike",
    "car",
    "laptop",
    "kitchen",
    "garden",
    "roof",
    "boiler",
    "server",
    "database",
    "dashboard",
    "pipeline",
    "release",
    "newsletter",
    "presentation",
    "wedding",
    "trip",
    "ticket",
    "flight",
    "hotel",
    "apartment",
    "lease",
    "camera",
    "guitar",
    "piano",
    "novel",
    "recipe",
    "cake",
    "bread",
    "soup",
    "painting",
    "mural",
    "poster",
    "website",
    "app",
    "backup",
    "password",
    "printer",
    "router",
    "phone",
    "tablet",
    "sofa",
    "desk",
    "lamp",
    "fence",
    "bridge",
    "boat",
    "tent",
    "jacket",
    "shoes",
    "passport",
    "visa",
    "course",
    "exam",
    "thesis",
    "paper",
    "grant",
    "proposal",
    "meeting",
    "workshop",
    "conference",
    "interview",
    "offsite",
    "party",
    "dinner",
    "picnic",
    "concert",
    "museum",
    "gallery",
    "library",
    "clinic",
    "appointment",
    "prescription",
    "vaccine",
    "puppy",
    "kitten",
    "aquarium",
]
_PLACES = [
    "Lisbon",
    "Berlin",
    "Paris",
    "Leeds",
    "Bristol",
    "Toronto",
    "Osaka",
    "Nairobi",
    "Lima",
    "Oslo",
    "Krakow",
    "Porto",
    "Seattle",
    "Denver",
    "Austin",
    "Dublin",
    "Madrid",
    "Vienna",
    "Prague",
    "Seoul",
    "the office",
    "the lake house",
    "the warehouse",
    "the lab",
    "the studio",
    "the garage",
    "the clinic",
    "the library",
    "the station",
    "the market",
    "the harbour",
    "the school",
    "the gym",
    "the park",
]
_TIMES = [
    "on Monday",
    "on Tuesday",
    "on Wednesday",
    "on Thursday",
    "on Friday",
    "on Saturday",
    "on Sunday",
    "last week",
    "yesterday",
    "this morning",
    "in March",
    "in April",
    "in June",
    "in September",
    "in November",
    "before the holidays",
    "after lunch",
    "at night",
    "during the storm",
    "before the deadline",
    "next month",
    "at dawn",
]
_WHY = [
    "because the client asked",
    "so the team could rest",
    "since the budget was cut",
    "after a long delay",
    "to save money",
    "for the first time",
    "with help from a neighbour",
    "despite the rain",
    "ahead of the audit",
    "as a surprise",
    "to test the new process",
    "while everyone was away",
]


def _zipf_pick(rng: np.random.Generator, words: list[str], size: int, skew: float = 1.0) -> np.ndarray:
    """Indices into ``words`` with a Zipf-like skew (the first words common, the last ones rare)."""
    weights = 1.0 / np.arange(1, len(words) + 1) ** skew
    return rng.choice(len(words), size=size, p=weights / weights.sum())


def _coined_names(count: int, seed: int) -> list[str]:
    """Proper names made of syllables (products, pets, projects): the long tail of a real vocabulary."""
    rng = np.random.default_rng(seed)
    syllables = [
        "ka",
        "ro",
        "ta",
        "mi",
        "ve",
        "lo",
        "sa",
        "ne",
        "ri",
        "do",
        "lu",
        "fa",
        "zen",
        "tor",
        "mal",
        "bri",
        "gan",
        "sol",
        "kir",
        "pel",
        "va",
        "no",
        "du",
    ]
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.choice(syllables, size=int(rng.integers(2, 4)))).capitalize())
    return sorted(names)


_NAMES = _coined_names(5000, 99)
_PARTS = (
    ("first", _FIRST, 0.5),
    ("last", _LAST, 0.5),
    ("verb", _VERBS, 0.8),
    ("adj", _ADJ, 0.8),
    ("noun", _NOUNS, 0.8),
    ("name", _NAMES, 1.0),
    ("place", _PLACES, 0.8),
    ("time", _TIMES, 0.5),
    ("why", _WHY, 0.5),
)


def sentences(count: int, seed: int) -> list[str]:
    """``count`` memories as an agent would store them: who did what to which named thing, where, when,
    and sometimes why (a vocabulary of about 5,500 words, each part of speech skewed as in real text)."""
    rng = np.random.default_rng(seed)
    pick = {name: _zipf_pick(rng, words, count, skew) for name, words, skew in _PARTS}
    with_why = rng.random(count) < 0.4
    out = []
    for i in range(count):
        w = {name: words[pick[name][i]] for name, words, _ in _PARTS}
        s = f"{w['first']} {w['last']} {w['verb']} the {w['adj']} {w['noun']} {w['name']} in {w['place']} {w['time']}"
        out.append(s + (f" {w['why']}." if with_why[i] else "."))
    return out


def questions(count: int, seed: int) -> list[str]:
    """Questions about such memories, in an agent's words."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        w = {name: words[_zipf_pick(rng, words, 1, skew)[0]] for name, words, skew in _PARTS}
        first, noun, place, verb = w["first"], w["noun"], w["place"], w["verb"]
        form = rng.integers(0, 4)
        if form == 0:
            out.append(f"When did {first} visit {place}?")
        elif form == 3:
            out.append(f"Where is the {noun} {w['name']} now?")
        elif form == 1:
            out.append(f"What happened to the {noun} that {first} {verb}?")
        else:
            out.append(f"Who {verb} the {noun} in {place}?")
    return out
