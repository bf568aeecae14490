"""Huge pages under FAISS's arrays (``server/index/hugepages.py``), read back from the kernel's own
account of the process's mappings (/proc/self/smaps): the advice lands on the pages of the array,
the pages present become huge ones, and a vector index advises its storage when it grows and when
asked after a load (start-up asks for a snapshot it keeps)."""

from __future__ import annotations

import ctypes
import mmap
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tiermem.server.index import hugepages
from tiermem.server.index.vector_index import VectorIndex

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _THP.exists() or "[never]" in _THP.read_text(),
    reason="transparent huge pages: Linux, not switched off",
)


def _mapping_of(address: int) -> dict[str, str]:
    """The smaps fields of the mapping holding ``address``."""
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            if inside:
                break
            inside = lo <= address < hi
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    assert fields, "no mapping holds the address"
    return fields


def _huge_kb(address: int) -> int:
    return int(_mapping_of(address)["AnonHugePages"].split()[0])


def _address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # (as malloc maps a large allocation)
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _collapse_works() -> bool:
    """Whether this kernel collapses pages on request now (6.1 and later, memory to spare)."""
    scratch = mmap.mmap(-1, 2 * hugepages.HUGE, flags=_PRIVATE)
    try:
        scratch.write(b"\x01" * (2 * hugepages.HUGE))
        a = _address(scratch)
        lo = -(-a // hugepages.HUGE) * hugepages.HUGE
        if lo + hugepages.HUGE > a + 2 * hugepages.HUGE:
            return False
        return _LIBC.madvise(lo, hugepages.HUGE, 14) == 0 and _LIBC.madvise(lo, hugepages.HUGE, 25) == 0
    finally:
        scratch.close()


def test_an_advised_array_gets_huge_pages_at_once_and_a_small_one_none() -> None:
    """Its pages present before the advice are collapsed within seconds (the kernel's own
    background scan would take far longer for the whole range)."""
    if not _collapse_works():
        pytest.skip("this kernel does not collapse pages on request now")
    size = 64 << 20
    big = mmap.mmap(-1, size, flags=_PRIVATE)
    small = mmap.mmap(-1, hugepages.MIN_BYTES - 4096, flags=_PRIVATE)
    try:
        a, b = _address(big), _address(small)
        assert _LIBC.madvise(a, size, 15) == 0  # (MADV_NOHUGEPAGE: 4 KB pages even where "always")
        big.write(b"\x01" * size)  # (present in 4 KB pages before the advice)
        small.write(b"\x01" * (hugepages.MIN_BYTES - 4096))
        assert "hg" not in _mapping_of(a + hugepages.HUGE)["VmFlags"].split()
        assert hugepages.advise(a, size // 2)  # (its first half)
        assert not hugepages.advise(b, hugepages.MIN_BYTES - 4096)
        assert "hg" in _mapping_of(a + hugepages.HUGE)["VmFlags"].split()
        assert "hg" not in _mapping_of(a + size - hugepages.HUGE)["VmFlags"].split()
        assert "hg" not in _mapping_of(b)["VmFlags"].split()
        advised_kb = (size // 2 - hugepages.HUGE) >> 10  # (its whole 2 MB pages: a is page-aligned)
        deadline = time.monotonic() + 5
        while _huge_kb(a + hugepages.HUGE) < advised_kb and time.monotonic() < deadline:
            time.sleep(0.05)  # (collapsed on the background thread)
        assert _huge_kb(a + hugepages.HUGE) >= advised_kb
        if "[madvise]" in _THP.read_text():  # (with "always" every large mapping may get them)
            assert _huge_kb(b) == 0
    finally:
        big.close()
        small.close()


def _storage_address(index: VectorIndex) -> int:
    return int(index._stored(index.indexed).ctypes.data)


def test_a_vector_index_advises_its_storage_when_it_grows_and_after_a_load(tmp_path: Path) -> None:
    """Vectors past MIN_BYTES: the mapping under HNSW's storage is advised after the add, and again
    in a snapshot loaded back (a fresh allocation). In a fresh process: in this one, the allocator
    may place the small storage in memory an earlier test's index had advised."""
    code = "import runpy, sys; runpy.run_path(sys.argv[1])['_grows_and_loads'](sys.argv[2])"
    out = subprocess.run(
        [sys.executable, "-c", code, __file__, str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]


def _grows_and_loads(folder: str) -> None:
    """The test above, in the process that runs it."""
    tmp_path = Path(folder)
    dim = 512
    count = hugepages.MIN_BYTES // (dim * 4) + 1024
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((count, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = VectorIndex(dim, m=8, ef_construction=16)  # (no indexer: an add moves into HNSW at once)
    ids = np.arange(count, dtype=np.int64)
    index.add(vectors[: count // 4], ids[: count // 4], ids[: count // 4])  # (small yet: not advised)
    assert index.indexed == count // 4 and not index._huge
    assert "hg" not in _mapping_of(_storage_address(index))["VmFlags"].split()
    index.add(vectors[count // 4 :], ids[count // 4 :], ids[count // 4 :])
    assert index.indexed == count and set(index._huge) == {"vectors"}  # (the links are small here)
    assert "hg" in _mapping_of(_storage_address(index) + hugepages.HUGE)["VmFlags"].split()
    rows, _, _ = index.search(vectors[7], 1, np.ones(count, np.bool_), 64)
    assert rows.tolist() == [7]

    index.save(tmp_path / "ix", "m", "inst")
    loaded = VectorIndex.load(tmp_path / "ix", "m", dim, 16, "inst")
    assert loaded is not None
    again = loaded[0]
    assert not again._huge  # (start-up advises a snapshot it keeps, after reviving its entries)
    again.advise_huge_pages()
    assert set(again._huge) == {"vectors"}
    assert "hg" in _mapping_of(_storage_address(again) + hugepages.HUGE)["VmFlags"].split()


def test_nothing_is_asked_where_the_machine_says_never(tmp_path: Path) -> None:
    """A machine set to ``never`` (read from a copy of the setting here, in a fresh process): no
    advice, no collapse (the collapse would not heed the setting)."""
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    code = """
import ctypes, mmap, sys
from pathlib import Path
from tiermem.server.index import hugepages
hugepages._SETTING = Path(sys.argv[1])
buf = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
a = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print(hugepages.advise(a, 64 << 20), hugepages._collapses is None)
inside = False
for line in open("/proc/self/smaps"):
    head = line.split(" ", 1)[0]
    if "-" in head and ":" not in head:
        lo, hi = (int(x, 16) for x in head.split("-"))
        inside = lo <= a + (2 << 20) < hi
    elif inside and line.startswith("VmFlags"):
        print(" hg" in line)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(setting)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "True", "False"]
