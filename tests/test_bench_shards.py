"""Smoke test of bench/shards.py (searches/s against the number of local tenant shards behind
HAProxy): a tiny run end to end, 1 and 2 shards, two rounds. Figures are printed, not asserted; only that there
is a row per N with positive figures, and no error.

Needs Debian's haproxy (``make proxy-toolchain``); skipped without it unless
TIERMEM_REQUIRE_HAPROXY=1 (CI), which makes a missing proxy a failure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import haproxy_or_skip

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(200)
def test_bench_shards_smoke(tmp_path: Path) -> None:
    haproxy_or_skip("bench/shards.py")
    out = tmp_path / "shards.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "shards.py"),
            *("--n", "300", "--tenants", "6", "--seconds", "1", "--max-shards", "2"),
            *("--json", str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    printed = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in proc.stdout.splitlines()
        if re.match(r"\| \d+ \|", line)
    ]
    assert [row[0] for row in printed] == ["1", "2"], proc.stdout
    for row in printed:  # N | searches/s | by round | x N=1 | / N | p50 ms | p99 ms | ...
        searches, ratio, per_n, p50, p99 = (float(row[i].replace(",", "")) for i in (1, 3, 4, 5, 6))
        assert min(searches, ratio, per_n, p50, p99) > 0, row
        assert len(row[2].split(", ")) == 2, row  # two rounds (the default)
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [r["shards"] for r in rows] == [1, 2]
    for r in rows:
        assert r["searches_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0, r
        assert r["errors"] == 0, r
        assert r["anon_after_bytes"] > 0 and r["anon_per_memory_bytes"] > 0, r
        assert sum(r["memories_per_shard"].values()) == 300, r
        assert [x["round"] for x in r["rounds"]] == [1, 2], r
    assert len(rows[1]["memories_per_shard"]) == 2
