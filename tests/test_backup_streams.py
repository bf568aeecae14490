"""Backup and restore (streaming export/import), memory streams (timelines) and debate records."""

from __future__ import annotations

import logging
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
from conftest import FakeClock, SlowLink, writes_grow_the_map
from google.protobuf.timestamp_pb2 import Timestamp

from tiermem.client import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    MemoryClient,
    NotFoundError,
)
from tiermem.client.client import metadata_dict
from tiermem.client.errors import from_rpc_error
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=60)
    c.wait_ready()
    return c


def _state(m: pb.Memory) -> tuple:
    """Everything an export must carry over, but the namespace."""
    return (
        m.id,
        m.content,
        m.kind,
        m.tier,
        round(m.importance, 6),
        m.source,
        m.topic,
        tuple(m.tags),
        tuple(sorted(metadata_dict(m).items())),
        m.embedding_model,
        tuple(np.round(m.embedding, 6)),
        m.create_time.seconds,
        m.last_access_time.seconds,
        m.access_count,
        round(m.surprise_score, 6),
        m.success_count,
        m.token_cost,
        tuple(m.source_memory_ids),
        m.tier_time.seconds,
    )


def test_a_restore_keeps_the_order_memories_were_stored_in(
    server_factory: Callable[..., RunningServer],
) -> None:
    """An export sends memories in the order they were stored (not by id), so a restore stores them
    in that order again: listings, and what breaks ties by it (the oldest duplicate reinforced,
    the earliest evicted among equals), come out as on the original, into the same namespaces or
    under a target."""
    src = server_factory()
    dst = server_factory(data_dir=src.engine.config.data_dir.parent / "restored")
    with _client(src) as a, _client(dst) as b:
        ids = ["z1", "y2", "x3", "w4", "m5"]
        for ns in ("o", "o/child"):
            for mid in ids:
                a.create(ns, f"memory {mid} of {ns}", id=mid)
        a.observe("dup", "the same words", id="zz-first")
        a.observe("dup", "the same words", id="aa-second")
        whole = list(a.export_memories())
        assert [c.memory.id for c in whole if c.WhichOneof("chunk") == "memory"][:5] == ids  # (not by id)
        b.import_memories(whole)
        b.import_memories(list(a.export_memories("o", include_children=True)), target_namespace="t")
        for ns, there in (("o", "o"), ("o/child", "o/child"), ("o", "t"), ("o/child", "t/child")):
            assert [m.id for m in b.list_memories(there)] == [m.id for m in a.list_memories(ns)] == ids
        for c in (a, b):  # (an exact duplicate reinforces the oldest: the one stored first)
            assert c.create("dup", "the same words").id == "zz-first"


def test_export_import_round_trip_under_concurrent_writes(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    clock = FakeClock()
    source = server_factory(data_dir=tmp_path / "a", clock=clock)
    rng = np.random.default_rng(5)
    with _client(source) as c:
        for i in range(300):
            kw = {"embedding": rng.normal(size=8), "embedding_model": "m8"} if i % 2 else {}
            c.create(
                "user:a/project:x",
                f"memory {i}",
                id=f"m{i}",
                importance=float(rng.random()),
                tier=["fast", "medium", "slow", "glacial"][i % 4],
                tags=[f"t{i % 3}"],
                metadata={"n": i, "odd": bool(i % 2)},
                source="agent",
                topic="tests",
                **kw,
            )
        c.create("user:a/project:x/task:1", "a child scope memory", id="child")
        c.create("user:b", "another user's memory", id="other")
        c.feedback("user:a/project:x", [{"id": "m1", "actual_usefulness": 1.0, "success": True}])
        before = {m.id: m for m in c.list_memories("user:a/project:x", include_embedding=True)}

        # Export while another client keeps writing to the same namespace.
        stop = threading.Event()
        written: list[str] = []

        def writer() -> None:
            with _client(source) as w:
                i = 0
                while not stop.is_set():
                    written.append(w.create("user:a/project:x", f"late {i}", id=f"late{i}").id)
                    i += 1

        t = threading.Thread(target=writer)
        t.start()
        try:
            chunks = list(c.export_memories("user:a/project:x", include_children=True))
        finally:
            stop.set()
            t.join()
        assert written, "the concurrent writer made no progress"
        assert chunks[0].HasField("header") and chunks[0].header.namespace == "user:a/project:x"
        exported = [ch.memory for ch in chunks[1:] if ch.WhichOneof("chunk") == "memory"]
        assert {ch.WhichOneof("chunk") for ch in chunks[1:]} == {"memory", "scope"}
        ids = {m.id for m in exported}
        assert {f"m{i}" for i in range(300)} | {"child"} <= ids
        assert "other" not in ids
        # A consistent snapshot: late writes are all in or all out up to a point (a prefix).
        late = sorted(int(i[4:]) for i in ids if i.startswith("late"))
        assert late == list(range(len(late)))

    target = server_factory(data_dir=tmp_path / "b", clock=clock)
    with _client(target) as c:
        resp = c.import_memories(chunks, target_namespace="user:a/project:y")
        assert resp.imported == len(exported) and resp.reembedded == 0
        after = {m.id: m for m in c.list_memories("user:a/project:y", include_embedding=True)}
        for mid, m in before.items():
            assert _state(after[mid]) == _state(m), mid
        assert c.get("user:a/project:y/task:1", "child").content == "a child scope memory"
        # Searchable after restore, by vector and by text.
        v = before["m7"].embedding
        top = c.search("user:a/project:y", list(v), embedding_model="m8", alpha=1, beta=0, gamma=0, limit=1)[
            0
        ]
        assert top.memory.id == "m7" and top.relevance == pytest.approx(1.0, abs=1e-5)
        assert c.search("user:a/project:y", "memory 10", limit=1)[0].memory.id == "m10"
        # Importing again into the same place collides, naming the memory.
        with pytest.raises(AlreadyExistsError):
            c.import_memories(chunks, target_namespace="user:a/project:y")


@pytest.mark.slow
def test_an_export_and_an_import_over_a_slow_link_complete(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Over a link of 2 Mbit/s each stream runs ~25 s, past the 10 s a ping is given to be answered:
    its answer waits behind the data in flight, which the fixed 1 MiB windows of client and server
    keep short enough (with bandwidth probing the export was cut after 10 s, the import after 20)."""
    server = server_factory()
    text = "a note about the deploy " * 20
    with _client(server) as c:
        for b in range(3):
            c.create_batch([{"namespace": "team:a", "content": f"{b}-{j} {text}"} for j in range(1000)])
    down = SlowLink(server.port, 256 * 1024)  # (answers slow: the export)
    up = SlowLink(server.port, 0, up=256 * 1024)  # (requests slow: the import)
    try:
        started = time.monotonic()
        with MemoryClient(f"127.0.0.1:{down.port}", timeout=300) as c:
            chunks = list(c.export_memories("team:a"))
        exported = time.monotonic() - started
        with MemoryClient(f"127.0.0.1:{up.port}", timeout=300) as c:
            done = c.import_memories(chunks, target_namespace="team:b")
        imported = time.monotonic() - started - exported
        print(f"\nexport {exported:.1f} s, import {imported:.1f} s")
        assert done.imported == 3000 and exported > 15 and imported > 15
    finally:
        down.cut()
        up.cut()
    with _client(server) as c:
        assert c.stats("team:b").memory_count == 3000


def test_writes_go_on_while_an_export_client_stops_reading(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """An export is read from one read transaction into a spool and sent after the transaction
    closed: a client that reads its first chunks and then stops holds no transaction on the
    server, so the server's writes go on and grow its map (growth waits for every open read
    transaction; before the spool these writes waited until their deadline). Read at last, the
    export is the snapshot of when it began."""
    server = server_factory(tmp_path / "s", map_size=4 << 20)
    text = "a note about the deploy " * 40
    with MemoryClient(f"127.0.0.1:{server.port}", timeout=20) as c:
        for b in range(6):  # (3,000 memories: an export far past a stream's window)
            c.create_batch([{"namespace": "team:old", "content": f"{b}-{j} {text}"} for j in range(500)])
        # (no BDP probing: the stream's window stays small, so the server's sends wait on it)
        options = [("grpc.http2.bdp_probe", 0)]
        with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=options) as channel:
            call = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest())
            try:
                first, second = next(call), next(call)  # then nothing more is read for a while
                assert first.HasField("header") and second.HasField("memory")
                writes_grow_the_map(c, server.engine.state.store)
                rest = list(call)
            finally:
                call.cancel()
    memories = [second.memory] + [ch.memory for ch in rest if ch.WhichOneof("chunk") == "memory"]
    assert len(memories) == 3000 and {m.namespace for m in memories} == {"team:old"}
    assert len({m.id for m in memories}) == 3000


def _slow_spooling(server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """3,000 memories in team:a, and each memory's packing into an export's spool slowed to 1 ms
    (the spool takes seconds): the times they were packed at."""
    from tiermem.server.core import backup

    with _client(server) as c:
        for b in range(6):
            c.create_batch([{"namespace": "team:a", "content": f"{b}-{j} a note"} for j in range(500)])
    packed: list[float] = []
    original = backup._packed

    def slow(item: Any) -> Any:
        time.sleep(0.001)
        packed.append(time.monotonic())
        return original(item)

    monkeypatch.setattr(backup, "_packed", slow)
    return packed


def test_an_export_cancelled_while_it_spools_stops_reading(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that cancels while its export is being spooled stops the spooling within a part
    (256 memories): the read transaction does not stay open to read the rest for no one. (Each
    memory's packing is slowed to 1 ms here, so the spool takes seconds.)"""
    from tiermem.server.core import backup

    server = server_factory()
    original = backup._packed
    packed = _slow_spooling(server, monkeypatch)
    with _client(server) as c:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest())
            assert next(call).HasField("header")
            time.sleep(0.1)
            cancelled = time.monotonic()
            call.cancel()
        time.sleep(1.5)  # (the rest would take over 2 s)
        after = sum(t > cancelled for t in packed)
        assert len(packed) < 1500 and after <= 2 * backup.SPOOL_ITEMS, (len(packed), after)
        monkeypatch.setattr(backup, "_packed", original)
        assert sum(ch.HasField("memory") for ch in c.export_memories("team:a")) == 3000


def test_a_cancelled_export_is_counted_cancelled_not_a_deadline_passed(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The export a client cancels while it spools is counted (and logged) CANCELLED; one whose
    deadline passes, DEADLINE_EXCEEDED."""
    import re
    import urllib.request

    server = server_factory(metrics_port=0)
    _slow_spooling(server, monkeypatch)

    def counted() -> dict[str, float]:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        got = re.findall(r'tiermem_rpc_total\{code="(\w+)",method="ExportMemories"\} (\S+)', text)
        return {code: float(n) for code, n in got}

    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest())
        assert next(call).HasField("header")
        time.sleep(0.1)
        call.cancel()
        for _ in range(100):  # (the handler leaves within a spool part)
            if counted():
                break
            time.sleep(0.05)
        assert counted() == {"CANCELLED": 1.0}
        late = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest(), timeout=0.5)
        with pytest.raises(grpc.RpcError) as e:
            list(late)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for _ in range(100):
            if len(counted()) == 2:
                break
            time.sleep(0.05)
        assert counted() == {"CANCELLED": 1.0, "DEADLINE_EXCEEDED": 1.0}


def test_calls_that_end_unanswered_are_counted_for_why_they_ended(
    server_factory: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The access line (and the count) of a call that ended before it was answered: an import
    whose client stalls past its deadline DEADLINE_EXCEEDED (its client's cancel at the deadline
    reaches the server first: it was CANCELLED, or OK), an export cancelled while it is sent
    CANCELLED (it was OK), an export the server's stop cut short UNAVAILABLE (it was CANCELLED:
    no client cancelled it)."""
    server = server_factory()
    caplog.set_level(logging.DEBUG, logger="tiermem.access")

    def codes(method: str) -> list[str]:
        time.sleep(0.3)  # (the handler's end, logged after the client saw it)
        return [r.code for r in caplog.records if r.name == "tiermem.access" and r.method.endswith(method)]

    head = pb.ImportMemoriesRequest(header=pb.ExportHeader(format_version=1))

    def stalled() -> Iterator[pb.ImportMemoriesRequest]:
        yield head
        time.sleep(1.5)

    with grpc.insecure_channel(f"127.0.0.1:{server.port}", options=[("grpc.http2.bdp_probe", 0)]) as channel:
        stub = pb_grpc.MemoryServiceStub(channel)
        for timeout in (1.0, 0.3):
            with pytest.raises(grpc.RpcError) as e:
                stub.ImportMemories(stalled(), timeout=timeout)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # (Rarely OK: the client's cancel at its deadline can end the request stream while the
        # server still sees the call active, and the handler answers; a known inaccuracy.)
        stalled_codes = codes("/ImportMemories")
        assert len(stalled_codes) == 2 and set(stalled_codes) <= {"DEADLINE_EXCEEDED", "OK"}, stalled_codes
        assert "DEADLINE_EXCEEDED" in stalled_codes, stalled_codes
        with _client(server) as c:  # (an export far past a stream's window: its sends wait)
            for b in range(6):
                c.create_batch(
                    [{"namespace": "a", "content": f"{b}-{j} " + "a note " * 120} for j in range(500)]
                )
        call = stub.ExportMemories(pb.ExportMemoriesRequest())
        assert next(call).HasField("header") and next(call).HasField("memory")
        call.cancel()
        assert codes("/ExportMemories") == ["CANCELLED"]
    _slow_spooling(server, monkeypatch)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest())
        assert next(call).HasField("header")
        server.stop(0)
        with pytest.raises(grpc.RpcError):
            list(call)
    assert codes("/ExportMemories") == ["CANCELLED", "UNAVAILABLE"]


def test_a_server_stopping_while_an_export_spools_closes_lmdb_once_the_handler_left(
    server_factory: Callable[..., RunningServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """gRPC reports a stopped server stopped once it has cancelled its calls, while their handlers
    may still run: the engine closes LMDB only after they left. Before, an export spooling when the
    server stopped read on from a closed environment ("ExportMemories failed: Attempt to operate on
    closed/deleted/dropped object"). Packing is slowed to 1 ms a memory so the spool takes seconds."""
    server = server_factory()
    packed = _slow_spooling(server, monkeypatch)
    caplog.set_level(logging.WARNING)
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = pb_grpc.MemoryServiceStub(channel).ExportMemories(pb.ExportMemoriesRequest())
        assert next(call).HasField("header")
        time.sleep(0.1)
        server.stop(0)
        stopped = time.monotonic()
        with pytest.raises(grpc.RpcError):
            list(call)
    time.sleep(0.5)
    assert 0 < len(packed) < 3000 and not [t for t in packed if t > stopped]  # (it stopped within a part)
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failures, failures


def test_an_export_is_the_same_spooled_in_memory_on_disk_or_sent_from_its_transaction(
    tmp_path: Path,
) -> None:
    """The same export three ways: spooled in memory, spooled to a file, and, where the disk has no
    room for the spool (here the process's file-size limit, EFBIG, as a full disk fails with
    ENOSPC), sent from its read transaction instead: the same chunks each time, nothing refused."""
    script = f"""
import resource
from pathlib import Path
from tiermem.server.config import ServerConfig
from tiermem.server.core import spool
from tiermem.server.core.engine import Engine
from tiermem.server.model.records import NewMemory
from tiermem.server.model.reports import ExportHeader
from tiermem.server.transport.convert import export_chunk_to_pb

cfg = ServerConfig(data_dir=Path({str(tmp_path / "data")!r}), maintenance_interval_seconds=0,
                   snapshot_interval_seconds=0, snapshot_on_shutdown=False)
e = Engine(cfg)
text = "a note about the deploy " * 40
for b in range(6):
    e.create([NewMemory(namespace="team:a", content=f"{{b}}-{{j}} {{text}}") for j in range(500)], batch=True)
e.create([NewMemory(namespace="team:b", content="another team's memory")])

def exported():
    return [export_chunk_to_pb(item).SerializeToString(deterministic=True)
            for item in e.export("team:a") if not isinstance(item, ExportHeader)]

in_memory = exported()
spool.MEMORY_BYTES = 1 << 16
on_disk = exported()
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # (Python ignores SIGXFSZ: EFBIG)
no_room = exported()
print(len(in_memory), sum(map(len, in_memory)), in_memory == on_disk, in_memory == no_room)
e.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
    count, size, same_on_disk, same_no_room = done.stdout.split()
    assert int(count) > 3000 and int(size) > 4 << 20  # (the memories, their scope; past the limit)
    assert same_on_disk == "True" and same_no_room == "True"


def test_import_reembeds_when_the_embedder_differs(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "a")
    with _client(source) as c:
        c.create("ns", "embedded by the server", id="s")
        c.create("ns", "brought its own vector", id="v", embedding=[1.0, 0.0, 0.0], embedding_model="own")
        chunks = list(c.export_memories("ns"))
    target = server_factory(data_dir=tmp_path / "b", builtin_model="hash-v2", builtin_dimension=64)
    with _client(target) as c:
        resp = c.import_memories(chunks)
        assert (resp.imported, resp.reembedded) == (2, 1)
        s = c.get("ns", "s", include_embedding=True)
        assert s.embedding_model == "hash-v2" and len(s.embedding) == 64
        v = c.get("ns", "v", include_embedding=True)
        assert v.embedding_model == "own" and list(v.embedding) == [1.0, 0.0, 0.0]


def test_import_needs_the_header_first(client: MemoryClient) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        client.import_memories(
            [pb.ExportMemoriesResponse(memory=pb.Memory(namespace="ns", content="x", id="a"))]
        )
    assert info.value.fields == ["header"]
    bad = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=9))
    with pytest.raises(InvalidArgumentError) as info:
        client.import_memories([bad])
    assert info.value.fields == ["header.format_version"]


_HEADER = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))


@pytest.mark.parametrize(
    "history, field",
    [
        ({"surprise_score": float("nan")}, "chunks[1].memory.surprise_score"),
        ({"surprise_score": 7.0}, "chunks[1].memory.surprise_score"),
        ({"access_count": -5}, "chunks[1].memory.access_count"),
        ({"success_count": -1}, "chunks[1].memory.success_count"),
        ({"update_time": Timestamp(seconds=2**62)}, "chunks[1].memory.update_time"),
        ({"last_access_time": Timestamp(seconds=-62135596801)}, "chunks[1].memory.last_access_time"),
        (
            {"origin": pb.MemoryOrigin(namespace="a b", id="m1", tier=pb.TIER_FAST)},
            "chunks[1].memory.origin.namespace",
        ),
        (
            {"origin": pb.MemoryOrigin(namespace="p", id="\x00", tier=pb.TIER_FAST)},
            "chunks[1].memory.origin.id",
        ),
        ({"origin": pb.MemoryOrigin(namespace="p", id="m1", tier=99)}, "chunks[1].memory.origin.tier"),
        ({"tier_time": Timestamp(seconds=1_700_000_000, nanos=-1)}, "chunks[1].memory.tier_time"),
        (
            {
                "origin": pb.MemoryOrigin(
                    namespace="p", id="m1", tier=pb.TIER_FAST, transfer_time=Timestamp(nanos=10**9)
                )
            },
            "chunks[1].memory.origin.transfer_time",
        ),
    ],
)
def test_import_refuses_a_history_no_server_could_have_made(
    client: MemoryClient, history: dict[str, object], field: str
) -> None:
    """An exported memory's counters, times and origin are restored as they are, so they are
    checked as a create checks its fields: a value no server could have given is refused."""
    bad = pb.ExportMemoriesResponse(memory=pb.Memory(namespace="i", id="x", content="imported", **history))
    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([_HEADER, bad])
    assert err.value.fields == [field]
    assert [ns.name for ns in client.list_namespaces()] == []
    good = pb.ExportMemoriesResponse(
        memory=pb.Memory(
            namespace="i",
            id="x",
            content="imported",
            surprise_score=0.4,
            access_count=3,
            origin=pb.MemoryOrigin(
                namespace="p", id="m1", tier=pb.TIER_SLOW, transfer_time=Timestamp(seconds=5)
            ),
        )
    )
    client.import_memories([_HEADER, good])
    m = client.get("i", "x")
    assert (round(m.surprise_score, 6), m.access_count, m.origin.id, m.origin.tier) == (
        0.4,
        3,
        "m1",
        pb.TIER_SLOW,
    )


def test_import_into_a_protected_namespace_needs_confirm_for_preferences_and_summaries(
    client: MemoryClient,
) -> None:
    """As a create does: restoring a summary (which becomes the current one) or a preference into
    a protected namespace needs confirm; other kinds do not."""
    client.create("p", "a note", id="n0", kind="observation")
    client.update_namespace_config("p", protected=True)

    def chunk(mid: str, kind: str) -> pb.ExportMemoriesResponse:
        return pb.ExportMemoriesResponse(
            memory=pb.Memory(namespace="p", id=mid, content=f"a {kind}", kind=kind)
        )

    client.import_memories([_HEADER, chunk("o1", "observation")])
    for kind in ("summary", "preference"):
        with pytest.raises(FailedPreconditionError) as err:
            client.import_memories([_HEADER, chunk(f"{kind}1", kind)])
        assert err.value.reason == "NAMESPACE_PROTECTED"
        client.import_memories([_HEADER, chunk(f"{kind}1", kind)], confirm=True)
    assert sorted(m.id for m in client.list_memories("p")) == ["n0", "o1", "preference1", "summary1"]


def test_a_cancelled_import_keeps_its_committed_batches_and_stores_nothing_after(
    server_factory: Callable[..., RunningServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled midway, an import keeps the batches of 500 it committed and stores nothing after
    them; the cancel is not an internal error. gRPC hands the server a cancel as the stream's end,
    and the cancel itself a moment later: a stream whose first chunk promised an end request
    (``end_marked``, as the Python clients send) and ended without it was cut short, so what came
    after the last batch is not stored (without the promise it was stored whole when the server
    saw the cancel after its last commit)."""
    running = server_factory()
    with _client(running) as c:
        for cancel in range(3):
            ns = f"imp{cancel}"
            release = threading.Event()

            def chunks(
                ns: str = ns, release: threading.Event = release
            ) -> Iterator[pb.ImportMemoriesRequest]:
                yield pb.ImportMemoriesRequest(header=pb.ExportHeader(format_version=1), end_marked=True)
                for i in range(700):
                    yield pb.ImportMemoriesRequest(
                        memory=pb.Memory(namespace=ns, id=f"m{i}", content=f"note {i}")
                    )
                yield pb.ImportMemoriesRequest(scope=pb.ScopeState(namespace=ns, summary_tokens=5))
                release.wait(30)

            call = c.stub.ImportMemories.future(chunks(), timeout=60)
            deadline = time.monotonic() + 30
            while c.stats(ns).memory_count < 500:
                assert time.monotonic() < deadline, "the first batch was not committed"
                time.sleep(0.05)
            time.sleep(0.3)  # (the rest reaches the server and waits for the stream's end)
            call.cancel()
            release.set()
            time.sleep(1.0)
            assert (c.stats(ns).memory_count, c.stats(ns).summary_tokens) == (500, 0)
    assert not [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and ("ImportMemories" in r.getMessage() or "Exception serializing" in r.getMessage())
    ]


def test_an_import_that_promised_its_end_and_ended_without_it_stores_nothing_after_its_batches(
    client: MemoryClient,
) -> None:
    """``end_marked`` on the first chunk promises an ``end`` request last: a stream that ends
    without it is INVALID_ARGUMENT naming ``end`` (the batches of 500 committed stay, the rest is
    not stored); ``end`` on a request that carries a chunk is refused; the Python client sends
    both, and a stream without the promise ends at its end, as before."""

    def requests(
        ns: str, n: int, marked: bool, end: pb.ImportMemoriesRequest | None
    ) -> list[pb.ImportMemoriesRequest]:
        out = [pb.ImportMemoriesRequest(header=pb.ExportHeader(format_version=1), end_marked=marked)]
        out += [
            pb.ImportMemoriesRequest(memory=pb.Memory(namespace=ns, id=f"m{i}", content=f"note {i}"))
            for i in range(n)
        ]
        out.append(pb.ImportMemoriesRequest(scope=pb.ScopeState(namespace=ns, summary_tokens=5)))
        return out + ([end] if end is not None else [])

    def refused(reqs: list[pb.ImportMemoriesRequest]) -> InvalidArgumentError:
        with pytest.raises(grpc.RpcError) as raised:
            client.stub.ImportMemories(iter(reqs), timeout=60)
        err = from_rpc_error(raised.value)
        assert isinstance(err, InvalidArgumentError)
        return err

    e = refused(requests("cut", 700, True, None))
    assert e.fields == ["end"] and "without the end request" in e.message
    assert (client.stats("cut").memory_count, client.stats("cut").summary_tokens) == (500, 0)

    bad = pb.ImportMemoriesRequest(memory=pb.Memory(namespace="bad", id="x", content="x"), end=True)
    e = refused(requests("bad", 3, True, bad))
    assert e.fields == ["chunks[5].end"] and client.stats("bad").memory_count == 0
    header_end = requests("bad", 3, True, None)
    header_end[0].end = True
    assert refused(header_end).fields == ["chunks[0].end"] and client.stats("bad").memory_count == 0

    done = client.stub.ImportMemories(
        iter(requests("whole", 700, True, pb.ImportMemoriesRequest(end=True))), timeout=60
    )
    assert done.imported == 700 and client.stats("whole").summary_tokens == 5
    done = client.stub.ImportMemories(iter(requests("old", 700, False, None)), timeout=60)
    assert done.imported == 700 and client.stats("old").summary_tokens == 5

    sent: list[pb.ImportMemoriesRequest] = []
    chunks = list(client.export_memories("whole"))
    original = client.stub.ImportMemories

    def recorded(reqs: Iterator[pb.ImportMemoriesRequest], **kw: object) -> pb.ImportMemoriesResponse:
        return original((sent.append(r) or r for r in reqs), **kw)

    client.stub.ImportMemories = recorded  # type: ignore[method-assign]
    try:
        assert client.import_memories(chunks, target_namespace="copy").imported == 700
    finally:
        client.stub.ImportMemories = original  # type: ignore[method-assign]
    assert sent[0].end_marked and sent[-1] == pb.ImportMemoriesRequest(end=True)
    assert not any(r.end for r in sent[:-1]) and len(sent) == len(chunks) + 1


def test_timeline_is_newest_first_paged_and_time_bounded(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock()
    with _client(server_factory(clock=clock)) as c:
        t0 = clock.now
        for i in range(25):
            c.create("agent:1", f"event {i}", id=f"e{i}")
            clock.advance(60)
        c.create("agent:2", "someone else's event")
        got = [m.id for m in c.timeline("agent:1", page_size=7)]
        assert got == [f"e{i}" for i in reversed(range(25))]
        window = [m.id for m in c.timeline("agent:1", since=t0 + 5 * 60, until=t0 + 10 * 60)]
        assert window == [f"e{i}" for i in (9, 8, 7, 6, 5)]


def test_debate_records_and_similar_debates(client: MemoryClient) -> None:
    client.create(
        "debates", "consensus: ship the cache behind a flag", kind="consensus", topic="caching rollout"
    )
    client.create("debates", "dissent: the cache hides stale reads", kind="dissent", topic="caching rollout")
    client.create("debates", "consensus: adopt trunk-based development", kind="consensus", topic="branching")
    client.create("debates", "an ordinary observation about caching", kind="observation")
    found = client.find_similar_debates("debates", "cache rollout")
    assert {r.memory.kind for r in found} <= {"consensus", "dissent"}
    assert {r.memory.content for r in found[:2]} == {
        "consensus: ship the cache behind a flag",
        "dissent: the cache hides stale reads",
    }


def test_export_carries_the_graph_and_the_current_summary(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "a")
    with _client(source) as c:
        m = c.create("p", "Ana owns billing")
        c.upsert_node("p", "ana", label="person", properties={"age": 41}, memory_ids=[m.id])
        c.upsert_node("p", "billing", label="service")
        old = c.add_edge("p", "ana", "owned", "billing", valid_from=1.0, invalid_from=2.0)
        c.add_edge("p", "ana", "owns", "billing")
        c.summarize("p", "First summary.", source_memory_ids=[])
        c.summarize("p", "Current summary.", source_memory_ids=[m.id])
        chunks = list(c.export_memories("p"))
    kinds = [ch.WhichOneof("chunk") for ch in chunks]
    assert kinds.count("node") == 2 and kinds.count("edge") == 2
    assert kinds.index("edge") > max(i for i, k in enumerate(kinds) if k == "node")  # nodes come first
    target = server_factory(data_dir=tmp_path / "b")
    with _client(target) as c:
        resp = c.import_memories(chunks, target_namespace="q")
        assert resp.graph_items == 4
        now = c.neighbors("q", "ana")
        assert [(e.source_id, e.relation, e.target_id) for e in now.edges] == [("ana", "owns", "billing")]
        history = c.neighbors("q", "ana", as_of=1.5)
        assert [e.id for e in history.edges] == [old.id]
        assert dict(now.nodes[0].properties)["age"].int_value == 41
        ctx = c.build_context(["q"], token_budget=100, read_only=True)
        summary = next(s for s in ctx.sections if s.kind == "summary")
        assert [i.text for i in summary.items] == ["Current summary."]


def _progress(c: MemoryClient, ns: str) -> tuple[float, int, bool, bool]:
    st = c.stats(ns)
    return round(st.reflection_importance, 6), st.summary_tokens, st.reflection_due, st.summary_due


def test_export_carries_progress_toward_the_next_reflection_and_summary(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A restored namespace reflects and summarizes when the original would have: its accumulated
    observation importance and token count since the last summary travel with the export (added
    to what the target namespace has accumulated itself)."""
    settings = {"reflection_threshold": 1.5, "summary_token_threshold": 40}
    source = server_factory(data_dir=tmp_path / "a", **settings)
    with _client(source) as c:
        c.observe("p", "the deploy failed twice on friday", importance=0.9)
        c.summarize("p", "Deploys are flaky.", source_memory_ids=[])  # resets the token count
        c.observe("p", "rollback worked after the second failure", importance=0.7)
        c.observe("p/c", "child scope note", importance=0.4)
        c.create("quiet", "no observations here", kind="fact")
        expected = {ns: _progress(c, ns) for ns in ("p", "p/c")}
        assert expected["p"][0] == pytest.approx(1.6) and expected["p"][2]  # reflection due
        assert 0 < expected["p"][1] < 40 and expected["p/c"][0] == pytest.approx(0.4)
        chunks = list(c.export_memories("p", include_children=True))
        everything = list(c.export_memories())
    scopes = {ch.scope.namespace: ch.scope for ch in chunks if ch.WhichOneof("chunk") == "scope"}
    assert set(scopes) == {"p", "p/c"}
    kinds = [ch.WhichOneof("chunk") for ch in chunks]
    assert kinds.index("scope") > max(i for i, k in enumerate(kinds) if k == "memory")
    assert {ch.scope.namespace for ch in everything if ch.WhichOneof("chunk") == "scope"} == {
        "p",
        "p/c",
        "quiet",  # a fact counts toward the summary, not the reflection
    }

    target = server_factory(data_dir=tmp_path / "b", **settings)
    with _client(target) as c:
        c.import_memories(chunks, target_namespace="q")
        assert _progress(c, "q") == expected["p"]
        assert _progress(c, "q/c") == expected["p/c"]
        # Into a namespace with progress of its own (and no summary): the exported progress adds.
        c.observe("r/c", "an observation of r/c's own", importance=0.3)
        own = _progress(c, "r/c")
        c.import_memories(chunks, target_namespace="r")
        merged = _progress(c, "r/c")
        assert merged[0] == pytest.approx(own[0] + expected["p/c"][0])
        assert merged[1] == own[1] + expected["p/c"][1]

        # A scope state that is not a progress is refused, naming the chunk's field.
        header = pb.ExportMemoriesResponse(header=chunks[0].header)
        bad = pb.ExportMemoriesResponse(scope=pb.ScopeState(namespace="p", reflection_importance=-1.0))
        with pytest.raises(InvalidArgumentError) as err:
            c.import_memories([header, bad], target_namespace="s")
        assert err.value.fields == ["chunks[1].scope.reflection_importance"]
        assert _progress(c, "s") == (0.0, 0, False, False)
        negative = pb.ExportMemoriesResponse(scope=pb.ScopeState(namespace="p", summary_tokens=-1))
        with pytest.raises(InvalidArgumentError) as err:
            c.import_memories([header, negative], target_namespace="s")
        assert err.value.fields == ["chunks[1].scope.summary_tokens"]
        assert _progress(c, "s") == (0.0, 0, False, False)
        # Past the most a scope keeps (a server whose creates counted past it exports more): kept
        # at it, so that every export imports.
        huge = pb.ExportMemoriesResponse(
            scope=pb.ScopeState(namespace="p", summary_tokens=2**62, reflection_importance=1e300)
        )
        c.import_memories([header, huge], target_namespace="v")
        assert _progress(c, "v")[:2] == (1e15, 2**53)
        c.observe("v", "one more observation", importance=0.5)  # (counts past the cap)
        c.import_memories(list(c.export_memories("v")), target_namespace="w")
        assert _progress(c, "w")[:2] == (1e15, 2**53)

        # Progress at the most a scope keeps, imported twice, stays there: the namespace's stats
        # and export still work, and the export restores.
        most = pb.ExportMemoriesResponse(
            scope=pb.ScopeState(namespace="p", summary_tokens=2**53, reflection_importance=1e15)
        )
        for _ in range(2):
            c.import_memories([header, most], target_namespace="t")
        assert _progress(c, "t")[:2] == (1e15, 2**53)
        again = list(c.export_memories("t"))
        c.import_memories(again, target_namespace="u")
        assert _progress(c, "u")[:2] == (1e15, 2**53)


def test_an_imported_edge_needs_its_nodes_and_replacing_one_moves_its_links(client: MemoryClient) -> None:
    """An imported edge is checked as AddGraphEdge checks one: its ends must be nodes of its
    namespace, stored or in the import (else NOT_FOUND naming the chunk's field, and no graph item
    of the import is stored). An imported edge whose id is stored already replaces it: the ends it
    no longer has lose it (they listed it as their neighbour's before)."""
    for n in ("n1", "n2", "n3"):
        client.upsert_node("g", n)
    edge = client.add_edge("g", "n1", "knows", "n2")
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))

    def edge_chunk(eid: str, source: str, target: str) -> pb.ExportMemoriesResponse:
        e = pb.GraphEdge(id=eid, source_id=source, target_id=target, relation="met")
        return pb.ExportMemoriesResponse(edge=e, graph_namespace="g")

    node = pb.ExportMemoriesResponse(node=pb.GraphNode(id="n4"), graph_namespace="g")
    with pytest.raises(NotFoundError) as err:
        client.import_memories([head, node, edge_chunk("e2", "n1", "ghost")])
    assert "chunks[2].edge.target_id" in str(err.value) and "ghost" in str(err.value)
    assert err.value.metadata["field"] == "chunks[2].edge.target_id"  # (the chunk, not only in the text)
    assert sorted(n.id for n in client.neighbors("g", "n1").nodes) == ["n1", "n2"]
    with pytest.raises(NotFoundError):  # (the import's node was not stored either)
        client.neighbors("g", "n4")

    # nodes imported with the edge are its ends; the stored edge is replaced, its links moved
    client.import_memories([head, node, edge_chunk(edge.id, "n3", "n4")])
    assert [e.id for e in client.neighbors("g", "n2").edges] == []
    assert sorted(n.id for n in client.neighbors("g", "n2").nodes) == ["n2"]
    (moved,) = client.neighbors("g", "n4").edges
    assert (moved.id, moved.source_id, moved.target_id) == (edge.id, "n3", "n4")
    assert [e.id for e in client.neighbors("g", "n1").edges] == []

    # an edge without a relation, or with one that is no label, is refused as AddGraphEdge refuses
    # one, and nothing is stored
    blank = pb.GraphEdge(id="e3", source_id="n1", target_id="n2")
    with pytest.raises(InvalidArgumentError) as bad:
        client.import_memories([head, pb.ExportMemoriesResponse(edge=blank, graph_namespace="g")])
    assert bad.value.fields == ["chunks[1].edge.relation"]
    for relation in ("knows\n", " "):  # (a label, as AddGraphEdge's)
        odd = pb.GraphEdge(id="e3", source_id="n1", target_id="n2", relation=relation)
        with pytest.raises(InvalidArgumentError) as bad:
            client.import_memories([head, pb.ExportMemoriesResponse(edge=odd, graph_namespace="g")])
        assert bad.value.fields == ["chunks[1].edge.relation"]
    assert [e.id for e in client.neighbors("g", "n1").edges] == []


def test_an_imported_memory_without_times_was_created_at_the_import(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A memory exported without a creation time (another tool wrote the stream) was created when
    it is imported, and its other unset times are that one: not 1970, whose recency is nothing and
    which the next pass demotes as idle."""
    clock = FakeClock()
    server = server_factory(clock=clock)
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))

    def memory(mid: str, ns: str, **fields: Any) -> pb.ExportMemoriesResponse:
        return pb.ExportMemoriesResponse(
            memory=pb.Memory(id=mid, namespace=ns, content=f"memory {mid}", **fields)
        )

    with _client(server) as c:
        bare = memory("bare", "i")
        hour_ago, origin = (
            Timestamp(seconds=int(clock.now) - 3600),
            pb.MemoryOrigin(namespace="o", id="x", tier=1),
        )
        c.import_memories([head, bare, memory("dated", "i", create_time=hour_ago, origin=origin)])
        m = c.get("i", "bare")
        times = (m.create_time, m.update_time, m.last_access_time, m.tier_time)
        assert [t.seconds for t in times] == [int(clock.now)] * 4
        updated_only = memory("updated", "j", update_time=Timestamp(seconds=int(clock.now) - 600))
        c.import_memories([head, updated_only])  # (created no later than its update)
        u = c.get("j", "updated")
        assert u.create_time.seconds == u.update_time.seconds == int(clock.now) - 600
        d = c.get("i", "dated")
        assert d.create_time.seconds == d.update_time.seconds == int(clock.now) - 3600
        assert d.origin.transfer_time.seconds == int(clock.now) - 3600
        clock.advance(60)
        assert [mv.id for mv in c.consolidate("i").moves] == []


def test_an_import_names_the_chunk_of_a_vector_of_another_dimension_and_of_a_repeated_id(
    client: MemoryClient,
) -> None:
    """Errors of an import's memories name the chunk (``chunks[i].memory.``, chunk 0 the header),
    as its scope and graph errors do."""
    client.create("d", "a stored memory", embedding=[1.0, 0.0, 0.0], embedding_model="m3")
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))
    node = pb.ExportMemoriesResponse(node=pb.GraphNode(id="n"), graph_namespace="d")

    def memory(mid: str, vec: list[float]) -> pb.ExportMemoriesResponse:
        m = pb.Memory(id=mid, namespace="d", content=f"memory {mid}", embedding=vec, embedding_model="m3")
        return pb.ExportMemoriesResponse(memory=m)

    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([head, node, memory("a", [1.0, 0.0, 0.0]), memory("b", [1.0, 0.0])])
    assert err.value.fields == ["chunks[3].memory.embedding"]
    with pytest.raises(AlreadyExistsError) as dup:
        client.import_memories([head, memory("c", [0.0, 1.0, 0.0]), node, memory("c", [0.0, 0.0, 1.0])])
    assert "chunks[3].memory.id" in str(dup.value) and "earlier chunk" in str(dup.value)
    assert dup.value.metadata["field"] == "chunks[3].memory.id"
    assert not {m.id for m in client.list_memories("d")} & {"a", "b", "c"}


def test_an_import_takes_an_id_only_an_expired_memory_holds(client: MemoryClient) -> None:
    """An expired memory's id is free for a new one, as for a create: an import storing that id
    replaces the expired memory (not swept yet) instead of refusing ALREADY_EXISTS; an id a live
    memory holds is still refused."""
    client.create("q", "an expired memory", id="e1", expire_time=978307200.0)  # (2001: expired at once)
    client.create("q", "a live memory", id="live")
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))

    def memory(mid: str) -> pb.ExportMemoriesResponse:
        return pb.ExportMemoriesResponse(memory=pb.Memory(id=mid, namespace="q", content=f"imported {mid}"))

    assert client.import_memories([head, memory("e1")]).imported == 1
    assert client.get("q", "e1").content == "imported e1"
    assert sorted(m.id for m in client.list_memories("q")) == ["e1", "live"]
    assert client.stats("q").memory_count == 2
    with pytest.raises(AlreadyExistsError):
        client.import_memories([head, memory("live")])
    assert client.get("q", "live").content == "a live memory"


def test_an_imported_memory_already_past_its_expire_time_is_neither_stored_nor_counted(
    client: MemoryClient,
) -> None:
    """A memory that expired since its export is deleted for every read: the import checks it,
    then stores and counts only the live ones (it counted one it could never return)."""
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))
    gone = Timestamp(seconds=978307200)  # (2001)

    def memory(mid: str, **fields: Any) -> pb.ExportMemoriesResponse:
        return pb.ExportMemoriesResponse(
            memory=pb.Memory(id=mid, namespace="x", content=f"imported {mid}", **fields)
        )

    done = client.import_memories([head, memory("live"), memory("gone", expire_time=gone)])
    assert done.imported == 1 and [m.id for m in client.list_memories("x")] == ["live"]
    assert client.stats("x").memory_count == 1
    with pytest.raises(InvalidArgumentError) as bad:  # (checked all the same)
        client.import_memories([head, memory("bad", expire_time=gone, importance=2.0)])
    assert bad.value.fields == ["chunks[1].memory.importance"]


def test_an_imported_summary_leaves_its_namespace_one_summary(client: MemoryClient) -> None:
    """A namespace keeps one summary when one is imported too: the newer by create time, the
    restored one or the namespace's own, is its summary, and the other is deleted (an older
    restored one counts as imported, replaced in the same commit)."""
    c = client
    c.create("s", "what happened today")
    own = c.summarize("s", "The namespace's own summary.", source_memory_ids=[])
    head = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1))

    def summary(mid: str, text: str, when: float) -> pb.ExportMemoriesResponse:
        m = pb.Memory(id=mid, namespace="s", content=text, kind="summary")
        m.create_time.FromSeconds(int(when))
        return pb.ExportMemoriesResponse(memory=m)

    created = own.create_time.seconds
    assert c.import_memories([head, summary("old", "An older summary.", created - 3600)]).imported == 1
    assert [m.id for m in c.list_memories("s", kinds=["summary"])] == [own.id]
    assert c.import_memories([head, summary("new", "A newer summary.", created + 1)]).imported == 1
    assert [m.id for m in c.list_memories("s", kinds=["summary"])] == ["new"]
    ctx = c.build_context(["s"], token_budget=100, read_only=True)
    assert [i.text for s in ctx.sections if s.kind == "summary" for i in s.items] == ["A newer summary."]
    two = [summary("a", "First of two.", created + 2), summary("b", "Second of two.", created + 3)]
    assert c.import_memories([head, *two[::-1]]).imported == 2  # (out of time order)
    assert [m.id for m in c.list_memories("s", kinds=["summary"])] == ["b"]
    assert c.stats("s").memory_count == 2
