"""bench/quality.py end to end on the small synthetic conversation set in tests/data/quality: a real
server process, ingestion through the client, every method and baseline scored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quality_benchmark_runs_and_scores_every_method(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "quality.py"),
            "--data",
            str(ROOT / "tests/data/quality"),
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "quality.json").read_text())
    assert (tmp_path / "quality.md").read_text().startswith("# Retrieval quality")
    # 16 questions with evidence (the category-5 ones have none and are left out)
    assert report["questions"] == 16 and report["conversations"] == 2
    methods = {m["method"]: m for m in report["methods"]}
    for name in (
        "exact cosine",
        "BM25 (rank_bm25)",
        "RRF(BM25, cosine), k=60",
        "tiermem default (vector + text)",
    ):
        assert name in methods
    for m in report["methods"]:
        a = m["all"]
        assert 0.0 <= a["recall@5"] <= a["recall@10"] <= 1.0
        assert a["recall@10"] <= a["hit@10"] + 1e-9  # one evidence turn per question: equal, never above
        if m["method"].startswith("tiermem"):
            assert m["p50_ms"] > 0 and m["p99_ms"] >= m["p50_ms"]
    # Similarity ranking over the same vectors, in namespaces this small, is exact: the server's answer
    # must score as the in-process exact cosine does.
    exact, served = methods["exact cosine"]["all"], methods["tiermem strategy similarity (vector)"]["all"]
    assert served == exact
    # Each conversation is scored apart, and its questions make up the whole.
    for m in report["methods"]:
        parts = [m[g] for g in m if g.startswith("conversation ")]
        assert len(parts) == 2 and sum(p["n"] for p in parts) == m["all"]["n"]
        mean = sum(p["recall@10"] * p["n"] for p in parts) / m["all"]["n"]
        assert abs(mean - m["all"]["recall@10"]) < 1e-9
    # The paired gaps: the default against the baselines, a gap inside its bootstrap intervals.
    gaps = {(c["a"], c["b"]): c for c in report["comparisons"]}
    gap = gaps[("tiermem default (vector + text)", "RRF(BM25, cosine), k=60")]
    default, rrf = (
        methods["tiermem default (vector + text)"]["all"],
        methods["RRF(BM25, cosine), k=60"]["all"],
    )
    assert abs(gap["gap"] - (default["recall@10"] - rrf["recall@10"])) < 1e-9
    for lo, hi in (gap["ci_questions"], gap["ci_conversations"]):
        assert lo <= gap["gap"] <= hi
    assert set(gap["per_conversation"]) == {"c1", "c2"}
    assert "Paired gaps in recall@10" in (tmp_path / "quality.md").read_text()
