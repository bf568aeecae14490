"""Search followers by default: a server started with no setting serves the port from one process
per core (at most 4). When a follower applies its leader's commits: at once while searches come
to it; left while no search comes and the leader keeps committing (a bulk write alone runs at one
process's speed); a search reaching it far behind is answered by the leader while it catches up.

Real processes on one port over loopback, one LMDB; the follower's pace set short by tuning."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess, child_pids, client_on

from tiermem.client import MemoryClient
from tiermem.server.config import ServerConfig, Tuning
from tiermem.server.core.follow import Pace
from tiermem.server.cores import usable_cores
from tiermem.server.transport.app import RunningServer
from tiermem.server.transport.follower import AUTO_PROCESSES_MOST, processes
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
        clients.extend([client_on(srv.port, os.getpid()), client_on(srv.port, fpid)])
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


def test_a_server_started_with_no_setting_serves_from_one_process_per_core(
    server_process: Callable[..., ServerProcess], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The command line's default: one process per core, at most 4; every process serves searches
    and writes through any of them are read from all."""
    monkeypatch.delenv("TIERMEM_SEARCH_PROCESSES")  # (the tests' own pin to one process)
    want = min(usable_cores(), AUTO_PROCESSES_MOST)
    srv = server_process(tmp_path / "data")
    followers = child_pids(srv.proc.pid)
    assert len(followers) == want - 1
    with MemoryClient(srv.target, connections=16) as c:
        c.wait_ready()
        for i in range(32):  # (over the 16 connections in turn)
            c.create("ns", f"note {i}")
        seen = set()
        for _ in range(48):
            by, found = _ranked_by(c, "ns")
            assert found == {f"note {i}" for i in range(32)}
            seen.add(by)
    assert seen == {srv.proc.pid, *followers}


def test_search_processes_zero_is_resolved_as_the_server_starts() -> None:
    """0 (the default) stays 0 in the settings (an ``Engine`` alone leads no followers) and is
    resolved by the server: one per core up to the most, one for a replica; a number is kept."""
    assert ServerConfig().search_processes == 0
    auto = processes(ServerConfig())
    assert auto.search_processes == (
        min(usable_cores(), AUTO_PROCESSES_MOST) if sys.platform == "linux" else 1
    )
    assert processes(ServerConfig(replica_of="127.0.0.1:1")).search_processes == 1
    assert processes(ServerConfig(search_processes=3)).search_processes == 3
    assert processes(auto) == auto


def _simulate(
    tuning: Tuning,
    seconds: float,
    commits_every: float | None,
    searches: list[float] = (),  # type: ignore[assignment]
) -> list[float]:
    """The times the follow loop (every 50 ms) catches up while its leader commits every
    ``commits_every`` s (None: never) and searches come at ``searches``; each catch-up applies
    everything committed."""
    pace = Pace(tuning, 0, 0.0)
    seq = applied = 0
    searched_at = -1e9
    caught = []
    step, now, next_commit = 0.05, 0.0, commits_every
    while now < seconds:
        now = round(now + step, 6)
        while next_commit is not None and commits_every is not None and next_commit <= now:
            seq += 1
            next_commit += commits_every
        searched_at = max([searched_at, *(t for t in searches if t <= now)])
        if pace.due(seq, applied, searched_at, now):
            applied = seq
            caught.append(now)
    return caught


def test_the_pace_defers_again_after_each_catch_up_while_the_leader_keeps_committing() -> None:
    """Idle, the leader committing without a pause: one catch-up a defer period, not one a tick
    once the first period has passed."""
    caught = _simulate(Tuning(follower_defer_seconds=30.0), 95.0, commits_every=0.05)
    assert [round(t) for t in caught] == [30, 60, 90]


def test_the_pace_catches_up_once_the_leader_is_quiet_and_at_once_while_searches_come() -> None:
    tuning = Tuning(follower_idle_seconds=2.0, follower_quiet_seconds=0.25, follower_defer_seconds=30.0)
    # commits every 0.5 s: each is applied once the leader has been quiet 0.25 s after it
    caught = _simulate(tuning, 5.0, commits_every=0.5)
    assert caught == [0.75 + 0.5 * i for i in range(9)]
    # a bulk write (a commit every 50 ms) with searches from 10 s to 12 s: applied every tick from
    # the first search until 2 s after the last, then left again
    busy = _simulate(tuning, 20.0, commits_every=0.05, searches=[10.0 + 0.5 * i for i in range(5)])
    during = [t for t in busy if 10.0 <= t <= 14.0]
    assert len(during) >= 70 and [t for t in busy if t < 10.0] == [] and [t for t in busy if t > 14.1] == []


def test_the_pace_defers_for_at_most_half_the_commit_logs_keeping() -> None:
    """Commits the log dropped would make the follower reload: it never leaves them that long."""
    caught = _simulate(Tuning(follower_defer_seconds=30.0, commit_log_seconds=20.0), 35.0, commits_every=0.05)
    assert [round(t) for t in caught] == [10, 20, 30]


def test_a_server_on_its_own_clock_serves_from_one_process(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Followers would rank recency by the real clock: a server given another clock has none."""
    srv = server_factory(search_processes=0, clock=lambda: 1_700_000_000.0)
    assert srv.followers is None and srv.engine.config.search_processes == 1


def test_a_follower_applies_a_bulk_write_it_left_alone_as_the_leader_stored_it(
    pair: Callable[..., tuple[int, MemoryClient, MemoryClient]],
) -> None:
    """More records than a catch-up applies at a time (APPLY_SLICE), with updates and deletes
    among them: once caught up the follower finds each as the leader stored it."""
    fpid, lead, follow = pair()
    ids: list[str] = []
    for start in range(0, 10_000, 500):
        batch = [{"namespace": "bulk", "content": f"note w{i}x"} for i in range(start, start + 500)]
        ids += [m.id for m in lead.create_batch(batch)]
    updated, deleted = ids[100:130], ids[5000:5030]
    for mid in updated:
        lead.update("bulk", mid, content=f"changed {mid.replace('-', '')}")
    for mid in deleted:
        lead.delete("bulk", mid)
    by, _ = _ranked_by(follow, "bulk")  # (far behind: its leader answers, and it catches up)
    assert by == os.getpid()
    deadline = time.monotonic() + 60
    while _ranked_by(follow, "bulk")[0] != fpid:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    def found(c: MemoryClient, text: str) -> tuple[int, list[str]]:
        req = pb.SearchMemoriesRequest(namespaces=["bulk"], query_text=text, read_only=True, limit=3)
        reply, call = c.stub.SearchMemories.with_call(req, timeout=30)
        by = int(dict(call.trailing_metadata())["tiermem-search-process"])
        return by, [r.memory.content for r in reply.results if text in r.memory.content]

    for i in (0, 99, 4095, 4096, 4097, 8191, 8192, 9999):
        assert found(follow, f"w{i}x") == (fpid, [f"note w{i}x"])
    for mid in updated[:10]:
        assert found(follow, mid.replace("-", "")) == (fpid, [f"changed {mid.replace('-', '')}"])
        assert found(follow, f"w{ids.index(mid)}x") == (fpid, [])
    for mid in deleted[:10]:
        assert found(follow, f"w{ids.index(mid)}x") == (fpid, [])
