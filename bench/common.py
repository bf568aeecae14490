"""Shared by the benchmarks: seeded data that behaves like text embeddings, and a server process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np


def clustered_vectors(n: int, dim: int, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded, clustered, normalized float32 vectors and their cluster centres."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((clusters, dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    labels = rng.integers(0, clusters, n)
    x = centres[labels] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32) / np.sqrt(dim) * 4
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), centres


def start_server(data_dir: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``python -m tiermem.server`` on 127.0.0.1 port 0 (a separate process); returns (process, target)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tiermem.server",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on ([^:]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, f"{m.group(1)}:{m.group(2)}"
    raise RuntimeError("server did not start")
