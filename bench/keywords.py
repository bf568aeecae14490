"""The keyword pass alone, in process: BM25 over the in-memory keyword index at N memories of the
suite's real-looking sentences, with nothing else around it, so a change to the keyword
kernels or the index layout can be judged on its own (the suite's figures include the RPC, the masks,
the vector search and the fusion).

    python bench/keywords.py                     # 1,000,000 memories, one namespace, 300 questions
    python bench/keywords.py --n 100000 --json bench/results/keywords.json

It posts ``--n`` sentences (``bench.common.sentences``) into one namespace, compacts the index into
one segment (as after a snapshot restore or a compaction), then asks the suite's questions
(``bench.common.questions``) for the best 50 (the fused default's keyword depth) with 50 probe rows
(the vector candidates whose keyword scores the fusion reads), and for every match. It prints the mean
and percentiles of each, and how many postings the questions' terms hold.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import questions, sentences
from tiermem.server.index.keyword_index import KeywordIndex, bm25
from tiermem.server.model.text import keyword_terms


def _timed(index: KeywordIndex, qs: list[str], allowed: np.ndarray, probes: list, depth: int) -> np.ndarray:
    out = []
    for q, probe in zip(qs, probes, strict=True):
        t = time.perf_counter()
        bm25(index, [0], q, allowed, 10**12, probe, depth)
        out.append(time.perf_counter() - t)
    return np.array(out) * 1e3


def _postings(index: KeywordIndex, q: str) -> int:
    ids = (index._key_ids.get((0, t)) for t in keyword_terms(q))  # (a benchmark may look inside)
    return int(sum(index._df[k] for k in ids if k is not None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    texts = sentences(args.n, 7)
    index = KeywordIndex()
    t0 = time.perf_counter()
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    posted = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.compact(np.ones(args.n, np.bool_))
    compacted = time.perf_counter() - t0
    qs = questions(args.questions, 11)
    rng = np.random.default_rng(1)
    probes = [rng.integers(0, args.n, 50).astype(np.int64) for _ in qs]
    allowed = np.ones(args.n, np.bool_)
    per_q = np.array([_postings(index, q) for q in qs])
    report: dict = {
        "n": args.n,
        "questions": len(qs),
        "post_us_per_memory": round(posted / args.n * 1e6, 1),
        "compact_s": round(compacted, 2),
        "postings_per_question": {
            "mean": int(per_q.mean()),
            "p50": int(np.median(per_q)),
            "max": int(per_q.max()),
        },
    }
    print(f"{args.n:,} memories posted in {posted:.1f} s, compacted in {compacted:.2f} s")
    print(
        f"postings of a question's terms: mean {per_q.mean():,.0f}, p50 {np.median(per_q):,.0f}, max {per_q.max():,}"
    )
    for depth in (50, -1):
        _timed(index, qs, allowed, probes, depth)  # warm-up (and compilation)
    for depth, name in ((50, "best 50 + 50 probes"), (-1, "every match")):
        lat = np.concatenate([_timed(index, qs, allowed, probes, depth) for _ in range(args.rounds)])
        row = {
            k: round(float(v), 3)
            for k, v in (
                ("mean", lat.mean()),
                ("p50", np.percentile(lat, 50)),
                ("p90", np.percentile(lat, 90)),
                ("p99", np.percentile(lat, 99)),
            )
        }
        report[name] = row
        print(
            f"{name}: mean {row['mean']:.3f} ms, p50 {row['p50']:.3f}, p90 {row['p90']:.3f}, p99 {row['p99']:.3f}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
