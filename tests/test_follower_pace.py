"""When a search follower applies its leader's commits: at once while searches come to it; left
while no search comes and the leader keeps committing (a bulk write alone runs at one process's
speed); a search reaching it far behind is answered by the leader while it catches up.

Real processes on one port over loopback, one LMDB; the follower's pace set short by tuning."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from tiermem.client import MemoryClient
from tiermem.server.config import Tuning
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

IDLE = 0.5  # follower_idle_seconds
QUIET = 1.0  # follower_quiet_seconds
BACKLOG = 50  # follower_forward_backlog


def _ranked_by(c: MemoryClient, namespace: str) -> tuple[int, set[str]]:
    """The process that ranked a search of ``namespace`` on this connection, and the contents
    it found (every memory, at most 1,000)."""
    req = pb.SearchMemoriesRequest(namespaces=[namespace], query_text="note", read_only=True, limit=1000)
    reply, call = c.stub.SearchMemories.with_call(req, timeout=30)
    return int(dict(call.trailing_metadata())["tiermem-search-process"]), {
        r.memory.content for r in reply.results
    }


def _client_on(port: int, pid: int) -> MemoryClient:
    """A client whose connection the kernel gave to process ``pid``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        c = MemoryClient(channel=channel, timeout=30)
        c.wait_ready()
        if _ranked_by(c, "probe")[0] == pid:
            return c
        channel.close()
    raise AssertionError(f"no connection reached process {pid} in 60 s")


class Writer:
    """Notes written through the leader, one commit every ``every`` seconds, until stopped."""

    def __init__(self, client: MemoryClient, namespace: str, every: float, batch: int) -> None:
        self.client, self.namespace, self.every, self.batch = client, namespace, every, batch
        self.written: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            i = len(self.written)
            notes = [f"note {j}" for j in range(i, i + self.batch)]
            self.client.create_batch([{"namespace": self.namespace, "content": n} for n in notes])
            self.written += notes
            time.sleep(self.every)

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def pair(
    server_factory: Callable[..., RunningServer],
) -> Iterator[Callable[..., tuple[int, MemoryClient, MemoryClient]]]:
    """``pair(defer)``: a leader with one follower at a short pace (the follower leaves commits
    for at most ``defer`` seconds); the follower's pid, a client of each."""
    clients: list[MemoryClient] = []

    def start(defer: float = 600.0) -> tuple[int, MemoryClient, MemoryClient]:
        tuning = Tuning(
            follower_idle_seconds=IDLE,
            follower_quiet_seconds=QUIET,
            follower_defer_seconds=defer,
            follower_forward_backlog=BACKLOG,
        )
        srv = server_factory(search_processes=2, tuning=tuning)
        assert srv.followers is not None
        (fpid,) = srv.followers.pids()
        clients.extend([_client_on(srv.port, os.getpid()), _client_on(srv.port, fpid)])
        time.sleep(IDLE * 2)  # (the probes were searches: idle from here)
        return fpid, clients[-2], clients[-1]

    yield start
    for c in clients:
        c.channel.close()


def test_an_idle_follower_leaves_a_bulk_write_to_the_leader_and_then_catches_up(
    pair: Callable[..., tuple[int, MemoryClient, MemoryClient]],
) -> None:
    fpid, lead, follow = pair()
    with Writer(lead, "bulk", every=0.05, batch=20) as w:
        while len(w.written) < BACKLOG * 3:
            time.sleep(0.05)
        # Far behind (it applied nothing while idle): the leader answers, with every write.
        before = set(w.written)
        by, found = _ranked_by(follow, "bulk")
        assert by == os.getpid()
        assert before <= found
        # That search woke it: it catches up and ranks again while the writes go on.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            before = set(w.written)
            by, found = _ranked_by(follow, "bulk")
            assert before <= found
            if by == fpid:
                break
            time.sleep(0.05)
        assert by == fpid
    # Idle again and the leader quiet: it catches up without being asked.
    time.sleep(IDLE)
    with Writer(lead, "second", every=0.05, batch=20) as w:
        while len(w.written) < BACKLOG * 3:
            time.sleep(0.05)
    time.sleep(QUIET * 2)
    assert _ranked_by(follow, "second") == (fpid, set(w.written))


def test_an_idle_follower_leaves_the_commits_for_at_most_its_defer_time(
    pair: Callable[..., tuple[int, MemoryClient, MemoryClient]],
) -> None:
    """The leader never quiet: an idle follower still applies what it left, every ``defer`` s."""
    defer = 1.0
    fpid, lead, follow = pair(defer)
    with Writer(lead, "steady", every=0.05, batch=1) as w:
        t0 = time.monotonic()
        while len(w.written) < BACKLOG * 3:  # (far more than one defer's worth of writes)
            time.sleep(0.05)
        rate = len(w.written) / (time.monotonic() - t0)
        assert rate * defer * 1.5 < BACKLOG  # (else this test could not tell)
        before = set(w.written)
        by, found = _ranked_by(follow, "steady")
    assert by == fpid
    assert before <= found
