"""Forward calls of a gRPC service, as raw bytes, to another process.

A search follower process serves searches itself and forwards every other call of the
MemoryService to the process that writes: ``Forwarder`` is registered as a generic handler
before the follower's own servicer, forwards every method but the ones in ``keep`` and returns
None for those, so the handler registered after it serves them locally.

Messages are never parsed: request and response bytes go through unchanged. What else passes:

- upstream: the caller's invocation metadata, but ``user-agent`` (the forwarding channel sends its
  own) and keys starting with ``:`` (HTTP/2 pseudo-headers, which gRPC refuses to send), with the
  forwarder's own ``metadata`` in place of any the caller sent under its keys; and the caller's
  remaining deadline as the upstream call's timeout.
- back: the upstream's initial metadata and trailing metadata of a successful call; on error its
  code, details and trailing metadata (so a rich status, ``grpc-status-details-bin``, reaches the
  caller as ``grpc_status.rpc_status.from_call`` expects it). The initial metadata of a failed call
  is not passed back. An upstream that cannot be reached (UNAVAILABLE without a rich status) is
  UNAVAILABLE with details naming it.
- a caller that cancels, or whose deadline passes, cancels the upstream call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor

__all__ = ["CARDINALITIES", "Forwarder", "methods_of"]

CARDINALITIES = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

Metadata = tuple[tuple[str, Any], ...]

# grpcio reports "no deadline" as a huge time_remaining() (about 9.2e18 s), which overflows as a
# timeout: anything above this (~3 years) means no deadline.
_NO_DEADLINE_ABOVE = 1e8
_RICH_STATUS_KEY = "grpc-status-details-bin"


def methods_of(service: ServiceDescriptor) -> dict[str, str]:
    """Method name -> cardinality ("unary_unary", ...) of every method of a protobuf service."""
    return {
        m.name: f"{'stream' if m.client_streaming else 'unary'}_{'stream' if m.server_streaming else 'unary'}"
        for m in service.methods
    }


def _upstream_metadata(context: grpc.ServicerContext, own: Metadata = ()) -> Metadata:
    """The caller's metadata to send upstream, with ``own`` in place of the caller's same keys."""
    replaced = {k for k, _ in own}
    return (
        tuple(
            (md.key, md.value)
            for md in context.invocation_metadata() or ()
            if not md.key.startswith(":") and md.key != "user-agent" and md.key not in replaced
        )
        + own
    )


def _timeout(context: grpc.ServicerContext) -> float | None:
    left = context.time_remaining()
    return None if left is None or left > _NO_DEADLINE_ABOVE else left


def _cancel_with(context: grpc.ServicerContext, call: Any) -> None:
    """Cancel ``call`` when the caller's RPC ends (cancel, deadline); at once if it already did."""
    if not context.add_callback(call.cancel):
        call.cancel()


class Forwarder(grpc.GenericRpcHandler):
    """Forward every method of ``service`` (full name, e.g. "tiermem.v1.MemoryService") in
    ``methods`` (name -> cardinality, see ``methods_of``) but those in ``keep`` to ``channel``.
    ``upstream`` names the writing process in errors (e.g. its address)."""

    def __init__(
        self,
        channel: grpc.Channel,
        service: str,
        methods: dict[str, str],
        keep: set[str],
        *,
        upstream: str = "",
        metadata: Metadata = (),
    ) -> None:
        unknown = set(methods.values()) - set(CARDINALITIES)
        if unknown:
            raise ValueError(f"unknown cardinalities {sorted(unknown)}; expected one of {CARDINALITIES}")
        self._own = metadata  # sent upstream on every call, in place of any the caller sent
        self._unavailable = f"the writing process{f' at {upstream}' if upstream else ''} is unavailable"
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._behaviors: dict[str, Callable[..., Any]] = {}
        for name, cardinality in methods.items():
            path = f"/{service}/{name}"
            # No serializers: bytes in, bytes out, on both sides.
            upstream_call = getattr(channel, cardinality)(path)
            behavior = getattr(self, f"_{cardinality}")(upstream_call)
            self._behaviors[name] = behavior
            if name not in keep:
                self._handlers[path] = getattr(grpc, f"{cardinality}_rpc_method_handler")(behavior)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)

    def behavior(self, name: str) -> Callable[..., Any]:
        """The forwarding function of method ``name`` (kept ones too): (raw request or request
        iterator, context) -> raw response or iterator, for a local handler that forwards at times."""
        return self._behaviors[name]

    def _abort(self, context: grpc.ServicerContext, error: grpc.RpcError) -> None:
        """End the caller's RPC with the upstream's status (raises, as ``context.abort`` does)."""
        call: Any = error  # every RpcError grpcio raises for a call is also the grpc.Call
        code, details, trailing = call.code(), call.details() or "", call.trailing_metadata() or ()
        if code == grpc.StatusCode.UNAVAILABLE and not any(k == _RICH_STATUS_KEY for k, _ in trailing):
            details = f"{self._unavailable}: {details}" if details else self._unavailable
        context.set_trailing_metadata(tuple(trailing))
        context.abort(code, details)

    def _unary_unary(self, upstream: Any) -> Callable[[Any, grpc.ServicerContext], bytes]:
        """One response: a request, or a request iterator (``_stream_unary``), sent upstream."""

        def forward(request: Any, context: grpc.ServicerContext) -> bytes:
            future = upstream.future(
                request, timeout=_timeout(context), metadata=_upstream_metadata(context, self._own)
            )
            return self._finish_future(future, context)

        return forward

    _stream_unary = _unary_unary

    def _finish_future(self, future: Any, context: grpc.ServicerContext) -> bytes:
        _cancel_with(context, future)
        try:
            response: bytes = future.result()
        except grpc.FutureCancelledError:  # the caller went away and cancelled it: nobody to answer
            context.abort(grpc.StatusCode.CANCELLED, "the caller cancelled the call")
            raise  # not reached: abort raises
        except grpc.RpcError as e:
            self._abort(context, e)
            raise  # not reached: abort raises
        initial = future.initial_metadata()
        if initial:
            context.send_initial_metadata(tuple(initial))
        context.set_trailing_metadata(tuple(future.trailing_metadata() or ()))
        return response

    def _unary_stream(self, upstream: Any) -> Callable[[Any, grpc.ServicerContext], Iterator[bytes]]:
        """Streamed responses: a request, or a request iterator (``_stream_stream``), sent upstream."""

        def forward(request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
            call = upstream(
                request, timeout=_timeout(context), metadata=_upstream_metadata(context, self._own)
            )
            _cancel_with(context, call)  # now, not at the first next(): the caller may leave before
            return self._relay(call, context)

        return forward

    _stream_stream = _unary_stream

    def _relay(self, call: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Yield the upstream's responses as they come, then its trailing metadata and status."""
        try:
            initial = call.initial_metadata()  # waits for the upstream's headers, not a message
            if initial:
                context.send_initial_metadata(tuple(initial))
            yield from call
        except grpc.RpcError as e:
            self._abort(context, e)
        context.set_trailing_metadata(tuple(call.trailing_metadata() or ()))
