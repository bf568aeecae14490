"""Storage faults (issue 26), each on real files: LMDB in a temp dir (or on a small tmpfs), real
FAISS snapshots, real server processes where the exit matters.

- A full disk answers RESOURCE_EXHAUSTED (STORAGE_FULL, metadata resource=disk) and changes nothing;
  a SIGTERM then skips the snapshots with a warning and exits 0. The disk is a small tmpfs (needs
  root or CAP_SYS_ADMIN, skipped otherwise) and, everywhere, a file-size limit (RLIMIT_FSIZE: LMDB's
  writes past it come back short, EIO, then EFBIG), in a server process of its own.
- A full LMDB map still takes deletes, so space can be freed, and creates work again after.
- A truncated data.mdb is refused at start-up with one line (it used to die of SIGBUS).
- A damaged snapshot file of any kind is detected by its checksum, discarded with a warning and
  rebuilt from LMDB: every memory is found again by its own vector and ListMemories works.
- With the LOCK file deleted a second server is still refused (the lock is on data.mdb itself).
- A read-only data directory is refused with one line naming it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import ServerProcess, spawn_server

from tiermem.client import MemoryClient
from tiermem.client.errors import NotFoundError, ResourceExhaustedError
from tiermem.server.config import Tuning
from tiermem.server.storage.store import Store
from tiermem.server.transport.app import RunningServer

pytestmark = pytest.mark.timeout(240)

MODEL, DIM = "faults", 16
_LISTENING = re.compile(r"tiermem listening on [^:]+:(\d+)")
# A server process's environment: no background passes, searches that record nothing.
_ENV = {"TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0", "TIERMEM_SEARCH_RECORDS_ACCESS": "0"}


def _vecs(n: int, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _client(target: str) -> MemoryClient:
    c = MemoryClient(target, timeout=60)
    c.wait_ready()
    return c


def _finds_itself(c: MemoryClient, ns: str, mid: str, vec: np.ndarray) -> bool:
    hits = c.search(
        ns, vec.tolist(), embedding_model=MODEL, limit=1, alpha=1, beta=0, gamma=0, read_only=True
    )
    return bool(hits) and hits[0].memory.id == mid


def _server_command(data_dir: Path, fsize_limit: int | None) -> list[str]:
    args = ["--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), "--log-level", "WARNING"]
    if fsize_limit is None:
        return [sys.executable, "-m", "tiermem.server", *args]
    # The limit is set in the server process itself (no preexec_fn in a threaded pytest). SIGXFSZ
    # ignored: a write past the limit then fails with EFBIG (or comes back short) instead of killing.
    boot = (
        "import resource, runpy, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize_limit}, {fsize_limit}))\n"
        "sys.argv = ['tiermem-server', *sys.argv[1:]]\n"
        "runpy.run_module('tiermem.server', run_name='__main__')\n"
    )
    return [sys.executable, "-c", boot, *args]


class _Output:
    """A server process's output, read on a thread (so the pipe never fills), kept for asserts."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.port = threading.Event()
        self.port_number = 0
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                self.lines.append(line)
                m = _LISTENING.search(line)
                if m:
                    self.port_number = int(m.group(1))
                    self.port.set()

    def text(self) -> str:
        self._thread.join(10)
        return "".join(self.lines)


def _spawn(
    data_dir: Path, fsize_limit: int | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], _Output]:
    proc = subprocess.Popen(
        _server_command(data_dir, fsize_limit),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **_ENV, "TIERMEM_SNAPSHOT_INTERVAL_SECONDS": "0", **(env or {})},
    )
    out = _Output(proc)
    deadline = time.monotonic() + 120
    while not out.port.wait(0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError("server did not start:\n" + out.text())
    return proc, out


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def _start_fails(data_dir: Path) -> tuple[int, str]:
    """Start a server that must not come up: its exit status and output."""
    r = subprocess.run(
        _server_command(data_dir, None),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **_ENV},
    )
    assert not _LISTENING.search(r.stdout + r.stderr), "the server started"
    return r.returncode, r.stdout + r.stderr


def _one_line_error(code: int, output: str, *words: str) -> str:
    """The exit was clean and said why on one line: non-zero (not a signal), no traceback."""
    assert code > 0, (code, output)
    assert "Traceback" not in output, output
    [line] = [ln for ln in output.splitlines() if ln.startswith("tiermem-server: cannot start:")]
    for word in words:
        assert word in line, (word, line)
    return line


def _fill(
    c: MemoryClient, vecs: np.ndarray, content_bytes: int, first: int = 0, create_time: float | None = None
) -> tuple[list[int], ResourceExhaustedError]:
    """Create memories m<i> (i from ``first``, content of ``content_bytes``, created at
    ``create_time`` if given) until storage is full; returns the i of those acknowledged and the
    error of the first refused."""
    acked: list[int] = []
    at = {} if create_time is None else {"create_time": create_time}
    for i in range(first, len(vecs)):
        v = vecs[i]
        try:
            c.create(
                "ns",
                f"m{i} " + "x" * content_bytes,
                id=f"m{i}",
                embedding=v.tolist(),
                embedding_model=MODEL,
                **at,
            )
        except ResourceExhaustedError as e:
            return acked, e
        acked.append(i)
    raise AssertionError(f"storage never filled up ({len(acked)} memories)")


def _refused_changed_nothing(c: MemoryClient, vecs: np.ndarray, acked: list[int], refused: int) -> None:
    with pytest.raises(NotFoundError):
        c.get("ns", f"m{refused}")
    listed = sorted(int(m.id[1:]) for m in c.list_memories("ns"))
    assert listed == acked
    assert c.stats("ns").memory_count == len(acked)
    for i in acked[:: max(1, len(acked) // 20)]:
        assert _finds_itself(c, "ns", f"m{i}", vecs[i])


# -- 1 and 2: a full disk ------------------------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 12 MiB tmpfs (LMDB and the snapshots on a disk that fills up for real)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (the file-size-limit test covers a full disk)")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_refuses_writes_cleanly_and_a_sigterm_still_exits_0(small_fs: Path) -> None:
    data = small_fs / "data"
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * (3 * 1024 * 1024))  # freed later, to restart on the same disk
    vecs = _vecs(2000, seed=1)
    proc, out = _spawn(data)
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            acked, err = _fill(c, vecs, 30_000)
            assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert err.reason == "STORAGE_FULL" and err.metadata.get("resource") == "disk", err
            assert len(acked) > 50
            refused = len(acked)
            with pytest.raises(ResourceExhaustedError):  # still full, still refused cleanly
                c.create(
                    "ns",
                    "one more " + "y" * 30_000,
                    id="late",
                    embedding=vecs[-1].tolist(),
                    embedding_model=MODEL,
                )
            _refused_changed_nothing(c, vecs, acked, refused)
        # SIGTERM on the full disk: the shutdown snapshots cannot be written, and are skipped.
        assert _stop(proc) == 0, out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.text()
    assert "Traceback" not in text, text
    assert re.search(r"snapshot .*skipped", text), text
    ballast.unlink()
    proc, out = _spawn(data)
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            assert sorted(int(m.id[1:]) for m in c.list_memories("ns")) == acked
            for i in acked:
                assert _finds_itself(c, "ns", f"m{i}", vecs[i])
            c.create(
                "ns", "after space was freed", id="again", embedding=vecs[-2].tolist(), embedding_model=MODEL
            )
        assert _stop(proc) == 0, out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_file_size_limit_is_a_full_disk(tmp_path: Path) -> None:
    """RLIMIT_FSIZE stands in for a full disk where no tmpfs can be mounted: LMDB's write that
    crosses the limit comes back short (EIO), later ones fail with EFBIG."""
    data = tmp_path / "data"
    vecs = _vecs(2000, seed=2)
    proc, out = _spawn(data, fsize_limit=3 * 1024 * 1024)
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            acked, err = _fill(c, vecs, 20_000)
            assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            assert err.reason == "STORAGE_FULL" and err.metadata.get("resource") == "disk", err
            for _ in range(3):  # past the limit now: EFBIG
                with pytest.raises(ResourceExhaustedError) as again:
                    c.create(
                        "ns",
                        "more " + "y" * 20_000,
                        id="late",
                        embedding=vecs[-1].tolist(),
                        embedding_model=MODEL,
                    )
                assert again.value.metadata.get("resource") == "disk"
            _refused_changed_nothing(c, vecs, acked, len(acked))
        assert _stop(proc) == 0, out.text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in out.text(), out.text()
    proc, out = _spawn(data)  # no limit: the same data, and room again
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            assert sorted(int(m.id[1:]) for m in c.list_memories("ns")) == acked
            c.create(
                "ns",
                "room again " + "z" * 20_000,
                id="again",
                embedding=vecs[-2].tolist(),
                embedding_model=MODEL,
            )
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_background_passes_on_a_full_disk_log_one_line_not_a_traceback_each(tmp_path: Path) -> None:
    """A full disk is a state the server is in: a maintenance pass whose moves it cannot store
    says so in one WARNING line when it begins (and once a minute while it lasts), not an ERROR
    with its traceback every pass."""
    env = {
        "TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0.2",
        "TIERMEM_DEFAULT_TIER": "1",
        "TIERMEM_TIER_TTL_SECONDS": "3,3600,86400,604800",  # (FAST memories move down after 3 s)
        "TIERMEM_TIER_CADENCE_SECONDS": "0,0.2,60,600,3600",  # (FAST looked at every pass)
    }
    proc, out = _spawn(tmp_path / "data", fsize_limit=3 * 1024 * 1024, env=env)
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            # All created at one time, so all of them are due to move down in the same pass: one
            # commit too large for what the full disk has left (moved a few at a time, as they
            # were stored, the first few could fit in the pages LMDB frees as it goes).
            acked, err = _fill(c, _vecs(2000, seed=4), 20_000, create_time=time.time())
            assert err.reason == "STORAGE_FULL" and len(acked) > 50
            time.sleep(5)  # (the TTL, then about ten passes that cannot store their moves)
            assert c.get("ns", f"m{acked[0]}").tier == 1
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.text()
    assert "Traceback" not in text and " ERROR " not in text, text
    passes = [line for line in text.splitlines() if "maintenance pass failed" in line]
    assert len(passes) == 1 and "STORAGE_FULL" in passes[0], text
    refused = [line for line in text.splitlines() if "write operations refused" in line]
    assert len(refused) == 1, text  # (the writer's own line, likewise: the create that found it full)


def test_a_namespace_is_cleared_on_a_disk_with_no_room_left(tmp_path: Path) -> None:
    """Clearing a namespace is how an operator frees a full disk: one commit deleting all of its
    memories needs pages the disk no longer has (it was STORAGE_FULL, while deletes one by one
    went through); in commits of fewer memories it frees them all, and creates fit again."""
    vecs = _vecs(2000, seed=6)
    proc, out = _spawn(tmp_path / "data", fsize_limit=3 * 1024 * 1024)
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            c.create(
                "keep", "another tenant's memory", id="k", embedding=vecs[-1].tolist(), embedding_model=MODEL
            )
            acked, err = _fill(c, vecs, 4_000)
            assert err.reason == "STORAGE_FULL" and len(acked) > 100
            assert c.delete_namespace("ns") == len(acked)
            assert c.stats("ns").memory_count == 0 and list(c.list_memories("ns")) == []
            c.create(
                "ns",
                "room again " + "z" * 4_000,
                id="again",
                embedding=vecs[-2].tolist(),
                embedding_model=MODEL,
            )
            assert [m.id for m in c.list_memories("keep")] == ["k"]
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in out.text(), out.text()
    proc, out = _spawn(tmp_path / "data")
    try:
        with _client(f"127.0.0.1:{out.port_number}") as c:
            assert [m.id for m in c.list_memories("ns")] == ["again"]
            assert _finds_itself(c, "keep", "k", vecs[-1])
        assert _stop(proc) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- 3: a full LMDB map ----------------------------------------------------------------------------


def test_a_full_map_still_takes_deletes_and_then_creates(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory(
        map_size=2 * 1024 * 1024, max_map_size=2 * 1024 * 1024, snapshot_interval_seconds=0
    )
    vecs = _vecs(5000, seed=3)
    with _client(f"127.0.0.1:{running.port}") as c:
        acked, err = _fill(c, vecs, 3000)
        assert err.reason == "STORAGE_FULL" and err.metadata.get("resource") == "map", err
        assert len(acked) > 100
        for i in acked[:50]:  # one by one: each its own commit
            c.delete("ns", f"m{i}")
        for i in acked[:50]:
            with pytest.raises(NotFoundError):
                c.get("ns", f"m{i}")
        for j in range(10):
            c.create(
                "ns",
                f"after {j} " + "z" * 3000,
                id=f"after{j}",
                embedding=vecs[-1 - j].tolist(),
                embedding_model=MODEL,
            )
        assert c.stats("ns").memory_count == len(acked) - 50 + 10
        # Deletes keep working whatever the creates took since.
        _fill(c, vecs, 3000, first=len(acked) + 1)
        for i in acked[50:100]:
            c.delete("ns", f"m{i}")
        assert c.stats("ns").memory_count < len(acked)


def test_the_reserve_for_deletes_is_not_taken_by_creates(tmp_path: Path) -> None:
    """Store level: beyond max_map_size the map has room only for writes that free space, and the
    pages in use never pass max_map_size by a commit that stores records."""
    from conftest import make_record

    from tiermem.server.storage.writer import Writer

    store = Store(tmp_path / "lmdb", map_size=1 << 20, max_map_size=1 << 20)
    writer = Writer(store, max_group=64, before_commit=lambda txn: None)
    try:
        rid = 0
        while True:
            rid += 1
            rec = make_record(rid)
            rec.content = f"memory {rid} " + "x" * 2500

            def put(txn: Any, rec: Any = rec) -> None:
                store.insert(txn, rec)

            try:
                writer.submit(put, lambda r: r)
            except Exception as e:
                assert getattr(e, "reason", "") == "STORAGE_FULL", e
                break
        assert store.map_size == store.max_map_size + store.reserve_bytes
        with store.read() as txn:
            assert store.pages_in_use(txn) <= store.max_map_size
        for r in range(1, 60):
            rec = make_record(r)
            rec.content = f"memory {r} " + "x" * 2500

            def delete(txn: Any, rec: Any = rec) -> None:
                store.delete(txn, rec)

            writer.submit(delete, lambda r: r)
        with store.read() as txn:
            assert store.record_count(txn) == rid - 1 - 59
    finally:
        writer.close()
        store.close()


# -- 4: a truncated data file --------------------------------------------------------------------


def _some_data(server_factory: Callable[..., RunningServer], data: Path, n: int = 300) -> np.ndarray:
    vecs = _vecs(n, seed=4)
    running = server_factory(data_dir=data)
    with _client(f"127.0.0.1:{running.port}") as c:
        c.create_batch(
            [
                {
                    "namespace": "ns",
                    "content": f"m{i} " + "w" * 1500,
                    "id": f"m{i}",
                    "embedding": v.tolist(),
                    "embedding_model": MODEL,
                }
                for i, v in enumerate(vecs)
            ]
        )
    running.stop(0)
    return vecs


def test_a_truncated_data_file_is_refused_with_one_line(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    _some_data(server_factory, data)
    mdb = data / "lmdb" / "data.mdb"
    size = mdb.stat().st_size
    with open(mdb, "r+b") as f:
        f.truncate(size // 2)
    code, output = _start_fails(data)
    assert code != -signal.SIGBUS, output
    _one_line_error(code, output, str(mdb), "truncated", "STORAGE_DAMAGED")
    with open(mdb, "r+b") as f:  # cut inside its meta pages
        f.truncate(6000)
    code, output = _start_fails(data)
    _one_line_error(code, output, str(mdb), "STORAGE_DAMAGED")


def test_a_short_file_whose_missing_pages_are_free_still_opens(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """LMDB does not write a page it allocated and freed in the same transaction: a file may end
    before the last page its meta counts. Made here by raising both metas' last page number: every
    page the trees reach is in the file, so it opens, and its data is all there."""
    data = tmp_path / "data"
    vecs = _some_data(server_factory, data)
    mdb = data / "lmdb" / "data.mdb"
    raw = bytearray(mdb.read_bytes())
    psize = struct.unpack_from("<I", raw, 40)[0]
    for meta in (0, psize):
        last = struct.unpack_from("<Q", raw, meta + 136)[0]
        struct.pack_into("<Q", raw, meta + 136, last + 8)
    mdb.write_bytes(bytes(raw))
    running = server_factory(data_dir=data)
    with _client(f"127.0.0.1:{running.port}") as c:
        assert c.stats("ns").memory_count == len(vecs)
        assert _finds_itself(c, "ns", "m7", vecs[7])
        c.create("ns", "still writable", id="new", embedding=vecs[0].tolist(), embedding_model=MODEL)


# -- 5: damaged snapshots ----------------------------------------------------------------------------

_HNSW_ALWAYS = {"exact_search_max_rows": 0, "tuning": Tuning(exact_entries=0, exact_per_k=0)}


def _damage(path: Path, count: int, from_end: int = 0) -> None:
    """Flip ``count`` bytes from the middle of the file (or ``from_end`` bytes before its end)."""
    raw = bytearray(path.read_bytes())
    at = len(raw) - from_end if from_end else len(raw) // 2
    for i in range(at, min(at + count, len(raw))):
        raw[i] ^= 0x01 if path.suffix == ".json" else 0xFF  # (a manifest stays ASCII)
    path.write_bytes(bytes(raw))


# kind -> (file, bytes flipped, where: 0 the middle, else this many bytes before the end)
_KINDS: dict[str, tuple[str, int, int]] = {
    "columns data": ("columns.*.bin", 4, 0),
    "columns manifest": ("columns.json", 1, 0),
    # In the stored vectors (the file's last 200 x 64 bytes): read as they are, one vector turned
    # to NaN and huge values makes most self-searches miss (125 of 200 when tried).
    "faiss index vectors": ("*.faiss", 64, 6000),
    "faiss index graph": ("*.faiss", 64, 0),
    "index vks": ("*.vks.npy", 8, 0),
    "index manifest": ("*-t[0-9].json", 1, 0),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_a_damaged_snapshot_is_discarded_and_rebuilt(
    kind: str, server_factory: Callable[..., RunningServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    vecs = _vecs(200, seed=5)
    running = server_factory(data_dir=data, **_HNSW_ALWAYS)
    with _client(f"127.0.0.1:{running.port}") as c:
        c.create_batch(
            [
                {
                    "namespace": "ns",
                    "content": f"memory {i}",
                    "id": f"m{i}",
                    "embedding": v.tolist(),
                    "embedding_model": MODEL,
                }
                for i, v in enumerate(vecs)
            ]
        )
        deadline = time.monotonic() + 30  # every vector in HNSW, so the index snapshot holds them
        while any(s.pending_vectors for s in c.stats().spaces) and time.monotonic() < deadline:
            time.sleep(0.05)
    running.stop(0)
    pattern, count, from_end = _KINDS[kind]
    [target] = list((data / "indexes").glob(pattern))
    _damage(target, count, from_end)

    caplog.set_level(logging.WARNING)
    running = server_factory(data_dir=data, **_HNSW_ALWAYS)
    damaged = [r for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    assert damaged, [r.getMessage() for r in caplog.records]
    with _client(f"127.0.0.1:{running.port}") as c:
        missed = [i for i, v in enumerate(vecs) if not _finds_itself(c, "ns", f"m{i}", v)]
        assert not missed, missed
        assert sorted(m.id for m in c.list_memories("ns")) == sorted(f"m{i}" for i in range(200))
    running.stop(0)  # writes sound snapshots again

    caplog.clear()
    running = server_factory(data_dir=data, **_HNSW_ALWAYS)
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]
    with _client(f"127.0.0.1:{running.port}") as c:
        assert all(_finds_itself(c, "ns", f"m{i}", v) for i, v in enumerate(vecs))
        assert len(list(c.list_memories("ns"))) == 200


class _Touch:
    """Pickled, a call of ``Path.touch``: what a pickle may do when read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (Path.touch, (self.path,))


def test_no_snapshot_file_can_run_code_when_read(
    server_factory: Callable[..., RunningServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The columns snapshot is msgpack and raw arrays, not a pickle: a pickle left by an older
    version is ignored (its manifest says another version) and replaced, and one put in place of
    this version's file is refused as damaged; neither is ever unpickled."""
    data = tmp_path / "data"
    _some_data(server_factory, data, n=20)
    index_dir = data / "indexes"
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(_Touch(marker))
    instance = json.loads((index_dir / "columns.json").read_text())["instance"]
    for f in index_dir.glob("columns.*"):
        f.unlink()
    (index_dir / "columns.0123456789abcdef.pkl").write_bytes(payload)
    old = {"version": 2, "seq": 1, "instance": instance, "token": "0123456789abcdef"}
    (index_dir / "columns.json").write_text(json.dumps(old))

    caplog.set_level(logging.INFO)
    running = server_factory(data_dir=data)
    assert not marker.exists()
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]  # another version: rebuilt
    with _client(f"127.0.0.1:{running.port}") as c:
        assert c.stats("ns").memory_count == 20
    running.stop(0)
    assert not list(index_dir.glob("*.pkl"))  # replaced by this version's snapshot
    [columns] = list(index_dir.glob("columns.*.bin"))
    assert columns.read_bytes().startswith(b"TMCOLS")

    columns.write_bytes(payload)
    caplog.clear()
    running = server_factory(data_dir=data)
    assert not marker.exists()
    assert [r for r in caplog.records if r.levelno == logging.WARNING and "damaged" in r.getMessage()]
    with _client(f"127.0.0.1:{running.port}") as c:
        assert c.stats("ns").memory_count == 20


# -- 6: a second server without the LOCK file ---------------------------------------------------------


def test_a_second_server_is_refused_even_without_the_lock_file(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first: ServerProcess = spawn_server(data)
    try:
        with _client(first.target) as c:
            c.create("ns", "written by the first server", id="one")
            (data / "LOCK").unlink()
            code, output = _start_fails(data)
            _one_line_error(code, output, "in use", "DATA_DIR_IN_USE")
            c.create("ns", "the first server still writes", id="two")
            assert {m.id for m in c.list_memories("ns")} == {"one", "two"}
        assert first.stop() == 0
    finally:
        first.close()
    second = spawn_server(data)  # the first one gone: the directory is free again
    try:
        with _client(second.target) as c:
            assert {m.id for m in c.list_memories("ns")} == {"one", "two"}
            c.create("ns", "three", id="three")  # a new record id, not one the first server used
            assert {m.id for m in c.list_memories("ns")} == {"one", "two", "three"}
    finally:
        second.close()


# -- 7: a read-only data directory ----------------------------------------------------------------


@contextlib.contextmanager
def _read_only(folder: Path) -> Iterator[None]:
    """``folder`` read-only: a read-only bind mount as root (root writes through permissions),
    else permissions."""
    if os.geteuid() == 0:
        if shutil.which("mount") is None:
            pytest.skip("no mount command")
        r = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot bind-mount here: {r.stderr.strip()}")
        try:
            r = subprocess.run(
                ["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True, text=True
            )
            if r.returncode:
                pytest.skip(f"cannot remount read-only here: {r.stderr.strip()}")
            yield
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=False)
        return
    paths = [folder, *folder.rglob("*")]
    modes = {p: p.stat().st_mode for p in paths}
    for p in paths:
        p.chmod(modes[p] & ~0o222)
    try:
        yield
    finally:
        for p in reversed(paths):
            p.chmod(modes[p])


def test_a_read_only_data_dir_is_refused_with_one_line(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    _some_data(server_factory, data, n=10)
    with _read_only(data):
        code, output = _start_fails(data)
    _one_line_error(code, output, str(data), "not writable", "DATA_DIR_NOT_WRITABLE")


def test_a_data_dir_that_cannot_be_created_is_refused_with_one_line(tmp_path: Path) -> None:
    parent = tmp_path / "parent"
    parent.mkdir()
    with _read_only(parent):
        code, output = _start_fails(parent / "data")
    _one_line_error(code, output, str(parent), "not writable")


def test_background_failures_tell_each_fault_and_a_refusal_once_a_minute_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refusal for want of room is a state: one WARNING line when it begins, again when its cause
    changes (a full map, then a full disk); any other failure, a domain error too, is a fault told
    each time with its traceback (it was rate-limited as a refusal)."""
    from tiermem.server.core.failures import Failures
    from tiermem.server.model.errors import ResourceExhausted, TiermemError

    def refusal(resource: str) -> ResourceExhausted:
        e = ResourceExhausted(f"the {resource} is full")
        e.metadata["resource"] = resource
        return e

    failures = Failures("a pass")
    with caplog.at_level(logging.WARNING, logger="tiermem.server.core.failures"):
        for e in (refusal("disk"), refusal("disk"), refusal("map"), refusal("map")):
            failures.failed(e)
        for _ in range(2):
            try:
                raise TiermemError("write failed: an I/O error")
            except TiermemError as e:
                failures.failed(e)
    lines = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert [(level, text.split(": ")[1]) for level, text, _ in lines[:2]] == [
        (logging.WARNING, "the disk is full [STORAGE_FULL]"),
        (logging.WARNING, "the map is full [STORAGE_FULL]"),
    ]
    assert [(level, tb) for level, _, tb in lines[2:]] == [(logging.ERROR, True)] * 2
