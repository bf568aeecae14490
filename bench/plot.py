"""Plots of a suite.json: throughput and p99 latency against collection size and against concurrency.

    .venv-bench/bin/python bench/plot.py bench/results/suite.json

Writes ``suite_size.png`` and ``suite_concurrency.png`` next to the JSON. Needs only matplotlib (run by
bench/suite.py with .venv-bench's Python, or any Python that has matplotlib).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

THOUSANDS = FuncFormatter(lambda x, _pos: f"{x:,.0f}")


def _scale(ax: Any) -> None:
    """Log y when the series span more than 10x (the ceilings dwarf the measured line), else from 0."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata() if y > 0]
    if ys and max(ys) / min(ys) > 10:
        ax.set_yscale("log")
        ax.set_ylabel(ax.get_ylabel() + " (log scale)")
        ax.yaxis.set_major_formatter(THOUSANDS)
    else:
        ax.set_ylim(bottom=0)


def _row(res: dict[str, Any], phase: str, conc: int, name_part: str = "") -> dict[str, Any] | None:
    for r in res["rows"]:
        if r["phase"] == phase and r["concurrency"] == conc and name_part in r["name"]:
            return r
    return None


def _subtitle(res: dict[str, Any]) -> str:
    m, p = res["machine"], res["params"]
    return (
        f"n={p['n']:,} dim={p['dim']}, {m['cpus']} cores ({m['cpu']}), client and server on the same "
        f"machine; HNSW M=32 efC=128 efS=64"
    )


def plot_size(res: dict[str, Any], path: Path) -> None:
    curve = sorted(res["size_curve"], key=lambda p: p["memories"])
    hi = res["params"]["concurrency"]
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(12, 4.8))
    for conc, style in ((1, "o-"), (hi, "s-")):
        pts = [(p["memories"], p[f"c{conc}"]) for p in curve if f"c{conc}" in p]
        if not pts:
            continue
        xs = [x for x, _ in pts]
        ax_t.plot(xs, [r["ops_per_s"] for _, r in pts], style, label=f"tiermem search k=10, c{conc}")
        ax_p.plot(xs, [r["p99_ms"] for _, r in pts], style, label=f"tiermem search k=10, c{conc}")
    for ax, ylabel in ((ax_t, "queries/s"), (ax_p, "p99 latency (ms)")):
        ax.set_xlabel("memories in the collection")
        ax.xaxis.set_major_formatter(THOUSANDS)
        ax.set_ylabel(ylabel)
        _scale(ax)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_t.set_title("Search throughput vs collection size")
    ax_p.set_title("Search p99 vs collection size")
    fig.suptitle(_subtitle(res), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_concurrency(res: dict[str, Any], path: Path) -> None:
    curve = sorted(res["concurrency_curve"], key=lambda p: p["concurrency"])
    hi = res["params"]["concurrency"]
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = [p["concurrency"] for p in curve]
    ax_t.plot(xs, [p["ops_per_s"] for p in curve], "o-", label="tiermem search k=10")
    ax_p.plot(xs, [p["p99_ms"] for p in curve], "o-", label="tiermem search k=10")
    refs = (
        ("empty_rpc", "", "empty RPC (health Check)", "k^"),
        ("chroma", "query", "Chroma query k=10 (HTTP)", "rv"),
    )
    for phase, part, label, style in refs:
        pts = [(c, _row(res, phase, c, part)) for c in (1, hi)]
        pts = [(c, r) for c, r in pts if r is not None]
        if pts:
            for ax, key in ((ax_t, "ops_per_s"), (ax_p, "p99_ms")):
                ax.plot([c for c, _ in pts], [r[key] for _, r in pts], style, markersize=9, label=label)
    for ax, ylabel in ((ax_t, "ops/s"), (ax_p, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency (in-flight requests)")
        ax.set_ylabel(ylabel)
        _scale(ax)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_t.set_title("Throughput vs concurrency")
    ax_p.set_title("p99 vs concurrency")
    fig.suptitle(_subtitle(res), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: plot.py SUITE_JSON")
    src = Path(sys.argv[1])
    res = json.loads(src.read_text())
    for name, fn in (("suite_size.png", plot_size), ("suite_concurrency.png", plot_concurrency)):
        fn(res, src.parent / name)
        print(f"wrote {src.parent / name}")


if __name__ == "__main__":
    main()
