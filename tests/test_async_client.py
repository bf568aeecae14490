"""``AsyncMemoryClient`` end to end against real servers on 127.0.0.1: every method with its effect
checked, the same signatures, errors and TypeErrors as ``MemoryClient``, per-call timeouts and
metadata, ``async with``, concurrent searches, API keys, TLS, waiting for a starting server.

Each test runs its coroutine with ``asyncio.run`` (no pytest plugin); the client is created inside
it, as its channels belong to the running event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from conftest import FakeClock
from grpc_health.v1 import health_pb2
from test_client_usability import Delay, RecordMetadata, front_server, health_only_server
from test_security import _cert, _pem, pki  # noqa: F401 (pki: a fixture used here)

import tiermem.client
from tiermem.client import (
    AsyncMemoryClient,
    DeadlineExceededError,
    InvalidArgumentError,
    MemoryClient,
    NotFoundError,
    TiermemError,
    UnauthenticatedError,
    UnavailableError,
)
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

NS = "user:ana/project:async"
T = TypeVar("T")
Body = Callable[[AsyncMemoryClient], Awaitable[T]]


def run(target: str | RunningServer, body: Body[T], **kw: Any) -> T:
    """``body(client)`` on a fresh event loop, with a client of ``target`` made and closed there."""
    address = target if isinstance(target, str) else f"127.0.0.1:{target.port}"

    async def main() -> T:
        async with AsyncMemoryClient(address, **{"timeout": 30, **kw}) as c:
            return await body(c)

    return asyncio.run(main())


def ready(target: RunningServer, body: Body[T], **kw: Any) -> T:
    """``run``, once the server reports SERVING."""

    async def waiting(c: AsyncMemoryClient) -> T:
        await c.wait_ready()
        return await body(c)

    return run(target, waiting, **kw)


async def collect(items: AsyncIterator[T]) -> list[T]:
    return [item async for item in items]


def sync_client(running: RunningServer, **kw: Any) -> MemoryClient:
    return MemoryClient(f"127.0.0.1:{running.port}", timeout=30, **kw)


# -- the same methods as MemoryClient ---------------------------------------------------------------


def _public(cls: type) -> dict[str, Any]:
    return {name: f for name, f in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


ITERATORS = {
    "list_memories",
    "timeline",
    "export_memories",
}  # an async iterator at once: arguments checked on the call
GENERATORS = {"list_namespaces"}


def test_every_method_of_memory_client_is_there_with_the_same_parameters() -> None:
    sync, aio = _public(MemoryClient), _public(AsyncMemoryClient)
    assert sorted(sync) == sorted(aio)
    for name in [*sync, "__init__"]:
        want = inspect.signature(getattr(MemoryClient, name)).parameters
        got = inspect.signature(getattr(AsyncMemoryClient, name)).parameters
        assert [(p.name, p.kind, p.default) for p in got.values()] == [
            (p.name, p.kind, p.default) for p in want.values()
        ], name
        method = getattr(AsyncMemoryClient, name)
        if name in GENERATORS:
            assert inspect.isasyncgenfunction(method), name
        elif name not in ITERATORS and name != "__init__":
            assert inspect.iscoroutinefunction(method), name
        assert method.__doc__ or not getattr(MemoryClient, name).__doc__, name  # MemoryClient's at least
    assert "AsyncMemoryClient" in tiermem.client.__all__


# -- every method, with its effect --------------------------------------------------------------


def test_memories_created_read_updated_listed_and_deleted(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()

    async def body(c: AsyncMemoryClient) -> str:
        m = await c.create(NS, "The deploy failed: STRIPE_KEY missing", tags=["deploy"], importance=0.4)
        assert m.id and list(m.tags) == ["deploy"]
        got = await c.get(NS, m.id, include_embedding=True)
        assert got.content == m.content and len(got.embedding) > 0
        updated = await c.update(NS, m.id, importance=0.9, tags=["deploy", "stripe"])
        assert updated.importance == pytest.approx(0.9) and list(updated.tags) == ["deploy", "stripe"]
        batch = await c.create_batch(
            [{"namespace": NS, "content": f"note {i}", "id": f"n{i}"} for i in range(3)]
            + [pb.Memory(namespace=NS, content="a message", id="msg")]
        )
        assert [b.id for b in batch] == ["n0", "n1", "n2", "msg"]
        page, token = await c.list_page(NS, page_size=2)
        assert len(page) == 2 and token
        rest, end = await c.list_page(NS, page_size=10, page_token=token)
        assert len(rest) == 3 and end == ""
        listed = await collect(c.list_memories(NS, page_size=2))
        assert {x.id for x in listed} == {m.id, "n0", "n1", "n2", "msg"}
        assert [x.id async for x in c.list_memories(NS, tags_any=["stripe"])] == [m.id]
        fed = await c.feedback(NS, [{"id": "n0", "actual_usefulness": 1.0, "success": True}])
        assert [f.id for f in fed] == ["n0"] and fed[0].access_count == 1
        await c.delete(NS, "n1")
        with pytest.raises(NotFoundError):
            await c.get(NS, "n1")
        return m.id

    first = ready(running, body)
    with sync_client(running) as s:  # the effects, as the sync client sees them
        assert sorted(x.id for x in s.list_memories(NS)) == sorted([first, "msg", "n0", "n2"])
        assert s.get(NS, first).importance == pytest.approx(0.9)
        assert s.get(NS, "n0").access_count == 1


def test_searches_one_many_and_debates(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory(clock=FakeClock())  # recency the same for both clients' searches
    with sync_client(running) as s:
        s.create(NS, "The billing service times out under load", id="billing")
        s.create(NS, "Lunch was pizza on Friday", id="lunch")
        s.create(NS, "We agreed to retry billing calls with backoff", id="agree", kind="consensus")
        s.create(NS, "Ana disagreed: retries hide the real billing bug", id="dissent", kind="dissent")
        want = s.search(NS, "billing timeouts", limit=3, read_only=True)

    async def body(c: AsyncMemoryClient) -> None:
        got = await c.search(NS, "billing timeouts", limit=3, read_only=True)
        assert [(r.memory.id, r.score) for r in got] == [(r.memory.id, r.score) for r in want]
        assert "billing" in [r.memory.id for r in got] and "lunch" not in [r.memory.id for r in got]
        assert [r.memory.id for r in await c.search(NS, "billing", kinds=["dissent"])] == ["dissent"]
        many = await c.search_many(
            [{"namespaces": NS, "query": "pizza", "limit": 1}, {"namespaces": [NS], "query": "billing"}]
        )
        assert [r.memory.id for r in many[0]] == ["lunch"] and len(many[1]) >= 3
        debates = await c.find_similar_debates(NS, "retrying billing")
        assert {r.memory.id for r in debates} == {"agree", "dissent"}

    ready(running, body)


def test_namespaces_stats_config_lifecycle_and_transfer(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock)
    other = "user:ana/project:other"

    async def body(c: AsyncMemoryClient) -> None:
        for i in range(3):
            await c.create(NS, f"memory {i}", id=f"m{i}", tier="slow")
        await c.create(other, "elsewhere", id="e")
        assert (await c.stats(NS)).memory_count == 3 and (await c.stats()).memory_count == 4
        names = [(n.name, n.memory_count) async for n in c.list_namespaces("user:ana", page_size=1)]
        assert names == [(NS, 3), (other, 1)]

        changed = await c.update_namespace_config(NS, promote_access_count=2, retention="fifo")
        assert changed.config.policy.promote_access_count == 2
        config = await c.get_namespace_config(NS)
        assert config.effective.promote_access_count == 2 and config.config.policy.retention

        clock.advance(10)
        await c.feedback(NS, [{"id": "m0"}, {"id": "m0"}])
        dry = await c.consolidate(NS, dry_run=True)
        assert [(m.id, m.from_tier, m.to_tier) for m in dry.moves] == [("m0", pb.TIER_SLOW, pb.TIER_MEDIUM)]
        assert (await c.get(NS, "m0")).tier == pb.TIER_SLOW  # a dry run moves nothing
        done = await c.consolidate(NS)
        assert done.promoted == 1 and (await c.get(NS, "m0")).tier == pb.TIER_MEDIUM

        moved = await c.transfer(NS, "m1", mode="move", target_namespace=other, target_tier="fast")
        assert moved.namespace == other and moved.tier == pb.TIER_FAST and moved.origin.namespace == NS
        with pytest.raises(NotFoundError):
            await c.get(NS, "m1")
        assert await c.delete_namespace("user:ana", include_children=True) == 4
        assert [n async for n in c.list_namespaces()] == []

    ready(running, body)


def test_timeline_export_and_import_from_lists_and_async_iterables(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock)

    async def body(c: AsyncMemoryClient) -> None:
        t0 = clock.now
        for i in range(4):
            await c.create(NS, f"event {i}", id=f"e{i}", topic="deploys" if i % 2 else "lunch")
            clock.advance(60)
        line = [m.id async for m in c.timeline(NS, page_size=1)]
        assert line == ["e3", "e2", "e1", "e0"]  # newest first, page by page
        within = c.timeline(NS, since=t0 + 60, until=t0 + 180, where={"topic": "deploys"})
        assert [m.id async for m in within] == ["e1"]

        await c.upsert_node(NS, "ana", label="person")
        chunks = await collect(c.export_memories(NS))
        assert chunks[0].WhichOneof("chunk") == "header"
        assert sorted(x.memory.id for x in chunks if x.WhichOneof("chunk") == "memory") == [
            "e0",
            "e1",
            "e2",
            "e3",
        ]
        assert any(x.WhichOneof("chunk") == "node" for x in chunks)

        copied = await c.import_memories(chunks, target_namespace="restored:list")
        assert (copied.imported, copied.graph_items) == (4, 1)

        async def trickle() -> AsyncIterator[pb.ExportMemoriesResponse]:
            for chunk in chunks:
                await asyncio.sleep(0)
                yield chunk

        streamed = await c.import_memories(trickle(), target_namespace="restored:async")
        assert streamed.imported == 4
        assert (await c.get("restored:async", "e2")).content == "event 2"
        assert [n.id for n in (await c.neighbors("restored:list", "ana")).nodes] == ["ana"]

        # Failures: the server's (naming the field), and a chunk the client cannot send, as MemoryClient.
        with pytest.raises(InvalidArgumentError) as bad:
            await c.import_memories([chunks[1]], target_namespace="restored:bad")
        assert bad.value.fields == ["header"]
        with pytest.raises(TiermemError) as empty:
            await c.import_memories([chunks[0], pb.ExportMemoriesResponse()], target_namespace="x")
        assert empty.value.code == grpc.StatusCode.UNKNOWN
        assert "chunk 1 of the export is empty" in str(empty.value.__cause__)

    ready(running, body)
    with sync_client(running) as s, pytest.raises(TiermemError) as sync_empty:
        s.import_memories([next(s.export_memories(NS)), pb.ExportMemoriesResponse()], target_namespace="x")
    assert sync_empty.value.code == grpc.StatusCode.UNKNOWN
    assert "chunk 1 of the export is empty" in str(sync_empty.value.__cause__)  # (its cause kept, as above)


def test_agent_memory_reflection_and_summaries(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory(reflection_threshold=1.0, summary_token_threshold=20)

    async def body(c: AsyncMemoryClient) -> None:
        seen = [
            await c.observe("agent:1", f"The agent saw event number {i}", importance=0.4) for i in range(3)
        ]
        assert [r.reflection_due for r in seen] == [False, False, True] and seen[-1].summary_due
        ids = [r.memory.id for r in seen]
        candidates = await c.reflection_candidates("agent:1", limit=2)
        assert [m.id for m in candidates.observations] == ids[::-1][:2] and candidates.reflection_due
        reflection = await c.reflect("agent:1", "The agent sees numbered events", source_memory_ids=ids)
        assert reflection.kind == "reflection" and list(reflection.source_memory_ids) == ids
        assert not (await c.stats("agent:1")).reflection_due

        built = await c.build_summary("agent:1", max_tokens=50)
        assert built.text and set(built.source_memory_ids) >= set(ids)
        summary = await c.summarize("agent:1", built.text, source_memory_ids=built.source_memory_ids)
        assert summary.kind == "summary"
        assert (await c.stats("agent:1")).summary_tokens == 0

    ready(running, body)


def test_graph_memory_and_context_packages(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()

    async def body(c: AsyncMemoryClient) -> None:
        m = await c.create(NS, "Ana owns the billing service", id="owns")
        node = await c.upsert_node(
            NS, "ana", label="person", properties={"team": "payments"}, memory_ids=[m.id]
        )
        assert node.label == "person" and list(node.memory_ids) == ["owns"]
        await c.upsert_node(NS, "billing", label="service")
        edge = await c.add_edge(NS, "ana", "owns", "billing", valid_from=1_600_000_000)
        around = await c.neighbors(NS, "ana", depth=1)
        assert {n.id for n in around.nodes} == {"ana", "billing"}
        assert [(e.source_id, e.relation, e.target_id) for e in around.edges] == [("ana", "owns", "billing")]
        ended = await c.invalidate_edge(NS, edge.id)
        assert ended.HasField("invalid_from")
        assert list((await c.neighbors(NS, "ana")).edges) == []
        assert len((await c.neighbors(NS, "ana", include_invalid=True)).edges) == 1

        ctx = await c.build_context([NS], token_budget=200, query="who owns billing", read_only=True)
        items = [item for section in ctx.sections for item in section.items]
        assert ctx.tokens_used <= 200 and items and not ctx.warnings

    ready(running, body)


# -- errors ---------------------------------------------------------------------------------------


def test_errors_are_the_sync_clients_with_reason_and_fields(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("get", (NS, "missing"), {}),
        ("create", ("", "no namespace"), {}),
        ("create", (NS, "weak insight"), {"kind": "reflection", "importance": 0.1}),
        ("search", (NS, "q"), {"limit": -1}),
        ("transfer", (NS, "missing"), {"target_namespace": "elsewhere"}),
    ]

    def sync_error(name: str, args: tuple[Any, ...], kw: dict[str, Any]) -> TiermemError:
        with sync_client(running) as s, pytest.raises(TiermemError) as e:
            getattr(s, name)(*args, **kw)
        return e.value

    async def body(c: AsyncMemoryClient) -> list[TiermemError]:
        errors = []
        for name, args, kw in calls:
            with pytest.raises(TiermemError) as e:
                await getattr(c, name)(*args, **kw)
            errors.append(e.value)
        return errors

    got = ready(running, body)
    for (name, args, kw), error in zip(calls, got, strict=True):
        want = sync_error(name, args, kw)
        assert type(error) is type(want), name
        assert (error.code, error.reason, error.field_violations) == (
            want.code,
            want.reason,
            want.field_violations,
        )
    assert isinstance(got[0], NotFoundError) and got[0].reason == "MEMORY_NOT_FOUND"
    assert isinstance(got[1], InvalidArgumentError) and got[1].fields == ["memory.namespace"]
    assert got[2].fields == ["memory.importance"]


def test_a_misspelled_argument_is_the_same_type_error(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    attempts: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("create", (NS, "x"), {"tgs": ["a"]}),
        ("search", (NS, "q"), {"tag_any": ["x"]}),
        ("update", (NS, "x"), {"importanc": 0.5}),
        ("observe", (NS, "x"), {"knd": "note"}),
        ("create_batch", ([{"namespace": NS, "content": "x", "tgs": []}],), {}),
        ("search_many", ([{"namespaces": NS, "qeury": "x"}],), {}),
        ("find_similar_debates", (NS, "t"), {"kinds": ["x"]}),
        ("summarize", (NS, "t"), {"source_memory_ids": [], "kind": "x"}),
        ("list_memories", (NS,), {"tag_all": ["x"]}),
        ("timeline", (NS,), {"since_": 1}),
        ("get", (NS, "x"), {"include_embeding": True}),  # Python's own: not a forwarded **fields
    ]

    def message(e: TypeError) -> str:
        return str(e).replace("AsyncMemoryClient.", "").replace("MemoryClient.", "")

    async def body(c: AsyncMemoryClient) -> list[str]:
        out = []
        for name, args, kw in attempts:
            with pytest.raises(TypeError) as e:
                result = getattr(c, name)(*args, **kw)
                await (collect(result) if name in ITERATORS else result)
            out.append(message(e.value))
        assert (await c.stats()).memory_count == 0  # nothing was sent
        return out

    got = ready(running, body)
    with sync_client(running) as s:
        for (name, args, kw), text in zip(attempts, got, strict=True):
            with pytest.raises(TypeError) as e:
                getattr(s, name)(*args, **kw)
            assert text == message(e.value), name
    assert "Did you mean 'tags_any'?" in got[1]

    async def at_once(c: AsyncMemoryClient) -> None:  # an iterator's arguments are checked on the call
        with pytest.raises(TypeError, match="list_memories"):
            c.list_memories(NS, tag_all=["x"])

    run(running, at_once)


# -- timeouts, metadata, retries --------------------------------------------------------------------


def test_a_call_takes_its_own_timeout_and_metadata(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    with sync_client(running) as s:
        m = s.create(NS, "kept")
    recorder = RecordMetadata()
    with front_server(running, (Delay(0.5), recorder)) as (port, _):

        async def body(c: AsyncMemoryClient) -> None:
            began = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await c.get(NS, m.id, timeout=0.1)
            assert time.monotonic() - began < 0.45
            got = await c.get(NS, m.id, timeout=10, call_metadata=[("x-agent", "seven")])
            assert got.content == "kept"

        run(f"127.0.0.1:{port}", body)

        async def client_timeout(c: AsyncMemoryClient) -> None:  # the client's, for calls giving none
            with pytest.raises(DeadlineExceededError):
                await c.stats()

        run(f"127.0.0.1:{port}", client_timeout, timeout=0.1)
    assert any(name == "GetMemory" and md.get("x-agent") == "seven" for name, md in recorder.seen)


def test_a_call_the_server_refused_while_starting_is_made_again(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    with sync_client(running) as s:
        m = s.create(NS, "kept until the server is up")
    with front_server(None) as (port, servicer):

        async def body(c: AsyncMemoryClient) -> None:
            began = time.monotonic()
            with pytest.raises(UnavailableError) as info:
                await c.delete(NS, m.id, timeout=0.5)
            assert info.value.reason == "STARTING" and time.monotonic() - began >= 0.3
            attach = threading.Timer(1.0, lambda: servicer.attach(running.engine, None, None))
            attach.start()
            try:
                await c.delete(NS, m.id, timeout=30)  # made again by the client until attached
            finally:
                attach.join()

        run(f"127.0.0.1:{port}", body)
    with sync_client(running) as s:
        assert list(s.list_memories(NS)) == []


def test_wait_ready_waits_for_serving_and_names_what_it_saw() -> None:
    with health_only_server() as (port, servicer):

        async def not_serving(c: AsyncMemoryClient) -> None:
            with pytest.raises(UnavailableError, match="last status NOT_SERVING"):
                await c.wait_ready(timeout=0.6)
            flip = threading.Timer(
                0.5, lambda: servicer.set("tiermem.v1.MemoryService", health_pb2.HealthCheckResponse.SERVING)
            )
            flip.start()
            try:
                await c.wait_ready(timeout=30)
            finally:
                flip.join()

        run(f"127.0.0.1:{port}", not_serving)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]

    async def nothing(c: AsyncMemoryClient) -> None:
        with pytest.raises(UnavailableError, match="last error UNAVAILABLE"):
            await c.wait_ready(timeout=0.5)
        with pytest.raises(DeadlineExceededError, match="could not be reached"):  # a call says so too
            await c.create("ns", "hello", timeout=0.5)
        with pytest.raises(DeadlineExceededError, match="could not be reached"):  # and the streams
            [chunk async for chunk in c.export_memories("ns", timeout=0.5)]
        with pytest.raises(DeadlineExceededError, match="could not be reached"):
            await c.import_memories([pb.ExportMemoriesResponse(header=pb.ExportHeader())], timeout=0.5)

    run(f"127.0.0.1:{free}", nothing)


# -- the client itself ----------------------------------------------------------------------------


def test_async_with_closes_the_client_and_a_client_needs_a_running_loop(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()

    async def body() -> None:
        async with AsyncMemoryClient(f"127.0.0.1:{running.port}") as c:
            await c.wait_ready()
            await c.create(NS, "inside")
        with pytest.raises(TiermemError) as err:  # (as the sync client's: grpc.aio's UsageError before)
            await c.stats()
        assert err.value.code == grpc.StatusCode.CANCELLED

    asyncio.run(body())
    with pytest.raises(RuntimeError, match="in a coroutine"):
        AsyncMemoryClient(f"127.0.0.1:{running.port}")


def test_many_concurrent_searches_over_several_connections(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    topics = ["billing", "deploy", "lunch", "oncall", "database", "frontend", "latency", "backup"]
    with sync_client(running) as s:
        s.create_batch(
            [
                {"namespace": NS, "content": f"{t} note {i}: the {t} work item {i}"}
                for t in topics
                for i in range(5)
            ]
        )
        queries = [f"{t} work item {i}" for t in topics for i in range(25)]
        want = [[r.memory.id for r in s.search(NS, q, limit=5, read_only=True)] for q in queries[:8]]

    async def body(c: AsyncMemoryClient) -> None:
        results = await asyncio.gather(*(c.search(NS, q, limit=5, read_only=True) for q in queries))
        assert len(results) == 200 and all(len(r) == 5 for r in results)
        assert [[r.memory.id for r in rs] for rs in results[:8]] == want
        assert all(
            rs[0].memory.content.startswith(q.split()[0]) for q, rs in zip(queries, results, strict=True)
        )

    ready(running, body, connections=3)


# -- API keys and TLS -------------------------------------------------------------------------------


def test_an_api_key_rides_on_every_call_streams_included(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.jsonl"
    token = add_key(keys, ["user:ana"], "admin")  # import needs the admin role
    running = server_factory(api_keys=str(keys))

    async def with_key(c: AsyncMemoryClient) -> None:
        await c.create(NS, "hello")
        assert [n.name async for n in c.list_namespaces()] == [NS]
        chunks = await collect(c.export_memories(NS))  # a response stream
        assert (
            await c.import_memories(chunks, target_namespace="user:ana/copy")
        ).imported == 1  # a request stream

    ready(running, with_key, api_key=token)

    async def without(c: AsyncMemoryClient) -> list[str]:
        await c.wait_ready()  # health needs no key
        reasons = []
        for call in (lambda: c.create(NS, "x"), lambda: collect(c.export_memories(NS))):
            with pytest.raises(UnauthenticatedError) as e:
                await call()
            reasons.append(e.value.reason)
        return reasons

    assert run(running, without) == ["API_KEY_MISSING", "API_KEY_MISSING"]
    assert run(running, without, api_key=token[:-2] + "xx") == ["API_KEY_INVALID", "API_KEY_INVALID"]

    async def own_channel() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
        with pytest.raises(ValueError, match="api_key"):
            AsyncMemoryClient(channel=channel, api_key=token)
        async with AsyncMemoryClient(channel=channel) as c, channel:
            with pytest.raises(UnauthenticatedError):
                await c.stats(NS)

    asyncio.run(own_channel())


def test_tls_by_ca_path_pem_bytes_and_client_certificates(
    server_factory: Callable[..., RunningServer],
    tmp_path: Path,
    pki: dict[str, Path],  # noqa: F811
) -> None:
    keys = tmp_path / "keys.jsonl"
    token = add_key(keys, ["user:ana"], "write")
    tls = {"tls_cert": str(pki["server_crt"]), "tls_key": str(pki["server_key"])}
    running = server_factory(api_keys=str(keys), **tls)

    async def over_tls(c: AsyncMemoryClient) -> int:
        await c.create(NS, "over TLS", allow_duplicates=True)
        return int((await c.stats(NS)).memory_count)

    assert ready(running, over_tls, api_key=token, tls=str(pki["ca"])) == 1
    assert ready(running, over_tls, api_key=token, tls=pki["ca"].read_bytes()) == 2

    async def plain(c: AsyncMemoryClient) -> None:
        with pytest.raises(TiermemError):  # no TLS: no answer
            await c.stats(NS, timeout=1)

    run(running, plain, api_key=token)

    # A CA of its own: the server's certificate is not trusted.
    other_ca = _pem(*_cert("another CA", None, ca=True), tmp_path, "other")[0]
    run(running, plain, api_key=token, tls=str(other_ca))

    mutual = server_factory(tls_client_ca=str(pki["ca"]), data_dir=tmp_path / "mutual", **tls)
    creds = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].read_bytes(),
        private_key=pki["client_key"].read_bytes(),
        certificate_chain=pki["client_crt"].read_bytes(),
    )
    assert ready(mutual, over_tls, tls=creds) == 1
    run(mutual, plain, tls=pki["ca"].read_bytes())  # no client certificate


def test_leaving_an_export_early_cancels_the_call(client: MemoryClient, server: RunningServer) -> None:
    for i in range(30):
        client.create("aio:early", f"memory {i}")

    async def run() -> None:
        async with AsyncMemoryClient(f"127.0.0.1:{server.port}") as mem:
            stream = mem.export_memories("aio:early")
            async for _ in stream:
                break
            await stream.aclose()  # type: ignore[attr-defined]
            # The next call is served at once: the export's stream slot was given back.
            assert (await mem.stats("aio:early")).memory_count == 30

    asyncio.run(run())


# -- closing with calls under way, and cancelled tasks ----------------------------------------------


def test_closing_fails_the_calls_under_way_as_the_sync_client_does(
    server_factory: Callable[..., RunningServer],
) -> None:
    """close() with calls under way: each fails with MemoryClient's error then (TiermemError
    CANCELLED), unary calls, pages, a response stream and a request stream alike."""
    running = server_factory()
    with sync_client(running) as s:
        m = s.create(NS, "kept")
    with front_server(running, (Delay(0.5),)) as (port, _):
        address = f"127.0.0.1:{port}"
        sync = MemoryClient(address, timeout=30)
        sync_errors: list[BaseException] = []

        def sync_call() -> None:
            try:
                sync.get(NS, m.id)
            except BaseException as e:
                sync_errors.append(e)

        caller = threading.Thread(target=sync_call)
        caller.start()
        time.sleep(0.2)
        sync.close()
        caller.join()
        (want,) = sync_errors
        assert isinstance(want, TiermemError) and want.code == grpc.StatusCode.CANCELLED

        async def body() -> list[BaseException]:
            c = AsyncMemoryClient(address, timeout=30)
            chunks = await collect(c.export_memories(NS))
            never = asyncio.Event()

            async def stalled() -> AsyncIterator[pb.ExportMemoriesResponse]:
                yield chunks[0]
                await never.wait()  # the import is under way, waiting for its next chunk
                yield chunks[1]

            tasks = [
                asyncio.ensure_future(call)
                for call in (
                    c.get(NS, m.id),
                    c.search(NS, "kept"),
                    collect(c.list_memories(NS)),
                    collect(c.list_namespaces()),
                    collect(c.export_memories(NS)),
                    c.import_memories(stalled(), target_namespace="restored:stalled"),
                )
            ]
            await asyncio.sleep(0.2)
            await c.close()
            return list(await asyncio.gather(*tasks, return_exceptions=True))

        for got in asyncio.run(body()):
            assert type(got) is type(want), got
            assert isinstance(got, TiermemError)
            assert (got.code, got.message, got.reason) == (want.code, want.message, want.reason)


def test_a_task_cancelled_by_its_caller_raises_cancelled_error(
    server_factory: Callable[..., RunningServer],
) -> None:
    """task.cancel() (or a timeout around the call) during a call: CancelledError, as any awaitable;
    the client goes on serving other calls."""
    running = server_factory()
    with sync_client(running) as s:
        m = s.create(NS, "kept")
    with front_server(running, (Delay(0.5),)) as (port, _):

        async def body(c: AsyncMemoryClient) -> None:
            tasks = [
                asyncio.ensure_future(call)
                for call in (c.get(NS, m.id), collect(c.list_memories(NS)), collect(c.export_memories(NS)))
            ]
            await asyncio.sleep(0.2)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert task.cancelled()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(c.get(NS, m.id), 0.1)
            assert (await c.get(NS, m.id)).content == "kept"

        run(f"127.0.0.1:{port}", body)
