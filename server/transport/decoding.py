"""Requests that cannot be decoded are INVALID_ARGUMENT (reason MALFORMED_REQUEST), never INTERNAL.

grpcio answers a request its deserializer cannot parse (truncated bytes, a string field holding
invalid UTF-8, a wrong wire type) with INTERNAL "Exception deserializing request!" and no details,
as though the server had failed. Here every method of a service is registered with a deserializer
that never raises: bytes that do not decode become a ``Malformed`` marker, and a call that carries
one is answered INVALID_ARGUMENT with an ``ErrorInfo`` (reason ``MALFORMED_REQUEST``, domain
``tiermem``) before the servicer method sees it. A client stream (ImportMemories) ends at its first
malformed message with that status; the messages before it reached the servicer as they came, as
any invalid chunk of an import does (its earlier commits stay).

The handlers are built from the service descriptor, so an RPC added to the proto is covered as
soon as the stubs are regenerated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

from tiermem.server.model.errors import TiermemError
from tiermem.server.transport.status import to_status
from tiermem.v1 import memory_pb2 as pb

__all__ = [
    "MEMORY_SERVICE",
    "REASON",
    "Malformed",
    "add_memory_service",
    "checked_raw",
    "malformed_error",
    "method_handlers",
]

REASON = "MALFORMED_REQUEST"
MEMORY_SERVICE = pb.DESCRIPTOR.services_by_name["MemoryService"]

Behavior = Callable[..., Any]


class Malformed:
    """What the deserializer yields for bytes that are not the method's request message."""

    __slots__ = ("error",)

    def __init__(self, error: TiermemError) -> None:
        self.error = error


def malformed_error(method: MethodDescriptor, cause: Exception) -> TiermemError:
    """The error a request of ``method`` gets when its bytes failed to parse with ``cause``."""
    name = method.input_type.full_name
    # upb says "Error parsing message with type '<name>': <what>": keep the what.
    detail = str(cause).removeprefix(f"Error parsing message with type '{name}': ") or type(cause).__name__
    return TiermemError(
        message=f"the request could not be decoded as a {name} message: {detail}",
        reason=REASON,
        status="INVALID_ARGUMENT",
        metadata={"request_type": name},
    )


def _decoder(method: MethodDescriptor, keep_bytes: bool = False) -> Callable[[bytes], Any]:
    """The request deserializer of ``method``: the message (or, with ``keep_bytes``, the bytes
    once they parse), or a ``Malformed`` marker; it never raises."""
    parse = message_factory.GetMessageClass(method.input_type).FromString

    def decode(raw: bytes) -> Any:
        try:
            request = parse(raw)
        except Exception as e:  # whatever the parser raises on these bytes is about these bytes
            return Malformed(malformed_error(method, e))
        return raw if keep_bytes else request

    return decode


class _Checked:
    """A request stream that raises the error of its first malformed message (and after it)."""

    def __init__(self, requests: Iterator[Any]) -> None:
        self._requests = requests
        self.malformed: TiermemError | None = None

    def __iter__(self) -> _Checked:
        return self

    def __next__(self) -> Any:
        if self.malformed is not None:
            raise self.malformed
        request = next(self._requests)
        if isinstance(request, Malformed):
            self.malformed = request.error
            raise request.error  # the servicer's error mapping turns it into its status ...
        return request


def _answer(checked: _Checked, context: grpc.ServicerContext) -> None:
    # ... and whatever the servicer made of it (its own status, or none), this is the answer.
    if checked.malformed is not None:
        context.abort_with_status(to_status(checked.malformed))


def _single(behavior: Behavior) -> Behavior:
    """unary_unary and unary_stream: a malformed request never reaches ``behavior``."""

    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            context.abort_with_status(to_status(request.error))
        return behavior(request, context)

    return handle


def _stream_unary(behavior: Behavior) -> Behavior:
    def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        checked = _Checked(requests)
        try:
            response = behavior(checked, context)
        except Exception:
            if checked.malformed is None:
                raise
            response = None
        _answer(checked, context)
        return response

    return handle


def _stream_stream(behavior: Behavior) -> Behavior:
    def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        checked = _Checked(requests)
        try:
            yield from behavior(checked, context)
        except Exception:
            if checked.malformed is None:
                raise
        _answer(checked, context)

    return handle


def _wrap(method: MethodDescriptor) -> Callable[[Behavior], Behavior]:
    if not method.client_streaming:
        return _single
    return _stream_stream if method.server_streaming else _stream_unary


def _cardinality(method: MethodDescriptor) -> str:
    return f"{'stream' if method.client_streaming else 'unary'}_{'stream' if method.server_streaming else 'unary'}"


def method_handlers(
    servicer: Any, service: ServiceDescriptor = MEMORY_SERVICE
) -> dict[str, grpc.RpcMethodHandler]:
    """Method name -> handler for every method of ``service``, served by ``servicer``'s method of
    that name, with requests that do not decode answered MALFORMED_REQUEST."""
    handlers = {}
    for m in service.methods:
        make = getattr(grpc, f"{_cardinality(m)}_rpc_method_handler")
        handlers[m.name] = make(
            _wrap(m)(getattr(servicer, m.name)),
            request_deserializer=_decoder(m),
            response_serializer=message_factory.GetMessageClass(m.output_type).SerializeToString,
        )
    return handlers


def add_memory_service(servicer: Any, server: grpc.Server) -> None:
    """``memory_pb2_grpc.add_MemoryServiceServicer_to_server``, with undecodable requests answered
    INVALID_ARGUMENT (MALFORMED_REQUEST) instead of INTERNAL."""
    handlers = method_handlers(servicer, MEMORY_SERVICE)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(MEMORY_SERVICE.full_name, handlers),)
    )
    server.add_registered_method_handlers(MEMORY_SERVICE.full_name, handlers)


class _CheckedRaw(grpc.GenericRpcHandler):
    """``checked_raw``: wraps the raw-bytes handlers ``inner`` gives for methods of ``service``."""

    def __init__(self, inner: grpc.GenericRpcHandler, service: ServiceDescriptor) -> None:
        self._inner = inner
        self._methods = {f"/{service.full_name}/{m.name}": m for m in service.methods}
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        handler = self._inner.service(handler_call_details)
        method = self._methods.get(path)
        if handler is None or method is None or handler.request_deserializer is not None:
            return handler  # not a raw-bytes handler of the service: its own deserializer decides
        cached = self._wrapped.get(path)
        if cached is not None and cached[0] is handler:
            return cached[1]
        cardinality = _cardinality(method)
        wrapped = getattr(grpc, f"{cardinality}_rpc_method_handler")(
            _wrap(method)(getattr(handler, cardinality)),
            request_deserializer=_decoder(method, keep_bytes=True),
            response_serializer=handler.response_serializer,
        )
        self._wrapped[path] = (handler, wrapped)
        return wrapped


def checked_raw(
    inner: grpc.GenericRpcHandler, service: ServiceDescriptor = MEMORY_SERVICE
) -> grpc.GenericRpcHandler:
    """``inner`` (handlers of ``service``'s methods that take raw bytes, e.g. a search follower's
    local searches), with bytes that do not decode as the method's request answered
    MALFORMED_REQUEST before ``inner``'s handler runs; the bytes that do pass on unchanged."""
    return _CheckedRaw(inner, service)
