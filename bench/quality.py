"""Retrieval quality on multi-session conversations: does a search return the memory an agent needs?

Each conversation's dialog turns are stored through a tiermem server (a separate process), one namespace
per conversation, each turn created at its session's date. Every question with known evidence turns is then
asked of its conversation, and the share of evidence turns in the top k (recall@k) and whether any is
there (hit@k) are reported for tiermem's searches (the default, each strategy, hybrid, the built-in
embedder) beside baselines computed in the same run on the same vectors: exact cosine, BM25 (rank_bm25's
BM25Okapi) and their reciprocal-rank fusion (k = 60).

Data: a directory holding ``locomo.json`` (``{"turns": [...], "questions": [...]}``: a turn has ``conv``,
``dia_id``, ``session``, ``date``, ``speaker``, ``text``; a question ``conv``, ``q``, ``evidence`` (dia_ids),
``category``) and, optionally, ``turns.npy`` / ``questions.npy`` (float32 sentence vectors, one row per
turn / question). Without the vectors, the built-in embedder's vectors are used for both. The data is
read where it lies; it is never copied into the repository.

    python bench/quality.py --data ../shared/data/locomo-dev --out bench/results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import start_server, stop_server, wait_serving

from tiermem.client import MemoryClient
from tiermem.client.client import build_memory, strategy_value
from tiermem.v1 import memory_pb2 as pb

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (5, 10)
MODEL = "bench-sentence-model"  # the embedding space of the supplied vectors
RRF_K = 60.0


@dataclass
class Dataset:
    turns: list[dict[str, Any]]
    questions: list[dict[str, Any]]  # those of categories 1-4 with evidence
    turn_vectors: np.ndarray | None
    question_vectors: np.ndarray | None
    as_of: float = 0.0  # a day after the last session

    @property
    def conversations(self) -> list[str]:
        return sorted({str(t["conv"]) for t in self.turns})


@dataclass
class Result:
    name: str
    ranked: list[list[str]] = field(default_factory=list)  # per question: dia_ids, best first
    latencies: list[float] = field(default_factory=list)


def parse_date(text: str) -> float:
    """A session date as the dataset writes it ("1:56 pm on 8 May, 2023"), as UTC seconds."""
    when = dt.datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    return when.replace(tzinfo=dt.timezone.utc).timestamp()


def load(data_dir: Path) -> Dataset:
    raw = json.loads((data_dir / "locomo.json").read_text())
    keep = [
        i for i, q in enumerate(raw["questions"]) if q.get("evidence") and q.get("category") in CATEGORIES
    ]
    questions = [raw["questions"][i] for i in keep]
    if (data_dir / "turns.npy").exists() and (data_dir / "questions.npy").exists():
        tv, qv = np.load(data_dir / "turns.npy"), np.load(data_dir / "questions.npy")[keep]
    else:  # no sentence vectors: the built-in embedder's, so every method still runs
        from tiermem.server.embedding.hashing import HashEmbedder

        embedder = HashEmbedder()
        tv = np.stack([embedder.embed(t["text"]) for t in raw["turns"]])
        qv = np.stack([embedder.embed(q["q"]) for q in questions])
    ds = Dataset(turns=raw["turns"], questions=questions, turn_vectors=tv, question_vectors=qv)
    ds.as_of = max(parse_date(t["date"]) for t in ds.turns) + 86400.0
    return ds


def memory_id(dia_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:-]", "-", dia_id)


def tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


# -- baselines, in this process ------------------------------------------------------------------


def baselines(ds: Dataset, depth: int) -> list[Result]:
    from rank_bm25 import BM25Okapi

    cosine, bm25, fused = (
        Result("exact cosine"),
        Result("BM25 (rank_bm25)"),
        Result("RRF(BM25, cosine), k=60"),
    )
    by_conv: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(ds.turns):
        by_conv[str(t["conv"])].append(i)
    indexes = {c: BM25Okapi([tokens(ds.turns[i]["text"]) for i in rows]) for c, rows in by_conv.items()}
    for qi, q in enumerate(ds.questions):
        rows = by_conv[str(q["conv"])]
        ids = [memory_id(ds.turns[i]["dia_id"]) for i in rows]
        cos_order: list[int] = []
        if ds.turn_vectors is not None and ds.question_vectors is not None:
            sims = ds.turn_vectors[rows] @ ds.question_vectors[qi]
            cos_order = np.argsort(-sims, kind="stable").tolist()
            cosine.ranked.append([ids[j] for j in cos_order[:depth]])
        scores = indexes[str(q["conv"])].get_scores(tokens(q["q"]))
        bm_order = np.argsort(-scores, kind="stable").tolist()
        bm25.ranked.append([ids[j] for j in bm_order[:depth]])
        if cos_order:  # fused over the whole rankings, as RRF is usually run
            fused.ranked.append(rrf([[ids[j] for j in cos_order], [ids[j] for j in bm_order]], depth))
    return [r for r in (cosine, bm25, fused) if r.ranked]


def rrf(rankings: list[list[str]], depth: int, k: float = RRF_K) -> list[str]:
    score: dict[str, float] = defaultdict(float)
    for ranking in rankings:
        for rank, item in enumerate(ranking):
            score[item] += 1.0 / (k + rank + 1)
    return sorted(score, key=lambda item: -score[item])[:depth]


# -- tiermem, through the server -----------------------------------------------------------------


def ingest(client: MemoryClient, ds: Dataset, with_vectors: bool, suffix: str) -> None:
    """One namespace per conversation; client ids, so repeated turns are kept as separate memories."""
    batch: list[pb.Memory] = []
    for i, t in enumerate(ds.turns):
        fields: dict[str, Any] = {}
        if with_vectors and ds.turn_vectors is not None:
            fields = {"embedding": ds.turn_vectors[i], "embedding_model": MODEL}
        batch.append(
            build_memory(
                f"conv-{t['conv']}{suffix}",
                t["text"],
                id=memory_id(t["dia_id"]),
                create_time=parse_date(t["date"]),
                **fields,
            )
        )
        if len(batch) == 256:
            client.create_batch(batch)
            batch = []
    if batch:
        client.create_batch(batch)


def search_request(
    ds: Dataset, qi: int, *, vector: bool, text: bool, suffix: str, limit: int, **opts: Any
) -> Any:
    q = ds.questions[qi]
    req = pb.SearchMemoriesRequest(namespaces=[f"conv-{q['conv']}{suffix}"], limit=limit, read_only=True)
    if vector and ds.question_vectors is not None:
        req.query_embedding.extend(ds.question_vectors[qi].tolist())
        req.embedding_model = MODEL
    if text:
        req.query_text = q["q"]
    if opts.pop("hybrid", False):
        req.hybrid.enabled = True
    if "strategy" in opts:
        req.strategy = strategy_value(opts.pop("strategy"))
    req.as_of.FromSeconds(int(ds.as_of))
    for name, value in opts.items():
        setattr(req, name, value)
    return req


# (name, request options): vector / text say what the request carries; suffix picks the namespaces.
SERVER_METHODS: list[tuple[str, dict[str, Any]]] = [
    ("tiermem default (vector + text)", {"vector": True, "text": True}),
    ("tiermem default (vector)", {"vector": True, "text": False}),
    # The default's recency and importance weights (0.1 each) halved and doubled: how much its lead
    # rests on the exact values.
    *[
        (
            f"tiermem default (vector + text), beta = gamma = {w}",
            {"vector": True, "text": True, "beta": w, "gamma": w},
        )
        for w in (0.05, 0.2)
    ],
    *[
        (f"tiermem strategy {s} (vector)", {"vector": True, "text": False, "strategy": s})
        for s in ("comprehensive", "weighted", "fast_first", "similarity", "recency", "importance")
    ],
    ("tiermem similarity + hybrid", {"vector": True, "text": True, "strategy": "similarity", "hybrid": True}),
    ("tiermem default + hybrid", {"vector": True, "text": True, "hybrid": True}),
    ("tiermem built-in embedder, default (text)", {"vector": False, "text": True, "suffix": "-text"}),
    (
        "tiermem built-in embedder, similarity (text)",
        {"vector": False, "text": True, "suffix": "-text", "strategy": "similarity"},
    ),
    (
        "tiermem built-in embedder, hybrid (text)",
        {"vector": False, "text": True, "suffix": "-text", "hybrid": True},
    ),
]


def run_server_methods(client: MemoryClient, ds: Dataset, depth: int) -> list[Result]:
    out = []
    for name, spec in SERVER_METHODS:
        opts = dict(spec)
        if opts["vector"] and ds.question_vectors is None:
            continue
        suffix = opts.pop("suffix", "")
        res = Result(name)
        for qi in range(len(ds.questions)):
            req = search_request(ds, qi, suffix=suffix, limit=depth, **opts)
            t0 = time.perf_counter()
            reply = client.stub.SearchMemories(req, timeout=30)
            res.latencies.append(time.perf_counter() - t0)
            res.ranked.append([r.memory.id for r in reply.results])
        out.append(res)
    return out


# -- scoring and report --------------------------------------------------------------------------


def recalls(ds: Dataset, res: Result, k: int = 10) -> np.ndarray:
    """recall@k of each question, in question order."""
    out = np.empty(len(ds.questions))
    for i, (q, ranked) in enumerate(zip(ds.questions, res.ranked, strict=True)):
        evidence = {memory_id(e) for e in q["evidence"]}
        out[i] = len(evidence & set(ranked[:k])) / len(evidence)
    return out


def score(ds: Dataset, res: Result) -> dict[str, Any]:
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for q, ranked in zip(ds.questions, res.ranked, strict=True):
        evidence = {memory_id(e) for e in q["evidence"]}
        for group in ("all", CATEGORIES[q["category"]], f"conversation {q['conv']}"):
            for k in KS:
                found = len(evidence & set(ranked[:k]))
                rows[group][f"recall@{k}"].append(found / len(evidence))
                rows[group][f"hit@{k}"].append(float(found > 0))
    figures = {
        g: {m: float(np.mean(v)) for m, v in ms.items()} | {"n": len(ms["hit@5"])} for g, ms in rows.items()
    }
    out: dict[str, Any] = {"method": res.name, **figures}
    if res.latencies:
        lat = np.array(res.latencies) * 1000
        out["p50_ms"], out["p99_ms"] = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    return out


def paired_gap(ds: Dataset, a: Result, b: Result, k: int = 10, resamples: int = 10_000) -> dict[str, Any]:
    """How much ``a`` recalls beyond ``b`` (recall@k, per question), with 95% bootstrap intervals:
    resampling questions, and resampling in two stages, whole conversations and then the questions
    within each one drawn (how far the gap carries over to conversations not measured; with few
    conversations a rough guide, wider than the questions' interval)."""
    gap = recalls(ds, a, k) - recalls(ds, b, k)
    rng = np.random.default_rng(0)  # (a fixed seed: the same data gives the same report)
    by_question = gap[rng.integers(0, len(gap), (resamples, len(gap)))].mean(axis=1)
    convs = np.array([str(q["conv"]) for q in ds.questions])
    names = sorted(set(convs.tolist()))
    gaps = [gap[convs == n] for n in names]
    drawn = rng.integers(0, len(names), (resamples, len(names)))
    sums, counts = np.zeros(drawn.shape), np.zeros(drawn.shape)
    for j, g in enumerate(gaps):
        slots = drawn == j
        picks = rng.integers(0, len(g), (int(slots.sum()), len(g)))
        sums[slots], counts[slots] = g[picks].sum(axis=1), len(g)
    by_conversation = sums.sum(axis=1) / counts.sum(axis=1)
    per_conversation = {n: float(g.mean()) for n, g in zip(names, gaps, strict=True)}
    return {
        "a": a.name,
        "b": b.name,
        "k": k,
        "gap": float(gap.mean()),
        "ci_questions": [float(v) for v in np.percentile(by_question, [2.5, 97.5])],
        "ci_conversations": [float(v) for v in np.percentile(by_conversation, [2.5, 97.5])],
        "per_conversation": per_conversation,
        "conversations_ahead": sum(v > 0 for v in per_conversation.values()),
        "questions_ahead": int((gap > 0).sum()),
        "questions_behind": int((gap < 0).sum()),
    }


# The comparisons the report makes: the default against the strongest baseline and against cosine.
COMPARED = [
    ("tiermem default (vector + text)", "RRF(BM25, cosine), k=60"),
    ("tiermem default (vector + text)", "exact cosine"),
    ("tiermem default (vector)", "exact cosine"),
]


def comparisons(ds: Dataset, results: list[Result]) -> list[dict[str, Any]]:
    by_name = {r.name: r for r in results}
    return [paired_gap(ds, by_name[a], by_name[b]) for a, b in COMPARED if a in by_name and b in by_name]


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Retrieval quality: {report['questions']} questions over {report['conversations']} conversations",
        "",
        f"Data: `{report['data']}`; vectors: {report['vectors']}; as_of: a day after the last session.",
        "",
        "| method | recall@5 | recall@10 | hit@5 | hit@10 | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in report["methods"]:
        a = m["all"]
        lat = f"{m['p50_ms']:.1f} | {m['p99_ms']:.1f}" if "p50_ms" in m else " | "
        lines.append(
            f"| {m['method']} | {a['recall@5']:.3f} | {a['recall@10']:.3f} | {a['hit@5']:.3f} | {a['hit@10']:.3f} | {lat} |"
        )
    lines += ["", "recall@10 by question category:", ""]
    cats = [c for c in CATEGORIES.values() if any(c in m for m in report["methods"])]
    lines += ["| method | " + " | ".join(f"{c} (n={report['methods'][0][c]['n']})" for c in cats) + " |"]
    lines += ["| --- |" + " --- |" * len(cats)]
    for m in report["methods"]:
        lines.append(f"| {m['method']} | " + " | ".join(f"{m[c]['recall@10']:.3f}" for c in cats) + " |")
    convs = [g for g in report["methods"][0] if g.startswith("conversation ")]
    lines += ["", "recall@10 by conversation:", ""]
    lines += [
        "| method | " + " | ".join(f"{c[13:]} (n={report['methods'][0][c]['n']})" for c in convs) + " |"
    ]
    lines += ["| --- |" + " --- |" * len(convs)]
    for m in report["methods"]:
        lines.append(f"| {m['method']} | " + " | ".join(f"{m[c]['recall@10']:.3f}" for c in convs) + " |")
    lines += _comparison_lines(report.get("comparisons", []))
    return "\n".join(lines) + "\n"


def _comparison_lines(comps: list[dict[str, Any]]) -> list[str]:
    if not comps:
        return []
    lines = [
        "",
        "Paired gaps in recall@10 (95% bootstrap intervals, 10,000 resamples: of questions, and of whole",
        "conversations with the questions within each; few conversations make the second a rough guide):",
        "",
        "| method | against | gap | by question | by conversation | conversations ahead | questions ahead / behind |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in comps:
        q, v = c["ci_questions"], c["ci_conversations"]
        lines.append(
            f"| {c['a']} | {c['b']} | {c['gap']:+.3f} | [{q[0]:+.3f}, {q[1]:+.3f}] | [{v[0]:+.3f}, {v[1]:+.3f}] "
            f"| {c['conversations_ahead']} of {len(c['per_conversation'])} "
            f"| {c['questions_ahead']} / {c['questions_behind']} |"
        )
    return lines


def evaluate(data_dir: Path, depth: int = 10, log: Callable[[str], None] = print) -> dict[str, Any]:
    ds = load(data_dir)
    with tempfile.TemporaryDirectory(prefix="tiermem-quality-") as tmp:
        proc, target = start_server(Path(tmp) / "data", env={"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0"})
        try:
            wait_serving(target, 600, proc)
            with MemoryClient(target, timeout=120) as client:
                t0 = time.perf_counter()
                if ds.turn_vectors is not None:
                    ingest(client, ds, with_vectors=True, suffix="")
                ingest(client, ds, with_vectors=False, suffix="-text")
                log(f"ingested {len(ds.turns)} turns twice in {time.perf_counter() - t0:.1f} s")
                results = baselines(ds, depth) + run_server_methods(client, ds, depth)
        finally:
            stop_server(proc)
    return {
        "data": str(data_dir),
        "conversations": len(ds.conversations),
        "turns": len(ds.turns),
        "questions": len(ds.questions),
        "vectors": "supplied" if (data_dir / "turns.npy").exists() else "the built-in embedder's",
        "methods": [score(ds, r) for r in results],
        "comparisons": comparisons(ds, results),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data", type=Path, required=True, help="directory with locomo.json (and optional .npy vectors)"
    )
    p.add_argument("--out", type=Path, default=None, help="write quality.json and quality.md here")
    args = p.parse_args(argv)
    report = evaluate(args.data)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "quality.json").write_text(json.dumps(report, indent=2))
        (args.out / "quality.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
