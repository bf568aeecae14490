"""The follower's Forwarder: MemoryService calls through a forwarding server behave as if made to
the writing process directly (results, statuses, rich statuses, streams, metadata, cancellation)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from conftest import FakeClock
from grpc_status import rpc_status

from tiermem.server.transport.app import RunningServer
from tiermem.server.transport.forward import Forwarder, methods_of
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

SERVICE = "tiermem.v1.MemoryService"
METHODS = methods_of(pb.DESCRIPTOR.services_by_name["MemoryService"])
TIMEOUT = 10.0


@pytest.fixture
def serve() -> Iterator[Callable[..., int]]:
    """``serve(*generic_handlers)`` starts a plain gRPC server on 127.0.0.1 port 0; returns its port."""
    servers: list[grpc.Server] = []

    def start(*handlers: grpc.GenericRpcHandler) -> int:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(handlers)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return port

    yield start
    for server in servers:
        server.stop(None).wait()


@pytest.fixture
def channel() -> Iterator[Callable[[int], grpc.Channel]]:
    """``channel(port)`` opens an insecure channel to 127.0.0.1:port, closed after the test."""
    opened: list[grpc.Channel] = []

    def open_(port: int) -> grpc.Channel:
        opened.append(grpc.insecure_channel(f"127.0.0.1:{port}"))
        return opened[-1]

    yield open_
    for ch in opened:
        ch.close()


@pytest.fixture
def upstream(server_factory: Callable[..., RunningServer]) -> RunningServer:
    return server_factory(clock=FakeClock())


@pytest.fixture
def forward(
    serve: Callable[..., int], channel: Callable[[int], grpc.Channel]
) -> Callable[..., pb_grpc.MemoryServiceStub]:
    """``forward(upstream_port, keep=set())``: a MemoryService stub of a server whose only handler
    forwards to the upstream."""

    def start(upstream_port: int, keep: set[str] | None = None) -> pb_grpc.MemoryServiceStub:
        forwarder = Forwarder(
            channel(upstream_port), SERVICE, METHODS, keep or set(), upstream=f"127.0.0.1:{upstream_port}"
        )
        return pb_grpc.MemoryServiceStub(channel(serve(forwarder)))

    return start


@pytest.fixture
def stubs(
    upstream: RunningServer,
    forward: Callable[..., pb_grpc.MemoryServiceStub],
    channel: Callable[[int], grpc.Channel],
) -> tuple[pb_grpc.MemoryServiceStub, pb_grpc.MemoryServiceStub]:
    """(through the forwarder, directly to the upstream)."""
    return forward(upstream.port), pb_grpc.MemoryServiceStub(channel(upstream.port))


def _error(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def _same_status(via: Any, direct: Any) -> None:
    assert via.code() == direct.code()
    assert via.details() == direct.details()
    rich = rpc_status.from_call(via)
    assert rich is not None and rich == rpc_status.from_call(direct)


def test_methods_of_reads_cardinalities() -> None:
    assert len(METHODS) == len(pb.DESCRIPTOR.services_by_name["MemoryService"].methods)
    assert METHODS["CreateMemory"] == "unary_unary"
    assert METHODS["ExportMemories"] == "unary_stream"
    assert METHODS["ImportMemories"] == "stream_unary"
    assert METHODS["ReplicateChanges"] == "stream_stream"
    assert set(METHODS.values()) == {"unary_unary", "unary_stream", "stream_unary", "stream_stream"}


def test_create_then_get_through_the_forwarder(stubs: tuple[Any, Any]) -> None:
    via, direct = stubs
    created = via.CreateMemory(
        pb.CreateMemoryRequest(memory=pb.Memory(namespace="user:a", content="likes tea", id="m1")),
        timeout=TIMEOUT,
    )
    assert created.memory.id == "m1" and created.memory.content == "likes tea"
    got = via.GetMemory(pb.GetMemoryRequest(namespace="user:a", id="m1"), timeout=TIMEOUT)
    assert got.memory.content == "likes tea" and got.memory.create_time == created.memory.create_time
    assert got == direct.GetMemory(pb.GetMemoryRequest(namespace="user:a", id="m1"), timeout=TIMEOUT)


def test_invalid_argument_keeps_code_details_and_rich_status(stubs: tuple[Any, Any]) -> None:
    request = pb.CreateMemoryRequest(memory=pb.Memory(namespace="", content="x"))
    via = _error(lambda: stubs[0].CreateMemory(request, timeout=TIMEOUT))
    direct = _error(lambda: stubs[1].CreateMemory(request, timeout=TIMEOUT))
    assert via.code() == grpc.StatusCode.INVALID_ARGUMENT
    _same_status(via, direct)


def test_not_found_keeps_code_details_and_rich_status(stubs: tuple[Any, Any]) -> None:
    request = pb.GetMemoryRequest(namespace="user:a", id="missing")
    via = _error(lambda: stubs[0].GetMemory(request, timeout=TIMEOUT))
    direct = _error(lambda: stubs[1].GetMemory(request, timeout=TIMEOUT))
    assert via.code() == grpc.StatusCode.NOT_FOUND
    _same_status(via, direct)


def _create_src(stub: Any, count: int) -> None:
    """Memories m0.. in namespace "src", straight upstream."""
    for i in range(count):
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace="src", content=f"memory {i}", id=f"m{i}")),
            timeout=TIMEOUT,
        )


def test_export_streams_the_same_chunks_as_upstream(stubs: tuple[Any, Any]) -> None:
    via, direct = stubs
    _create_src(direct, 5)
    request = pb.ExportMemoriesRequest(namespace="src")
    chunks = list(via.ExportMemories(request, timeout=TIMEOUT))
    assert chunks == list(direct.ExportMemories(request, timeout=TIMEOUT))
    assert chunks[0].HasField("header")
    assert {c.memory.id for c in chunks if c.HasField("memory")} == {f"m{i}" for i in range(5)}


def _import_requests(
    chunks: list[pb.ExportMemoriesResponse], target: str
) -> Iterator[pb.ImportMemoriesRequest]:
    for i, chunk in enumerate(chunks):
        req = pb.ImportMemoriesRequest(target_namespace=target if i == 0 else "")
        which = chunk.WhichOneof("chunk")
        assert which in ("header", "memory", "scope")  # no graph in these tests
        getattr(req, which).CopyFrom(getattr(chunk, which))
        yield req


def test_import_streams_requests_upstream(stubs: tuple[Any, Any]) -> None:
    via, direct = stubs
    _create_src(direct, 3)
    chunks = list(direct.ExportMemories(pb.ExportMemoriesRequest(namespace="src"), timeout=TIMEOUT))
    resp = via.ImportMemories(_import_requests(chunks, "dst"), timeout=TIMEOUT)
    assert resp.imported == 3
    got = via.GetMemory(pb.GetMemoryRequest(namespace="dst", id="m2"), timeout=TIMEOUT)
    assert got.memory.content == "memory 2"
    # An error of a client stream comes back like the upstream's.
    headless = [pb.ImportMemoriesRequest(memory=pb.Memory(namespace="ns", content="x", id="a"))]
    _same_status(
        _error(lambda: via.ImportMemories(iter(headless), timeout=TIMEOUT)),
        _error(lambda: direct.ImportMemories(iter(headless), timeout=TIMEOUT)),
    )


def test_kept_method_is_unimplemented_without_a_local_handler(
    upstream: RunningServer, forward: Callable[..., pb_grpc.MemoryServiceStub]
) -> None:
    via = forward(upstream.port, keep={"SearchMemories"})
    e = _error(lambda: via.SearchMemories(pb.SearchMemoriesRequest(namespaces=["ns"]), timeout=TIMEOUT))
    assert e.code() == grpc.StatusCode.UNIMPLEMENTED
    # The other methods still go upstream.
    e = _error(lambda: via.GetMemory(pb.GetMemoryRequest(namespace="ns", id="x"), timeout=TIMEOUT))
    assert e.code() == grpc.StatusCode.NOT_FOUND


def test_unreachable_upstream_is_unavailable_naming_it(
    forward: Callable[..., pb_grpc.MemoryServiceStub],
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    via = forward(port)
    e = _error(lambda: via.GetMemory(pb.GetMemoryRequest(namespace="ns", id="x"), timeout=TIMEOUT))
    assert e.code() == grpc.StatusCode.UNAVAILABLE
    assert e.details().startswith(f"the writing process at 127.0.0.1:{port} is unavailable")
    e = _error(lambda: list(via.ExportMemories(pb.ExportMemoriesRequest(), timeout=TIMEOUT)))
    assert e.code() == grpc.StatusCode.UNAVAILABLE and "writing process" in e.details()


# -- a tiny raw-bytes upstream, to observe what reaches it --------------------------------------


class Echo(grpc.GenericRpcHandler):
    """Service "test.Echo": Unary echoes the request and records the call's metadata and deadline;
    Stream sends b"first", waits for ``release``, then b"second"; Wait blocks until cancelled."""

    def __init__(self) -> None:
        self.metadata: dict[str, Any] = {}
        self.time_remaining: float | None = None
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.cancelled = threading.Event()
        self.handlers = {
            "/test.Echo/Unary": grpc.unary_unary_rpc_method_handler(self.unary),
            "/test.Echo/Stream": grpc.unary_stream_rpc_method_handler(self.stream),
            "/test.Echo/Wait": grpc.unary_unary_rpc_method_handler(self.wait),
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self.handlers.get(handler_call_details.method)

    def unary(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.metadata = {md.key: md.value for md in context.invocation_metadata()}
        self.time_remaining = context.time_remaining()
        context.send_initial_metadata((("x-initial", "i"),))
        context.set_trailing_metadata((("x-trailing", "t"), ("x-trailing-bin", b"\x00\xff")))
        return request

    def stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        context.send_initial_metadata((("x-initial", "s"),))
        yield b"first"
        assert self.release.wait(TIMEOUT)
        yield b"second"
        context.set_trailing_metadata((("x-trailing", "s"),))

    def wait(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        context.add_callback(self.cancelled.set)
        self.waiting.set()
        self.cancelled.wait(TIMEOUT)
        return b""


@pytest.fixture
def echo(serve: Callable[..., int], channel: Callable[[int], grpc.Channel]) -> tuple[Echo, grpc.Channel]:
    """The Echo upstream and a channel to a forwarder in front of it."""
    upstream = Echo()
    methods = {"Unary": "unary_unary", "Stream": "unary_stream", "Wait": "unary_unary"}
    forwarder = Forwarder(channel(serve(upstream)), "test.Echo", methods, set())
    return upstream, channel(serve(forwarder))


def test_metadata_and_deadline_go_up_and_metadata_comes_back(echo: tuple[Echo, grpc.Channel]) -> None:
    upstream, ch = echo
    sent = (("x-request-id", "r-1"), ("x-token-bin", b"\x01\x02"))
    response, call = ch.unary_unary("/test.Echo/Unary").with_call(b"ping", timeout=5, metadata=sent)
    assert response == b"ping"
    assert upstream.metadata["x-request-id"] == "r-1" and upstream.metadata["x-token-bin"] == b"\x01\x02"
    # The caller's deadline (gRPC rounds timeouts up a little on the wire).
    assert upstream.time_remaining is not None and 0 < upstream.time_remaining < 5.5
    assert ("x-initial", "i") in call.initial_metadata()
    assert {("x-trailing", "t"), ("x-trailing-bin", b"\x00\xff")} <= set(call.trailing_metadata())
    # Without a deadline the upstream call has none either.
    ch.unary_unary("/test.Echo/Unary")(b"ping")
    assert upstream.time_remaining is not None and upstream.time_remaining > 1e8


def test_server_stream_relays_each_response_as_it_comes(echo: tuple[Echo, grpc.Channel]) -> None:
    upstream, ch = echo
    call = ch.unary_stream("/test.Echo/Stream")(b"", timeout=TIMEOUT)
    assert next(call) == b"first"  # before the upstream sends the second one
    upstream.release.set()
    assert list(call) == [b"second"]
    assert ("x-initial", "s") in call.initial_metadata()
    assert ("x-trailing", "s") in call.trailing_metadata()


def test_caller_cancel_and_deadline_cancel_upstream(echo: tuple[Echo, grpc.Channel]) -> None:
    upstream, ch = echo
    future = ch.unary_unary("/test.Echo/Wait").future(b"", timeout=TIMEOUT)
    assert upstream.waiting.wait(TIMEOUT)
    future.cancel()
    assert upstream.cancelled.wait(TIMEOUT)

    upstream.waiting.clear()
    upstream.cancelled.clear()
    e = _error(lambda: ch.unary_unary("/test.Echo/Wait")(b"", timeout=0.3))
    assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert upstream.cancelled.wait(TIMEOUT)
