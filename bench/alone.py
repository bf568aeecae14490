"""The engine alone, in process: the suite's searches with no gRPC around them.

``Engine.search`` of the questions a load sends (similarity, and the default with the question's
text; limit 10, read-only) on a data directory no server holds, from one thread (its p50 and p99)
and from many (searches a second). Beside the empty RPC's own figures this splits a search's time
through the server into the ranking and the rest: the ranking's own p99 bounds what the server's
can be, and its rate from many threads bounds what one server process can serve (the GIL lets one
Python ranking run at a time). The suite runs it on a copy of its memories taken at a clean stop,
after its server is gone; from the command line, on any data directory of the suite's memories:

    python bench/alone.py --data DIR [--n 100000] [--seconds 4] [--rounds 2] [--threads 16]

Kinds alternate round by round (similarity, text; text, similarity; ...), as the suite's compared
searches do. From many threads read the rate: its tail is the order in which threads that search
without a pause take turns, not a client's wait. Figures only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import summarize
from load import NAMESPACE, K

KINDS = ("sim", "text")


def _queries(kind: str, queries: np.ndarray, texts: list[str], model: str) -> list[Any]:
    from tiermem.server.search.query import SIMILARITY, SearchQuery

    return [
        SearchQuery(
            namespaces=[NAMESPACE],
            embedding=q,
            embedding_model=model,
            limit=K,
            read_only=True,
            **({"strategy": SIMILARITY} if kind == "sim" else {"text": texts[i % len(texts)]}),
        )
        for i, q in enumerate(queries)
    ]


def _load(engine: Any, qs: list[Any], threads: int, seconds: float) -> np.ndarray:
    """The latencies (s) of ``threads`` threads searching ``qs`` in turn (each from its own
    offset) for ``seconds``."""
    lat: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    end = [0.0]

    def run(t: int) -> None:
        start.wait()
        i, mine = t * 17, lat[t]
        while True:
            t0 = time.perf_counter()
            if t0 >= end[0]:
                return
            engine.search(qs[i % len(qs)], False)
            mine.append(time.perf_counter() - t0)
            i += 1

    workers = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for w in workers:
        w.start()
    end[0] = time.perf_counter() + seconds
    start.wait()
    for w in workers:
        w.join()
    return np.array([x for xs in lat for x in xs])


def open_engine(data_dir: Path) -> Any:
    """An ``Engine`` on ``data_dir`` as the suite's searches see it: the lifecycle off, as for the
    suite's server; no snapshots, since nothing is written meanwhile."""
    from tiermem.server.config import ServerConfig
    from tiermem.server.core.engine import Engine

    env = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"}
    return Engine(ServerConfig.from_env(env=env, data_dir=data_dir, snapshot_interval_seconds=0))


def engine_alone(
    data_dir: Path,
    queries: np.ndarray,
    texts: list[str],
    model: str,
    seconds: float,
    rounds: int,
    threads: int,
) -> dict[str, dict[str, Any]]:
    """``{"<kind>_c1" | "<kind>_hi": summary}`` of each kind from 1 thread and from ``threads``,
    their rounds taken together (``seconds`` a round), with each round's p50 (``p50_rounds``)."""
    engine = open_engine(data_dir)
    try:
        qs = {kind: _queries(kind, queries, texts, model) for kind in KINDS}
        for kind in KINDS:  # (warm: the first searches compile and fault pages in)
            for q in qs[kind][:64]:
                engine.search(q, False)
        out: dict[str, dict[str, Any]] = {}
        for conc, at in ((1, "c1"), (threads, "hi")):
            got: dict[str, list[np.ndarray]] = {kind: [] for kind in KINDS}
            for rnd in range(rounds):
                for kind in KINDS if rnd % 2 == 0 else KINDS[::-1]:
                    got[kind].append(_load(engine, qs[kind], conc, seconds))
                    r = summarize(got[kind][-1], seconds)
                    print(
                        f"[alone] {kind} from {conc} thread(s), round {rnd + 1} of {rounds}: "
                        f"{r['ops_per_s']:,.0f}/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms",
                        flush=True,
                    )
            for kind, lats in got.items():
                out[f"{kind}_{at}"] = summarize(np.concatenate(lats), seconds * len(lats)) | {
                    "threads": conc,
                    "p50_rounds": [float(np.percentile(x, 50)) * 1e3 for x in lats],
                }
        return out
    finally:
        engine.close()


def main() -> None:
    from suite import make_data

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a data directory of the suite's memories")
    p.add_argument("--n", type=int, default=100_000, help="the memories it holds (its questions)")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--seconds", type=float, default=4.0, help="per round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=16)
    args = p.parse_args()
    d = make_data(args.n, args.dim, args.seed)
    res = engine_alone(args.data, d.queries, d.query_texts, d.model, args.seconds, args.rounds, args.threads)
    for key, r in res.items():
        print(f"{key}: {r['ops_per_s']:,.0f}/s p50 {r['p50_ms']:.3f} p99 {r['p99_ms']:.3f} ms")


if __name__ == "__main__":
    main()
