"""Smoke test of bench/suite.py: a tiny run end to end (server process, load processes, FAISS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PHASES = {"empty_rpc", "ingest", "search", "mix", "faiss"}


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_bench_suite_smoke(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "suite.py"),
            "--n",
            "600",
            "--dim",
            "32",
            "--seconds",
            "0.5",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "suite.json").read_text())
    rows = results["rows"]
    assert {r["phase"] for r in rows} == PHASES
    for r in rows:
        assert r["ops_per_s"] > 0, r
        assert r.get("errors", 0) == 0, r
    names = {(r["phase"], r["concurrency"]) for r in rows}
    for phase in ("empty_rpc", "search"):
        assert {(phase, 1), (phase, 16)} <= names
    assert results["memory"]["rss_after_bytes"] > 0
    assert results["memory"]["memories"] == 600
    assert len(results["ratios"]) >= 6
    md = (tmp_path / "suite.md").read_text()
    assert "| phase |" in md
    assert "not measured in this version" in md.lower()
    print(md)
