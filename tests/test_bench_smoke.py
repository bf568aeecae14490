"""Smoke tests of bench/suite.py (a tiny run end to end: server process, load processes, filtered search,
recall, start-ups, consolidation, concurrency sweep, FAISS; without Chroma) and bench/gil.py (threads
against processes). Figures are printed, not asserted; only the structure is checked."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tiermem.server.cores import usable_cores
from tiermem.server.transport.follower import AUTO_PROCESSES_MOST

ROOT = Path(__file__).resolve().parent.parent
PHASES = {
    "empty_rpc",
    "ingest",
    "search",
    "machine",
    "search_vs_size",
    "filtered_search",
    "followers",
    "mix",
    "consolidation",
    "alone",
    "faiss",
}


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """python bench/<script> with args, from the repository root (output captured)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_bench_suite_smoke(tmp_path: Path) -> None:
    # The followers phase runs the server's default (one process per core, at most 4); on one core
    # that is one process, and the phase is asked for two instead.
    default = min(usable_cores(), AUTO_PROCESSES_MOST)
    procs = default if default > 1 else 2
    proc = run_bench(
        "suite.py",
        *("--n", "600", "--dim", "32", "--seconds", "0.5", "--recall-queries", "20", "--rounds", "2"),
        *("--no-chroma", "--out", str(tmp_path)),
        *(() if default > 1 else ("--search-processes", "2")),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "suite.json").read_text())
    rows = results["rows"]
    assert {r["phase"] for r in rows} == PHASES
    assert {"memory", "recall", "startup", "consolidation"} <= set(results["phases"])
    for r in rows:
        assert r["ops_per_s"] > 0, r
        assert r.get("errors", 0) == 0, r
    names = {(r["phase"], r["concurrency"]) for r in rows}
    for phase in ("empty_rpc", "search", "filtered_search"):
        assert {(phase, 1), (phase, 16)} <= names
    assert [p["concurrency"] for p in results["concurrency_curve"]] == [1, 2, 4, 8, 16]
    assert results["size_curve"][-1]["memories"] == 600 and len(results["size_curve"]) >= 2
    similarity = {r["concurrency"] for r in rows if "similarity strategy" in r["name"]}
    assert similarity == {1, 16}
    # The searches compared with each other: measured in alternating rounds, a row each (the rounds
    # taken together), at concurrency 1 and 16.
    compared = [r for r in rows if r.get("rounds") and r["phase"] == "search"]
    kinds = ("similarity strategy", "default, vector + text", "similarity + hybrid", "comprehensive + hybrid")
    assert sorted(r["name"].split("k=10 ")[1] for r in compared if r["concurrency"] == 1) == sorted(
        (*kinds, "comprehensive, vector only")
    )
    assert len(compared) == 10 and all(r["rounds"] == 2 and "round" not in r["name"] for r in compared)
    for r in compared:  # (the two rounds of 0.25 s pooled)
        assert r["ops"] / r["ops_per_s"] == pytest.approx(0.5), r
    # Alternating: every search once a round, the second round starting one search later.
    started = re.findall(
        r"\[search\] SearchMemories k=10 (.+?) \(round (\d) of 2\) at concurrency 1 ", proc.stdout
    )
    assert [int(rnd) for _, rnd in started] == [1] * 5 + [2] * 5
    first, second = [name for name, _ in started[:5]], [name for name, _ in started[5:]]
    assert sorted(first) == sorted((*kinds, "comprehensive, vector only")) and second == first[1:] + first[:1]
    assert proc.stdout.count("    round ") == 20  # (each round's figures printed)
    figures = results["figures"]
    for key in ("sim", "fused_text", "sim_hybrid", "hybrid", "comprehensive"):
        for at in ("c1", "hi"):
            assert all(figures[f"{key}_{at}_{m}"] > 0 for m in ("p50", "p99", "ops")), (key, at)
            each = figures[f"{key}_{at}_p50_rounds"]  # (each round's own p50)
            pooled = figures[f"{key}_{at}_p50"]  # (the median of both rounds together: between theirs)
            assert len(each) == 2 and min(each) - 1e-9 <= pooled <= max(each) + 1e-9, (key, at, each)
    scatter = [r for r in results["ratios"] if "round by round" in r["name"] and "/ similarity" in r["name"]]
    assert [r["name"].split(" p50")[0] for r in scatter] == ["default with text c1", "default with text c16"]
    for r, at in zip(scatter, ("c1", "hi"), strict=True):
        text, similarity = figures[f"fused_text_{at}_p50_rounds"], figures[f"sim_{at}_p50_rounds"]
        each = [a / b for a, b in zip(text, similarity, strict=True)]
        assert r["value"] == pytest.approx(statistics.median(each)) and r["meets"] is None
        assert r["name"].endswith(", ".join(f"{x:.2f}" for x in each) + " (the median)")
    # The text search's p99 at 1 of each round (one slow round sets the p99 of all together).
    (tails,) = [
        r for r in results["ratios"] if r["name"].startswith("default with text c1 p99 round by round")
    ]
    each99 = figures["fused_text_c1_p99_rounds"]
    assert len(each99) == 2 and all(x > 0 for x in each99) and tails["value"] == min(each99), each99
    assert tails["name"].endswith(", ".join(f"{x:.2f}" for x in each99) + " ms (the lowest)")
    # The machine's own tail: a fixed CPU task calibrated to the text search's p50 at concurrency 1.
    (task,) = [r for r in rows if r["phase"] == "machine"]
    assert task["concurrency"] == 1 and task["name"].startswith("fixed CPU task of ")
    target = figures["fused_text_c1_p50"]
    assert 0.25 * target < figures["cpu_c1_p50"] < 4 * target, (figures["cpu_c1_p50"], target)
    tail, needed = (r for r in results["ratios"] if "fixed CPU task" in r["name"] or "that tail" in r["name"])
    assert (
        tail["value"] == pytest.approx(figures["cpu_c1_p99"] / figures["cpu_c1_p50"]) and tail["value"] >= 1
    )
    assert needed["value"] == pytest.approx(2.5 / tail["value"]) and needed["meets"] is None
    # The engine alone, in process, on a copy of the memories searched above: both kinds from 1
    # thread and from 16; then both at 16 through a bare grpcio server around it; the context rows
    # read from those figures.
    alone = {(r["name"], r["concurrency"]) for r in rows if r["phase"] == "alone"}
    kinds = ("similarity strategy", "default, vector + text")
    assert alone == {
        (f"Engine.search k=10 {kind}, in process, no RPC", c) for kind in kinds for c in (1, 16)
    } | {(f"SearchMemories k=10 {kind}, bare grpcio server around the engine", 16) for kind in kinds}
    for kind in ("sim", "text"):
        for at in ("c1", "hi"):
            assert all(figures[f"alone_{kind}_{at}_{m}"] > 0 for m in ("p50", "p99", "ops")), (kind, at)
            assert len(figures[f"alone_{kind}_{at}_p50_rounds"]) == 2
    bare = [r for r in rows if r["phase"] == "alone" and "bare grpcio" in r["name"]]
    assert all(r["errors"] == 0 and r["rounds"] == 2 and r["server_cores"] > 0 for r in bare), bare
    assert figures["bare_sim_hi_ops"] > 0 and figures["bare_text_hi_ops"] > 0
    alone_p99, alone_chroma, alone_threads = (
        r for r in results["ratios"] if r["name"].startswith("engine alone")
    )
    assert alone_p99["value"] == pytest.approx(figures["alone_text_c1_p99"]) and alone_p99["meets"] is None
    assert alone_chroma["value"] is None  # (no Chroma in this run)
    threads = figures["alone_text_hi_ops"] / figures["alone_text_c1_ops"]
    assert alone_threads["value"] == pytest.approx(threads) and alone_threads["meets"] is None
    by_chroma, reached = (r for r in results["ratios"] if "bare grpcio" in r["name"])
    assert by_chroma["value"] is None and by_chroma["meets"] is None  # (no Chroma in this run)
    assert reached["value"] == pytest.approx(figures["fused_text_hi_ops"] / figures["bare_text_hi_ops"])
    assert reached["meets"] is None
    # The server's CPU over each load through it: cores used and CPU a call, in rows and figures.
    served = [r for r in rows if r["phase"] in ("empty_rpc", "search", "followers")]
    assert served and all(r["server_cores"] > 0 and r["server_cpu_ms_per_op"] > 0 for r in served)
    for key in ("fused_text_hi_cores", "sim_hi_cores", "fol_text_hi_cores", "fol1_text_hi_cores"):
        assert figures[key] > 0, key
    per_core = [r for r in results["ratios"] if "server CPU" in r["name"]]
    assert len(per_core) == 3 and all(r["value"] is None and r["meets"] is None for r in per_core)
    assert results["memory"]["anon_after_bytes"] > 0 and results["memory"]["file_after_bytes"] > 0
    # The followers' memory: all processes' anonymous RSS, and its growth less each process's start.
    mem = results["memory"]
    assert mem["followers"] == procs and mem["followers_default"] == (default > 1)
    assert mem["followers_anon_bytes"] > 0 and mem["anon_before_bytes"] > 0
    growth = mem["followers_anon_bytes"] - procs * mem["anon_before_bytes"]
    assert mem["followers_anon_growth_bytes"] == growth
    (grown,) = [r for r in results["ratios"] if "growth of all" in r["name"]]
    assert grown["value"] == pytest.approx(mem["followers_anon_growth_bytes"] / 600 / (32 * 4 + 32 * 2 * 4))
    filtered = {r["name"] for r in rows if r["phase"] == "filtered_search"}
    assert any("10%" in n for n in filtered) and any("1%" in n for n in filtered)

    recall = results["recall"]
    assert {(r["selectivity_pct"], r["kind"]) for r in recall} == {
        (s, k) for s in (100, 10, 1) for k in ("similarity", "combined")
    }
    for r in recall:
        assert 0.0 <= r["strict"] <= 1.0 and 0.0 <= r["tolerant"] <= 1.0, r

    (st,) = results["startup"]
    assert st["clean_start_s"] > 0 and st["kill9_start_s"] > 0
    assert st["memories_after_clean"] == st["memories_after_kill9"] == st["memories"] >= 600
    assert results["consolidation"]["seconds"] > 0
    during = results["consolidation"]["searches_during"]
    assert during["ops"] >= 1 and during["errors"] == 0 and during["max_ms"] >= during["p50_ms"] > 0

    assert results["memory"]["rss_after_bytes"] > 0
    assert results["memory"]["memories"] == 600
    assert len(results["ratios"]) >= 15
    assert any("Chroma" in n for n in results["not_measured"])
    assert any("1,000,000" in n for n in results["not_measured"])
    for r in results["ratios"]:
        assert r["meets"] in (True, False, None)
        assert r["value"] is None or not math.isnan(r["value"]) or r["meets"] is None
    for png in results.get("plots", []):
        assert (tmp_path / png).stat().st_size > 0
    md = (tmp_path / "suite.md").read_text()
    assert "| phase |" in md and "| ratio |" in md and "| recall" in md
    assert "not measured in this run" in md.lower()
    print(md)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_bench_gil_smoke(tmp_path: Path) -> None:
    """bench/gil.py end to end at a tiny size: every row measured (figures printed, not asserted)."""
    out = tmp_path / "gil.json"
    proc = run_bench("gil.py", *("--n", "600", "--dim", "32", "--seconds", "0.3", "--json", str(out)))
    print(proc.stdout, proc.stderr[-3000:])
    assert proc.returncode == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["strategy"], r["how"]) for r in rows] == [
        (s, how)
        for s in ("default", "similarity")
        for how in ("1 thread", "2 threads, 1 process", "2 processes, 1 thread each")
    ]
    for r in rows:
        assert r["searches_per_s"] > 0 and r["cpu_ms_per_search"] > 0, r


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_bench_suite_startup_only(tmp_path: Path) -> None:
    """--startup-only: just the --startup-n phase (a data dir built through BatchCreateMemories, then
    timed start-ups after a clean stop and after kill -9), no other phase; the rest's ratios are n/a."""
    proc = run_bench(
        "suite.py",
        *("--startup-only", "--startup-n", "1500", "--n", "200", "--dim", "32", "--seconds", "1"),
        *("--no-chroma", "--no-plots", "--out", str(tmp_path)),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads((tmp_path / "suite.json").read_text())
    # The searches on the --startup-n data only: similarity and the default with text, c1 and high;
    # then the engine alone on that data (the same searches, no RPC), and the keyword pass alone over
    # the same texts by the kernel, tantivy and bm25s.
    assert {r["phase"] for r in results["rows"]} == {"startup"} and len(results["rows"]) == 11
    searches = [r for r in results["rows"] if r["name"].startswith("SearchMemories")]
    assert len(searches) == 4 and all(r["rounds"] == 4 for r in searches)  # (alternating, the default 4)
    assert all(r["ops"] / r["ops_per_s"] == pytest.approx(2.0) for r in searches)  # (4 rounds of 0.5 s)
    f = results["figures"]
    for key in ("big_sim", "big_fused_text"):
        assert f[f"{key}_c1_p50"] > 0 and f[f"{key}_hi_p50"] > 0
    alone = [r for r in results["rows"] if r["name"].startswith("Engine.search")]
    assert sorted((r["name"].split(" k=10 ")[1].split(",")[0], r["concurrency"]) for r in alone) == [
        ("default", 1), ("default", 16), ("similarity strategy", 1), ("similarity strategy", 16)
    ]  # fmt: skip
    assert all(r["ops"] > 0 and r["p50_ms"] > 0 and "no RPC, 1,500 memories" in r["name"] for r in alone)
    passes = [r for r in results["rows"] if r["name"].startswith("keyword pass alone")]
    assert [r["name"].split("), ")[1].split(",")[0] for r in passes] == ["kernel", "tantivy", "bm25s"]
    assert all(r["p50_ms"] > 0 for r in passes)
    assert all("1,500 memories" in r["name"] and r.get("errors", 0) == 0 for r in results["rows"])
    (st,) = results["startup"]
    assert st["clean_start_s"] > 0 and st["kill9_start_s"] > 0
    assert st["memories_after_clean"] == st["memories_after_kill9"] == st["memories"] == st["built"] == 1500
    timed = {t["name"] for t in results["timings"]}
    assert "build 1,500 memories through BatchCreateMemories" in timed
    by_name = {r["name"]: r for r in results["ratios"]}
    assert by_name["start-up after kill -9 / clean start-up, 1,500 memories"]["meets"] in (True, False)
    assert by_name["at --startup-n: default with text c1 p50 / similarity c1 p50"]["meets"] in (True, False)
    on_its_own = "at --startup-n: engine alone, in process, no RPC: default with text / similarity from "
    c1 = by_name[on_its_own + "1 thread, p50"]
    assert c1["value"] == pytest.approx(f["big_alone_text_c1_p50"] / f["big_alone_sim_c1_p50"])
    hi = by_name[on_its_own + "16 threads (similarity's searches a second / text's)"]
    assert hi["value"] == pytest.approx(f["big_alone_sim_hi_ops"] / f["big_alone_text_hi_ops"])
    bound = next(r for n, r in by_name.items() if n.startswith("at --startup-n: fastest keyword pass"))
    fastest = min(r["p50_ms"] for r in passes)
    assert bound["value"] == pytest.approx(fastest / (0.3 * results["figures"]["big_sim_c1_p50"]))
    assert all(r["meets"] is None for n, r in by_name.items() if "start-up" not in n and "startup-n" not in n)
    print((tmp_path / "suite.md").read_text())


def test_bench_suite_startup_only_needs_startup_n() -> None:
    proc = run_bench("suite.py", "--startup-only")
    assert proc.returncode == 2 and "--startup-only needs --startup-n N" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_bench_keywords_smoke_with_its_peers(tmp_path: Path) -> None:
    """The keyword pass alone, and beside it the same best 32 from tantivy and bm25s (dev
    dependencies): each answers, and each ranks mostly the rows the kernel ranks best (BM25 variants
    differ a little in idf and ties)."""
    out = tmp_path / "keywords.json"
    proc = run_bench(
        "keywords.py", "--n", "3000", "--questions", "30", "--rounds", "1", "--peers", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["n"] == 3000 and report["postings_per_question"]["mean"] > 0
    peers = report["peers"]
    assert set(peers) == {"kernel", "tantivy", "bm25s"}, proc.stdout
    assert peers["kernel"]["shares_kernel_best"] == 1.0
    for name in ("tantivy", "bm25s"):
        assert peers[name]["mean"] > 0
        assert peers[name]["shares_kernel_best"] >= 0.5, (name, peers[name])


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_bench_versus_smoke(tmp_path: Path) -> None:
    """Two builds side by side (HEAD in a temporary worktree, and this tree): both servers store the
    memories, every load runs on each, and the figures of both come back per round."""
    out = tmp_path / "versus.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "versus.py"), "--base", "HEAD", "--n", "1500", "--kinds",
         "sim,text", "--conc", "1", "--rounds", "2", "--seconds", "0.5", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["base"] == "HEAD" and report["n"] == 1500
    for build in ("base", "new"):
        for kind in ("sim", "text"):
            loads = report["loads"][f"{build} {kind} c1"]
            assert len(loads) == 2 and all(r["ops_per_s"] > 0 and r["p50_ms"] > 0 for r in loads)
    assert len(report["ratios"]["new/base text c1 p50"]) == 2
    assert len(report["ratios"]["new text/sim c1 p50"]) == 2
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True)
    assert "tiermem-versus-" not in worktrees.stdout  # (its checkout removed)
