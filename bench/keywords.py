"""The keyword pass alone, in process: BM25 over the in-memory keyword index at N memories of the
suite's real-looking sentences, with nothing else around it, so a change to the keyword
kernels or the index layout can be judged on its own (the suite's figures include the RPC, the masks,
the vector search and the fusion).

    python bench/keywords.py                     # 1,000,000 memories, one namespace, 300 questions
    python bench/keywords.py --n 100000 --json bench/results/keywords.json
    python bench/keywords.py --peers             # also tantivy and bm25s (make bench-keywords)

It posts ``--n`` sentences (``bench.common.sentences``) into one namespace, compacts the index into
one segment (as after a snapshot restore or a compaction), then asks the suite's questions
(``bench.common.questions``) for the best 32 (the fused default's keyword depth at limit 10) with 32 probe rows
(the vector candidates whose keyword scores the fusion reads), and for every match. It prints the mean
and percentiles of each, and how many postings the questions' terms hold.

With ``--peers`` the same best 32 come, in the same run, from two well-kept BM25 libraries given the
same terms (the index's stemmed terms without stop words, repeated as often as they occur): tantivy
(Rust: compressed postings, block-max WAND for the best k) and bm25s (scores precomputed per posting,
its Numba backend). Rounds alternate the three, so they share the machine's moods. It prints each one's
latency (all three given the question's terms: its tokenizing is not timed), its ratio to the
kernel's and how many of the kernel's best 32 it also ranks there (the
libraries' idf and length normalization differ a little, and ties are cut differently). The libraries
are dev dependencies (``make venv`` installs them); without them only the kernel is timed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import questions, sentences
from tiermem.server.index.keyword_index import KeywordIndex, bm25
from tiermem.server.model.text import keyword_terms
from tiermem.server.search.candidates import similarity_depth

DEPTH = similarity_depth(10)  # the fused default's keyword depth at limit 10 (32)


def _timed(index: KeywordIndex, qs: list[str], allowed: np.ndarray, probes: list, depth: int) -> np.ndarray:
    out = []
    for q, probe in zip(qs, probes, strict=True):
        t = time.perf_counter()
        bm25(index, [0], q, allowed, 10**12, probe, depth)
        out.append(time.perf_counter() - t)
    return np.array(out) * 1e3


def _postings(index: KeywordIndex, q: str) -> int:
    keys = index._keys  # (a benchmark may look inside)
    ids = (keys.ids.get((0, t)) for t in keyword_terms(q))
    return int(sum(keys.df[k] for k in ids if k is not None))


def build_index(texts: list[str]) -> tuple[KeywordIndex, float, float]:
    """The texts posted as rows 0.. of namespace 0 and compacted into one segment: (index, seconds
    posting, seconds compacting)."""
    index = KeywordIndex()
    t0 = time.perf_counter()
    for row, text in enumerate(texts):
        index.add(row, 0, text)
    posted = time.perf_counter() - t0
    t0 = time.perf_counter()
    index.compact(np.ones(len(texts), np.bool_))
    return index, posted, time.perf_counter() - t0


def keyword_pass(texts: list[str], qs: list[str], rounds: int) -> dict:
    """The best DEPTH of each question by this kernel, tantivy and bm25s (those installed) over ``texts``:
    what ``peers`` reports (bench/suite.py's start-up phase asks this of its own data)."""
    index, _, _ = build_index(texts)
    return peers(index, texts, qs, np.ones(len(texts), np.bool_), rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--peers", action="store_true", help="also tantivy and bm25s (optional packages)")
    args = ap.parse_args()
    texts = sentences(args.n, 7)
    index, posted, compacted = build_index(texts)
    qs = questions(args.questions, 11)
    rng = np.random.default_rng(1)
    probes = [rng.integers(0, args.n, DEPTH).astype(np.int64) for _ in qs]
    allowed = np.ones(args.n, np.bool_)
    per_q = np.array([_postings(index, q) for q in qs])
    segments = index._view[0]
    postings_mb = sum(a.nbytes for seg in segments for a in seg.arrays) / 1e6
    bitmaps = [seg.bitmaps for seg in segments]
    bitmaps_mb = sum(b.words.nbytes + b.ranks.nbytes + b.tf_bits.nbytes for b in bitmaps) / 1e6
    report: dict = {
        "n": args.n,
        "questions": len(qs),
        "post_us_per_memory": round(posted / args.n * 1e6, 1),
        "compact_s": round(compacted, 2),
        "postings_mb": round(postings_mb, 1),
        "bitmaps_mb": round(bitmaps_mb, 1),  # the common keys' row bitmaps (derived, not saved)
        "postings_per_question": {
            "mean": int(per_q.mean()),
            "p50": int(np.median(per_q)),
            "max": int(per_q.max()),
        },
    }
    print(f"{args.n:,} memories posted in {posted:.1f} s, compacted in {compacted:.2f} s")
    print(f"postings {postings_mb:.1f} MB, the common keys' row bitmaps {bitmaps_mb:.1f} MB")
    print(
        f"postings of a question's terms: mean {per_q.mean():,.0f}, p50 {np.median(per_q):,.0f}, max {per_q.max():,}"
    )
    for depth in (DEPTH, -1):
        _timed(index, qs, allowed, probes, depth)  # warm-up (and compilation)
    for depth, name in ((DEPTH, f"best {DEPTH} + {DEPTH} probes"), (-1, "every match")):
        lat = np.concatenate([_timed(index, qs, allowed, probes, depth) for _ in range(args.rounds)])
        row = _stats(lat, (50, 90, 99))
        report[name] = row
        print(
            f"{name}: mean {row['mean']:.3f} ms, p50 {row['p50']:.3f}, p90 {row['p90']:.3f}, p99 {row['p99']:.3f}"
        )
    if args.peers:
        report["peers"] = peers(index, texts, qs, allowed, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


def _stats(lat: np.ndarray, percentiles: tuple[int, ...] = (50, 99)) -> dict[str, float]:
    """The mean and percentiles (``p50`` ...) of latencies in ms, rounded to the µs."""
    out = {"mean": round(float(lat.mean()), 3)}
    out.update({f"p{q}": round(float(np.percentile(lat, q)), 3) for q in percentiles})
    return out


def _tantivy(texts: list[str]) -> Callable[[list[str]], list[int]]:
    import tantivy  # (a dev dependency)

    builder = tantivy.SchemaBuilder()
    builder.add_text_field("t", stored=False, tokenizer_name="whitespace", index_option="freq")
    schema = builder.build()
    index = tantivy.Index(schema)  # (in memory)
    writer = index.writer(heap_size=500_000_000, num_threads=1)
    for text in texts:
        words = " ".join(" ".join([t] * n) for t, n in keyword_terms(text).items())
        writer.add_document(tantivy.Document(t=words))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    searcher = index.searcher()
    if searcher.num_segments != 1:
        print(f"tantivy: {searcher.num_segments} segments: its overlap with the kernel is undercounted")

    def search(terms: list[str]) -> list[int]:
        if not terms:
            return []
        should = [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "t", t)) for t in terms]
        hits = searcher.search(tantivy.Query.boolean_query(should), DEPTH).hits
        return [addr.doc if addr.segment_ord == 0 else -1 for _, addr in hits]  # (one segment: doc = row)

    return search


def _bm25s(texts: list[str]) -> Callable[[list[str]], list[int]]:
    import bm25s  # (a dev dependency)

    corpus = [[t for t, n in keyword_terms(text).items() for _ in range(n)] for text in texts]
    retriever = bm25s.BM25(k1=1.2, b=0.75, backend="numba")
    retriever.index(corpus, show_progress=False)
    vocab = retriever.vocab_dict

    def search(terms: list[str]) -> list[int]:
        known = [t for t in terms if t in vocab]
        if not known:
            return []
        docs, _ = retriever.retrieve([known], k=DEPTH, show_progress=False, n_threads=1)
        return [int(d) for d in docs[0]]

    return search


def peers(index: KeywordIndex, texts: list[str], qs: list[str], allowed: np.ndarray, rounds: int) -> dict:
    """The best DEPTH from tantivy and bm25s beside the kernel's, rounds alternating."""
    terms = [list(keyword_terms(q)) for q in qs]
    engines: dict[str, Callable[[list[str]], list[int]]] = {}
    for name, make in (("tantivy", _tantivy), ("bm25s", _bm25s)):
        try:
            t0 = time.perf_counter()
            engines[name] = make(texts)
            print(f"{name}: indexed in {time.perf_counter() - t0:.1f} s")
        except ImportError:
            print(f"{name}: not installed (a dev dependency: pip install -e '.[dev]')")

    no_probe = np.empty(0, np.int64)

    def kernel(i: int) -> list[int]:  # (the same terms as the libraries get: no tokenizing timed)
        return index.bm25([0], terms[i], allowed, 10**12, no_probe, DEPTH)[0].tolist()

    runs: dict[str, Callable[[int], list[int]]] = {"kernel": kernel}
    for name, engine in engines.items():
        runs[name] = lambda i, e=engine: e(terms[i])
    best = {name: [run(i) for i in range(len(qs))] for name, run in runs.items()}  # (and warm-up)
    lat: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            for i in range(len(qs)):
                t = time.perf_counter()
                run(i)
                lat[name].append(time.perf_counter() - t)
    out: dict = {}
    base = np.array(lat["kernel"]) * 1e3
    for name in runs:
        ms = np.array(lat[name]) * 1e3
        row: dict = _stats(ms)
        row["mean_vs_kernel"] = round(float(ms.mean() / base.mean()), 2)  # (of the unrounded means)
        shared = [
            len(set(a) & set(b)) / max(1, len(a)) for a, b in zip(best["kernel"], best[name], strict=True)
        ]
        row["shares_kernel_best"] = round(float(np.mean(shared)), 3)
        out[name] = row
        print(
            f"best {DEPTH}, {name}: mean {row['mean']:.3f} ms, p50 {row['p50']:.3f}, p99 {row['p99']:.3f}; "
            f"{row['mean_vs_kernel']:.2f}x the kernel's mean; {row['shares_kernel_best']:.3f} of its best {DEPTH}"
        )
    return out


if __name__ == "__main__":
    main()
