"""The cores a server sizes itself by: a cgroup CPU quota caps the affinity (cgroup v2 and v1
trees laid out in a temporary directory as the kernel lays them out)."""

from __future__ import annotations

from pathlib import Path

from tiermem.server.cores import quota_cores


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_v2_quota_caps_the_cores_rounded_up_the_least_of_the_cgroup_and_its_ancestors(
    tmp_path: Path,
) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/system.slice/tiermem.service\n")
    root = tmp_path / "fs"
    _tree(root, {"system.slice/tiermem.service/cpu.max": "150000 100000\n"})
    assert quota_cores(proc, root) == 2  # 1.5 cores: two processes may each use some
    _tree(root, {"system.slice/cpu.max": "100000 100000\n"})  # a tighter parent wins
    assert quota_cores(proc, root) == 1
    _tree(
        root, {"system.slice/cpu.max": "max 100000\n", "system.slice/tiermem.service/cpu.max": "max 100000\n"}
    )
    assert quota_cores(proc, root) is None


def test_a_v1_quota_under_the_cpu_hierarchy(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    root = tmp_path / "fs"
    _tree(
        root,
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        },
    )
    assert quota_cores(proc, root) == 3
    _tree(root, {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "-1\n"})  # no quota
    assert quota_cores(proc, root) is None


def test_no_quota_where_nothing_can_be_read(tmp_path: Path) -> None:
    assert quota_cores(tmp_path / "missing", tmp_path) is None
    proc = tmp_path / "cgroup"
    proc.write_text("garbage\n0::/\n")
    _tree(tmp_path / "fs", {"cpu.max": "not numbers\n"})
    assert quota_cores(proc, tmp_path / "fs") is None


def test_a_cgroup_outside_the_namespace_root_reads_nothing_above_the_mount(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/../../elsewhere\n")
    _tree(tmp_path / "fs", {"cpu.max": "100000 100000\n"})
    _tree(tmp_path, {"elsewhere/cpu.max": "100000 100000\n"})
    assert quota_cores(proc, tmp_path / "fs") is None
