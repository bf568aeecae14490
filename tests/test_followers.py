"""Search followers (search_processes > 1): real processes on one port over loopback, one LMDB.

A follower serves searches from its own copy of the columns and indexes, caught up on the
leader's commits before each search, and forwards everything else to the leader."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import (
    ServerProcess,
    child_pids,
    client_on,
    create_memories,
    make_record,
    search_pid,
    spawn_server,
    wait_indexed,
)

from tiermem.client import MemoryClient, UnavailableError
from tiermem.client.errors import InvalidArgumentError
from tiermem.server.config import ServerConfig, Tuning
from tiermem.server.core.background import Snapshots
from tiermem.server.cores import usable_cores
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.storage.store import Store
from tiermem.server.transport.app import RunningServer, create_server
from tiermem.server.transport.follower import AUTO_PROCESSES_MOST
from tiermem.v1 import memory_pb2 as pb

DIM = 32


def _vec(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM).astype(np.float32)
    return (v / np.linalg.norm(v)).tolist()


@pytest.fixture
def pair(
    server_factory: Callable[..., RunningServer],
) -> Iterator[tuple[RunningServer, MemoryClient, MemoryClient]]:
    """A leader with one follower; a client connected to each."""
    srv = server_factory(search_processes=2, access_flush_seconds=0.2)
    assert srv.followers is not None
    (fpid,) = srv.followers.pids()
    lead, follow = client_on(srv.port, os.getpid()), client_on(srv.port, fpid)
    yield srv, lead, follow
    lead.channel.close()
    follow.channel.close()


def test_a_followers_refusal_carries_the_retry_hint_the_leaders_does(
    pair: tuple[RunningServer, MemoryClient, MemoryClient],
) -> None:
    """A search a follower refuses (here a moved scope) tells the client when to try again, as
    the leader's refusal does."""
    _, lead, follow = pair
    lead.create("user:ana", "ana's memory")
    lead.set_scope_routing("user:ana", "moved", moved_to="shard-b")
    for c in (lead, follow):  # (short deadlines: the client waits out the hint until its deadline)
        with pytest.raises(UnavailableError) as e:
            c.search("user:ana", "memory", timeout=2)
        assert (e.value.reason, e.value.retry_after) == ("SCOPE_MOVED", 0.5)
        with pytest.raises(UnavailableError) as e:
            c.search_many([{"namespaces": ["user:ana"], "query": "memory"}], timeout=2)
        assert (e.value.reason, e.value.retry_after) == ("SCOPE_MOVED", 0.5)


def _ids(results: list[pb.SearchResult]) -> list[str]:
    return [r.memory.id for r in results]


def test_follower_sees_every_acknowledged_write_at_once(
    pair: tuple[RunningServer, MemoryClient, MemoryClient],
) -> None:
    _, lead, follow = pair
    rng = np.random.default_rng(3)
    vecs = {f"m{i}": _vec(rng) for i in range(40)}
    for i, (mid, v) in enumerate(vecs.items()):
        # Writes through either process; each is searchable from the other at once.
        (lead if i % 2 else follow).create("ns", f"memory {mid}", id=mid, embedding=v, embedding_model="t")
        for c in (lead, follow):
            got = c.search("ns", v, embedding_model="t", limit=1, read_only=True, strategy="similarity")
            assert _ids(got) == [mid]
    q = vecs["m7"]
    both = [
        [
            (r.memory.id, round(r.score, 5))
            for r in c.search("ns", q, embedding_model="t", read_only=True, strategy="comprehensive")
        ]
        for c in (lead, follow)
    ]
    assert both[0] == both[1] and len(both[0]) == 10
    # Update (importance: the score), tier move (a new vector entry), delete.
    lead.update("ns", "m7", importance=0.01, tier="glacial")
    lead.delete("ns", "m8")
    for c in (lead, follow):
        got = c.search("ns", vecs["m7"], embedding_model="t", limit=40, read_only=True)
        hit = next(r for r in got if r.memory.id == "m7")
        assert hit.memory.tier == pb.TIER_GLACIAL and hit.importance == pytest.approx(0.01, abs=1e-3)
        assert "m8" not in _ids(got)
        glacial = c.search("ns", vecs["m7"], embedding_model="t", read_only=True, tiers=["glacial"])
        assert _ids(glacial) == ["m7"]
    # Re-embedding moves the vector: the old one no longer finds it.
    new = _vec(rng)
    follow.update("ns", "m9", embedding=new, embedding_model="t")
    for c in (lead, follow):
        assert _ids(
            c.search("ns", new, embedding_model="t", limit=1, read_only=True, strategy="similarity")
        ) == ["m9"]
        old = c.search("ns", vecs["m9"], embedding_model="t", limit=1, read_only=True, strategy="similarity")
        assert _ids(old) != ["m9"]
    follow.delete_namespace("ns", confirm=True)
    for c in (lead, follow):
        assert c.search("ns", q, embedding_model="t", read_only=True) == []


def test_follower_follows_settings_and_new_spaces(
    pair: tuple[RunningServer, MemoryClient, MemoryClient],
) -> None:
    _, lead, follow = pair
    rng = np.random.default_rng(4)
    v = _vec(rng)
    lead.create("s", "a memory in a new space", id="x", embedding=v, embedding_model="other")
    assert _ids(follow.search("s", v, embedding_model="other", read_only=True)) == ["x"]
    # A namespace setting that changes scores: the importance half-life of its tier.
    before = follow.search("s", v, embedding_model="other", read_only=True, as_of=time.time() + 86400 * 3)[0]
    lead.update_namespace_config("s", tiers={"slow": {"half_life_hours": 1.0}})
    after = follow.search("s", v, embedding_model="other", read_only=True, as_of=time.time() + 86400 * 3)[0]
    ref = lead.search("s", v, embedding_model="other", read_only=True, as_of=time.time() + 86400 * 3)[0]
    assert after.importance < before.importance
    assert after.importance == pytest.approx(ref.importance, rel=1e-3)


def test_forwarded_calls_keep_their_errors(pair: tuple[RunningServer, MemoryClient, MemoryClient]) -> None:
    _, lead, follow = pair
    with pytest.raises(InvalidArgumentError) as direct:
        lead.create("ns", "x", importance=7.0)
    with pytest.raises(InvalidArgumentError) as forwarded:
        follow.create("ns", "x", importance=7.0)
    assert forwarded.value.fields == direct.value.fields == ["memory.importance"]
    assert str(forwarded.value) == str(direct.value)
    assert lead.stats().memory_count == 0


def test_follower_searches_count_as_accesses_on_the_leader(
    server_factory: Callable[..., RunningServer],
) -> None:
    srv = server_factory(search_processes=2, access_flush_seconds=0.2, search_records_access=True)
    assert srv.followers is not None
    follow = client_on(srv.port, srv.followers.pids()[0])
    v = _vec(np.random.default_rng(5))
    follow.create("acc", "remember me", id="r", embedding=v, embedding_model="t")
    for _ in range(3):
        assert _ids(follow.search("acc", v, embedding_model="t")) == ["r"]
    deadline = time.monotonic() + 10
    while follow.get("acc", "r").access_count < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert follow.get("acc", "r").access_count == 3
    assert follow.stats("acc").search_hits == 3  # the follower's hit counts reach the leader's stats
    follow.channel.close()


def test_a_killed_follower_is_replaced(pair: tuple[RunningServer, MemoryClient, MemoryClient]) -> None:
    srv, lead, _ = pair
    assert srv.followers is not None
    (old,) = srv.followers.pids()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (srv.followers.pids() == [old] or srv.followers.restarts == 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    (new,) = srv.followers.pids()
    assert new != old
    v = _vec(np.random.default_rng(6))
    lead.create("k", "after the restart", id="a", embedding=v, embedding_model="t")
    c = client_on(srv.port, new)
    assert _ids(c.search("k", v, embedding_model="t", read_only=True)) == ["a"]
    c.channel.close()


def test_stopping_the_leader_stops_its_followers(server_factory: Callable[..., RunningServer]) -> None:
    srv = server_factory(search_processes=3)
    assert srv.followers is not None
    pids = srv.followers.pids()
    assert len(pids) == 2
    srv.stop(1.0)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_zero_search_processes_means_one_per_core(server_factory: Callable[..., RunningServer]) -> None:
    cores = min(usable_cores(), AUTO_PROCESSES_MOST)
    srv = server_factory(search_processes=0)
    assert srv.engine.config.search_processes == cores  # (resolved once: every reader sees the count)
    if cores == 1:
        assert srv.followers is None
        return
    assert srv.followers is not None and len(srv.followers.pids()) == cores - 1
    with MemoryClient(f"127.0.0.1:{srv.port}", connections=16) as c:
        c.wait_ready()
        pids = {search_pid(c) for _ in range(48)}
    assert len(pids) >= 2 and pids <= {os.getpid(), *srv.followers.pids()}


def test_followers_exit_when_the_leader_is_killed(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    srv = server_process(tmp_path / "data", "--search-processes", "2")
    with MemoryClient(srv.target) as c:
        c.create("ns", "durable", id="d")
    children = child_pids(srv.proc.pid)
    assert len(children) == 1
    srv.kill9()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{children[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{children[0]}").exists()
    again = server_process(tmp_path / "data", "--search-processes", "2")  # the port's data dir again
    with MemoryClient(again.target) as c:
        assert c.get("ns", "d").content == "durable"


def test_commit_log_names_each_commits_records(tmp_path: Path) -> None:
    # prune_every=2: a look for old entries every second commit
    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 30, log_commits=True, prune_every=2)

    for rids, settings, when in (([1, 2], False, 1000.0), ([3], True, 1001.0), ([2], False, 1002.0)):
        with store.write() as txn:
            for r in rids:
                store.put(txn, make_record(r))
            if settings:
                store.put_namespace_config(txn, "n", {"protected": True})
            store.next_seq(txn, when)
    with store.read() as txn:
        assert store.committed_seq(txn) == 3
        first, settings, rids = store.commits_after(txn, 0)  # type: ignore[misc]
        assert (first, settings, rids.tolist()) == (1, True, [1, 2, 3])
        first, settings, rids = store.commits_after(txn, 2)  # type: ignore[misc]
        assert (first, settings, rids.tolist()) == (3, False, [2])
        assert store.commits_after(txn, 3) is None
    # Entries go once commit_log_seconds old (looked for every prune_every commits).
    with store.write() as txn:
        store.put(txn, make_record(4))
        store.next_seq(txn, 1001.5 + store.commit_log_seconds)  # commit 4: drops commits 1 and 2
    with store.read() as txn:
        first, _, rids = store.commits_after(txn, 0)  # type: ignore[misc]
        assert first == 3 and rids.tolist() == [2, 4]
    store.close()
    # Without followers no log is written.
    plain = Store(tmp_path / "plain", map_size=1 << 26, max_map_size=1 << 30)
    with plain.write() as txn:
        plain.put(txn, make_record(1))
        plain.next_seq(txn, 1.0)
    with plain.read() as txn:
        assert plain.committed_seq(txn) == 1 and plain.commits_after(txn, 0) is None
    plain.close()


def test_a_follower_behind_the_commit_log_is_replaced(
    pair: tuple[RunningServer, MemoryClient, MemoryClient],
) -> None:
    srv, lead, follow = pair
    assert srv.followers is not None
    (old,) = srv.followers.pids()
    rng = np.random.default_rng(8)
    v1, v2 = _vec(rng), _vec(rng)
    lead.create("b", "first", id="one", embedding=v1, embedding_model="t")
    assert _ids(follow.search("b", v1, embedding_model="t", limit=1, read_only=True)) == ["one"]
    store = srv.engine.store
    os.kill(old, signal.SIGSTOP)  # the follower misses the next commits ...
    try:
        lead.create("b", "second", id="two", embedding=v2, embedding_model="t")
        missed = store.seq

        def drop(txn: object) -> None:  # ... and the log loses one of them
            assert txn.delete(missed.to_bytes(8, "big"), db=store.commits)  # type: ignore[attr-defined]

        srv.engine.writer.submit(drop, lambda r: r)
    finally:
        os.kill(old, signal.SIGCONT)
    # It cannot know what it missed: it stops following, the leader answers its searches until it
    # is replaced (no search fails meanwhile, and none misses the memory).
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        req = pb.SearchMemoriesRequest(namespaces=["b"], embedding_model="t", limit=1, read_only=True)
        req.query_embedding.extend(v2)
        try:
            resp, call = follow.stub.SearchMemories.with_call(req, timeout=30)
        except grpc.RpcError as e:  # the follower's connection closing as it exits: clients retry
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            continue
        assert [r.memory.id for r in resp.results] == ["two"]
        if dict(call.trailing_metadata())["tiermem-search-process"] != str(old):
            break
    else:
        raise AssertionError("searches on the stale follower's connection never reached the leader")
    deadline = time.monotonic() + 60
    while srv.followers.pids() == [old] and time.monotonic() < deadline:
        time.sleep(0.1)
    (new,) = srv.followers.pids()
    c = client_on(srv.port, new)  # loaded afresh: has what the old one missed
    assert _ids(c.search("b", v2, embedding_model="t", limit=1, read_only=True)) == ["two"]
    c.channel.close()


def test_reader_slots_of_killed_processes_are_freed(tmp_path: Path) -> None:
    store = Store(tmp_path / "lmdb", map_size=1 << 26, max_map_size=1 << 30)
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lmdb, sys, time\n"
            "env = lmdb.open(sys.argv[1], readonly=True, max_dbs=16, lock=True)\n"
            "txn = env.begin()\nprint('reading', flush=True)\ntime.sleep(60)\n",
            str(tmp_path / "lmdb"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
    reader.kill()  # dies holding its read transaction
    reader.wait()
    reader.stdout.close()
    assert str(reader.pid) in store.env.readers()
    assert store.clear_stale_readers() == 1
    assert str(reader.pid) not in store.env.readers()
    store.close()


def test_a_port_in_use_is_refused_with_followers(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even by a sharing-minded one
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = ServerConfig(
            host="127.0.0.1", port=taken.getsockname()[1], data_dir=tmp_path / "data", search_processes=2
        )
        with pytest.raises(FailedPrecondition, match="cannot listen"):
            create_server(config)
    assert not (tmp_path / "data").exists()  # refused before anything was opened


def test_a_burst_of_sigterms_stops_leader_and_followers(
    server_process: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A second SIGTERM arriving while the first is handled must not hang a process (a follower
    got its leader's and its death signal at once and hung in Event.set)."""
    srv = server_process(tmp_path / "data", "--search-processes", "2")
    (child,) = child_pids(srv.proc.pid)
    for _ in range(30):
        for pid in (int(child), srv.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        time.sleep(0.002)
    assert srv.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists()


def test_a_client_with_several_connections_reaches_every_process(
    server_factory: Callable[..., RunningServer],
) -> None:
    srv = server_factory(search_processes=2)
    assert srv.followers is not None
    with MemoryClient(f"127.0.0.1:{srv.port}", connections=16) as c:  # all on one process: 1 in 32,768
        c.wait_ready()
        assert len({id(ch) for ch in c.channels}) == 16
        v = _vec(np.random.default_rng(9))
        c.create("cc", "spread", id="s", embedding=v, embedding_model="t")
        for _ in range(20):  # every connection finds it, whichever process serves it
            assert _ids(c.search("cc", v, embedding_model="t", limit=1, read_only=True)) == ["s"]
        pids = {search_pid(c) for _ in range(48)}
    assert pids == {os.getpid(), *srv.followers.pids()}
    with pytest.raises(ValueError, match="connections"):
        MemoryClient(channel=grpc.insecure_channel("127.0.0.1:1"), connections=2)


def test_after_a_lifecycle_pass_follower_and_leader_rank_alike(
    pair: tuple[RunningServer, MemoryClient, MemoryClient],
) -> None:
    """Thousands of tier moves (new vector entries, old ones killed, the source index compacted)
    reach the follower: both processes answer every query with the same top 10 and scores."""
    _, lead, follow = pair
    rng = np.random.default_rng(10)
    vecs = rng.standard_normal((5000, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for start in range(0, 5000, 1000):
        lead.create_batch(
            {
                "namespace": "life",
                "content": f"memory {i}",
                "id": f"m{i}",
                "embedding": vecs[i].tolist(),
                "embedding_model": "t",
                "importance": float(rng.uniform(0.0, 1.0)),
            }
            for i in range(start, start + 1000)
        )
    lead.update_namespace_config("life", tiers={"slow": {"ttl_seconds": 0.5}})
    time.sleep(1.0)
    report = lead.consolidate("life")
    assert report.demoted >= 4000
    as_of = time.time()
    queries = rng.standard_normal((20, DIM)).astype(np.float32)
    for q in queries:
        got = [
            [
                (r.memory.id, r.memory.tier, round(r.score, 5))
                for r in c.search("life", q.tolist(), embedding_model="t", as_of=as_of, read_only=True)
            ]
            for c in (lead, follow)
        ]
        assert got[0] == got[1] and len(got[0]) == 10
    glacial = [
        len(
            c.search(
                "life",
                queries[0].tolist(),
                embedding_model="t",
                tiers=["glacial"],
                limit=1000,
                read_only=True,
            )
        )
        for c in (lead, follow)
    ]
    assert glacial[0] == glacial[1] == 1000


def test_wait_ready_with_several_connections_fails_when_nothing_listens() -> None:
    from tiermem.client.errors import UnavailableError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with MemoryClient(f"127.0.0.1:{port}", connections=3) as c, pytest.raises(UnavailableError):
        c.wait_ready(timeout=0.5)


def _leader_and_follower(
    server_factory: Callable[..., RunningServer],
    data: Path,
    rng: np.random.Generator,
    n: int,
    tuning: dict[str, int],
    **settings: float,
) -> tuple[RunningServer, np.ndarray, int, MemoryClient, MemoryClient]:
    """A leader with one follower on ``data`` with ``settings`` (every index searched as a graph,
    ``tuning`` beside), ``n`` unit vectors to store, the follower's pid and a client on each
    process."""
    vecs = rng.standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    srv = server_factory(
        data_dir=data,
        search_processes=2,
        tuning=Tuning(exact_entries=0, exact_per_k=0, **tuning),
        **settings,
    )
    assert srv.followers is not None
    (fpid,) = srv.followers.pids()
    return srv, vecs, fpid, client_on(srv.port, os.getpid()), client_on(srv.port, fpid)


def _mapped_snapshots(pid: int) -> set[str]:
    """The index snapshot files process ``pid`` maps."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if line.endswith(".faiss")}


def test_a_follower_maps_its_leaders_snapshot_and_ranks_alike(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A follower started on a data directory with index snapshots maps their HNSW from the files
    (shared, not copied) and keeps what comes later in an index of its own: after adds, deletes,
    re-embeddings and tier moves, both processes answer alike."""
    data = tmp_path / "data"
    rng = np.random.default_rng(12)
    vecs = rng.standard_normal((3000, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    first = server_factory(data_dir=data)
    with MemoryClient(f"127.0.0.1:{first.port}", timeout=30) as c:
        create_memories(c, vecs, range(2500))
    first.stop(5)  # (a clean stop writes the snapshots)
    snapshots = {str(p) for p in data.rglob("*.faiss")}
    assert snapshots
    # Graph searches however small the parts (not exact scans): the mapped graph is walked.
    srv = server_factory(data_dir=data, search_processes=2, tuning=Tuning(exact_entries=0, exact_per_k=0))
    assert srv.followers is not None
    (fpid,) = srv.followers.pids()
    assert _mapped_snapshots(fpid) == snapshots
    assert not _mapped_snapshots(os.getpid()) & snapshots  # the leader reads its copy, to add to it
    lead, follow = client_on(srv.port, os.getpid()), client_on(srv.port, fpid)
    create_memories(lead, vecs, range(2500, 3000))
    for i in range(0, 3000, 7):
        lead.delete("m", f"m{i}")
    new = rng.standard_normal((20, DIM)).astype(np.float32)
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    reembedded = [i for i in range(1, 800, 20) if i % 7][:20]
    for j, i in enumerate(reembedded):
        follow.update("m", f"m{i}", embedding=new[j].tolist(), embedding_model="t")
    for i in (i for i in range(2, 400, 9) if i % 7):
        lead.update("m", f"m{i}", tier="glacial")
    for i in (3, 2600):  # one of the snapshot's, one added since
        for c in (lead, follow):
            got = c.search(
                "m", vecs[i].tolist(), embedding_model="t", limit=1, read_only=True, strategy="similarity"
            )
            assert _ids(got) == [f"m{i}"]
    for c in (lead, follow):
        assert _ids(c.search("m", new[3].tolist(), embedding_model="t", limit=1, read_only=True)) == [
            f"m{reembedded[3]}"
        ]
        assert "m7" not in _ids(
            c.search("m", vecs[7].tolist(), embedding_model="t", limit=20, read_only=True)
        )
    as_of = time.time()
    for q in rng.standard_normal((20, DIM)).astype(np.float32):
        got = [
            [
                (r.memory.id, r.memory.tier, round(r.score, 5))
                for r in c.search("m", q.tolist(), embedding_model="t", as_of=as_of, read_only=True)
            ]
            for c in (lead, follow)
        ]
        assert got[0] == got[1] and len(got[0]) == 10
    lead.channel.close()
    follow.channel.close()


def _wait_mapped(pid: int, want: set[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _mapped_snapshots(pid) != want:
        assert time.monotonic() < deadline, (_mapped_snapshots(pid), want)
        time.sleep(0.1)


def test_a_follower_moves_onto_its_leaders_newer_snapshots(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A follower that started with no snapshot (a fresh data directory) builds its own index from
    the commits; once its own entries pass ``follower_remap_entries`` and the leader writes a
    snapshot, it maps that one and keeps only what came after it, and again at the next snapshot.
    Both processes answer alike throughout."""
    data = tmp_path / "data"
    rng = np.random.default_rng(13)
    srv, vecs, fpid, lead, follow = _leader_and_follower(
        server_factory, data, rng, 3000, {"follower_remap_entries": 200}, snapshot_interval_seconds=0
    )

    def alike(ids: list[int], gone: list[int]) -> None:
        as_of = time.time()
        for i in ids:
            for c in (lead, follow):
                got = c.search(
                    "m", vecs[i].tolist(), embedding_model="t", limit=1, read_only=True, strategy="similarity"
                )
                assert _ids(got) == [f"m{i}"], (c is follow, i)
        for i in gone:
            assert f"m{i}" not in _ids(
                follow.search("m", vecs[i].tolist(), embedding_model="t", read_only=True)
            )
        for q in rng.standard_normal((10, DIM)).astype(np.float32):
            got = [
                [
                    (r.memory.id, round(r.score, 5))
                    for r in c.search("m", q.tolist(), embedding_model="t", as_of=as_of, read_only=True)
                ]
                for c in (lead, follow)
            ]
            assert got[0] == got[1] and len(got[0]) == 10

    create_memories(lead, vecs, range(1000))
    alike([5, 999], [])
    # Searches through the follower all along, switches included: each finds m5, none fails.
    stop, answers, failures = threading.Event(), [], []

    def searching() -> None:
        q = vecs[5].tolist()
        while not stop.is_set():
            try:
                got = follow.search(
                    "m", q, embedding_model="t", limit=1, read_only=True, strategy="similarity"
                )
                answers.append(_ids(got))
            except Exception as e:  # (any failure fails the test below)
                failures.append(e)

    searcher = threading.Thread(target=searching)
    searcher.start()
    assert _mapped_snapshots(fpid) == set()
    srv.engine.snapshot()
    first = {str(p) for p in data.rglob("*.faiss")}
    assert len(first) == 1
    create_memories(follow, vecs, range(1000, 2000))  # after the snapshot: the follower's own again
    for i in range(0, 2000, 11):
        lead.delete("m", f"m{i}")
    _wait_mapped(fpid, first)
    alike([5, 999, 1002, 1999], [0, 11, 1012])
    srv.engine.snapshot()
    second = {str(p) for p in data.rglob("*.faiss")}
    assert second.isdisjoint(first)
    create_memories(lead, vecs, range(2000, 3000))
    _wait_mapped(fpid, second)  # (the first one's mapping gone with the index that held it)
    alike([5, 1002, 2001, 2999], [0, 1012, 1991])
    stop.set()
    searcher.join(30)
    assert not failures and len(answers) > 50 and all(a == ["m5"] for a in answers)
    lead.channel.close()
    follow.channel.close()


def _wait_mapping_current(pid: int, data: Path, timeout: float = 30.0) -> set[str]:
    """Wait until process ``pid`` maps exactly the index snapshots in ``data`` (some); returns them."""
    deadline = time.monotonic() + timeout
    while True:
        current = {str(p) for p in data.rglob("*.faiss")}
        if current and _mapped_snapshots(pid) == current:
            return current
        assert time.monotonic() < deadline, (_mapped_snapshots(pid), current)
        time.sleep(0.1)


def test_a_leader_with_followers_snapshots_growing_indexes_for_them(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """With no periodic snapshot due (no columns snapshot is written), the leader still snapshots
    an index that gained ``follower_snapshot_entries`` since its last one, and its follower maps
    each in turn instead of keeping every later entry in an index of its own."""
    data = tmp_path / "data"
    _, vecs, fpid, lead, follow = _leader_and_follower(
        server_factory,
        data,
        np.random.default_rng(14),
        2000,
        {"follower_snapshot_entries": 300, "follower_remap_entries": 100},
        snapshot_interval_seconds=3600,
        snapshot_min_changes=10**9,
    )
    create_memories(lead, vecs, range(1000))
    first = _wait_mapping_current(fpid, data)
    create_memories(lead, vecs, range(1000, 2000))
    deadline = time.monotonic() + 30
    while (second := _wait_mapping_current(fpid, data)) == first:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert not list(data.rglob("columns.json"))  # indexes alone, not the periodic snapshots
    for i in (3, 999, 1500, 1999):
        for c in (lead, follow):
            got = c.search(
                "m", vecs[i].tolist(), embedding_model="t", limit=1, read_only=True, strategy="similarity"
            )
            assert _ids(got) == [f"m{i}"], (c is follow, i)
    assert second
    lead.channel.close()
    follow.channel.close()


def _two_tiers_indexed(
    server_factory: Callable[..., RunningServer], data: Path, tuning: Tuning
) -> tuple[RunningServer, Snapshots]:
    """A server (no followers: its index snapshots for them are taken by hand) with 120 memories
    in the glacial tier and 300 in the slow one, all in HNSW, none snapshotted yet."""
    vecs = np.random.default_rng(15).standard_normal((420, DIM)).astype(np.float32)
    srv = server_factory(data_dir=data, tuning=tuning)
    with MemoryClient(f"127.0.0.1:{srv.port}", timeout=30) as c:
        for tier, ids in (("glacial", range(120)), ("slow", range(120, 420))):
            create_memories(c, vecs, ids, tier)
    wait_indexed(srv)
    return srv, srv.engine._snapshots


def test_index_snapshots_for_followers_take_the_index_furthest_behind_first(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Of the indexes due, the one with the most new entries since its last snapshot is written
    first; none while the quiet time after a write lasts, none once nothing is due."""
    data = tmp_path / "data"
    _, snaps = _two_tiers_indexed(server_factory, data, Tuning(follower_snapshot_entries=50))

    def written() -> set[str]:
        return {p.name.split("-t")[1][0] for p in data.rglob("*.faiss")}

    assert snaps.take_indexes() and written() == {"3"}  # slow: 300 new entries, glacial 120
    snaps._index_quiet_until = time.monotonic() + 60
    assert not snaps.take_indexes() and written() == {"3"}
    snaps._index_quiet_until = 0.0
    assert snaps.take_indexes() and written() == {"3", "4"}
    snaps._index_quiet_until = 0.0
    assert not snaps.take_indexes()  # (nothing new since)


@pytest.mark.parametrize("rate", [20_000, 0])
def test_index_snapshots_for_followers_wait_for_their_bytes_at_the_capped_rate(
    server_factory: Callable[..., RunningServer], tmp_path: Path, rate: int
) -> None:
    """After an index snapshot for followers the next waits until its file's bytes at
    ``follower_snapshot_bytes_per_second`` would have been written; uncapped (0), four times as
    long as the write took."""
    data = tmp_path / "data"
    tuning = Tuning(follower_snapshot_entries=50, follower_snapshot_bytes_per_second=rate)
    _, snaps = _two_tiers_indexed(server_factory, data, tuning)
    before = time.monotonic()
    assert snaps.take_indexes()
    took = time.monotonic() - before
    [written] = data.rglob("*.faiss")
    quiet = snaps._index_quiet_until - before
    if rate:
        assert quiet >= written.stat().st_size / rate > 5 * took  # (the cap, not the write's time)
    else:
        assert quiet <= 5 * took
    assert not snaps.take_indexes()  # (the glacial tier is due too: it waits)
    assert len(list(data.rglob("*.faiss"))) == 1


def test_a_followers_count_of_its_own_searches_follows_them_in_and_out(tmp_path: Path) -> None:
    """The count a follower's helper rule reads (``_Serving``) holds the searches the follower is
    ranking itself while they run, and is back at 0 whichever way they end: answered, refused as
    undecodable or invalid, or out of time while waiting for a ranking turn. Searches it forwards
    (once it stopped following) are not counted."""
    from concurrent import futures

    from tiermem.server.core.engine import Engine
    from tiermem.server.transport.follower import SEARCHES, _local_searches, _Serving
    from tiermem.server.transport.forward import Forwarder, methods_of
    from tiermem.server.transport.servicer import MemoryServicer

    data = tmp_path / "data"
    leader = spawn_server(data, "--search-processes", "2")  # (it keeps the commit log followers read)
    rng = np.random.default_rng(5)
    with MemoryClient(leader.target, timeout=30) as c:
        for i in range(20):
            c.create("f", f"memory {i}", embedding=_vec(rng), embedding_model="t", id=f"m{i}")
    config = ServerConfig(data_dir=data, maintenance_interval_seconds=0, search_concurrency=1)
    engine = Engine(config, follower=True)  # (a follower of the leader, in this process)
    upstream = grpc.insecure_channel(leader.target)
    service = pb.DESCRIPTOR.services_by_name["MemoryService"]
    forwarder = Forwarder(
        upstream, service.full_name, methods_of(service), keep=set(SEARCHES), upstream="the leader"
    )
    serving = _Serving()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers(
        (forwarder, _local_searches(MemoryServicer(engine), engine, forwarder, serving))
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    raw = channel.unary_unary("/tiermem.v1.MemoryService/SearchMemories")  # (bytes in and out)
    good = pb.SearchMemoriesRequest(
        namespaces=["f"], query_embedding=_vec(rng), embedding_model="t", read_only=True
    ).SerializeToString()

    def wait_count(n: int) -> None:
        deadline = time.monotonic() + 20
        while serving() != n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert serving() == n

    try:
        assert len(pb.SearchMemoriesResponse.FromString(raw(good, timeout=30)).results) == 10
        assert serving() == 0
        with engine.searcher.turns.take():  # (the one ranking turn: searches wait for it)
            running = [raw.future(good, timeout=30) for _ in range(3)]
            late = raw.future(good, timeout=1.0)
            wait_count(4)
            with pytest.raises(grpc.RpcError) as waited:
                late.result()
            assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            wait_count(3)  # (it gave up waiting for its turn at its deadline)
            for bad in (
                b"\xff\xff",
                pb.SearchMemoriesRequest(namespaces=["f"], limit=-1).SerializeToString(),
            ):
                with pytest.raises(grpc.RpcError) as refused:
                    raw(bad, timeout=30)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert serving() == 3
        for call in running:
            assert len(pb.SearchMemoriesResponse.FromString(call.result()).results) == 10
        wait_count(0)
        engine.state.follow_error = RuntimeError("stopped following")  # (as a failed catch-up leaves it)
        # (the forwarded search waits there: the leader and its own follower, which shares its port)
        stopped = [leader.proc.pid, *map(int, child_pids(leader.proc.pid))]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            forwarded = raw.future(good, timeout=30)
            time.sleep(0.5)
            assert not forwarded.done() and serving() == 0
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert len(pb.SearchMemoriesResponse.FromString(forwarded.result()).results) == 10
        assert serving() == 0
    finally:
        channel.close()
        server.stop(None).wait()
        upstream.close()
        engine.close()
        leader.stop()
        leader.close()
