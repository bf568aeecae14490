"""This build against another: the same searches on two servers side by side, loads alternating.

A change's effect on speed is often 5-15%, while this kind of machine's speed drifts by more between
two loads minutes apart. Here the other build (``--base``, a git revision checked out into a
temporary worktree) and this working tree each serve the same memories from their own data
directory, both servers up at once, and every load goes to one then the other (the order flipped
each round), so both see the same moods of the machine.

    python bench/versus.py --base HEAD~3                     # 100,000 memories, c1 and c16
    python bench/versus.py --base main --n 20000 --kinds sim,text --json out.json
    python bench/versus.py --base main --data DIR --kinds sim,text   # copies of a data directory

Memories: the suite's data (``suite.make_data``: clustered vectors, real-looking sentences), stored
through each server (``BatchCreateMemories``, so each build writes its own format), then searched
with the suite's questions as their text. With ``--data`` each build serves a copy of that data
directory instead (the suite's 1,000,000 memories, say, which take many minutes to store; the
questions are still those of ``make_data(--n)``, as the suite's start-up phase asks them). Kinds:
``sim`` (similarity), ``text`` (the default with the query's text), ``hybrid`` (similarity +
hybrid), ``vector`` (the default, a vector alone), ``comprehensive``. Printed per kind and
concurrency: each build's p50, p99 and searches a second (medians of the rounds), new/base per
round, and each build's kind against similarity per round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_seconds, free_port, server_args, stop_server, wait_idle, wait_serving
from load import LoadPool
from suite import BATCH, batch_request, make_data

ROOT = Path(__file__).resolve().parent.parent
# (the lifecycle would move memories mid-load; one process each: two builds' rankings side by side)
SERVER_ENV = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0", "TIERMEM_SEARCH_PROCESSES": "1"}

# Runs a checkout's server: its packages mapped as its pyproject maps them, ahead of this install.
BOOT = """
import importlib.abc, importlib.util, runpy, sys, tomllib
from pathlib import Path
root = Path(sys.argv[1])
dirs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in dirs:
            d = root / dirs[name]
            return importlib.util.spec_from_file_location(name, d / "__init__.py", submodule_search_locations=[str(d)])
        return None
sys.meta_path.insert(0, Finder())
sys.argv = ["tiermem.server", *sys.argv[2:]]
runpy.run_module("tiermem.server", run_name="__main__", alter_sys=True)
"""


def searches(kind: str, pb: Any, texts: list[str]) -> dict[str, Any]:
    """The load's arguments for a kind of search (``load._run_task``)."""
    sim, comp = pb.SEARCH_STRATEGY_SIMILARITY, pb.SEARCH_STRATEGY_COMPREHENSIVE
    return {
        "sim": {"strategy": sim},
        "text": {"texts": texts},
        "hybrid": {"texts": texts, "hybrid": True, "strategy": sim},
        "vector": {},
        "comprehensive": {"strategy": comp},
    }[kind]


def start(cmd: list[str], data: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd + server_args(data, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SERVER_ENV},
        )
    return proc, f"127.0.0.1:{port}"


def ingest(target: str, data: Any) -> None:
    """The memories through BatchCreateMemories, 256 a call."""
    import grpc

    from tiermem.v1 import memory_pb2 as pb
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    n = data.vectors.shape[0]
    with grpc.insecure_channel(target, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = pb_grpc.MemoryServiceStub(ch)
        for s in range(0, n, BATCH):
            stub.BatchCreateMemories(batch_request(pb, data, s, min(n, s + BATCH)), timeout=600)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from tiermem.v1 import memory_pb2 as pb

    base_tree = work / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), args.base],
                   check=True, capture_output=True)  # fmt: skip
    try:
        data = make_data(args.n, 384, args.seed)
        py = sys.executable
        boot = work / "boot.py"
        boot.write_text(BOOT)
        cmds = {"base": [py, str(boot), str(base_tree)], "new": [py, "-m", "tiermem.server"]}
        servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        pools: dict[str, LoadPool] = {}
        try:
            for name, cmd in cmds.items():
                if args.data is not None:  # (a copy each: a server writes its data directory)
                    shutil.copytree(args.data, work / f"data-{name}", symlinks=True)
                servers[name] = start(cmd, work / f"data-{name}", work / f"{name}.log")
                wait_serving(servers[name][1], 1800, servers[name][0])
                if args.data is None:
                    print(f"[{name}] serving; storing {args.n:,} memories ...", flush=True)
                    ingest(servers[name][1], data)
            for name, (proc, target) in servers.items():
                wait_idle(proc.pid, limit=1800)  # (its indexing done)
                pools[name] = LoadPool(target, 2)
            return compare(args, pb, data, servers, pools)
        finally:
            for p in pools.values():
                p.close()
            for proc, _ in servers.values():
                stop_server(proc)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False)


def compare(
    args: argparse.Namespace,
    pb: Any,
    data: Any,
    servers: dict[str, tuple[subprocess.Popen[bytes], str]],
    pools: dict[str, LoadPool],
) -> dict[str, Any]:
    """Every (kind, concurrency) load on both builds, alternating, ``--rounds`` times: each load's p50,
    p99, searches a second and the server's CPU a search."""
    kinds, concs = args.kinds.split(","), [int(c) for c in args.conc.split(",")]
    load = {"queries": data.queries, "model": data.model}
    for name in pools:  # warm-up
        for kind in kinds:
            pools[name].run("search", 1, 1, 0.5, "warm", **load, **searches(kind, pb, data.query_texts))
    got: dict[str, list[dict[str, float]]] = {}
    for rnd in range(args.rounds):
        order = ["base", "new"] if rnd % 2 == 0 else ["new", "base"]
        for conc in concs:
            procs, threads = (1, 1) if conc == 1 else (2, conc // 2)
            for kind in kinds:
                for name in order:
                    pid = servers[name][0].pid
                    c0 = cpu_seconds(pid)
                    out = pools[name].run("search", procs, threads, args.seconds, kind, **load,
                                          **searches(kind, pb, data.query_texts))  # fmt: skip
                    cpu = cpu_seconds(pid) - c0
                    lat = np.concatenate(list(out["latencies"].values())) * 1e3
                    got.setdefault(f"{name} {kind} c{conc}", []).append(
                        {
                            "p50_ms": float(np.percentile(lat, 50)),
                            "p99_ms": float(np.percentile(lat, 99)),
                            "ops_per_s": lat.shape[0] / args.seconds,
                            "cpu_ms": cpu / max(1, lat.shape[0]) * 1e3,
                        }
                    )
    return summarize(args, kinds, concs, got)


def summarize(
    args: argparse.Namespace, kinds: list[str], concs: list[int], got: dict[str, list[dict[str, float]]]
) -> dict[str, Any]:
    """Print and return the figures: per build the rounds' medians; new/base per round; kind/sim."""

    def col(key: str, field: str) -> np.ndarray:
        return np.array([r[field] for r in got[key]])

    report: dict[str, Any] = {
        "base": args.base,
        "n": args.n,
        "rounds": args.rounds,
        "loads": got,
        "ratios": {},
    }
    for conc in concs:
        for kind in kinds:
            b, w = f"base {kind} c{conc}", f"new {kind} c{conc}"
            p50 = col(w, "p50_ms") / col(b, "p50_ms")
            ops = col(w, "ops_per_s") / col(b, "ops_per_s")
            report["ratios"][f"new/base {kind} c{conc} p50"] = [round(float(x), 3) for x in p50]
            print(
                f"c{conc:<2} {kind:13s} p50 base {np.median(col(b, 'p50_ms')):6.2f} new "
                f"{np.median(col(w, 'p50_ms')):6.2f} ms; new/base p50 {_rounds(p50)}; ops/s base "
                f"{np.median(col(b, 'ops_per_s')):6.0f} new {np.median(col(w, 'ops_per_s')):6.0f} "
                f"(new/base {np.median(ops):.3f}); p99 {np.median(col(b, 'p99_ms')):.2f} / "
                f"{np.median(col(w, 'p99_ms')):.2f} ms; server CPU a search {np.median(col(b, 'cpu_ms')):.2f} / "
                f"{np.median(col(w, 'cpu_ms')):.2f} ms",
                flush=True,
            )
        if "sim" not in kinds:
            continue
        for name in ("base", "new"):
            for kind in kinds:
                if kind != "sim":
                    r = col(f"{name} {kind} c{conc}", "p50_ms") / col(f"{name} sim c{conc}", "p50_ms")
                    report["ratios"][f"{name} {kind}/sim c{conc} p50"] = [round(float(x), 3) for x in r]
                    print(f"    {name}: {kind} / sim p50 {_rounds(r)}")
    return report


def _rounds(x: np.ndarray) -> str:
    return f"{', '.join(f'{v:.2f}' for v in x)} (median {np.median(x):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision to compare this working tree with")
    ap.add_argument("--n", type=int, default=100_000, help="memories (default 100,000)")
    ap.add_argument("--kinds", default="sim,text,hybrid", help="sim, text, hybrid, vector, comprehensive")
    ap.add_argument("--conc", default="1,16", help="concurrencies (default 1,16)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0, help="per load")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--data", type=Path, help="serve copies of this data directory instead of storing --n memories"
    )
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="tiermem-versus-") as tmp:  # (run removes its worktree)
        report = run(args, Path(tmp))
    print(f"done in {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
