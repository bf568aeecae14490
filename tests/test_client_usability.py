"""The Python client as a new user meets it, through real gRPC servers on 127.0.0.1: waiting for a
starting server, calls that span a server restart, per-call timeouts and metadata, misspelled
arguments, ``timeline`` with a ``where`` filter and ``search_many``.

Servers are tiermem's own (``server_factory``, ``create_server``) or, where a test needs a server in
a given state, a small gRPC server in the test: the standard health servicer alone, or tiermem's
``MemoryServicer`` over a real engine behind a recording interceptor. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import FakeClock
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from tiermem.client import AsyncMemoryClient, DeadlineExceededError, MemoryClient, UnavailableError
from tiermem.server.config import ServerConfig
from tiermem.server.transport.app import RunningServer, create_server
from tiermem.server.transport.servicer import MemoryServicer
from tiermem.v1 import memory_pb2_grpc

NS = "user:ana/project:usability"
SERVICE = "tiermem.v1.MemoryService"
T0 = 1_700_000_000.0  # FakeClock's default start


@contextlib.contextmanager
def connect(port: int) -> Iterator[MemoryClient]:
    with MemoryClient(f"127.0.0.1:{port}", timeout=30) as c:
        c.wait_ready()
        yield c


@contextlib.contextmanager
def health_only_server() -> Iterator[tuple[int, health.HealthServicer]]:
    """A gRPC server on port 0 with only the standard health service, NOT_SERVING at first."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", SERVICE):
        servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, servicer
    finally:
        server.stop(0).wait()


class RecordMetadata(grpc.ServerInterceptor):
    """Keeps the invocation metadata of every call, by method name."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        pairs = {k: v for k, v in details.invocation_metadata if not k.startswith(":")}
        self.seen.append((details.method.rsplit("/", 1)[-1], pairs))
        return continuation(details)


class Delay(grpc.ServerInterceptor):
    """Makes every call with a single request wait ``seconds`` on the server before it runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_streaming:
            return handler
        run = handler.unary_unary or handler.unary_stream

        def later(request: Any, context: grpc.ServicerContext) -> Any:
            time.sleep(self.seconds)
            return run(request, context)

        make = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary
            else grpc.unary_stream_rpc_method_handler
        )
        return make(
            later,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@contextlib.contextmanager
def front_server(
    engine_server: RunningServer | None, interceptors: tuple[grpc.ServerInterceptor, ...] = ()
) -> Iterator[tuple[int, MemoryServicer]]:
    """tiermem's MemoryService on another port, over ``engine_server``'s engine (none: it answers
    UNAVAILABLE STARTING until the test attaches one), with ``interceptors``."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=interceptors)
    servicer = MemoryServicer()
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)
    if engine_server is not None:
        servicer.attach(engine_server.engine, None, None)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port, servicer
    finally:
        server.stop(0).wait()


def result_keys(results: list[Any]) -> list[tuple[str, float]]:
    return [(r.memory.id, round(r.score, 6)) for r in results]


# --------------------------------------------------------------------------------------------
# 1. wait_ready waits through NOT_SERVING
# --------------------------------------------------------------------------------------------


def test_wait_ready_keeps_asking_while_the_server_is_not_serving() -> None:
    with health_only_server() as (port, servicer):

        def serve() -> None:
            for name in ("", SERVICE):
                servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

        flip = threading.Timer(1.0, serve)
        began = time.monotonic()
        flip.start()
        try:
            with MemoryClient(f"127.0.0.1:{port}") as c:
                c.wait_ready(timeout=30)
        finally:
            flip.cancel()
            flip.join()
        assert time.monotonic() - began >= 0.9  # it returned once SERVING, not before


def test_wait_ready_times_out_naming_the_last_status() -> None:
    with health_only_server() as (port, _), MemoryClient(f"127.0.0.1:{port}") as c:
        began = time.monotonic()
        with pytest.raises(UnavailableError, match="last status NOT_SERVING") as info:
            c.wait_ready(timeout=0.6)
        assert 0.5 <= time.monotonic() - began < 10
        assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_wait_ready_names_the_last_error_when_nothing_answers() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with (
        MemoryClient(f"127.0.0.1:{port}") as c,
        pytest.raises(UnavailableError, match="last error UNAVAILABLE") as info,
    ):
        c.wait_ready(timeout=0.5)
    assert "NOT_SERVING" not in str(info.value)


def test_a_call_to_a_server_that_is_not_there_says_so_when_its_deadline_passes() -> None:
    """A call waits for its connection until its deadline; its error then says the server could
    not be reached, and why, not only DEADLINE_EXCEEDED."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with MemoryClient(f"127.0.0.1:{port}", timeout=0.5) as c, pytest.raises(DeadlineExceededError) as info:
        c.create("ns", "hello")
    assert "could not be reached" in str(info.value) and "UNAVAILABLE" in str(info.value)
    assert "is it running at that address?" in str(info.value) and "TLS" not in str(info.value)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_timeout_that_is_not_a_positive_number_is_refused_before_any_call() -> None:
    for bad in (0, -1, float("nan"), float("inf"), 1e10):  # (inf and 1e10: every call failed at once)
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            MemoryClient("127.0.0.1:1", timeout=bad)
        with MemoryClient("127.0.0.1:1") as c, pytest.raises(ValueError, match="timeout must be a positive"):
            c.get("ns", "id", timeout=bad)


def test_a_deadline_a_reachable_server_missed_says_nothing_of_reaching_it(
    server_factory: Callable[..., Any],
) -> None:
    running = server_factory()
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        with pytest.raises(DeadlineExceededError) as info:
            c.create_batch(
                [{"namespace": "ns", "content": f"memory {i} " * 50} for i in range(1000)], timeout=0.001
            )
    assert "could not be reached" not in str(info.value)


# --------------------------------------------------------------------------------------------
# 2. a server restart within a call's deadline is invisible
# --------------------------------------------------------------------------------------------


def _config(data_dir: Path, port: int) -> ServerConfig:
    return ServerConfig(
        host="127.0.0.1",
        port=port,
        data_dir=data_dir,
        maintenance_interval_seconds=0,
        search_records_access=False,
        search_processes=1,
    )


def test_a_call_made_while_the_server_restarts_waits_for_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = create_server(_config(data_dir, 0))
    port = first.port
    second: list[RunningServer] = []
    failed: list[BaseException] = []

    def restart() -> None:
        time.sleep(1.0)
        try:
            second.append(create_server(_config(data_dir, port)))  # the same port and data
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=restart)
    try:
        with connect(port) as c:
            m = c.create(NS, "The deploy failed: STRIPE_KEY missing in staging", tags=["deploy"])
            first.stop(0)
            thread.start()
            began = time.monotonic()
            got = c.get(NS, m.id, timeout=30)
            waited = time.monotonic() - began
    finally:
        if thread.ident is not None:
            thread.join(120)
        with contextlib.suppress(Exception):
            first.stop(0)
        for s in second:
            s.stop(0)
    assert not failed, failed
    assert got.id == m.id and got.content == m.content and list(got.tags) == ["deploy"]
    assert waited >= 0.9  # it was issued while no server ran, and answered by the restarted one


def test_a_call_the_server_refused_while_starting_is_made_again(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    with connect(running.port) as c:
        m = c.create(NS, "kept until the server is up")
    with front_server(None) as (port, servicer), MemoryClient(f"127.0.0.1:{port}") as c:
        # Until attached, every call fails with UNAVAILABLE STARTING (it never ran), and is made
        # again until its deadline.
        began = time.monotonic()
        with pytest.raises(UnavailableError) as info:
            c.delete(NS, m.id, timeout=0.5)
        assert info.value.reason == "STARTING" and time.monotonic() - began >= 0.3
        attach = threading.Timer(1.0, lambda: servicer.attach(running.engine, None, None))
        attach.start()
        try:
            c.delete(NS, m.id, timeout=30)  # not retried by the channel's policy: by the client
        finally:
            attach.join()
    with connect(running.port) as c:
        assert [x.id for x in c.list_memories(NS)] == []


# --------------------------------------------------------------------------------------------
# 3. timeline with where
# --------------------------------------------------------------------------------------------


def test_timeline_combines_where_with_since_and_until(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    with connect(running.port) as c:
        for i in range(6):
            c.create(
                NS, f"event {i}", id=f"e{i}", kind="note" if i % 2 else "observation", create_time=T0 + i
            )
        ids = lambda it: [m.id for m in it]  # noqa: E731
        assert ids(c.timeline(NS, since=T0 + 1, until=T0 + 5, where={"kind": "note"})) == ["e3", "e1"]
        assert ids(c.timeline(NS, since=T0 + 2, where='{"kind": "observation"}')) == ["e4", "e2"]
        assert ids(c.timeline(NS, until=T0 + 3, where={"$or": [{"kind": "note"}, {"tags": "x"}]})) == ["e1"]
        assert ids(c.timeline(NS, where={"kind": "note"})) == ["e5", "e3", "e1"]
        assert ids(c.timeline(NS, since=T0 + 4, where="")) == ["e5", "e4"]
        assert ids(c.timeline(NS, since=T0, until=T0 + 4, kinds=["note"], page_size=1)) == ["e3", "e1"]


def test_a_naive_datetime_is_utc_in_timeline_as_everywhere(
    server_factory: Callable[..., RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a local time zone that is not UTC: timeline's bounds read it as list_memories' do."""
    import datetime as dt
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        running = server_factory()
        with connect(running.port) as c:
            base = dt.datetime(2026, 3, 1, 12, 0)  # (naive)
            for h in range(8):
                c.create(NS, f"hour {h}", id=f"h{h}", create_time=base + dt.timedelta(hours=h))
            since, until = base, base + dt.timedelta(hours=3)
            listed = [m.id for m in c.list_memories(NS, created_after=since, created_before=until)]
            assert sorted(listed) == ["h0", "h1", "h2"]
            assert sorted(m.id for m in c.timeline(NS, since=since, until=until)) == sorted(listed)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# --------------------------------------------------------------------------------------------
# 4. per-call timeout and metadata, misspelled arguments
# --------------------------------------------------------------------------------------------


def test_a_call_takes_its_own_timeout(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    with connect(running.port) as c:
        c.create(NS, "timeouts are per call")
        assert [r.memory.content for r in c.search(NS, "timeouts", timeout=2)] == ["timeouts are per call"]
    # Every call to this server takes 0.5 s more, so a deadline of 0.1 s always passes first.
    with front_server(running, (Delay(0.5),)) as (port, _):
        with MemoryClient(f"127.0.0.1:{port}", timeout=30) as c:
            with pytest.raises(DeadlineExceededError):
                c.search(NS, "timeouts", timeout=0.1)
            with pytest.raises(DeadlineExceededError):
                c.stats(timeout=0.1)
            with pytest.raises(DeadlineExceededError):
                list(c.export_memories(NS, timeout=0.1))
            assert c.stats().memory_count == 1  # the client's 30 s otherwise
        with MemoryClient(f"127.0.0.1:{port}", timeout=0.1) as c:
            with pytest.raises(DeadlineExceededError):
                c.stats()  # the client's 0.1 s
            assert c.stats(timeout=5).memory_count == 1
            assert len(c.search(NS, "timeouts", timeout=5)) == 1


def test_call_metadata_reaches_the_server(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    recorder = RecordMetadata()
    sent = [("x-request-origin", "agent-7"), ("x-tenant", "ana")]
    with front_server(running, (recorder,)) as (port, _), MemoryClient(f"127.0.0.1:{port}") as c:
        m = c.create(NS, "metadata travels with the call", call_metadata=sent)
        c.search(NS, "metadata", call_metadata=sent)
        c.search_many([{"namespaces": NS, "query": "metadata"}], call_metadata=sent)
        chunks = list(c.export_memories(NS, call_metadata=sent))
        c.delete(NS, m.id, call_metadata=sent)
        assert c.import_memories(chunks, call_metadata=sent).imported == 1
        c.get(NS, m.id)  # none sent
    by_method = {name: pairs for name, pairs in recorder.seen}
    for name in (
        "CreateMemory",
        "SearchMemories",
        "BatchSearchMemories",
        "ExportMemories",
        "DeleteMemory",
        "ImportMemories",
    ):
        assert by_method[name]["x-request-origin"] == "agent-7", name
        assert by_method[name]["x-tenant"] == "ana", name
    assert "x-tenant" not in by_method["GetMemory"]


def test_call_metadata_gRPC_would_refuse_is_told_before_any_call(
    server_factory: Callable[..., RunningServer],
) -> None:
    """gRPC's client refused an upper-case key, an empty one, or a value with a newline as INTERNAL
    "Invalid metadata"; keys are lower-cased now (header names are case-insensitive), and what
    gRPC cannot send is a ValueError or TypeError naming it, in both clients."""
    running = server_factory()
    recorder = RecordMetadata()
    bad: list[tuple[Any, type[Exception], str]] = [
        ([("", "a")], ValueError, "key ''"),
        ([("x-ok", "a\nb")], ValueError, "printable ASCII"),
        ([("x-ok", "é")], ValueError, "printable ASCII"),
        ([("x-data-bin", "text")], TypeError, "bytes"),
        ([("grpc-timeout", "1S")], ValueError, "not grpc-"),
        ({"x-a": "b"}, TypeError, "list of"),
        ([("x-a",)], TypeError, "pair"),
    ]
    with front_server(running, (recorder,)) as (port, _), MemoryClient(f"127.0.0.1:{port}") as c:
        c.stats(call_metadata=[("X-Trace-Id", "t-1"), ("x-data-bin", b"\x00\xff")])
        for md, error, message in bad:
            with pytest.raises(error, match=message):
                c.stats(call_metadata=md)

        async def async_calls() -> None:
            async with AsyncMemoryClient(f"127.0.0.1:{port}") as ac:
                await ac.stats(call_metadata=[("X-Async", "yes")])
                with pytest.raises(ValueError, match="printable ASCII"):
                    await ac.stats(call_metadata=[("x-ok", "a\nb")])

        asyncio.run(async_calls())
    seen = [pairs for name, pairs in recorder.seen if name == "GetStats"]
    assert seen[0]["x-trace-id"] == "t-1" and seen[0]["x-data-bin"] == b"\x00\xff"
    assert seen[1]["x-async"] == "yes" and len(seen) == 2


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c: c.search(NS, "q", tag_any=["x"]),
            r"^search\(\) got an unexpected keyword argument 'tag_any'",
        ),
        (lambda c: c.list_memories(NS, tag_any=["x"]), r"^list_memories\(\) got .* 'tag_any'"),
        (lambda c: c.list_page(NS, kind=["x"]), r"^list_page\(\) got .* 'kind'"),
        (lambda c: list(c.timeline(NS, tag_any=["x"])), r"^timeline\(\) got .* 'tag_any'"),
        (lambda c: c.create(NS, "x", tag=["x"]), r"^create\(\) got .* 'tag'"),
        (lambda c: c.update(NS, "m1", importanc=0.5), r"^update\(\) got .* 'importanc'"),
        (lambda c: c.observe(NS, "x", tier_="fast"), r"^observe\(\) got .* 'tier_'"),
        (lambda c: c.reflect(NS, "x", source_memory_ids=[], kind="x"), r"^reflect\(\) got .* 'kind'"),
        (lambda c: c.summarize(NS, "x", source_memory_ids=[], kind="x"), r"^summarize\(\) got .* 'kind'"),
        (lambda c: c.find_similar_debates(NS, "t", kinds=["x"]), r"^find_similar_debates\(\) got .* 'kinds'"),
        (
            lambda c: c.search_many([{"namespaces": NS}, {"namespaces": NS, "timeout": 1}]),
            r"^search_many\(\) got an unexpected keyword argument 'timeout' in searches\[1\]",
        ),
        (
            lambda c: c.create_batch([{"namespace": NS, "content": "x", "tgs": []}]),
            r"^create_batch\(\) got .* 'tgs' in memories\[0\]",
        ),
        (
            lambda c: c.feedback(NS, [{"idd": "m1"}]),
            r"^feedback\(\) got .* 'idd' in items\[0\]\. Did you mean 'id'",
        ),
        (
            lambda c: c.build_context([{"namspace": NS}], token_budget=100),
            r"^build_context\(\) got .* 'namspace' in scopes\[0\]",
        ),
        (lambda c: c.create(NS, 123), r"^content must be a string, not int"),
        (
            lambda c: c.create_batch([{"namespace": 7, "content": "x"}]),
            r"^namespace must be a string, not int",
        ),
    ],
)
def test_a_misspelled_argument_is_a_type_error_naming_the_method(
    client: MemoryClient, call: Callable[[MemoryClient], Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        call(client)
    assert client.stats().memory_count == 0  # nothing was sent


def test_a_type_error_suggests_the_argument_meant(client: MemoryClient) -> None:
    with pytest.raises(TypeError, match=r"Did you mean 'tags_any'\?"):
        client.search(NS, "q", tag_any=["x"])


# --------------------------------------------------------------------------------------------
# 5. search_many
# --------------------------------------------------------------------------------------------


def test_search_many_equals_the_searches_one_by_one(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    clock.advance(86400)  # the memories below are from the day before
    running = server_factory(clock=clock)
    with connect(running.port) as c:
        texts = [
            "The deploy failed: STRIPE_KEY missing in staging",
            "Ana prefers short answers in the morning",
            "The billing report job timed out on the database",
            "Staging deploys need the release checklist",
            "The database migration ran for two hours",
        ]
        for i, text in enumerate(texts):
            c.create(
                NS,
                text,
                id=f"m{i}",
                kind="incident" if i % 2 == 0 else "preference",
                tags=["deploy"] if "deploy" in text.lower() else [],
                importance=0.2 + 0.15 * i,
                create_time=T0 + 60 * i,
            )
        c.create("user:bob", "Bob deploys on Fridays", id="b0", tags=["deploy"], create_time=T0)
        searches: list[dict[str, Any]] = [
            {"namespaces": NS, "query": "why did the deploy fail?", "limit": 3},
            {"namespaces": [NS, "user:bob"], "query": "deploy", "tags_any": ["deploy"]},
            {"namespaces": NS, "query": "database", "kinds": ["incident"], "strategy": "weighted"},
            {"namespaces": NS, "strategy": "importance", "limit": 2, "where": {"importance": {"$gte": 0.4}}},
            {"namespaces": NS, "query": "report", "hybrid": True, "explain": True, "as_of": T0 + 3600},
        ]
        batched = c.search_many(searches, timeout=10)
        one_by_one = [c.search(**s) for s in searches]
    assert len(batched) == len(searches)
    for got, expected in zip(batched, one_by_one, strict=True):
        assert expected, "every search finds something"
        assert result_keys(got) == result_keys(expected)
        assert [r.explanation for r in got] == [r.explanation for r in expected]


# --------------------------------------------------------------------------------------------
# 6. results as plain Python values
# --------------------------------------------------------------------------------------------


def test_metadata_and_results_read_as_plain_python_values(
    server_factory: Callable[..., RunningServer],
) -> None:
    from tiermem.client import metadata_dict, to_python

    running = server_factory(clock=FakeClock())
    meta = {"build": 1432, "flaky": False, "ratio": 0.25, "branch": "main"}
    with connect(running.port) as c:
        m = c.create(
            NS, "The deploy failed: STRIPE_KEY missing", id="d1", tier="fast", metadata=meta, tags=["ci"]
        )
        node = c.upsert_node(NS, "deploy", properties={"attempts": 3})
        [hit] = c.search(NS, "deploy failed", limit=1)
        [[batched]] = c.search_many([{"namespaces": NS, "query": "deploy failed", "limit": 1}])
        listed = list(c.list_memories(NS))
    # The results stay the generated messages: code reading them as such keeps working.
    assert m.metadata["build"].int_value == 1432 and m.metadata["flaky"].WhichOneof("kind") == "bool_value"
    # Plain values, the type of each kept (1432 an int, not 1432.0 or "1432").
    for got in (m, hit.memory, batched.memory, listed[0]):
        plain = metadata_dict(got)
        assert plain == meta and type(plain["build"]) is int and type(plain["flaky"]) is bool
    assert metadata_dict(node) == {"attempts": 3}
    # A whole result as dicts, lists and scalars: times in epoch seconds, enums by name, unset
    # optional fields as None.
    d = to_python(hit)
    assert d["memory"]["metadata"] == meta
    assert d["memory"]["tier"] == "TIER_FAST" and d["memory"]["tags"] == ["ci"]
    assert d["memory"]["create_time"] == pytest.approx(T0) and d["memory"]["expire_time"] is None
    assert d["score"] == pytest.approx(hit.score) and d["explanation"] is None
    assert [r["memory"]["id"] for r in to_python([hit, batched])] == ["d1", "d1"]
    assert to_python(listed)[0]["metadata"]["build"] == 1432


# --------------------------------------------------------------------------------------------
# 7. every lifecycle policy field and the context switches as arguments
# --------------------------------------------------------------------------------------------

EVERY_POLICY_FIELD: dict[str, Any] = {
    "retention": "importance",
    "delete_from_glacial": True,
    "promote_access_count": 4,
    "promote_surprise": 0.25,
    "promote_success_count": 2,
    "reflection_threshold": 3.5,
    "summary_token_threshold": 900,
    "default_importance": 0.5,
    "importance_decay": "none",
    "importance_floor": 0.05,
    "importance_heuristic": "ten_point",
    "promote_through_tiers": True,
    "decay_grace": False,
    "summarize_evictions": True,
    "max_items": 900,
    "kind_capacities": {"reflection": 100, "observation": 1000},
    "evict_share": 0.1,
    "evict_on_create": True,
    "preset": "generative_agents",
    "recency_basis": "last_access",
    "auto_summarize": True,
    "summary_max_tokens": 900,
    "summary_strategy": "hierarchical",
    "working_token_limit": 32000,
}


def test_update_namespace_config_takes_every_policy_field(client: MemoryClient) -> None:
    from tiermem.v1 import memory_pb2 as pb

    assert {*EVERY_POLICY_FIELD, "tiers"} == {f.name for f in pb.LifecyclePolicy.DESCRIPTOR.fields}
    resp = client.update_namespace_config(NS, tiers={"fast": {"max_items": 7}}, **EVERY_POLICY_FIELD)
    stored = client.get_namespace_config(NS).config.policy
    # each argument given is set, and named in the update mask (else the server would not store it)
    assert {f.name for f, _ in stored.ListFields()} == {*EVERY_POLICY_FIELD, "tiers"}
    assert stored.retention == pb.RETENTION_POLICY_IMPORTANCE
    assert stored.importance_decay == pb.IMPORTANCE_DECAY_NONE
    assert stored.importance_heuristic == pb.IMPORTANCE_HEURISTIC_TEN_POINT
    assert stored.recency_basis == pb.RECENCY_BASIS_LAST_ACCESS
    assert stored.summary_strategy == pb.SUMMARY_STRATEGY_HIERARCHICAL
    assert {k.kind: k.max_items for k in stored.kind_capacities} == EVERY_POLICY_FIELD["kind_capacities"]
    for name in (
        "importance_floor",
        "max_items",
        "evict_share",
        "preset",
        "decay_grace",
        "evict_on_create",
        "auto_summarize",
        "summary_max_tokens",
        "working_token_limit",
    ):
        assert getattr(stored, name) == pytest.approx(EVERY_POLICY_FIELD[name]), name
    eff = resp.effective
    assert (eff.preset, eff.max_items, eff.recency_basis) == (
        "generative_agents",
        900,
        pb.RECENCY_BASIS_LAST_ACCESS,
    )
    # names in any case, with or without the enum's prefix, and enum values, are the same
    client.update_namespace_config(NS, recency_basis="RECENCY_BASIS_CREATION", importance_decay=1)
    stored = client.get_namespace_config(NS).config.policy
    assert (stored.recency_basis, stored.importance_decay) == (
        pb.RECENCY_BASIS_CREATION,
        pb.IMPORTANCE_DECAY_HALF_LIFE,
    )
    assert stored.max_items == 900  # a field not given is not in the mask: kept


@pytest.mark.parametrize(
    "argument,value",
    [
        ("importance_decay", "exponential"),
        ("importance_heuristic", "tenpoint"),
        ("recency_basis", "access"),
        ("retention", "oldest"),
        ("recency_basis", "unspecified"),
    ],
)
def test_an_unknown_policy_name_is_a_value_error_naming_the_argument(
    client: MemoryClient, argument: str, value: str
) -> None:
    client.update_namespace_config(NS, max_items=5)
    with pytest.raises(ValueError, match=rf"^{argument} must be one of .* not {value!r}"):
        client.update_namespace_config(NS, max_items=9, **{argument: value})
    assert client.get_namespace_config(NS).config.policy.max_items == 5  # nothing was sent


def test_build_context_takes_fill_per_scope_and_summarize_overflow(client: MemoryClient) -> None:
    for i in range(5):
        text = f"Deploy {i} failed on staging. The log shows a long trace of retries and timeouts."
        client.create(NS, text, id=f"d{i}", importance=0.1 * (i + 1), token_cost=30)
    scope = {"namespace": NS, "share": 1.0, "recent_window": 0}

    def kinds(**kw: Any) -> list[str]:
        ctx = client.build_context([{**scope, **kw.pop("scope", {})}], token_budget=100, read_only=True, **kw)
        return [s.kind for s in ctx.sections if s.items]

    assert kinds() == ["important", "overflow"]  # d4, d3, d2, then a summary of d1 and d0
    assert kinds(summarize_overflow=False) == ["important"]
    assert kinds(scope={"fill": False}) == []
    assert kinds(scope={"fill": True}, summarize_overflow=True) == ["important", "overflow"]


def test_to_python_turns_repeated_messages_into_lists_of_dicts(client: MemoryClient) -> None:
    from tiermem.client import to_python

    client.create(NS, "one memory", tier="fast", tags=["a", "b"])
    stats = to_python(client.stats(NS))
    assert isinstance(stats["tiers"], list) and stats["tiers"][0]["tier"] == "TIER_FAST"
    assert stats["tiers"][0]["memory_count"] == 1
    [m] = [to_python(x) for x in client.list_memories(NS)]
    assert m["tags"] == ["a", "b"]


def test_a_string_where_a_list_of_strings_goes_is_a_type_error(client: MemoryClient) -> None:
    """``tags="deploy"`` would be six one-letter tags, a dict its keys: refused before any call."""
    for call in (
        lambda: client.create("n:a", "x", tags="deploy"),
        lambda: client.create("n:a", "x", tags={"deploy": 1}),
        lambda: client.create("n:a", "x", source_memory_ids="m1"),
        lambda: client.search("n:a", "x", tags_any="deploy"),
        lambda: client.search("n:a", "x", tags_all=b"deploy"),
        lambda: client.list_page("n:a", kinds="observation"),
    ):
        with pytest.raises(TypeError, match="must be a list of strings"):
            call()
    assert client.stats().memory_count == 0
    assert list(client.create("n:a", "x", tags=("deploy", "ci")).tags) == ["deploy", "ci"]


def test_an_error_whose_status_differs_from_the_servers_is_still_a_tiermem_error() -> None:
    """A deadline that passes at both ends at once: the call reports the client's own status
    message while its trailers carry the server's google.rpc.Status. grpc_status refuses such a
    pair (ValueError, which escaped the client's handlers); the client reads the server's details
    and keeps the call's code. (The race is not reproducible on demand: the call's shape is built.)"""
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    from tiermem.client.errors import from_rpc_error

    sent = status_pb2.Status(
        code=code_pb2.DEADLINE_EXCEEDED, message="the export was cancelled or its deadline passed"
    )
    sent.details.add().Pack(error_details_pb2.ErrorInfo(domain="tiermem", reason="DEADLINE_EXCEEDED"))

    class Call(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self) -> str:
            return "Stream removed (Deadline Exceeded)"

        def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
            return (("grpc-status-details-bin", sent.SerializeToString()),)

    err = from_rpc_error(Call())
    assert isinstance(err, DeadlineExceededError) and err.reason == "DEADLINE_EXCEEDED"


def test_a_str_where_a_list_goes_and_a_str_for_protected_are_type_errors(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Not taken apart into characters (a scope, a question, a memory id per character), nor
    truthy "no" protecting a namespace: a TypeError before any call."""
    running = server_factory()
    with connect(running.port) as c:
        for call in (
            lambda: c.build_context("user:ana", token_budget=100),
            lambda: c.reflect(NS, "an insight", source_memory_ids=[], questions="why?"),
            lambda: c.upsert_node(NS, "n1", memory_ids="a94e5"),
            lambda: c.add_edge(NS, "n1", "knows", "n2", memory_ids="a94e5"),
            lambda: c.update_namespace_config(NS, protected="no"),  # type: ignore[arg-type]
        ):
            with pytest.raises(TypeError):
                call()
        assert not c.get_namespace_config(NS).config.protected
        assert list(c.list_memories(NS)) == []


def test_errors_pickle_and_copy_whole(server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """As an error raised in a worker process reaches its parent: class, code, reason, fields."""
    import copy
    import pickle

    from tiermem.client import InvalidArgumentError, NotFoundError
    from tiermem.client.backup import BackupFileError

    running = server_factory()
    with connect(running.port) as c:
        caught = []
        for call in (lambda: c.get(NS, "missing"), lambda: c.create(NS, "x", importance=2.0)):
            with pytest.raises((NotFoundError, InvalidArgumentError)) as err:
                call()
            caught.append(err.value)
    for e in caught:
        e.add_note("seen in a worker")
        for again in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
            assert type(again) is type(e) and str(again) == str(e)
            assert (again.code, again.reason, again.fields, again.__notes__) == (
                e.code,
                e.reason,
                e.fields,
                ["seen in a worker"],
            )
    bad = BackupFileError(tmp_path / "x.tmb", "checksum mismatch")
    again = pickle.loads(pickle.dumps(bad))
    assert (again.path, again.problem, str(again)) == (bad.path, bad.problem, str(bad))


def test_wait_ready_without_a_deadline_returns_and_an_endless_one_is_refused(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=None) as c:
        c.wait_ready()  # (no deadline: it raised a TypeError)
        for endless in (float("inf"), 1e10):
            with pytest.raises(ValueError, match="timeout"):
                c.wait_ready(endless)  # (it never returned)
        c.wait_ready(5)


def test_a_closed_client_says_so_the_same_way_sync_and_async(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A TiermemError CANCELLED, as for a call under way when it closed (gRPC's own errors were a
    ValueError in one client and a UsageError in the other)."""
    import asyncio

    from tiermem.client import AsyncMemoryClient, TiermemError

    running = server_factory()
    c = MemoryClient(f"127.0.0.1:{running.port}")
    c.close()
    for call in (lambda: c.get(NS, "x"), lambda: list(c.list_memories(NS)), c.wait_ready):
        with pytest.raises(TiermemError) as err:
            call()
        assert err.value.code == grpc.StatusCode.CANCELLED and "closed" in err.value.message

    async def closed_async() -> None:
        a = AsyncMemoryClient(f"127.0.0.1:{running.port}")
        await a.close()
        for make in (lambda: a.get(NS, "x"), a.wait_ready):
            with pytest.raises(TiermemError) as err:
                await make()
            assert err.value.code == grpc.StatusCode.CANCELLED
        with pytest.raises(TiermemError):
            [m async for m in a.list_memories(NS)]
        with pytest.raises(TiermemError):
            [m async for m in a.export_memories(NS)]

    asyncio.run(closed_async())


def test_a_servers_timestamp_goes_back_as_a_time_and_tiers_must_be_a_list(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    with connect(running.port) as c:
        first = c.create(NS, "first", create_time=T0)
        c.create(NS, "second", create_time=T0 + 60)
        later = [m.content for m in c.timeline(NS, since=first.create_time)]  # (a TypeError before)
        assert later == ["second", "first"]
        assert [m.content for m in c.timeline(NS, until=first.create_time)] == []
        again = c.create(NS, "third", create_time=first.create_time)
        assert again.create_time == first.create_time
        with pytest.raises(TypeError, match="tiers must be a list"):
            c.search(NS, "first", tiers="fast")  # (it said: unknown tier 'f')


def test_a_tier_or_strategy_is_a_name_or_an_int_never_a_float_or_a_bool(
    server_factory: Callable[..., RunningServer],
) -> None:
    """``tier=1.7`` was taken as FAST (``int()`` rounds it down) and ``tier=True`` as FAST too: a
    TypeError before any call now; names, ints and NumPy ints are taken as before."""
    import numpy as np

    running = server_factory()
    with connect(running.port) as c:
        for bad in ({"tier": 1.7}, {"tier": True}):
            with pytest.raises(TypeError, match="tier must be a name or an int"):
                c.create(NS, "x", **bad)
        with pytest.raises(TypeError, match="strategy must be a name or an int"):
            c.search(NS, "x", strategy=4.0)
        with pytest.raises(TypeError, match="tier must be a name or an int"):
            c.search(NS, "x", tiers=[2.5])
        assert c.stats().memory_count == 0
        assert c.create(NS, "fast", tier="fast").tier == 1
        assert c.create(NS, "medium", tier=np.int64(2)).tier == 2
        assert c.create(NS, "slow", tier=3).tier == 3
        assert [h.memory.content for h in c.search(NS, "slow", strategy=4, tiers=[3])] == ["slow"]


def test_a_dict_where_a_list_of_dicts_goes_is_a_type_error(client: MemoryClient) -> None:
    """``create_batch({...})`` iterated the dict's keys and failed on a str with a message about
    its argument names; one dict, or an entry that is not one, is a TypeError naming the list."""
    one = {"namespace": NS, "content": "x"}
    with pytest.raises(TypeError, match="memories must be a list of dicts, not dict"):
        client.create_batch(one)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"memories\[1\] must be a dict, not str"):
        client.create_batch([one, "y"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="searches must be a list of dicts"):
        client.search_many({"namespaces": [NS], "query": "x"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"items\[0\] must be a dict"):
        client.feedback(NS, ["an-id"])  # type: ignore[list-item]
    assert client.stats().memory_count == 0
    from tiermem.client.client import build_memory

    assert len(client.create_batch([one, build_memory(NS, "y")])) == 2


def test_list_namespaces_checks_its_arguments_at_the_call(client: MemoryClient) -> None:
    """As ``list_memories`` does: a bad argument raises where the call is written, not where its
    first page happens to be read; the pages then come as before."""
    with pytest.raises(TypeError):
        client.list_namespaces(prefix=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.list_namespaces(page_size="ten")  # type: ignore[arg-type]
    for i in range(5):
        client.create(f"{NS}-{i}", "x")
    assert [n.name for n in client.list_namespaces(NS, page_size=2)] == [f"{NS}-{i}" for i in range(5)]
