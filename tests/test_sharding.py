"""Tenant shards: a server started with ``sharded`` takes only requests whose ``tiermem-route``
metadata names the one top-level scope of every namespace they name (docs/scaling.md)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import FreezingRelay

from tiermem.client import MemoryClient, TiermemError
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

ANA = [("tiermem-route", "user:ana")]
BOB = [("tiermem-route", "user:bob")]


def _refused(call: Callable[[], object], reason: str, field: str) -> TiermemError:
    with pytest.raises(TiermemError) as info:
        call()
    err = info.value
    assert (err.code.name, err.reason, err.fields) == ("INVALID_ARGUMENT", reason, [field]), err
    return err


def test_a_shard_takes_only_requests_routed_to_their_scope(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory(sharded=True)
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        kept = c.create("user:ana/project:x", "ana deploys on fridays", call_metadata=ANA)
        c.create("user:bob", "bob prefers tea", call_metadata=BOB)

        err = _refused(lambda: c.create("user:ana", "no key"), "ROUTE_MISSING", "metadata.tiermem-route")
        assert "'user:ana'" in err.message
        _refused(
            lambda: c.create("user:ana", "wrong key", call_metadata=BOB),
            "ROUTE_MISMATCH",
            "metadata.tiermem-route",
        )
        _refused(
            lambda: c.search(["user:ana", "user:bob"], "tea", call_metadata=ANA),
            "NAMESPACES_SPAN_SHARDS",
            "namespaces",
        )
        _refused(
            lambda: c.transfer("user:ana/project:x", kept.id, target_namespace="user:bob", call_metadata=ANA),
            "NAMESPACES_SPAN_SHARDS",
            "namespaces",
        )
        # Nothing refused was stored; a tenant's subtree and its ancestors search together.
        hits = c.search("user:ana/project:x", "deploys", include_ancestors=True, call_metadata=ANA)
        assert [h.memory.id for h in hits] == [kept.id]
        assert [m.content for m in c.list_memories("user:ana", call_metadata=ANA)] == []
        assert {m.content for m in c.list_memories("user:bob", call_metadata=BOB)} == {"bob prefers tea"}
        # What names no namespace needs no key: the fan-out helper asks every shard.
        assert {n.name for n in c.list_namespaces()} == {"user:ana/project:x", "user:bob"}
        assert c.stats().memory_count == 2


def test_an_import_into_a_shard_checks_every_chunk(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = server_factory(tmp_path / "source")
    shard = server_factory(tmp_path / "shard", sharded=True)
    with MemoryClient(f"127.0.0.1:{source.port}") as src, MemoryClient(f"127.0.0.1:{shard.port}") as dst:
        src.create("user:ana", "ana's memory")
        src.create("user:bob", "bob's memory")
        chunks = list(src.export_memories())
        _refused(
            lambda: dst.import_memories(chunks, call_metadata=ANA), "ROUTE_MISMATCH", "metadata.tiermem-route"
        )
        ana_only = list(src.export_memories(namespace="user:ana", include_children=True))
        dst.import_memories(ana_only, call_metadata=ANA)
        assert [m.content for m in dst.list_memories("user:ana", call_metadata=ANA)] == ["ana's memory"]
        assert dst.stats().memory_count == 1


def test_a_server_that_is_not_a_shard_ignores_routing_keys(server: RunningServer) -> None:
    with MemoryClient(f"127.0.0.1:{server.port}") as c:
        m = c.create("user:ana", "a memory", call_metadata=BOB)
        c.transfer("user:ana", m.id, target_namespace="user:bob")
        assert [x.content for x in c.list_memories("user:bob")] == ["a memory"]


def test_a_sharded_client_sends_each_calls_routing_key(server_factory: Callable[..., RunningServer]) -> None:
    """Every method of a client made with sharded=True carries its key: unary, streamed out, and
    streamed in (the key from the first chunk that names a namespace)."""
    running = server_factory(sharded=True)
    with MemoryClient(f"127.0.0.1:{running.port}", sharded=True) as c:
        m = c.create("user:ana/session:1", "ana asked about the deploy")
        c.create_batch([{"namespace": "user:ana", "content": "ana likes tea"}])
        assert c.get("user:ana/session:1", m.id).content == "ana asked about the deploy"
        assert len(c.search("user:ana/session:1", "deploy", include_ancestors=True)) == 2
        c.upsert_node("user:ana", "ana")
        chunks = list(c.export_memories("user:ana", include_children=True))
        c.delete_namespace("user:ana", include_children=True)
        assert c.import_memories(chunks).imported == 2
        assert c.stats("user:ana").memory_count == 1
        # A request that spans tenants is still refused: the key is the first namespace's.
        _refused(lambda: c.search(["user:ana", "user:bob"], "tea"), "NAMESPACES_SPAN_SHARDS", "namespaces")


def _plain(port: int) -> MemoryClient:
    """A client on a channel without gRPC's retry policy: a refused call ends in its own error
    once the client's attempts reach the deadline, not in DEADLINE_EXCEEDED. (1 s: at 0.3 s a
    routing change on a loaded CI machine missed it.)"""
    return MemoryClient(channel=grpc.insecure_channel(f"127.0.0.1:{port}"), timeout=1.0)


def _unavailable(call: Callable[[], object], reason: str) -> TiermemError:
    with pytest.raises(TiermemError) as info:
        call()
    err = info.value
    assert (err.code.name, err.reason) == ("UNAVAILABLE", reason), err
    assert err.retry_after is not None and 0 < err.retry_after <= 1, err.retry_after
    return err


def test_a_fenced_scope_refuses_writes_until_it_serves_again_and_across_a_restart(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    running = server_factory(tmp_path / "data")
    with _plain(running.port) as c:
        kept = c.create("user:ana/project:x", "ana deploys on fridays")
        c.set_scope_routing("user:ana", "fenced")
        err = _unavailable(lambda: c.create("user:ana/project:x", "refused"), "SCOPE_FENCED")
        assert err.metadata["scope"] == "user:ana"
        _unavailable(lambda: c.delete("user:ana/project:x", kept.id), "SCOPE_FENCED")
        _unavailable(lambda: c.upsert_node("user:ana", "ana"), "SCOPE_FENCED")
        # Reads are answered; other scopes are not touched.
        assert [h.memory.id for h in c.search("user:ana/project:x", "deploys")] == [kept.id]
        c.create("user:bob", "bob is served")
    running.stop(0)
    running = server_factory(tmp_path / "data")
    with _plain(running.port) as c:
        _unavailable(lambda: c.create("user:ana", "still refused after a restart"), "SCOPE_FENCED")
        c.set_scope_routing("user:ana", "serving")
        c.create("user:ana", "served again")
        assert sorted(m.content for m in c.list_memories("user:ana")) == ["served again"]


def test_a_moved_scope_refuses_every_call_and_purge_deletes_it(server: RunningServer) -> None:
    with _plain(server.port) as c:
        c.create("user:ana/session:1", "ana's memory")
        c.create("user:bob", "bob's memory")
        moved = c.set_scope_routing("user:ana", "moved", moved_to="shard-b", purge=True)
        assert moved.purged_count == 1
        err = _unavailable(lambda: c.search("user:ana/session:1", "memory"), "SCOPE_MOVED")
        assert err.metadata == {"scope": "user:ana", "moved_to": "shard-b"}
        _unavailable(lambda: list(c.list_memories("user:ana/session:1")), "SCOPE_MOVED")
        assert {n.name for n in c.list_namespaces()} == {"user:bob"}
        c.set_scope_routing("user:ana", "serving")
        assert list(c.list_memories("user:ana/session:1")) == []


def test_a_write_waiting_out_a_fence_succeeds_within_its_deadline(server: RunningServer) -> None:
    import threading

    with MemoryClient(f"127.0.0.1:{server.port}") as c:
        c.set_scope_routing("user:ana", "fenced")
        threading.Timer(0.4, lambda: c.set_scope_routing("user:ana", "serving")).start()
        m = c.create("user:ana", "written once the fence lifts", timeout=5)
        assert [x.id for x in c.list_memories("user:ana")] == [m.id]


@pytest.mark.parametrize(
    ("scope", "routing", "purge", "field"),
    [
        ("user:ana/x", "fenced", False, "scope"),
        ("user:ana", "fenced", True, "purge"),
        ("", "moved", False, "scope"),
        ("user:ana", "receiving", True, "purge"),
    ],
)
def test_bad_scope_routing_requests_change_nothing(
    server: RunningServer, scope: str, routing: str, purge: bool, field: str
) -> None:
    with MemoryClient(f"127.0.0.1:{server.port}") as c:
        c.create("user:ana", "kept")
        with pytest.raises(TiermemError) as info:
            c.set_scope_routing(scope, routing, purge=purge)
        assert (info.value.code.name, info.value.fields) == ("INVALID_ARGUMENT", [field])
        c.create("user:ana", "still writable")
        assert len(list(c.list_memories("user:ana"))) == 2


def test_a_sharded_async_client_sends_each_calls_routing_key(
    server_factory: Callable[..., RunningServer],
) -> None:
    import asyncio

    from tiermem.client import AsyncMemoryClient

    running = server_factory(sharded=True)

    async def run() -> None:
        async with AsyncMemoryClient(f"127.0.0.1:{running.port}", sharded=True) as c:
            m = await c.create("user:ana/session:1", "ana asked about the deploy")
            assert (await c.get("user:ana/session:1", m.id)).content == "ana asked about the deploy"
            assert len(await c.search("user:ana/session:1", "deploy", include_ancestors=True)) == 1
            chunks = [chunk async for chunk in c.export_memories("user:ana", include_children=True)]
            await c.delete_namespace("user:ana", include_children=True)
            assert (await c.import_memories(chunks)).imported == 1  # (the key from the first chunk)
            await c.set_scope_routing("user:ana", "fenced")
            with pytest.raises(TiermemError) as fenced:
                await c.create("user:ana", "refused", timeout=0.3)
            assert fenced.value.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
            await c.set_scope_routing("user:ana", "serving")
            with pytest.raises(ValueError, match="target_namespace"):

                async def stream():  # type: ignore[no-untyped-def]
                    for chunk in chunks:
                        yield chunk

                await c.import_memories(stream())

    asyncio.run(run())


def test_a_move_carries_writes_that_change_no_content_and_lifts_a_failed_fence(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Feedback (and tier moves) acknowledged between the copy and the fence reach the target; a
    fence call that failed after setting the fence is lifted, and the target keeps nothing."""
    from tiermem.client.shards import move_scope

    source = server_factory(tmp_path / "a")
    target = server_factory(tmp_path / "b")
    with MemoryClient(f"127.0.0.1:{source.port}") as a, MemoryClient(f"127.0.0.1:{target.port}") as b:
        m = a.create("user:ana", "ana deploys on fridays")

        def between(step: str) -> None:
            if step == "fence":  # (after the copy, before the fence)
                a.feedback(
                    "user:ana",
                    [{"id": m.id, "predicted_relevance": 0.2, "actual_usefulness": 0.9, "success": True}],
                )
                a.update("user:ana", m.id, tier="glacial")

        report = move_scope("user:ana", a, b, lambda: None, on_step=between)
        assert report.memories == 1 and report.caught_up == 1
        moved = b.get("user:ana", m.id)
        assert (moved.success_count, moved.tier) == (1, pb.TIER_GLACIAL) and moved.surprise_score > 0

        class FenceFailsAfterSetting(MemoryClient):
            def set_scope_routing(self, scope: str, routing: int | str, **kw: Any) -> Any:
                answer = super().set_scope_routing(scope, routing, **kw)
                if routing == "fenced":
                    raise TiermemError(grpc.StatusCode.UNAVAILABLE, "the answer was lost", "LOST")
                return answer

        b.create("user:bob", "bob's memory")
        with FenceFailsAfterSetting(f"127.0.0.1:{target.port}") as flaky, pytest.raises(TiermemError):
            move_scope("user:bob", flaky, a, lambda: None)
        b.create("user:bob", "bob writes again: the fence was lifted")
        assert list(a.list_memories("user:bob")) == []

        class FenceCannotBeLifted(FenceFailsAfterSetting):  # (a source gone after fencing)
            def set_scope_routing(self, scope: str, routing: int | str, **kw: Any) -> Any:
                if routing == "serving":
                    raise TiermemError(grpc.StatusCode.UNAVAILABLE, "the source is gone", "GONE")
                return super().set_scope_routing(scope, routing, **kw)

        with FenceCannotBeLifted(f"127.0.0.1:{target.port}") as gone, pytest.raises(TiermemError) as e:
            move_scope("user:bob", gone, a, lambda: None)
        assert any("could not lift the fence: " in note for note in e.value.__notes__)
        assert list(a.list_memories("user:bob")) == []  # the target's copy went all the same
        b.set_scope_routing("user:bob", "serving", call_metadata=[("tiermem-route", "user:bob")])


def test_a_protected_scope_moves_back_to_a_shard_that_kept_its_settings(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A shard a scope left keeps the scope's settings (its protection too): moving the scope
    back copies its preferences there again, as the source already held them."""
    from tiermem.client.shards import move_scope

    source = server_factory(tmp_path / "a")
    target = server_factory(tmp_path / "b")
    with MemoryClient(f"127.0.0.1:{source.port}") as a, MemoryClient(f"127.0.0.1:{target.port}") as b:
        a.create("ten", "I prefer tea over coffee", kind="preference")
        a.create("ten", "plain observation")
        a.update_namespace_config("ten", protected=True, confirm=True)
        assert move_scope("ten", a, b, lambda: None).memories == 2
        assert move_scope("ten", b, a, lambda: None).memories == 2
        assert sorted(m.kind for m in a.list_memories("ten")) == ["observation", "preference"]


def test_a_move_takes_the_settings_of_every_namespace_of_the_scope(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Protection and policies move with the scope, those of namespaces without memories too."""
    from tiermem.client.shards import move_scope

    source = server_factory(tmp_path / "a")
    target = server_factory(tmp_path / "b")
    with MemoryClient(f"127.0.0.1:{source.port}") as a, MemoryClient(f"127.0.0.1:{target.port}") as b:
        a.create("ten", "a note")
        a.update_namespace_config("ten", protected=True, max_items=30)
        a.update_namespace_config("ten/empty", promote_access_count=6)
        want = {ns: a.get_namespace_config(ns).config for ns in ("ten", "ten/empty")}
        assert move_scope("ten", a, b, lambda: None).memories == 1
        assert {ns: b.get_namespace_config(ns).config for ns in want} == want


def test_a_scopes_routing_state_is_read_in_every_state_and_a_receiving_scope_is_served(
    server: RunningServer,
) -> None:
    with _plain(server.port) as c:
        assert (c.get_scope_routing("user:ana").routing, c.get_scope_routing("user:ana").moved_to) == (0, "")
        c.set_scope_routing("user:ana", "receiving")
        assert c.get_scope_routing("user:ana").routing == pb.SCOPE_ROUTING_RECEIVING
        m = c.create("user:ana/project:x", "a receiving scope takes writes")  # (a mark, nothing refused)
        assert [h.memory.id for h in c.search("user:ana/project:x", "writes")] == [m.id]
        c.set_scope_routing("user:ana", "fenced", moved_to="shard-b")
        got = c.get_scope_routing("user:ana")
        assert (got.routing, got.moved_to) == (pb.SCOPE_ROUTING_FENCED, "shard-b")
        c.set_scope_routing("user:ana", "moved", moved_to="shard-b")
        _unavailable(lambda: c.get("user:ana/project:x", m.id), "SCOPE_MOVED")
        assert c.get_scope_routing("user:ana").routing == pb.SCOPE_ROUTING_MOVED  # (still read)
        assert c.get_scope_routing("user:bob").routing == pb.SCOPE_ROUTING_UNSPECIFIED
        for bad in ("user:ana/project:x", ""):
            with pytest.raises(TiermemError) as info:
                c.get_scope_routing(bad)
            assert (info.value.code.name, info.value.fields) == ("INVALID_ARGUMENT", ["scope"])


# A move killed at a step (a process of its own, ended by os._exit): "fence" after the copy,
# "switch" just before the proxy switch, "in switch" inside it, "retire" after it.
_KILLED_MOVE = """
import os, sys
from tiermem.client import MemoryClient
from tiermem.client.shards import move_scope
source, target, scope, at = sys.argv[1:5]
def die(step):
    if step == at:
        os._exit(9)
with MemoryClient(source, timeout=30) as s, MemoryClient(target, timeout=30) as t:
    move_scope(scope, s, t, lambda: die("in switch"), on_step=die)
sys.exit(3)  # (the move was not killed)
"""


def _kill_move(source: int, target: int, scope: str, at: str) -> None:
    import subprocess
    import sys

    args = [f"127.0.0.1:{source}", f"127.0.0.1:{target}", scope, at]
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_MOVE, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 9, done.stderr


def test_end_move_undoes_or_finishes_a_killed_move_and_refuses_what_is_not_one(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    from tiermem.client.shards import end_move, move_scope

    a, b = server_factory(tmp_path / "a"), server_factory(tmp_path / "b")
    with _plain(a.port) as src, _plain(b.port) as dst:
        for who in ("ana", "bob", "cy", "dee"):
            src.create(f"user:{who}/project:p", f"{who} deploys on fridays")
            src.create(f"user:{who}", f"{who} likes tea")

        def held(c: MemoryClient, scope: str) -> list[str]:
            return sorted(m.content for ns in (scope, f"{scope}/project:p") for m in c.list_memories(ns))

        def state(c: MemoryClient, scope: str) -> int:
            return int(c.get_scope_routing(scope).routing)

        # Killed after the copy, before the fence: undone, the source goes on, the next move works.
        _kill_move(a.port, b.port, "user:ana", "fence")
        assert (state(src, "user:ana"), state(dst, "user:ana")) == (0, pb.SCOPE_ROUTING_RECEIVING)
        assert len(held(dst, "user:ana")) == 2
        with pytest.raises(ValueError, match="tiermem shard end-move"):
            move_scope("user:ana", src, dst, lambda: None)
        report = end_move("user:ana", src, dst, switched=False)
        assert (report.ended, report.source_was, report.target_was, report.deleted) == (
            "undone",
            "serving",
            "receiving",
            2,
        )
        assert held(dst, "user:ana") == [] and state(dst, "user:ana") == 0
        assert move_scope("user:ana", src, dst, lambda: None).memories == 2

        # Killed in the switch, the proxy not switched: the fence lifted, the copy deleted.
        _kill_move(a.port, b.port, "user:bob", "in switch")
        assert (state(src, "user:bob"), state(dst, "user:bob")) == (1, pb.SCOPE_ROUTING_RECEIVING)
        # Not a move from b to a: refused, nothing changed.
        with pytest.raises(ValueError, match="check --from and --to"):
            end_move("user:bob", dst, src, switched=False)
        with pytest.raises(ValueError, match="not where a move to it ends"):
            end_move("user:bob", dst, src, switched=True)
        assert (state(src, "user:bob"), len(held(dst, "user:bob"))) == (1, 2)
        assert end_move("user:bob", src, dst, switched=False).ended == "undone"
        src.create("user:bob", "bob writes at the source again")
        assert len(held(src, "user:bob")) == 3 and held(dst, "user:bob") == []

        # Killed in the switch, the proxy switched: finished (the copy was compared before it).
        _kill_move(a.port, b.port, "user:cy", "in switch")
        switched: list[str] = []
        report = end_move("user:cy", src, dst, switched=True, switch=lambda: switched.append("again"))
        assert (report.ended, report.purged, switched) == ("finished", 2, ["again"])
        assert state(src, "user:cy") == pb.SCOPE_ROUTING_MOVED and state(dst, "user:cy") == 0
        _unavailable(lambda: list(src.list_memories("user:cy")), "SCOPE_MOVED")
        dst.create("user:cy", "cy writes at the target")
        assert len(held(dst, "user:cy")) == 3
        assert end_move("user:cy", src, dst, switched=True).ended == "nothing to end"

        # Killed after the switch, before the source retired: finished.
        _kill_move(a.port, b.port, "user:dee", "retire")
        assert (state(src, "user:dee"), state(dst, "user:dee")) == (1, 0)
        assert end_move("user:dee", src, dst, switched=True).ended == "finished"
        assert state(src, "user:dee") == pb.SCOPE_ROUTING_MOVED and len(held(dst, "user:dee")) == 2

        # No move under way: nothing to end; a scope the proxy routes to a shard that never
        # fenced it is not a move's.
        src.create("user:eve", "eve is served here")
        assert end_move("user:eve", src, dst, switched=False).ended == "nothing to end"
        with pytest.raises(ValueError, match="never fenced it"):
            end_move("user:eve", src, dst, switched=True)
        assert held(src, "user:eve") == ["eve is served here"] and state(src, "user:eve") == 0


def test_a_move_undone_after_its_catch_up_leaves_no_settings_at_the_target(
    server_factory: Callable[..., RunningServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiermem.client import shards

    a, b = server_factory(tmp_path / "a"), server_factory(tmp_path / "b")
    with _plain(a.port) as src, _plain(b.port) as dst:
        src.create("ten", "a note")
        src.update_namespace_config("ten", protected=True, max_items=30)

        def differs(*args: object) -> int:
            raise RuntimeError("the copy differs")

        monkeypatch.setattr(shards, "_verify", differs)
        with pytest.raises(RuntimeError, match="differs"):
            shards.move_scope("ten", src, dst, lambda: None)
        cfg = dst.get_namespace_config("ten").config
        assert not cfg.protected and not cfg.policy.HasField("max_items")
        assert list(dst.list_memories("ten")) == []


def test_a_shard_that_does_not_answer_is_named_in_the_error(server: RunningServer) -> None:
    from tiermem.client.shards import Shards

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"  # (closed again: nothing listens there)
    with Shards({"a": f"127.0.0.1:{server.port}", "b": gone}, timeout=1) as shards:
        for call in (shards.stats, shards.list_namespaces):
            with pytest.raises(TiermemError) as err:
                call()
            assert "(shard 'b')" in getattr(err.value, "__notes__", []), err.value


def test_a_move_whose_switch_fails_says_how_to_end_it(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    from tiermem.client.shards import end_move, move_scope

    a, b = server_factory(tmp_path / "a"), server_factory(tmp_path / "b")
    with _plain(a.port) as src, _plain(b.port) as dst:
        src.create("user:ana", "ana deploys on fridays")

        def switch() -> None:
            raise RuntimeError("HAProxy has no map routes.map")

        with pytest.raises(RuntimeError) as info:
            move_scope("user:ana", src, dst, switch)
        assert any("tiermem shard end-move" in note for note in info.value.__notes__)
        assert src.get_scope_routing("user:ana").routing == pb.SCOPE_ROUTING_FENCED
        assert end_move("user:ana", src, dst, switched=False).ended == "undone"
        src.create("user:ana", "the source takes the tenant's writes again")


def test_a_move_whose_target_goes_down_fails_within_the_clients_timeout(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Exports and imports have no deadline and wait for their connection: the move asks each shard
    to answer within the client's timeout first, instead of waiting for a dead target forever."""
    import time

    from tiermem.client.shards import move_scope

    a, b = server_factory(tmp_path / "a"), server_factory(tmp_path / "b")
    with (
        MemoryClient(f"127.0.0.1:{a.port}", timeout=1) as src,
        MemoryClient(f"127.0.0.1:{b.port}", timeout=1) as dst,
    ):
        src.create("user:ana", "ana deploys on fridays")
        started = time.monotonic()
        with pytest.raises(TiermemError) as info:
            move_scope("user:ana", src, dst, lambda: None, on_step=lambda s: s == "copy" and b.stop(0))
        assert info.value.code.name == "UNAVAILABLE" and time.monotonic() - started < 10
        assert any("could not delete the target's copy" in note for note in info.value.__notes__)
        src.create("user:ana", "the source still takes the tenant's writes")
        assert len(list(src.list_memories("user:ana"))) == 2


def test_end_move_run_during_a_move_stops_its_switch_and_a_wrong_source_or_unpurged_one_is_handled(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    from tiermem.client.shards import end_move, move_scope

    a, b, c = (server_factory(tmp_path / n) for n in "abc")
    with _plain(a.port) as src, _plain(b.port) as dst, _plain(c.port) as other:
        for who in ("ana", "bob", "cy"):
            src.create(f"user:{who}", f"{who} likes tea")

        # An end-move run while the move still runs (here during its catch-up) undoes it; the
        # move then sees its fence and its copy gone and does not switch.
        switched: list[str] = []

        def operator(step: str) -> None:
            if step == "catch up":
                assert end_move("user:ana", src, dst, switched=False).ended == "undone"

        with pytest.raises(RuntimeError, match="changed by another command"):
            move_scope("user:ana", src, dst, lambda: switched.append("switched"), on_step=operator)
        assert switched == [] and list(dst.list_memories("user:ana")) == []
        src.create("user:ana", "ana writes at the source")
        assert len(list(src.list_memories("user:ana"))) == 2

        # A wrong --from (a shard that neither holds nor fenced the scope) is refused.
        _kill_move(a.port, b.port, "user:bob", "in switch")
        with pytest.raises(ValueError, match="check --from"):
            end_move("user:bob", other, dst, switched=False)
        assert src.get_scope_routing("user:bob").routing == pb.SCOPE_ROUTING_FENCED
        assert dst.get_scope_routing("user:bob").routing == pb.SCOPE_ROUTING_RECEIVING
        assert end_move("user:bob", src, dst, switched=False).ended == "undone"

        # A source retired but not purged (the purge is a step of its own) is purged, once the
        # target holds the scope: never the only copy.
        move_scope("user:cy", src, dst, lambda: None)
        src.set_scope_routing("user:cy", "serving")
        src.create("user:cy", "a copy left at the source")
        src.set_scope_routing("user:cy", "moved", moved_to="b")
        with pytest.raises(ValueError, match="target nothing of it"):
            end_move("user:cy", src, other, switched=True)
        assert end_move("user:cy", src, dst, switched=True).purged == 1
        assert [n.name for n in src.list_namespaces("user:cy")] == []
        assert [m.content for m in dst.list_memories("user:cy")] == ["cy likes tea"]


@pytest.mark.slow
def test_a_move_whose_source_stops_answering_mid_export_fails_within_seconds(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A partition leaves the connection open: keepalive pings (client/connection.py) notice it
    within about 10-30 s, where the export, which has no deadline, waited for ever."""
    import threading
    import time

    from tiermem.client.shards import move_scope

    a, b = server_factory(tmp_path / "a"), server_factory(tmp_path / "b")
    relay = FreezingRelay(a.port, after=300_000)
    with (
        relay,
        MemoryClient(relay.address, timeout=5) as src,
        MemoryClient(f"127.0.0.1:{b.port}", timeout=5) as dst,
    ):
        for k in range(4):
            src.create_batch(
                [{"namespace": "user:ana", "content": f"m{k}-{i} " + "x" * 2000} for i in range(500)]
            )
        outcome: list[BaseException] = []

        def move() -> None:
            try:
                move_scope(
                    "user:ana", src, dst, lambda: None, on_step=lambda s: s == "copy" and relay.arm.set()
                )
            except BaseException as e:
                outcome.append(e)

        started = time.monotonic()
        mover = threading.Thread(target=move, daemon=True)
        mover.start()
        mover.join(60)
        assert relay.frozen.is_set() and outcome, "the move still waits"
        err = outcome[0]
        assert isinstance(err, TiermemError) and err.code.name == "UNAVAILABLE" and "ping" in str(err), err
        assert time.monotonic() - started < 45
        assert list(dst.list_memories("user:ana")) == []
