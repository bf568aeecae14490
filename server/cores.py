"""The cores this process may use: its CPU affinity (a container's cpuset, say), and no more than a
cgroup CPU quota allows (a container's or a systemd unit's ``--cpus`` / ``CPUQuota``), which the
affinity does not show. Sizes the search turns, FAISS's threads and the search processes. Quotas
are read where the hierarchies are usually mounted (``/sys/fs/cgroup``); one set above a cgroup
namespace's root cannot be seen from inside it."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup CPU quota if any."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1
    quota = quota_cores()
    return min(cores, quota) if quota else cores


def quota_cores(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> int | None:
    """The cores the CPU quotas of this process's cgroup and its ancestors allow, rounded up (the
    least of them); None where none is set or none can be read. cgroup v2 (``cpu.max``) and v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` under the ``cpu`` hierarchy)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy at the root
            found += _each_up(root, path, _v2)
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            found += _each_up(root / controllers, path, _v1)
    return min(found) if found else None


def _each_up(base: Path, path: str, read: Callable[[Path], int | None]) -> list[int]:
    """The quota at the cgroup ``path`` under ``base`` and at each of its ancestors, where set."""
    out: list[int] = []
    parts = [p for p in path.split("/") if p]
    if ".." in parts:  # (a cgroup outside this namespace's root: not under the mount)
        return out
    for depth in range(len(parts), -1, -1):
        cores = read(base.joinpath(*parts[:depth]))
        if cores:
            out.append(cores)
    return out


def _v2(directory: Path) -> int | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def _v1(directory: Path) -> int | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else max(1, math.ceil(quota / period))
    except (OSError, ValueError):
        return None
