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
