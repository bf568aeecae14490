"""Routing keys for tenant shards (docs/scaling.md): a proxy routes each call by its ``tiermem-route``
metadata, the top-level scope of the namespaces it names ("user:ana" for "user:ana/project:x"), so
a tenant's whole scope tree lives on one shard. A server started with ``sharded`` checks the key
against each request before anything runs: a request without one, naming namespaces of several
top-level scopes, or of another scope than its key, is refused (INVALID_ARGUMENT). Requests that
name no namespace (ListNamespaces, server-wide stats) need none."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from tiermem.server.model.errors import InvalidArgument, Unavailable

ROUTE_HEADER = "tiermem-route"
FIELD = f"metadata.{ROUTE_HEADER}"


# The proto's ScopeRouting: a scope fenced (its writes refused) or moved to another shard.
FENCED, MOVED = 1, 2
RETRY_SECONDS = 0.5  # what a refused call is told to wait: a move's switch takes about this long
# Calls that change a scope: refused while it is fenced.
WRITES = frozenset(
    {
        *("CreateMemory", "BatchCreateMemories", "UpdateMemory", "DeleteMemory", "RecordFeedback"),
        *("TransferMemory", "UpsertGraphNode", "AddGraphEdge", "InvalidateGraphEdge", "DeleteNamespace"),
        *("UpdateNamespaceConfig", "ConsolidateMemories", "ImportMemories"),
    }
)
RoutingOf = Callable[[str], "tuple[int, str] | None"]


class ScopeUnavailable(Unavailable):
    """A call on a scope fenced or moved: UNAVAILABLE, to be made again after ``retry_after``."""

    retry_after = RETRY_SECONDS


def check_fence(method: str, namespaces: Iterable[str], routing_of: RoutingOf) -> None:
    """ScopeUnavailable if a top-level scope of ``namespaces`` has moved away, or is fenced and
    ``method`` writes (SetScopeRouting and GetScopeRouting always pass: they are how a move is
    ended)."""
    if method in ("SetScopeRouting", "GetScopeRouting"):
        return
    for top in sorted({top_scope(ns) for ns in namespaces if ns}):
        found = routing_of(top)
        if found is None:
            continue
        state, moved_to = found
        if state == MOVED:
            err = ScopeUnavailable(
                f"scope {top!r} has moved to another shard ({moved_to or 'unnamed'}): retry through the proxy",
                "SCOPE_MOVED",
            )
            err.metadata.update(scope=top, moved_to=moved_to)
            raise err
        if state == FENCED and method in WRITES:
            err = ScopeUnavailable(f"scope {top!r} is moving to another shard: retry shortly", "SCOPE_FENCED")
            err.metadata.update(scope=top)
            raise err


class WriteGate:
    """The write calls in flight per top-level scope, so that fencing a scope can wait for those
    admitted before the fence: a write counts itself in before it looks at the fence, so once the
    fence is visible and the count is 0, no write of the scope can still commit."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._changed = threading.Condition()

    def enter(self, scopes: Iterable[str]) -> None:
        with self._changed:
            for s in scopes:
                self._counts[s] = self._counts.get(s, 0) + 1

    def leave(self, scopes: Iterable[str]) -> None:
        with self._changed:
            for s in scopes:
                left = self._counts[s] - 1
                if left:
                    self._counts[s] = left
                else:
                    del self._counts[s]
            self._changed.notify_all()

    def drain(self, scope: str, timeout: float) -> None:
        """Wait until no write call of ``scope`` is in flight; Unavailable after ``timeout``."""
        with self._changed:
            if not self._changed.wait_for(lambda: scope not in self._counts, timeout):
                raise Unavailable(
                    f"writes of scope {scope!r} still running after {timeout:.0f} s: the fence is set, "
                    "but call again before relying on it",
                    "WRITES_IN_FLIGHT",
                )


ANY = "*"  # the route of a server that is not a shard: any request passes


def check(method: str, namespaces: list[str], route: str | None, routing_of: RoutingOf | None) -> None:
    """Both checks of a request: its routing key (``route``; ``ANY``: none wanted) and its
    scopes' fences."""
    if route != ANY:
        check_route(route, namespaces)
    if routing_of is not None:
        check_fence(method, namespaces, routing_of)


def route_of(metadata: Any) -> str | None:
    """The call's routing key (None: it has none)."""
    for md in metadata or ():
        if md.key == ROUTE_HEADER:
            return str(md.value)
    return None


def top_scope(namespace: str) -> str:
    """ "user:ana/project:x" -> "user:ana"."""
    return namespace.split("/", 1)[0]


def check_route(route: str | None, namespaces: Iterable[str]) -> None:
    """InvalidArgument unless ``namespaces`` (if any) lie under one top-level scope, the one ``route``
    names (None: the call has no routing key)."""
    tops = sorted({top_scope(ns) for ns in namespaces if ns})
    if len(tops) > 1:
        raise InvalidArgument(
            "namespaces",
            f"the request names namespaces of {len(tops)} top-level scopes ({', '.join(tops[:4])}); "
            "a sharded server takes one tenant's scope tree a request: send one request a tenant",
            "NAMESPACES_SPAN_SHARDS",
        )
    if not tops:
        return
    if route is None:
        raise InvalidArgument(
            FIELD,
            f"this server is a shard: send the top-level scope of the request's namespaces "
            f"({tops[0]!r}) as {ROUTE_HEADER} metadata",
            "ROUTE_MISSING",
        )
    if route != tops[0]:
        raise InvalidArgument(
            FIELD,
            f"the routing key {route!r} is not the top-level scope of the request's namespaces ({tops[0]!r})",
            "ROUTE_MISMATCH",
        )
