"""Huge pages under FAISS's arrays (``server/index/hugepages.py``), read back from the kernel's own
account of the process's mappings (/proc/self/smaps): the advice lands on the pages of the array,
the pages present become huge ones, and a vector index advises its storage when it grows and when
it loads."""

from __future__ import annotations

import ctypes
import mmap
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


def test_an_array_of_its_own_mapping_gets_huge_pages_and_a_small_one_none() -> None:
    size = 64 << 20
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # (as malloc maps a large allocation)
    big = mmap.mmap(-1, size, flags=private)
    small = mmap.mmap(-1, hugepages.MIN_BYTES - 4096, flags=private)
    try:
        a, b = _address(big), _address(small)
        big.write(b"\x01" * size)  # (present in 4 KB pages before the advice)
        small.write(b"\x01" * (hugepages.MIN_BYTES - 4096))
        assert "hg" not in _mapping_of(a + hugepages.HUGE)["VmFlags"].split()
        assert hugepages.advise(a, size // 2)  # (its first half)
        assert not hugepages.advise(b, hugepages.MIN_BYTES - 4096)
        assert "hg" in _mapping_of(a + hugepages.HUGE)["VmFlags"].split()
        assert "hg" not in _mapping_of(a + size - hugepages.HUGE)["VmFlags"].split()
        assert "hg" not in _mapping_of(b)["VmFlags"].split()
        deadline = time.monotonic() + 20
        while _huge_kb(a + hugepages.HUGE) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # (collapsed on the background thread)
        assert _huge_kb(a + hugepages.HUGE) >= 2048
        if "[madvise]" in _THP.read_text():  # (with "always" every large mapping may get them)
            assert _huge_kb(b) == 0
    finally:
        big.close()
        small.close()


def _storage_address(index: VectorIndex) -> int:
    return int(index._stored(index.indexed).ctypes.data)


def test_a_vector_index_advises_its_storage_when_it_grows_and_when_it_loads(tmp_path: Path) -> None:
    """Vectors past MIN_BYTES: the mapping under HNSW's storage is advised after the add, and again
    in a snapshot loaded back (a fresh allocation)."""
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
    assert "hg" in _mapping_of(_storage_address(again) + hugepages.HUGE)["VmFlags"].split()
