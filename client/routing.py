"""Routing keys for tenant shards behind a proxy (docs/scaling.md): with ``sharded=True`` a client
sends every call's ``tiermem-route`` metadata, the top-level scope of the first namespace its
request names ("user:ana" for "user:ana/project:x"); the proxy routes by it and the shard checks
it. A call that names no namespace (ListNamespaces, server-wide stats) goes without one, to
whichever shard the proxy picks: ``shards.py`` asks each shard instead."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import Message

ROUTE_HEADER = "tiermem-route"
_NAMED = ("namespace", "namespaces", "target_namespace", "graph_namespace", "scope")


def top_scope(namespace: str) -> str:
    """ "user:ana/project:x" -> "user:ana"."""
    return namespace.split("/", 1)[0]


def route_of(request: Message) -> str | None:
    """The top-level scope of the first namespace ``request`` names (its own fields, then those of
    the messages it holds), or None."""
    nested: list[Message] = []
    for field, value in request.ListFields():
        if field.name in _NAMED and field.message_type is None:
            for ns in [value] if isinstance(value, str) else value:
                if ns:
                    return top_scope(ns)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            nested += [value] if isinstance(value, Message) else list(value)
    for message in nested:
        found = route_of(message)
        if found is not None:
            return found
    return None


def peek_route(requests: Iterator[Message]) -> tuple[str | None, Iterator[Message]]:
    """The route of a client stream (the first message naming a namespace; those before it are
    held, not sent) and the whole stream again."""
    held: list[Message] = []
    route = None
    for r in requests:
        held.append(r)
        route = route_of(r)
        if route is not None:
            break
    return route, itertools.chain(held, requests)


def _with_route(metadata: Any, route: str | None) -> list[tuple[str, str]]:
    pairs = list(metadata or ())
    if route is not None and not any(k == ROUTE_HEADER for k, _ in pairs):
        pairs.append((ROUTE_HEADER, route))
    return pairs


class _Details(grpc.ClientCallDetails):
    def __init__(self, details: Any, metadata: list[tuple[str, str]]) -> None:
        self.method, self.timeout, self.metadata = details.method, details.timeout, metadata
        self.credentials, self.wait_for_ready = details.credentials, details.wait_for_ready
        self.compression = details.compression


class _Routes(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds each call's routing key (see the module docstring)."""

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_Details(details, _with_route(details.metadata, _route(request))), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_Details(details, _with_route(details.metadata, _route(request))), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        route, requests = peek_route(iter(requests))
        return continuation(_Details(details, _with_route(details.metadata, route)), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        route, requests = peek_route(iter(requests))
        return continuation(_Details(details, _with_route(details.metadata, route)), requests)


def _route(request: Any) -> str | None:
    return route_of(request) if isinstance(request, Message) else None


def with_routes(channel: grpc.Channel) -> grpc.Channel:
    """``channel`` sending each call's routing key."""
    return grpc.intercept_channel(channel, _Routes())


class _AioRoutes:
    def _details(self, details: grpc.aio.ClientCallDetails, route: str | None) -> grpc.aio.ClientCallDetails:
        if route is None:
            return details
        pairs = list(details.metadata or ())
        if any(k == ROUTE_HEADER for k, _ in pairs):
            return details
        return details._replace(metadata=grpc.aio.Metadata(*pairs, (ROUTE_HEADER, route)))


class _AioUnaryUnary(_AioRoutes, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, _route(request)), request)


class _AioUnaryStream(_AioRoutes, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details, _route(request)), request)


def aio_route_interceptors() -> list[grpc.aio.ClientInterceptor]:
    """The grpc.aio interceptors sending each call's routing key (unary requests; a client stream,
    an import, is given its key by ``AsyncMemoryClient`` itself, before its first chunk is read)."""
    return [_AioUnaryUnary(), _AioUnaryStream()]
