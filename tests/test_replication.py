"""Replicas on other hosts (docs/scaling.md): a server started with ``replica_of`` copies its leader
over gRPC (ReplicateChanges), serves reads, refuses writes, catches up after a restart, and takes
over when promoted; with ``replica_ack`` sync a write is answered once a replica has stored it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import FreezingRelay, SlowLink, writes_grow_the_map

from tiermem.client import MemoryClient, TiermemError
from tiermem.client.errors import from_rpc_error
from tiermem.server.core.state import PROMOTED
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc


def _state(c: MemoryClient) -> dict[str, Any]:
    """What a server holds, as comparable values: memories (with vectors), configs, graph."""
    out: dict[str, Any] = {}
    for ns in c.list_namespaces():
        for m in c.list_memories(ns.name, include_embedding=True):
            out[(m.namespace, m.id)] = (m.content, m.tier, round(m.importance, 6), tuple(m.embedding))
    out["config"] = c.get_namespace_config("user:ana").config.SerializeToString(deterministic=True)
    try:
        around = c.neighbors("user:ana", "ana", depth=1, include_invalid=True)
        out["graph"] = (sorted(n.id for n in around.nodes), sorted(e.relation for e in around.edges))
    except TiermemError as e:  # (no graph)
        out["graph"] = e.reason
    return out


def _eventually(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the replica did not catch up in time"
        time.sleep(0.05)


def _same(leader: MemoryClient, replica: MemoryClient) -> Callable[[], bool]:
    def same() -> bool:
        try:
            return _state(leader) == _state(replica)
        except TiermemError as e:
            if e.reason != "REPLICA_COPYING":  # (reads wait for the copy's last batch)
                raise
            return False

    return same


def _write_some(c: MemoryClient, start: int, n: int) -> list[pb.Memory]:
    return [
        c.create("user:ana/project:x", f"ana noted fact number {i} about the deploy")
        for i in range(start, start + n)
    ]


def test_a_replica_says_when_it_cannot_reach_its_leader_and_when_it_does_again(
    server_factory: Callable[..., RunningServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its call waits for the leader in silence (reads answer REPLICA_COPYING meanwhile): the
    replica logs the wait."""
    from tiermem.server.transport import replication

    monkeypatch.setattr(replication, "UNREACHED_WARNING_SECONDS", (1.0, 60.0))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again: nothing listens there)
    caplog.set_level("INFO", logger="tiermem")
    server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{port}")
    _eventually(lambda: f"cannot reach its leader 127.0.0.1:{port}" in caplog.text)
    from tiermem.server.config import ServerConfig
    from tiermem.server.transport.app import create_server

    leader = create_server(
        ServerConfig(
            host="127.0.0.1", port=port, data_dir=tmp_path / "leader", replication=True, search_processes=1
        )
    )
    try:
        _eventually(lambda: f"reached its leader 127.0.0.1:{port} again" in caplog.text)
    finally:
        leader.stop(0)


def test_a_replica_that_declares_a_space_its_leader_holds_otherwise_stores_nothing_of_it(
    server_factory: Callable[..., RunningServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        lc.create("user:ana", "a vector of eight", embedding=[1.0] + [0.0] * 7, embedding_model="m8")
        replica = server_factory(
            tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}", embedding_spaces="m8=4"
        )
        _eventually(lambda: "EMBEDDING_SPACE_CONFLICT" in caplog.text)
        assert (
            "embedding_spaces declares m8=4, but the leader's vectors of it have dimension 8" in caplog.text
        )
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc, pytest.raises(TiermemError) as copying:
            list(rc.list_memories("user:ana"))
        assert copying.value.reason == "REPLICA_COPYING"  # (its copy never began)
        replica.stop(0)
        # nothing of the copy was stored: started again with the leader's spaces, it copies everything
        replica = server_factory(
            tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}", embedding_spaces="m8=8"
        )
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            assert [m.content for m in rc.list_memories("user:ana")] == ["a vector of eight"]
    replica.stop(0)


def _progress(c: MemoryClient) -> dict[str, tuple[float, int]]:
    """Each namespace's progress toward its next reflection and summary, as its export carries it."""
    return {
        ch.scope.namespace: (round(ch.scope.reflection_importance, 6), ch.scope.summary_tokens)
        for ch in c.export_memories()
        if ch.WhichOneof("chunk") == "scope"
    }


def _two_scopes_followed(lc: MemoryClient, rc: MemoryClient) -> None:
    """Observations in two task scopes at the leader, once the replica shows their progress."""
    for ns in ("user:ana/task:1", "user:ana/task:2"):
        for i in range(3):
            lc.create(ns, f"an observation number {i} in {ns}", importance=0.4)
    _eventually(lambda: _progress(rc) == _progress(lc) and len(_progress(lc)) == 2)


def test_a_replica_follows_the_progress_of_a_namespace_whose_memories_are_all_gone(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A namespace's progress toward its next reflection and summary reaches a replica with the
    commits that change it, also where none of its memories is written: a namespace deleted
    whole drops its progress on the replica too (it kept it: a promoted replica then reflected
    early)."""

    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        _two_scopes_followed(lc, rc)
        lc.delete_namespace("user:ana/task:1")
        assert set(_progress(lc)) == {"user:ana/task:2"}
        _eventually(lambda: _progress(rc) == _progress(lc) and rc.stats().memory_count == 3)
    replica.stop(0)


def test_a_replica_catching_up_across_commits_logged_before_their_namespaces_were_drops_the_gone(
    server_factory: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commit-log entries written by a server from before the log named the namespaces whose
    progress changed (four fields, not five) bring a resuming replica every namespace's progress,
    and drop the progress of the others: a namespace deleted whole in those commits has none left
    on the replica (it kept its progress)."""
    import lmdb
    import msgpack

    from tiermem.server.core import replication

    copies: list[int] = []
    full_copy = replication._full_copy

    def counted(*args: Any) -> Any:  # (the leader's full copies, counted)
        copies.append(1)
        return (yield from full_copy(*args))

    monkeypatch.setattr(replication, "_full_copy", counted)

    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        _two_scopes_followed(lc, rc)
    replica.stop(0)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        lc.delete_namespace("user:ana/task:1")
        lc.create("user:ana/task:2", "one more while the replica is down", importance=0.4)
        wanted = _progress(lc)
    leader.stop(None)
    env = lmdb.open(str(tmp_path / "leader" / "lmdb"), max_dbs=16)
    with env.begin(write=True) as txn:  # (each entry as a server from before the list wrote it)
        commits = env.open_db(b"commits", txn=txn)
        old = [(bytes(k), msgpack.unpackb(v)) for k, v in txn.cursor(db=commits)]
        assert old and all(len(entry) == 5 for _, entry in old)
        for key, entry in old:
            txn.put(key, msgpack.packb(entry[:4], use_bin_type=True), db=commits)
    env.close()
    copies.clear()
    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        _eventually(lambda: rc.stats().memory_count == 4 and _progress(rc) == wanted)
        assert set(_progress(rc)) == {"user:ana/task:2"}
    assert copies == []  # (it resumed from its commit: a full copy would have dropped it anyway)
    replica.stop(0)


def test_a_replica_moves_a_memorys_duplicate_entry_with_its_content(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """As on the leader, a content update leaves one exact-duplicate entry for the memory, the
    new content's (the old one's stayed: one entry more a replicated update)."""

    def entries(running: RunningServer) -> int:
        store = running.engine.state.store
        with store.read() as txn:
            return int(txn.stat(store.contents)["entries"])

    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        m = lc.create("ns", "version 0 of the note")
        for i in range(1, 11):
            lc.update("ns", m.id, content=f"version {i} of the note")
        _eventually(_same(lc, rc))
        assert entries(replica) == entries(leader) == 1
        lc.update("ns", m.id, kind="fact")  # (the entry is the kind's too)
        _eventually(lambda: rc.get("ns", m.id).kind == "fact")
        assert entries(replica) == entries(leader) == 1
        lc.delete("ns", m.id)
        _eventually(lambda: rc.stats().memory_count == 0)
        assert entries(replica) == entries(leader) == 0
    replica.stop(0)


def test_a_write_split_into_parts_for_a_replica_is_stored_whole_or_not_at_all(
    server_factory: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog of more memories than a batch carries comes in parts; the replica stores them
    together, so no reader sees, and no promotion keeps, a part of an all-or-none batch. (The
    replica keeps the parts in a temporary file here: past 1 KiB.)"""
    from tiermem.server.core import replication

    monkeypatch.setattr(replication, "SPOOL_MEMORY_BYTES", 1024)
    leader = server_factory(tmp_path / "leader", replication=True)
    link = SlowLink(leader.port, 256 * 1024)  # (the 1,000 memories and vectors: about 7 s of it)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{link.port}")
    batch = [{"namespace": "team:batch", "content": f"item {j}", "id": f"i{j}"} for j in range(1000)]
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        lc.create("user:ana", "before the batches")
        _eventually(lambda: rc.stats().memory_count == 1, timeout=30)
        lc.create_batch(batch)
        seen = set()
        _eventually(lambda: seen.add(n := rc.stats("team:batch").memory_count) or n == 1000, timeout=60)
        assert seen <= {0, 1000}
        # the link is cut, and the leader lost, before the last part of the next batch arrived
        lc.create_batch([{**m, "namespace": "team:second"} for m in batch])
        time.sleep(5.0)  # (the first part has come by now, the last one cannot have)
        link.cut()
        leader.stop(0)
        assert rc.promote_replica().memory_count == 1001
        assert rc.stats("team:second").memory_count == 0
    replica.stop(0)


def test_a_backlog_is_never_whole_in_the_leaders_memory(
    server_factory: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica far behind gets its backlog in parts, packed into a spool that goes to a file past
    its memory (1 MiB here): the leader never holds the whole backlog (24 parts) in memory."""
    from tiermem.server.core import replication

    monkeypatch.setattr(replication, "SPOOL_MEMORY_BYTES", 1 << 20)
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        lc.create("user:ana", "before the backlog")
        engine = leader.engine
        after = engine.committed_seq
        text = "a long note about the deploy " * 40  # (about 1.2 KB a memory)
        for b in range(12):
            lc.create_batch([{"namespace": "team:log", "content": f"{b}-{j} {text}"} for j in range(1000)])
    parts: list[tuple[int, int]] = []
    tracemalloc.start()
    try:
        feed = engine.replication_feed(engine.instance_id, after, lambda: not parts or parts[-1][0] == 0)
        for seq, start, payload in feed:
            assert not start
            parts.append((seq, len(payload)))
            if seq:
                break
        feed.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    total = sum(size for _, size in parts)
    print(f"\n{len(parts)} parts, {total / 2**20:.1f} MiB packed, peak {peak / 2**20:.1f} MiB while feeding")
    assert len(parts) >= 20 and parts[-1][0] == engine.committed_seq
    assert all(seq == 0 for seq, _ in parts[:-1])
    assert peak < total / 3


def test_writes_go_on_while_a_replica_stops_reading(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A replica that stops reading its stream (a stalled peer, a partition) holds no read
    transaction on the leader: the leader's writes go on, growing its map, which waits for every
    open read transaction."""
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    leader = server_factory(tmp_path / "leader", replication=True, map_size=4 << 20)
    with MemoryClient(f"127.0.0.1:{leader.port}", timeout=20) as lc:
        lc.create("user:ana", "before the stall")
        hold = threading.Event()

        def requests() -> Iterator[pb.ReplicateChangesRequest]:
            yield pb.ReplicateChangesRequest(
                instance_id=leader.engine.instance_id, applied_seq=leader.engine.committed_seq
            )
            hold.wait()

        with grpc.insecure_channel(f"127.0.0.1:{leader.port}") as channel:
            call = pb_grpc.MemoryServiceStub(channel).ReplicateChanges(requests())  # (never read)
            try:
                text = "a note about the deploy " * 40
                for b in range(40):  # (about 8 MiB of records and vectors: the map grows)
                    lc.create_batch(
                        [{"namespace": "team:log", "content": f"{b}-{j} {text}"} for j in range(100)]
                    )
                assert lc.stats("team:log").memory_count == 4000
                assert leader.engine.state.store.map_size > 4 << 20
            finally:
                call.cancel()
                hold.set()


def test_writes_go_on_while_a_new_replica_stops_reading_its_full_copy(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A new replica that stops reading in the middle of its full copy holds no read transaction on
    the leader either: each batch of the copy is read in a transaction of its own and sent after it
    closed, so the leader's writes go on and grow its map."""
    from tiermem.v1 import memory_pb2_grpc as pb_grpc

    leader = server_factory(tmp_path / "leader", replication=True, map_size=4 << 20)
    text = "a note about the deploy " * 40
    with MemoryClient(f"127.0.0.1:{leader.port}", timeout=20) as lc:
        for b in range(6):  # (3,000 memories: a copy of several parts, each past a stream's window)
            lc.create_batch([{"namespace": "team:old", "content": f"{b}-{j} {text}"} for j in range(500)])
        hold = threading.Event()

        def requests() -> Iterator[pb.ReplicateChangesRequest]:
            yield pb.ReplicateChangesRequest(instance_id="", applied_seq=0)  # (holds nothing: a full copy)
            hold.wait()

        # (no BDP probing: the stream's window stays small, so the leader's feed waits on it)
        options = [("grpc.http2.bdp_probe", 0)]
        with grpc.insecure_channel(f"127.0.0.1:{leader.port}", options=options) as channel:
            call = pb_grpc.MemoryServiceStub(channel).ReplicateChanges(requests())
            try:
                first = next(call)  # the copy has begun; then nothing more is read
                assert first.full_copy_start and first.seq == 0
                writes_grow_the_map(lc, leader.engine.state.store)
            finally:
                call.cancel()
                hold.set()


@pytest.mark.slow
def test_a_copy_over_a_slow_link_longer_than_a_keepalive_round_completes_in_one_call(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Over a link of 3 Mbit/s a copy of about 13 MiB takes ~35 s, far past the 10 s a ping is given
    to be answered. A ping's answer waits behind what is in flight; the replica's fixed 1 MiB
    window (up to 2 MiB while a batch of ~1.2 MiB arrives) keeps that short enough, so the one call
    carries the whole copy (with bandwidth probing's 4 MiB and more, over 2 Mbit/s, it was cut
    every ~12 s and never completed)."""
    leader = server_factory(tmp_path / "leader", replication=True)
    text = "a note about the deploy " * 20
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        for b in range(6):
            lc.create_batch([{"namespace": "team:a", "content": f"{b}-{j} {text}"} for j in range(1000)])
    link = SlowLink(leader.port, 384 * 1024)
    try:
        started = time.monotonic()
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{link.port}")
        follower = replica.replica_follower
        assert follower is not None
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(lambda: not replica.engine.replica_copying and rc.stats().memory_count == 6000, 120)
        took = time.monotonic() - started
        print(f"\nthe copy took {took:.1f} s")
        assert took > 25 and follower.full_copies == 1
        replica.stop(0)  # (before the link is cut: it would reconnect meanwhile)
    finally:
        link.cut()


@pytest.mark.slow
def test_the_feed_of_a_replica_cut_off_without_a_reset_ends_within_a_minute(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A partition leaves the replica's connection open: the leader's keepalive pings
    (transport/process.py) find that it no longer answers, and its feed ends, freeing the commit
    log it kept for it, where it waited for TCP to give up (about 15 minutes)."""
    leader = server_factory(tmp_path / "leader", replication=True)
    relay = FreezingRelay(leader.port, after=0)
    replica = server_factory(tmp_path / "replica", replica_of=relay.address)
    feeds = leader.engine.state.feed_floors
    with relay, MemoryClient(f"127.0.0.1:{leader.port}", timeout=20) as lc:
        lc.create("user:ana", "before the partition")
        _eventually(lambda: len(feeds) == 1, timeout=30)
        relay.arm.set()
        text = "a note about the deploy " * 40
        for b in range(10):  # (the first bytes back freeze the relay; the rest fill its windows)
            lc.create_batch([{"namespace": "team:log", "content": f"{b}-{j} {text}"} for j in range(100)])
        started = time.monotonic()
        assert relay.frozen.is_set()
        _eventually(lambda: not feeds, timeout=60)
        print(f"\nthe feed ended {time.monotonic() - started:.1f} s after the partition")
        replica.stop(0)  # (before the relay closes: it would reconnect to nothing meanwhile)


def test_parts_of_a_backlog_past_their_memory_go_to_a_file_and_read_back_every_time(tmp_path: Path) -> None:
    from tiermem.server.core.replication import Parts

    payloads = [bytes([i]) * (300 + i) for i in range(5)]
    parts = Parts(tmp_path, memory_bytes=1000)
    for p in payloads[:3]:
        parts.add(p)
    assert not parts.on_disk and list(parts) == payloads[:3]
    for p in payloads[3:]:
        parts.add(p)
    assert parts.on_disk
    assert list(parts) == payloads and list(parts) == payloads  # (a retried write reads them again)
    parts.close()


def test_parts_on_a_full_disk_are_resource_exhausted(tmp_path: Path) -> None:
    """A spool that cannot be written (here the process's file-size limit, EFBIG, as a full disk
    fails with ENOSPC) is RESOURCE_EXHAUSTED naming the disk, not an internal error, whether the
    failing part went straight to the file or through its buffer, and closing it raises nothing
    (what the buffer held is thrown away)."""
    script = f"""
import resource
from pathlib import Path
from tiermem.server.core.replication import Parts
from tiermem.server.model.errors import ResourceExhausted
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))  # (Python ignores SIGXFSZ: EFBIG)
for size in (80_000, 3_000):  # past the file's buffer, and within it
    parts = Parts(Path({str(tmp_path)!r}), memory_bytes=1000)
    parts.add(b"a" * 50_000)
    added = 1
    try:
        while True:
            parts.add(bytes([added]) * size)
            added += 1
    except ResourceExhausted as e:
        print(e.reason, e.metadata["resource"], e.message)
    parts.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.startswith("STORAGE_FULL disk no disk space to spool") for line in lines
    )


def test_a_full_copy_read_while_the_leader_writes_ends_equal_to_the_leader(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A full copy is read a batch at a time while the leader goes on writing; the commits made
    meanwhile come after it. Driven by hand here (the leader's feed, the replica storing each part
    as its follower does), with the writes between the first batch and the rest: memories changed
    after their batch went (600 of them: the commits come in parts, the first one with a vector
    of a new embedding space), one deleted before its batch was read, new ones, settings, the
    graph. The scan reads only the memories that existed when it began; a replica stopped between
    two parts of the commits starts again; the copy ends equal to the leader."""
    import msgpack

    from tiermem.server.model.records import Record

    with socket.create_server(("127.0.0.1", 0)) as reserved:  # (its own follower reaches nothing)
        nowhere = reserved.getsockname()[1]
    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{nowhere}")
    ns = "user:ana/project:x"
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        items = [
            m
            for b in range(3)
            for m in lc.create_batch(
                [{"namespace": ns, "content": f"ana noted fact {b}-{i} about the deploy"} for i in range(400)]
            )
        ]
        lc.upsert_node("user:ana", "ana")
        engine = leader.engine
        feed = engine.replication_feed("", 0, lambda: True)
        parts = []  # (seq, the batch)

        def store(seq: int, start: bool, payload: bytes) -> None:
            parts.append((seq, msgpack.unpackb(payload, raw=False, strict_map_key=False)))
            replica.engine.store_replica_batch(engine.instance_id, seq, start, [payload])

        store(*next(feed))  # settings
        store(*next(feed))  # the first 512 memories
        for m in items[3:600]:
            lc.update(ns, m.id, content=m.content + " (changed)")
        lc.delete(ns, items[1].id)  # (its batch went)
        lc.update(ns, items[2].id, tier="glacial")
        lc.delete(ns, items[-1].id)  # (its batch is not read yet)
        _write_some(lc, 0, 20)
        lc.update_namespace_config("user:ana", max_items=1000)
        lc.upsert_node("user:ana", "berlin")
        lc.add_edge("user:ana", "ana", "lives_in", "berlin")
        while "graph_items" not in parts[-1][1]:  # the rest of the scan, then the graph
            store(*next(feed))
        scanned = {Record.unpack(r[1]).id for _, b in parts for r in b.get("records", [])}
        assert scanned == {m.id for m in items[:-1]}  # (not the one deleted before its batch, nor the new)
        # After the scan: a vector of a new space, known to the replica only from the commits since.
        lc.update(ns, items[0].id, embedding=[1.0] + [0.0] * 7, embedding_model="m8")
        store(*next(feed))  # the first part of the commits since: settings and the new space with it
        assert "configs" in parts[-1][1] and parts[-1][0] == 0
        replica.stop(0)
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{nowhere}")
        while not parts[-1][0]:
            store(*next(feed))
        feed.close()
        assert parts[-1][0] == engine.committed_seq and not replica.engine.replica_copying
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            assert _state(rc) == _state(lc)
            assert rc.stats().memory_count == 1200 - 2 + 20
    replica.stop(0)


def test_a_replica_without_a_complete_copy_cannot_be_promoted(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        lc.create_batch([{"namespace": "team:a", "content": f"item {j}"} for j in range(1000)])
    link = SlowLink(leader.port, 256 * 1024)  # (the full copy takes about 7 s over it)
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        nowhere = reserved.getsockname()[1]
    alone = server_factory(tmp_path / "alone", replica_of=f"127.0.0.1:{nowhere}")
    copying = server_factory(tmp_path / "copying", replica_of=f"127.0.0.1:{link.port}")
    for replica in (alone, copying):
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            if replica is copying:  # (a part of the copy stored, not the last)
                _eventually(lambda: rc.stats().memory_count > 0, timeout=30)
            with pytest.raises(TiermemError) as refused:
                rc.promote_replica()
            assert (refused.value.code.name, refused.value.reason) == (
                "FAILED_PRECONDITION",
                "REPLICA_INCOMPLETE",
            )
    with MemoryClient(f"127.0.0.1:{copying.port}") as rc:  # (still a replica, following: it completes)
        # (every memory is in before the copy ends: the commits made during it come last)
        _eventually(lambda: rc.stats().memory_count == 1000 and not copying.engine.replica_copying, 60)
        assert rc.promote_replica().memory_count == 1000
    link.cut()


def test_a_replica_of_an_empty_leader_holds_a_complete_copy(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        _eventually(lambda: not replica.engine.replica_copying)  # (reads answered, not REPLICA_COPYING)
        assert list(rc.list_memories("user:ana")) == []
        assert rc.promote_replica().memory_count == 0


def test_a_promotion_during_which_a_new_copy_began_is_refused(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        for i in range(5):
            lc.create("user:ana", f"fact {i}")
        _eventually(_same(lc, rc))
        # the first batch of a new full copy (a reconnect too far behind the log), stored while the
        # follower stops: as one the follower was storing when the promotion began would be
        _, start, first = next(leader.engine.replication_feed("", 0, lambda: True))
        assert start

        def stop_following() -> None:
            replica.engine.store_replica_batch(leader.engine.instance_id, 0, True, [first])
            replica.replica_follower.stop()

        with pytest.raises(FailedPrecondition) as refused:
            replica.engine.promote("", stop_following)
        assert refused.value.reason == "REPLICA_INCOMPLETE"


@pytest.mark.slow
def test_a_replica_reaches_its_leader_within_seconds_of_it_coming_up_after_a_long_absence(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as reserved:  # the leader's address, nothing there yet
        port = reserved.getsockname()[1]
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{port}")
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        lc.create("user:ana", "written while the replica could not reach its leader")
        time.sleep(20.0)  # (gRPC's own reconnect backoff would have grown to about 10 s by now)
        link = SlowLink(leader.port, 0, listen=port)  # the leader's address answers from now on
        t0 = time.monotonic()
        _eventually(lambda: _same(lc, rc)(), timeout=30)
        assert time.monotonic() - t0 < 3.0
        link.cut()
    replica.stop(0)


def test_a_replica_copies_its_leader_serves_reads_refuses_writes_and_takes_over(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        first = _write_some(lc, 0, 30)  # before the replica exists: it gets a full copy
        lc.update_namespace_config("user:ana", max_items=1000)
        lc.upsert_node("user:ana", "ana")
        lc.upsert_node("user:ana", "deploy")
        lc.add_edge("user:ana", "ana", "owns", "deploy")
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            # Changes after the copy: creates, an update, a delete, a tier move, the graph.
            _write_some(lc, 30, 20)
            lc.update("user:ana/project:x", first[0].id, content="ana changed her mind about the deploy")
            lc.delete("user:ana/project:x", first[1].id)
            lc.update("user:ana/project:x", first[2].id, tier="glacial")
            lc.transfer("user:ana/project:x", first[3].id, target_namespace="user:ana/project:y", mode="move")
            lc.upsert_node("user:ana", "berlin")
            lc.add_edge("user:ana", "ana", "lives_in", "berlin")
            _eventually(_same(lc, rc))
            hits = rc.search("user:ana/project:x", "changed her mind", limit=1)
            assert hits[0].memory.id == first[0].id
            with pytest.raises(TiermemError) as refused:
                rc.create("user:ana", "written at the replica")
            assert (refused.value.code.name, refused.value.reason) == (
                "FAILED_PRECONDITION",
                "READ_ONLY_REPLICA",
            )
            held = _state(rc)
        # The leader is lost: the replica is promoted and takes writes, with nothing missing.
        leader.stop(0)
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            with pytest.raises(TiermemError) as wrong:
                rc.promote_replica(leader_instance_id="not-its-leader")
            assert (wrong.value.code.name, wrong.value.reason) == (
                "FAILED_PRECONDITION",
                "REPLICA_OF_ANOTHER",
            )
            promoted = rc.promote_replica(leader_instance_id=leader.engine.instance_id)
            assert promoted.leader_instance_id == leader.engine.instance_id
            assert promoted.memory_count == 49
            assert _state(rc) == held
            # A retry (its answer lost, or a failover command run again) gets the same answer.
            again = rc.promote_replica(leader_instance_id=leader.engine.instance_id)
            assert (again.leader_instance_id, again.applied_seq, again.memory_count) == (
                promoted.leader_instance_id,
                promoted.applied_seq,
                49,
            )
            with pytest.raises(TiermemError) as wrong:
                rc.promote_replica(leader_instance_id="not-its-leader")
            assert wrong.value.reason == "REPLICA_OF_ANOTHER"
            m = rc.create("user:ana/project:x", "written after the promotion")
            assert rc.get("user:ana/project:x", m.id).content == "written after the promotion"
            assert m.id not in {k[1] for k in held if isinstance(k, tuple)}
    replica.stop(0)
    # Started again as a replica, promoted data refuses: following a leader would replace it.
    with pytest.raises(Exception, match="promoted from a replica"):
        server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    # ... with exit status 2, a setting's fault, which the systemd unit does not restart after.
    started = subprocess.run(
        [sys.executable, "-m", "tiermem.server", "--data-dir", str(tmp_path / "replica"), "--port", "0",
         "--replica-of", f"127.0.0.1:{leader.port}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 2 and "[REPLICA_PROMOTED]" in started.stderr, started.stderr


def test_a_restarted_replica_continues_from_its_last_commit(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        _write_some(lc, 0, 10)
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
        replica.stop(0)
        _write_some(lc, 10, 10)  # while the replica is down
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        follower = replica.replica_follower
        assert follower is not None and follower.applied > 0  # (it resumes, not starts over)
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            assert rc.stats().memory_count == 20


def test_synchronous_acknowledgement_waits_for_a_replica(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    leader = server_factory(
        tmp_path / "leader", replication=True, replica_ack="sync", replica_ack_timeout_seconds=2.0
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{leader.port}")  # (no retry policy: the first answer)
    with MemoryClient(channel=channel, timeout=10) as lc:
        with pytest.raises(TiermemError) as unconfirmed:
            lc.create("user:ana", "no replica yet", request_id="r1")
        assert (unconfirmed.value.code.name, unconfirmed.value.reason) == (
            "UNAVAILABLE",
            "REPLICA_NOT_CONFIRMED",
        )
    # Through the client's own channel (its retry policy retries UNAVAILABLE): answered as it
    # is, once, not retried until the client's deadline (each retry waited out the timeout again).
    with MemoryClient(f"127.0.0.1:{leader.port}", timeout=20) as lc:
        started = time.monotonic()
        with pytest.raises(TiermemError) as unconfirmed:
            lc.create("user:ana", "no replica yet", request_id="r1")
        assert unconfirmed.value.reason == "REPLICA_NOT_CONFIRMED" and time.monotonic() - started < 6
    with MemoryClient(channel=grpc.insecure_channel(f"127.0.0.1:{leader.port}"), timeout=10) as lc:
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(lambda: rc.stats().memory_count == 1)
            retried = lc.create("user:ana", "no replica yet", request_id="r1")  # (stored once, now confirmed)
            for i in range(10):
                m = lc.create("user:ana", f"confirmed write {i}")
                assert rc.get("user:ana", m.id).content == f"confirmed write {i}"  # there when answered
            assert rc.get("user:ana", retried.id).content == "no replica yet"
            assert rc.stats().memory_count == 11


def test_an_idle_leader_stops_without_waiting_out_its_grace_for_its_replica(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A replica's feed never ends by itself: it ends once caught up and alone in the handlers."""
    leader = server_factory(tmp_path / "leader", replication=True, replica_ack="sync")
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc, MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        for i in range(5):
            lc.create("user:ana", f"confirmed {i}")
        assert rc.stats().memory_count == 5
    started = time.monotonic()
    leader.stop(10.0)
    assert time.monotonic() - started < 3.0


def test_promotions_overlapping_give_one_answer_and_one_set_of_writers(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A retry sent while the first promotion is still stopping its follower (the client's deadline
    passed) waits for it, then answers the same: it read the promoted position as a replica's and
    stored it promoted twice, starting the writer loops again."""

    leader = server_factory(tmp_path / "leader", replication=True)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        lc.create("ns", "hello")
    _eventually(lambda: not replica.engine.replica_copying and replica.engine.replica_position()[1] > 0)
    follower = replica.replica_follower
    assert follower is not None

    def slow_stop() -> None:
        follower.stop()
        time.sleep(0.5)  # (a follower slow to let go)

    answers: list[tuple[str, int, int]] = []
    calls = [
        threading.Thread(target=lambda: answers.append(replica.engine.promote("", slow_stop)))
        for _ in range(2)
    ]
    calls[0].start()
    time.sleep(0.1)
    calls[1].start()
    for t in calls:
        t.join()
    assert answers[0] == answers[1] and not answers[0][0].startswith(PROMOTED)
    names = [t.name for t in replica.engine._background._threads]
    assert names.count("tiermem-summarizer") == 1


def test_a_leader_stopping_does_not_wait_out_a_write_waiting_for_a_replica(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Once the server stopped, its replicas' feeds are cancelled and no ack can come: a write
    still waiting for one ends then (the stop waits for the calls' handlers before it closes LMDB;
    it waited out the ack timeout, here 20 s)."""
    leader = server_factory(
        tmp_path / "leader", replication=True, replica_ack="sync", replica_ack_timeout_seconds=20.0
    )
    with grpc.insecure_channel(f"127.0.0.1:{leader.port}") as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        write = stub.CreateMemory.future(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="ns", content="hi"))
        )
        deadline = time.monotonic() + 10
        while leader.engine.committed_seq == 0:  # (stored, now waiting for a replica)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        began = time.monotonic()
        leader.stop(0)
        assert time.monotonic() - began < 5
        with pytest.raises(grpc.RpcError):
            write.result(timeout=10)


@pytest.mark.parametrize("ahead", [5, 2**64 - 1 - 3])
def test_a_replica_past_the_last_commit_gets_a_full_copy_and_confirms_nothing(
    server_factory: Callable[..., RunningServer], tmp_path: Path, ahead: int
) -> None:
    """A replica claiming a commit this leader never made (another history, or a forged position
    up to the largest uint64) is sent a full copy, and its claim confirms no synchronous write."""
    leader = server_factory(
        tmp_path / "leader", replication=True, replica_ack="sync", replica_ack_timeout_seconds=0.5
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{leader.port}")  # (no retry policy: the first answer)
    with MemoryClient(channel=channel, timeout=10) as lc:
        for i in range(3):
            with pytest.raises(TiermemError):  # (stored, but no replica yet)
                lc.create("user:ana", f"before the replica {i}")
        probe = lc.stub.ReplicateChanges(iter([pb.ReplicateChangesRequest()]), timeout=5)
        instance = next(probe).instance_id
        probe.cancel()
        done = threading.Event()

        def requests() -> Iterator[pb.ReplicateChangesRequest]:
            yield pb.ReplicateChangesRequest(instance_id=instance, applied_seq=3 + ahead)
            done.wait(10)

        call = lc.stub.ReplicateChanges(requests(), timeout=10)
        try:
            first = next(call)
            assert first.full_copy_start and first.instance_id == instance
            with pytest.raises(TiermemError) as unconfirmed:
                lc.create("user:ana", "not confirmed by a forged position")
            assert (unconfirmed.value.code.name, unconfirmed.value.reason) == (
                "UNAVAILABLE",
                "REPLICA_NOT_CONFIRMED",
            )
        finally:
            done.set()
            call.cancel()
        assert lc.stats().memory_count == 4


def test_a_server_without_replication_feeds_no_replica(server: RunningServer) -> None:
    with MemoryClient(f"127.0.0.1:{server.port}") as c:
        with pytest.raises(grpc.RpcError) as refused:
            list(c.stub.ReplicateChanges(iter([pb.ReplicateChangesRequest()]), timeout=5))
        assert from_rpc_error(refused.value).reason == "NOT_REPLICATING"
        with pytest.raises(TiermemError) as not_replica:
            c.promote_replica()
        assert (not_replica.value.code.name, not_replica.value.reason) == (
            "FAILED_PRECONDITION",
            "NOT_A_REPLICA",
        )


def test_ids_reused_within_one_batch_and_vector_keys_after_promotion(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A batch that deletes a memory and gives its id to another keeps the id findable; a promoted
    replica numbers its new vectors after its leader's (a restart then maps each vector to its own
    memory)."""
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        old = lc.create("user:ana", "ana keeps her bike in the cellar", id="k1")
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            other = lc.create("user:ana", "ana rides to work every day")
            lc.transfer("user:ana", other.id, target_id="k1", overwrite=True, mode="move")  # (one commit)
            lc.delete("user:ana", "k1")
            lc.create("user:ana", "ana sold the bike in spring", id="k1")
            _eventually(_same(lc, rc))
            assert rc.get("user:ana", "k1").content == "ana sold the bike in spring"
            assert old.id == "k1"
            rc.promote_replica()
            fresh = rc.create("user:ana", "ana bought a red scooter")
    replica.stop(0)
    leader.stop(0)
    restarted = server_factory(tmp_path / "replica")
    with MemoryClient(f"127.0.0.1:{restarted.port}") as c:
        assert c.search("user:ana", "a red scooter", limit=1)[0].memory.id == fresh.id
        assert c.search("user:ana", "sold the bike in spring", limit=1)[0].memory.id == "k1"
        assert c.stats().memory_count == 2


def test_a_full_copy_is_split_and_the_log_keeps_what_a_replica_still_needs(
    server_factory: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full copy goes in batches of records and of graph items; with the commit log pruned at
    every commit, the commits a connected replica has yet to receive are kept, so it never starts
    over."""
    from tiermem.server.config import Tuning
    from tiermem.server.core import replication

    monkeypatch.setattr(replication, "BATCH_RECORDS", 4)
    monkeypatch.setattr(replication, "BATCH_GRAPH", 3)
    leader = server_factory(
        tmp_path / "leader", replication=True, tuning=Tuning(commit_log_seconds=0.0, commit_log_prune_every=1)
    )
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        _write_some(lc, 0, 10)
        for i in range(10):
            lc.upsert_node("user:ana", f"node{i}")
        lc.upsert_node("user:ana", "ana")
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            for i in range(30):
                lc.create("user:ana", f"written while the log is pruned {i}")
                if i % 10 == 0:
                    lc.upsert_node("user:ana", f"late{i}")
            _eventually(_same(lc, rc))
            assert rc.stats().memory_count == 40
            follower = replica.replica_follower
            assert follower is not None and follower.full_copies == 1


def test_a_replica_without_a_copy_answers_no_reads(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    import socket

    with socket.socket() as s:  # (a leader that is not there yet)
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"
    replica = server_factory(tmp_path / "replica", replica_of=nowhere)
    channel = grpc.insecure_channel(f"127.0.0.1:{replica.port}")
    with MemoryClient(channel=channel, timeout=0.5) as rc:
        with pytest.raises(TiermemError) as refused:
            rc.search("user:ana", "anything")
        assert (refused.value.code.name, refused.value.reason) == ("UNAVAILABLE", "REPLICA_COPYING")
        assert rc.stats().memory_count == 0  # (server-wide figures name no namespace)


def test_replication_is_watched_through_metrics(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """The leader exports its last commit, its replicas connected and how many commits the
    furthest has not confirmed; a replica whether it is fed and the leader's commit it stored:
    connected as soon as its call is fed, before any change comes, and not once the leader is gone."""
    import urllib.request

    def scrape(running: RunningServer) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
        return {
            name: float(value)
            for name, _, value in (line.partition(" ") for line in lines)
            if name.startswith(("tiermem_replica", "tiermem_commit_seq"))
        }

    leader = server_factory(tmp_path / "leader", replication=True, metrics_port=0)
    assert scrape(leader)["tiermem_replicas_connected"] == 0
    assert "tiermem_replica_commits_behind" not in scrape(leader)  # (no replica: nothing to be behind)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        _write_some(lc, 0, 10)
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}", metrics_port=0)
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
        seq = scrape(leader)["tiermem_commit_seq"]
        _eventually(lambda: scrape(leader).get("tiermem_replica_commits_behind") == 0)
        assert seq > 0 and scrape(leader)["tiermem_replicas_connected"] == 1
        got = scrape(replica)
        assert got["tiermem_replica_connected"] == 1 and got["tiermem_replica_applied_seq"] == seq
        assert got["tiermem_replica_full_copies_total"] == 1 and "tiermem_commit_seq" not in got
        replica.stop(0)
        _eventually(lambda: scrape(leader)["tiermem_replicas_connected"] == 0)
        _write_some(lc, 10, 3)  # (while it is down)
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}", metrics_port=0)
    _eventually(
        lambda: scrape(replica)["tiermem_replica_applied_seq"] == scrape(leader)["tiermem_commit_seq"]
    )
    replica.stop(0)
    # Started again caught up, the leader idle: connected before any change comes.
    replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}", metrics_port=0)
    _eventually(lambda: scrape(replica)["tiermem_replica_connected"] == 1)
    assert scrape(replica)["tiermem_replica_full_copies_total"] == 0  # (it continued from its commit)
    leader.stop(0)
    _eventually(lambda: scrape(replica)["tiermem_replica_connected"] == 0)


def test_a_listing_goes_on_across_a_replica_and_a_failover(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Page tokens are sealed with the leader data's key: a page read on the leader goes on at its
    replica (a proxy may send the next call there), and at the replica once promoted."""
    leader = server_factory(tmp_path / "leader", replication=True)
    with MemoryClient(f"127.0.0.1:{leader.port}") as lc:
        for i in range(6):
            lc.create("tenant-a", f"a{i}", id=f"a{i}")
        replica = server_factory(tmp_path / "replica", replica_of=f"127.0.0.1:{leader.port}")
        with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
            _eventually(_same(lc, rc))
            first, token = lc.list_page("tenant-a", page_size=2)
            second, token = rc.list_page("tenant-a", page_size=2, page_token=token)
    leader.stop(0)
    with MemoryClient(f"127.0.0.1:{replica.port}") as rc:
        rc.promote_replica()
        third, end = rc.list_page("tenant-a", page_size=2, page_token=token)
        assert end == "" and [m.id for m in first + second + third] == [f"a{i}" for i in range(6)]
