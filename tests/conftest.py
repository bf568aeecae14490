"""Shared fixtures: real servers on 127.0.0.1 port 0 with LMDB in a temp dir, in-process or as a
separate process (for kill -9 and other-language clients)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tiermem.client import MemoryClient
from tiermem.server.config import ServerConfig
from tiermem.server.transport.app import RunningServer, create_server

ROOT = Path(__file__).resolve().parent.parent

# Servers the tests start as processes inherit this: one process unless a test asks for search
# followers (the default, one per core, has tests of its own that drop the variable).
os.environ.setdefault("TIERMEM_SEARCH_PROCESSES", "1")


def search_pid(c: MemoryClient) -> int:
    """The process that ranks this connection's searches (their trailing metadata names it)."""
    from tiermem.v1 import memory_pb2 as pb

    req = pb.SearchMemoriesRequest(namespaces=["probe"], query_text="probe", read_only=True)
    _, call = c.stub.SearchMemories.with_call(req, timeout=30)
    return int(dict(call.trailing_metadata())["tiermem-search-process"])


def client_on(port: int, pid: int) -> MemoryClient:
    """A client whose connection the kernel gave to process ``pid`` (new connections until one is)."""
    import grpc

    deadline = time.monotonic() + 60  # (a replacement follower is listed before it listens)
    while time.monotonic() < deadline:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        c = MemoryClient(channel=channel, timeout=30)
        c.wait_ready()
        if search_pid(c) == pid:
            return c
        channel.close()
    raise AssertionError(f"no connection reached process {pid} in 60 s")


def child_pids(pid: int) -> list[int]:
    """Child processes of every thread of ``pid`` (a leader's Followers thread starts them)."""
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


class FakeClock:
    """An injectable clock for engine time (creation, expiry, recency): tests never sleep."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """``server_factory(data_dir=None, clock=None, **config)`` starts an in-process server."""
    started: list[RunningServer] = []

    def start(
        data_dir: Path | None = None, clock: Callable[[], float] | None = None, **overrides: Any
    ) -> RunningServer:
        # The background lifecycle would move memories between tiers while tests look; tests that
        # want it turn it on, the others drive passes explicitly.
        overrides.setdefault("maintenance_interval_seconds", 0)
        # Likewise searches counting as accesses would change recency between a test's searches.
        overrides.setdefault("search_records_access", False)
        # One process unless a test asks for search followers (the default's own tests do).
        overrides.setdefault("search_processes", 1)
        config = ServerConfig(host="127.0.0.1", port=0, data_dir=data_dir or tmp_path / "data", **overrides)
        running = create_server(config, clock=clock)
        started.append(running)
        return running

    yield start
    for running in started:
        with contextlib.suppress(Exception):
            running.stop(0)


@pytest.fixture
def server(server_factory: Callable[..., RunningServer]) -> RunningServer:
    return server_factory()


@pytest.fixture
def client(server: RunningServer) -> Iterator[MemoryClient]:
    with MemoryClient(f"127.0.0.1:{server.port}", timeout=30) as c:
        c.wait_ready()
        yield c


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    port: int
    data_dir: Path
    drain: threading.Thread | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        """Kill the process if it still runs, then close its stdout once the drain thread is done."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.drain is not None:
            self.drain.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_LISTENING = re.compile(r"tiermem listening on [^:]+:(\d+)")


def spawn_server(
    data_dir: Path, *extra_args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> ServerProcess:
    """Start ``python -m tiermem.server`` on port 0 and wait for its listening line (printed once SERVING)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tiermem.server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--log-level",
            "WARNING",
            *extra_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "TIERMEM_MAINTENANCE_INTERVAL_SECONDS": "0",
            "TIERMEM_SEARCH_RECORDS_ACCESS": "0",
            **(env or {}),
        },
    )
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = _LISTENING.search(line)
        if m:
            # Keep draining the pipe so a chatty server never blocks on a full stdout.
            drain = threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True)  # type: ignore[union-attr]
            drain.start()
            return ServerProcess(proc, int(m.group(1)), data_dir, drain)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    raise RuntimeError("server did not start:\n" + "".join(lines))


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    procs: list[ServerProcess] = []

    def start(data_dir: Path | None = None, *args: str, **kw: Any) -> ServerProcess:
        p = spawn_server(data_dir or tmp_path / "data", *args, **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.close()


def queued_behind_a_held_write(writer: Any, calls: list[Callable[[], Any]]) -> tuple[list[Any], int]:
    """Run ``calls`` on threads while ``writer`` (a server.writer.Writer) is held inside another
    write, each queued once the previous one is, so they enter one commit group in order. Returns
    their results (or the exceptions they raised) and how many groups committed once released."""
    gate, holding = threading.Event(), threading.Event()

    def hold(txn: Any) -> None:
        holding.set()
        gate.wait(10)

    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as e:
            results[i] = e

    first = threading.Thread(target=writer.submit, args=(hold, lambda r: r))
    first.start()
    threads = []
    groups = writer.groups_committed
    try:
        assert holding.wait(10)
        for i in range(len(calls)):
            threads.append(threading.Thread(target=run, args=(i,)))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while writer._queue.qsize() < i + 1 and time.monotonic() < deadline:
                time.sleep(0.001)
            assert writer._queue.qsize() == i + 1
        groups = writer.groups_committed
    finally:
        gate.set()
        for t in [first, *threads]:
            t.join(10)
    return results, writer.groups_committed - groups


def make_record(rid: int, namespace: str = "ns") -> Any:
    """A stored memory as the storage layer sees it (for tests that write LMDB directly)."""
    from tiermem.server.model.records import Record

    return Record(
        rid=rid,
        id=f"m{rid}",
        namespace=namespace,
        content=f"memory {rid}",
        kind="observation",
        tier=3,
        importance=0.5,
    )


def create_memories(client: MemoryClient, vecs: Any, ids: range, tier: str = "") -> None:
    """Memories ``m<i>`` ("memory <i>", vector ``vecs[i]`` of model "t", namespace "m", in ``tier``
    if named) for each i of ``ids``, 500 a BatchCreateMemories call."""
    for start in range(ids.start, ids.stop, 500):
        client.create_batch(
            {
                "namespace": "m",
                "content": f"memory {i}",
                "id": f"m{i}",
                "embedding": vecs[i].tolist(),
                "embedding_model": "t",
            }
            | ({"tier": tier} if tier else {})
            for i in range(start, min(start + 500, ids.stop))
        )


def wait_indexed(srv: RunningServer, model: str = "t", timeout: float = 30.0) -> None:
    """Until every vector of embedding space ``model`` in ``srv`` is in its HNSW."""
    deadline = time.monotonic() + timeout
    while any(i.pending for i in srv.engine.spaces[model].indexes.values()):
        assert time.monotonic() < deadline, "vectors still pending"
        time.sleep(0.01)


def haproxy_or_skip(what: str) -> str:
    """Debian's haproxy binary (``make proxy-toolchain``): ``what`` is skipped without it, unless
    TIERMEM_REQUIRE_HAPROXY=1 (CI), which makes a missing proxy a failure."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        if os.environ.get("TIERMEM_REQUIRE_HAPROXY") == "1":
            pytest.fail(f"TIERMEM_REQUIRE_HAPROXY=1 but haproxy is not installed, which {what} needs")
        pytest.skip(f"{what} needs haproxy (make proxy-toolchain)")
    return found


class SlowLink:
    """A TCP relay to ``port`` that passes the answers at ``rate`` bytes a second and what the
    caller sends at ``up`` (0: at once), a slow link, until ``cut``."""

    def __init__(self, port: int, rate: int, listen: int = 0, up: int = 0) -> None:
        self.upstream, self.rate, self.up = port, rate, up
        self.listener = socket.create_server(("127.0.0.1", listen))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                near, _ = self.listener.accept()
                self.socks.append(near)
                far = socket.create_connection(("127.0.0.1", self.upstream))
                self.socks.append(far)
                threading.Thread(target=self._pipe, args=(near, far, self.up), daemon=True).start()
                threading.Thread(target=self._pipe, args=(far, near, self.rate), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, rate: int) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(4096):
                dst.sendall(data)
                time.sleep(len(data) / rate if rate else 0)

    def cut(self) -> None:
        self.listener.close()  # (first: no connection is accepted after the others are closed)
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class FreezingRelay:
    """A TCP relay to ``port`` that, once ``arm`` is set and ``after`` more bytes came back from the
    server, forwards nothing more either way and keeps its connections open: a network partition,
    not a reset. A context manager: its sockets are closed on exit."""

    def __init__(self, port: int, after: int) -> None:
        self.port, self.after = port, after
        self.arm, self.frozen = threading.Event(), threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []  # (kept until close: none is left to the collector)
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> FreezingRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # (the listener closed)
            while True:
                client, _ = self.listener.accept()
                with self._lock:
                    self._socks.append(client)
                upstream = socket.create_connection(("127.0.0.1", self.port))
                with self._lock:
                    self._socks.append(upstream)
                for a, b, back in ((client, upstream, False), (upstream, client, True)):
                    threading.Thread(target=self._pipe, args=(a, b, back), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, back: bool) -> None:
        with contextlib.suppress(OSError):  # (a peer went away, or close)
            while data := a.recv(65536):
                if back and self.arm.is_set():
                    self.after -= len(data)
                    if self.after < 0:
                        self.frozen.set()
                if self.frozen.is_set():
                    while a.recv(65536):  # (read and dropped: never forwarded)
                        pass
                    return
                b.sendall(data)


def writes_grow_the_map(c: MemoryClient, store: Any) -> None:
    """Store 6,000 memories (about 12 MiB of records and vectors) through ``c``: they complete, and
    ``store``'s LMDB map grew, which waits for every open read transaction of the process."""
    before = store.map_size
    text = "a note about the deploy " * 40
    for b in range(60):
        c.create_batch([{"namespace": "team:new", "content": f"{b}-{j} {text}"} for j in range(100)])
    assert c.stats("team:new").memory_count == 6000
    assert store.map_size > before
