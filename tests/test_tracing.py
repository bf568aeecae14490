"""OpenTelemetry spans for every call (setting tracing), joined to the caller's trace."""

from __future__ import annotations

from collections.abc import Callable

import pytest

trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

from tiermem.client import MemoryClient, NotFoundError  # noqa: E402
from tiermem.server.transport.app import RunningServer  # noqa: E402

EXPORTER = in_memory.InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    p = sdk_trace.TracerProvider()
    p.add_span_processor(export.SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(p)  # (once per process: the global provider)


def test_every_call_is_a_span_joined_to_the_callers_trace(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory(tracing=True)
    EXPORTER.clear()
    tracer = trace.get_tracer("test")
    with (
        MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c,
        tracer.start_as_current_span("agent turn") as parent,
    ):
        carrier: dict[str, str] = {}
        from opentelemetry.propagate import inject

        inject(carrier)
        c.create("traced", "a traced memory", call_metadata=list(carrier.items()))
        with pytest.raises(NotFoundError):
            c.get("traced", "missing", call_metadata=list(carrier.items()))
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    create = spans["/tiermem.v1.MemoryService/CreateMemory"]
    assert create.context.trace_id == parent.get_span_context().trace_id  # joined to the caller's trace
    assert spans["/tiermem.v1.MemoryService/GetMemory"].context.trace_id == parent.get_span_context().trace_id


def test_no_spans_unless_asked(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    EXPORTER.clear()
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.create("untraced", "a memory")
    assert not [s for s in EXPORTER.get_finished_spans() if s.name.startswith("/tiermem.v1")]


def test_a_call_is_one_span_when_gRPC_is_instrumented_already(
    server_factory: Callable[..., RunningServer],
) -> None:
    """What ``opentelemetry-instrument`` does (it instruments grpc.server): tracing adds no second
    interceptor, which traced every call twice."""
    from opentelemetry.instrumentation.grpc import GrpcInstrumentorServer

    instrumentor = GrpcInstrumentorServer()
    instrumentor.instrument()
    try:
        running = server_factory(tracing=True)
        EXPORTER.clear()
        with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
            c.create("traced", "a memory traced once")
        names = [s.name for s in EXPORTER.get_finished_spans()]
        assert names.count("/tiermem.v1.MemoryService/CreateMemory") == 1, names
    finally:
        instrumentor.uninstrument()


def test_tracing_without_opentelemetry_is_an_unusable_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """One line and exit status 2 at start (a traceback and status 1 before)."""
    import sys

    from tiermem.server.config import UnusableSetting
    from tiermem.server.transport import process

    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.grpc", None)  # (not installed)
    with pytest.raises(UnusableSetting, match="tracing=True needs OpenTelemetry"):
        process._tracing_interceptor()
