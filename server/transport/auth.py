"""The one interceptor every call passes: admission (a server-wide cap with a share kept for health
and stats), then, with API keys configured, the caller's key (``authorization: Bearer <token>``),
its limits, and its right to every namespace the request names (``RULES``). The handler then runs
with the key in ``caller()``, so listings, stats and exports show only what it covers.

Health checks need no key. The search followers' private report method is checked by its own
handler (its peer must be the leader's Unix socket); every other call over that socket must carry
the run's secret. A key is checked before a scope's routing (a refused key learns nothing of it),
for imports and replication streams as they open, and on long streams again as they run (a
revoked key ends them). A forwarded call (raw bytes in a follower) is
authenticated there and checked in full by the leader it is forwarded to. Tokens are never logged."""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from tiermem.server.model.errors import (
    FailedPrecondition,
    PermissionDenied,
    ResourceExhausted,
    TiermemError,
    Unauthenticated,
)
from tiermem.server.security.keys import ROLES, ApiKey, KeyRing
from tiermem.server.security.limits import Admission, KeyLimits
from tiermem.server.security.models import ModelRule
from tiermem.server.transport import logs, names, routing
from tiermem.server.transport.metrics import Metrics
from tiermem.server.transport.status import final, to_status

SERVICE = "/tiermem.v1.MemoryService/"
# The per-run secret a leader's search followers present on its private Unix socket (follower.py):
# every call arriving there must carry it, as that socket bypasses TLS.
PRIVATE_SECRET_HEADER = "tiermem-follower-secret"
HEALTH = "/grpc.health.v1.Health/"
MONITORING = (HEALTH, SERVICE + "GetStats")
READ, WRITE, ADMIN = "read", "write", "admin"

_caller: contextvars.ContextVar[ApiKey | None] = contextvars.ContextVar("tiermem_caller", default=None)
# The call's routing key, whether this server requires one, and its scopes' routing (routing.py).
_route: contextvars.ContextVar[tuple[str | None, bool, routing.RoutingOf | None]] = contextvars.ContextVar(
    "tiermem_route", default=(None, False, None)
)
# The embedding models the call's key may name (security/models.py).
_model_rule: contextvars.ContextVar[ModelRule | None] = contextvars.ContextVar("tiermem_models", default=None)
_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("tiermem_call", default=None)


def caller() -> ApiKey | None:
    """The API key of the call being served (None: the server has no keys, or no call)."""
    return _caller.get()


def key_still_valid() -> None:
    """Unauthenticated (raised) once the key of the call being served was revoked: for a stream
    that waits with nothing to send, so that it ends as one that sends would."""
    call = _call.get()
    if call is not None:
        call.key_still_valid()


def _need(key: ApiKey, role: str, namespaces: Iterable[str], what: str) -> None:
    """PERMISSION_DENIED unless ``key`` has ``role`` (or more) on each of ``namespaces``."""
    if key.level < ROLES[role]:
        raise PermissionDenied(
            f"{what} needs the {role} role; this key has {key.role}",
            reason="ROLE_TOO_LOW",
            metadata={"needed_role": role, "key_role": key.role, "key_id": key.id},
        )
    for ns in namespaces:
        if not key.covers(ns):
            raise PermissionDenied(
                f"this key does not cover namespace {ns!r}",
                reason="NAMESPACE_NOT_COVERED",
                metadata={"namespace": ns, "key_id": key.id},
            )


def _everything(key: ApiKey, role: str, what: str) -> None:
    _need(key, role, [], what)
    if not key.everything:
        raise PermissionDenied(
            f"{what} needs a key for every namespace (an empty prefix)",
            reason="NAMESPACE_NOT_COVERED",
            metadata={"namespace": "", "key_id": key.id},
        )


def _delete_namespace(key: ApiKey, r: Any) -> None:
    _need(key, ADMIN if r.include_children else WRITE, [r.namespace], "DeleteNamespace")


def _update_config(key: ApiKey, r: Any) -> None:
    paths = set(r.update_mask.paths) or {"protected"}
    role = ADMIN if "protected" in paths else WRITE
    _need(
        key, role, [r.config.namespace], "changing protection" if role == ADMIN else "UpdateNamespaceConfig"
    )


def _consolidate(key: ApiKey, r: Any) -> None:
    if r.namespace:
        _need(key, WRITE, [r.namespace], "ConsolidateMemories")
    else:
        _everything(key, ADMIN, "a server-wide ConsolidateMemories")


def _export(key: ApiKey, r: Any) -> None:
    # Everything, or a namespace with its children: filtered to what the key covers.
    _need(key, READ, [r.namespace] if r.namespace and not r.include_children else [], "ExportMemories")


def _import_chunk(key: ApiKey, r: Any, target: str) -> None:
    """Each chunk of an import: admin, and the namespace it lands in covered (everything lands
    under ``target``, the first chunk's target_namespace, when there is one)."""
    _need(key, ADMIN, names.import_chunk(r, target), "ImportMemories")


def _simple(role: str, method: str) -> Callable[[ApiKey, Any], None]:
    named = names.NAMES[method]

    def rule(key: ApiKey, r: Any) -> None:
        _need(key, role, named(r), "this call")

    return rule


_READS = [
    "GetMemory",
    "ListMemories",
    "SearchMemories",
    "BatchSearchMemories",
    "GetStats",
    "ListNamespaces",
    "GetNamespaceConfig",
    "GetReflectionCandidates",
    "BuildSummary",
    "GetGraphNeighbors",
    "BuildContext",
]
_WRITES = [
    "CreateMemory",
    "BatchCreateMemories",
    "UpdateMemory",
    "DeleteMemory",
    "RecordFeedback",
    "TransferMemory",
    "UpsertGraphNode",
    "AddGraphEdge",
    "InvalidateGraphEdge",
]
# Method -> the check of a request (for a client stream: of each message).
RULES: dict[str, Callable[[ApiKey, Any], None]] = {
    **{m: _simple(READ, m) for m in _READS},
    **{m: _simple(WRITE, m) for m in _WRITES},
    "DeleteNamespace": _delete_namespace,
    "UpdateNamespaceConfig": _update_config,
    "ConsolidateMemories": _consolidate,
    "ExportMemories": _export,
    "SetScopeRouting": _simple(ADMIN, "SetScopeRouting"),
    "GetScopeRouting": _simple(ADMIN, "GetScopeRouting"),
}
IMPORT = SERVICE + "ImportMemories"  # checked chunk by chunk, with the first chunk's target
# Streams whose role is known before their first message: checked as they open, so that a key
# without it holds no handler thread or stream slot waiting for a message.
OPENING: dict[str, Callable[[ApiKey], None]] = {
    "ImportMemories": lambda key: _need(key, ADMIN, [], "ImportMemories"),
    "ReplicateChanges": lambda key: _everything(key, ADMIN, "ReplicateChanges"),
}
KEY_RECHECK_SECONDS = 0.5  # how often a long call checks its key is still in the keys file
_REPLICA_REFUSES = routing.WRITES | {"SetScopeRouting"}  # what a replica answers READ_ONLY_REPLICA


def authorize(method: str, request: Message) -> None:
    """For a handler that decodes its own request (a follower's searches): PermissionDenied unless
    the caller's key may make it, then InvalidArgument unless its routing key matches it."""
    key = caller()
    if key is not None:
        RULES[method](key, request)
        _check_models(_model_rule.get(), key, names.MODELS.get(method), request)
    route, sharded, routing_of = _route.get()
    routing.check(method, names.NAMES[method](request), route if sharded else routing.ANY, routing_of)


def _check_models(
    rule: ModelRule | None, key: ApiKey, models: Callable[[Any], list[str]] | None, request: Any
) -> None:
    """PermissionDenied unless ``key`` may name the embedding models of ``request``'s vectors."""
    if rule is not None and models is not None:
        rule.check(key, models(request))


def _has_rights_in(key: ApiKey, namespace: str) -> bool:
    """Whether ``key`` covers some namespace of ``namespace``'s top-level scope."""
    top = routing.top_scope(namespace)
    return any(routing.top_scope(p) == top for p in key.namespaces)


def _abort(context: grpc.ServicerContext, err: TiermemError, retry_after: float | None = None) -> None:
    context.abort_with_status(to_status(err, retry_after))


def _token(metadata: Any) -> str | None:
    """The bearer token of a call's metadata ("" when malformed), None when it has none."""
    for md in metadata or ():
        if md.key == "authorization":
            value = str(md.value)
            scheme, _, token = value.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else ""
    return None


class AuthInterceptor(grpc.ServerInterceptor):
    """See the module docstring. ``keys`` None: no keys (every call may do everything)."""

    def __init__(
        self,
        keys: KeyRing | None,
        admission: Admission,
        limits: KeyLimits,
        exempt: tuple[str, ...] = (),
        metrics: Metrics | None = None,
        sharded: bool = False,
        routing_of: routing.RoutingOf | None = None,
        gate: routing.WriteGate | None = None,
        is_replica: Callable[[], bool] | None = None,
        after_write: Callable[[], None] | None = None,
        replica_copying: Callable[[], bool] | None = None,
        private_secret: str = "",
        models: ModelRule | None = None,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        self.models = models  # the embedding models a key may name (with keys)
        self.stopping = stopping  # the server is stopping: the calls it cancels count UNAVAILABLE
        self.private_secret = private_secret  # required of calls over a Unix socket (a leader's private one)
        self.keys, self.admission, self.limits, self.exempt = keys, admission, limits, exempt
        self.metrics = metrics
        self.sharded = sharded  # requests naming namespaces must carry their routing key (routing.py)
        self.routing_of = routing_of  # a top-level scope's routing state: fenced or moved away
        self.gate = gate  # the write calls in flight per top-level scope
        self.is_replica = is_replica  # a replica refuses writes (its leader takes them)
        self.replica_copying = replica_copying  # ... and reads until it holds a complete copy
        self.after_write = after_write  # waits for a replica to store a write (synchronous replication)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(details)
        method = details.method
        if handler is None or method in self.exempt or method.startswith(HEALTH):
            return handler  # (health needs no key, is cheap, and its Watch must stay non-blocking)
        # Authenticated and admitted as it arrives, before it waits for a handler thread: a call
        # refused here is answered at once, reads nothing and holds no share of the cap.
        key, token = None, None
        if self.keys is not None:
            token = _token(details.invocation_metadata)
            key = self.keys.lookup(token) if token else None
            if key is None:
                missing = token is None
                return self._counted_refusal(
                    method,
                    Unauthenticated(
                        "this server needs an API key: metadata authorization: Bearer <token>"
                        if missing
                        else "the API key is not valid (unknown or revoked)",
                        "API_KEY_MISSING" if missing else "API_KEY_INVALID",
                    ),
                )
        name = method[len(SERVICE) :] if method.startswith(SERVICE) else ""
        opening = OPENING.get(name)
        if key is not None and opening is not None:
            try:
                opening(key)
            except PermissionDenied as e:
                return self._counted_refusal(method, e, key.id)
        call = _Call(self, method, RULES.get(name), key)
        call.token = token
        call.name = name
        call.named = names.NAMES.get(name)
        call.route = routing.route_of(details.invocation_metadata)
        call.lease = self.admission.enter(call.monitoring)
        if call.lease is None:
            busy = ResourceExhausted("the server is at its limit of calls in flight", "SERVER_BUSY")
            return self._counted_refusal(method, busy, key.id if key is not None else "", 0.1)
        return _wrap(handler, call)

    def _counted_refusal(
        self, method: str, err: TiermemError, key_id: str = "", retry_after: float | None = None
    ) -> Any:
        """``_refusal``, counted and logged as answered calls are (refusals are what operators
        watch for: bad keys, a server at its limit)."""
        metrics = self.metrics

        def record(context: grpc.ServicerContext) -> None:
            if metrics is not None:
                metrics.observe(method, err.status, 0.0)
            rid = logs.set_request_id(logs.request_id_of(context))  # (the caller's, as answered calls')
            try:
                logs.access(method, err.status, 0.0, context, key_id)
            finally:
                logs.reset_request_id(rid)

        return _refusal(err, retry_after, record)


def _refusal(
    err: TiermemError,
    retry_after: float | None = None,
    record: Callable[[grpc.ServicerContext], None] | None = None,
) -> Any:
    """A handler that answers ``err`` without reading the request (as a client stream, so no
    handler thread waits for a message that may never come); ``record`` notes the call first."""

    def refuse(_requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        if record is not None:
            record(context)
        _abort(context, err, retry_after)

    return grpc.stream_unary_rpc_method_handler(refuse)


def from_private_socket(context: grpc.ServicerContext, secret: str) -> bool:
    """Whether a call came over the leader's private Unix socket carrying the run's secret."""
    given = next(
        (md.value for md in context.invocation_metadata() or () if md.key == PRIVATE_SECRET_HEADER), ""
    )
    return context.peer().startswith("unix") and hmac.compare_digest(str(given), secret)


class _Call:
    """What the interceptor does around one method's handler."""

    def __init__(
        self,
        owner: AuthInterceptor,
        method: str,
        rule: Callable[[ApiKey, Any], None] | None,
        key: ApiKey | None,
    ) -> None:
        self.owner, self.method, self.rule, self.key = owner, method, rule, key
        self.monitoring = method.startswith(MONITORING)
        self.lease: int | None = None
        self.name = ""  # the method's name in the service
        self.writing: list[str] = []  # the top-level scopes it writes, counted in the write gate
        self.named: Callable[[Any], list[str]] | None = None  # the namespaces a request names
        self.route: str | None = None  # the call's routing key
        self.token: str | None = None  # the call's bearer token (when the server has keys)
        self.counted = False  # whether the call holds a place in its key's calls in flight
        self._key_checked = time.monotonic()

    def key_still_valid(self) -> None:
        """Unauthenticated once the call's key has left the keys file or changed (a revoked key
        ends the streams it opened, not only its next call); looked at every KEY_RECHECK_SECONDS."""
        keys = self.owner.keys
        if keys is None or self.token is None:
            return
        now = time.monotonic()
        if now - self._key_checked < KEY_RECHECK_SECONDS:
            return
        self._key_checked = now
        if keys.lookup(self.token) != self.key:
            raise Unauthenticated(
                "the API key was revoked or its rights changed while this call ran", "API_KEY_INVALID"
            )

    def enter(self, context: grpc.ServicerContext) -> ApiKey | None:
        """The key's own limits (aborting the call past them); returns the call's key."""
        key = self.key
        try:
            forwarded = self._forwarded(context)
            # (a call a follower forwarded was counted where it arrived: not a second time here)
            if key is not None and not forwarded:
                wait = self.owner.limits.enter(key.id)
                if wait is not None:
                    _abort(
                        context,
                        ResourceExhausted(f"key {key.id} is over its limits", "KEY_RATE_LIMITED"),
                        wait,
                    )
                self.counted = True
        except BaseException:
            self._release()
            raise
        return key

    def _forwarded(self, context: grpc.ServicerContext) -> bool:
        """Whether a search follower forwarded the call (over the private socket, with the run's
        secret); PERMISSION_DENIED for a call over that socket without the secret."""
        secret = self.owner.private_secret
        if not (secret and context.peer().startswith("unix")):
            return False
        if not from_private_socket(context, secret):
            _abort(
                context,
                PermissionDenied("this socket serves the server's own followers only", "PRIVATE_SOCKET"),
            )
        return True

    def _release(self) -> None:
        if self.lease is not None:
            self.owner.admission.leave(self.lease)
            self.lease = None

    def leave(self, key: ApiKey | None) -> None:
        if key is not None and self.counted:  # (a forwarded call took no place: it gives none back)
            self.counted = False
            self.owner.limits.leave(key.id)
        self._release()

    @contextlib.contextmanager
    def serving(self, context: grpc.ServicerContext) -> Iterator[ApiKey | None]:
        """Around a handler: its request id, admission, key and limits, the caller's key in
        ``caller()``, and the access line at the end."""
        rid = logs.set_request_id(logs.request_id_of(context))
        started, left = time.perf_counter(), context.time_remaining()
        key: ApiKey | None = None
        try:
            key = self.enter(context)
            try:
                token = _caller.set(key)
                routed = _route.set((self.route, self.owner.sharded, self.owner.routing_of))
                ruled = _model_rule.set(self.owner.models)
                serving = _call.set(self)
                try:
                    yield key
                finally:
                    _call.reset(serving)
                    _model_rule.reset(ruled)
                    _route.reset(routed)
                    _caller.reset(token)
            finally:
                self.leave(key)
                if self.writing and self.owner.gate is not None:
                    self.owner.gate.leave(self.writing)
        finally:
            code = logs.code_of(context, left, self.owner.stopping())
            seconds = time.perf_counter() - started
            if self.owner.metrics is not None:
                self.owner.metrics.observe(self.method, code, seconds)
            logs.access(self.method, code, seconds, context, key.id if key is not None else "")
            logs.reset_request_id(rid)

    def check(self, key: ApiKey | None, request: Any) -> None:
        """InvalidArgument unless the routing key matches the request, PermissionDenied unless the
        key may make it (an undecodable request, not a message, is left to the handler, which
        refuses it)."""
        if not isinstance(request, Message):
            return
        # The key first: a call it may not make learns nothing of the server's or a scope's state.
        if key is not None:
            if self.rule is not None:
                self.rule(key, request)
            elif self.method.startswith(SERVICE):  # (a method without a rule: admin on everything)
                _everything(key, ADMIN, self.method)
            _check_models(self.owner.models, key, names.MODELS.get(self.name), request)
        if self.owner.is_replica is not None and self.name in _REPLICA_REFUSES and self.owner.is_replica():
            raise FailedPrecondition(
                "this server is a replica: writes go to its leader (or promote it first)", "READ_ONLY_REPLICA"
            )
        if self.named is not None:
            named = self.named(request)
            if key is not None and not key.everything:
                # (a scope the key has no right in reached the handler only as an export of a tree,
                # which reads what the key covers there: nothing. Its routing is not the key's to see.)
                named = [ns for ns in named if _has_rights_in(key, ns)]
            copying = self.owner.replica_copying
            if named and copying is not None and copying():
                err = routing.ScopeUnavailable(
                    "this replica is still copying its leader: retry shortly, or ask the leader",
                    "REPLICA_COPYING",
                )
                err.retry_after = 1.0
                raise err
            self._check_routing(named)

    def _check_routing(self, named: list[str]) -> None:
        gate = self.owner.gate
        if gate is not None and self.name in routing.WRITES:
            new = sorted({routing.top_scope(ns) for ns in named if ns} - set(self.writing))
            gate.enter(new)  # (before the fence is looked at: see WriteGate)
            self.writing += new
        route = self.route if self.owner.sharded else routing.ANY
        routing.check(self.name, named, route, self.owner.routing_of)

    def confirm(self, context: grpc.ServicerContext) -> None:
        """After a write answered without error: with synchronous replication, wait for a replica."""
        if self.owner.after_write is not None and self.name in routing.WRITES:
            try:
                self.owner.after_write()
            except TiermemError as e:  # (stored: the client's retry policy is not to make it again)
                context.abort_with_status(final(to_status(e)))

    def check_or_abort(self, key: ApiKey | None, request: Any, context: grpc.ServicerContext) -> None:
        try:
            self.check(key, request)
        except TiermemError as e:
            _abort(context, e, getattr(e, "retry_after", None))


def _wrap(handler: Any, call: _Call) -> Any:
    if handler.request_streaming and handler.response_streaming:
        inner: Callable[..., Any] = handler.stream_stream
        return grpc.stream_stream_rpc_method_handler(
            _stream_in_stream_out(inner, call), handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _stream_in(handler.stream_unary, call, decoded=handler.request_deserializer is not None),
            handler.request_deserializer,
            handler.response_serializer,
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            _stream_out(handler.unary_stream, call), handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        _unary(handler.unary_unary, call), handler.request_deserializer, handler.response_serializer
    )


def _unary(inner: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    def behavior(request: Any, context: grpc.ServicerContext) -> Any:
        with call.serving(context) as key:
            call.check_or_abort(key, request, context)
            result = inner(request, context)
            call.confirm(context)
            return result

    return behavior


def _stream_out(inner: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    def behavior(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with call.serving(context) as key:
            call.check_or_abort(key, request, context)
            yield from _while_key_valid(inner(request, context), call, context)

    return behavior


def _checked(requests: Iterator[Any], key: ApiKey | None, call: _Call) -> Iterator[Any]:
    """The messages of a client stream, each checked as the handler reads it (a refused one raises
    PermissionDenied into the handler, which answers it and stores nothing more)."""
    target: str | None = None
    exported_by = ""  # an import's exporting embedder (its header's)
    for r in requests:
        if isinstance(r, Message):  # (raw bytes a follower forwards: the leader checks them)
            call.key_still_valid()
        if call.method == IMPORT and isinstance(r, Message):
            target = r.target_namespace if target is None else target  # type: ignore[attr-defined]
            if r.WhichOneof("chunk") == "header":
                exported_by = r.header.embedder_model  # type: ignore[attr-defined]
            if key is not None:
                _import_chunk(key, r, target)
                if call.owner.models is not None:
                    call.owner.models.check(key, names.import_chunk_models(r), reembedded=exported_by)
            call._check_routing(names.import_chunk(r, target))
        else:
            call.check(key, r)
        yield r


def _read_ahead(requests: Iterator[Any], call: _Call) -> Iterator[Any]:
    """A client stream's messages read on a thread of their own (two ahead at most), so that while
    its caller sends nothing the call's key is still looked at: a revoked key ends an idle import
    as it ends one that sends. The reader ends with the call."""
    box: queue.Queue[Any] = queue.Queue(maxsize=2)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                box.put(item, timeout=KEY_RECHECK_SECONDS)
                return True
        return False

    def read() -> None:
        try:
            for r in requests:
                if not put(r):
                    return
            put(end)
        except BaseException as e:  # (the call ended, or a message could not be read: the handler's)
            put(e)

    threading.Thread(target=read, name="tiermem-stream-reader", daemon=True).start()
    try:
        while True:
            try:
                item = box.get(timeout=KEY_RECHECK_SECONDS)
            except queue.Empty:
                call.key_still_valid()
                continue
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _stream_in(inner: Callable[..., Any], call: _Call, decoded: bool = True) -> Callable[..., Any]:
    """``decoded``: the handler reads messages (not a follower's forwarder, which passes raw bytes
    on to the leader from a thread of gRPC's own: the leader looks at the key)."""

    def behavior(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        with call.serving(context) as key:
            if call.token is not None and decoded:  # (a keyed call: its key is looked at while it idles)
                requests = _read_ahead(requests, call)
            result = inner(_checked(requests, key, call), context)
            call.confirm(context)
            return result

    return behavior


def _stream_in_stream_out(inner: Callable[..., Any], call: _Call) -> Callable[..., Any]:
    def behavior(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        with call.serving(context) as key:
            yield from _while_key_valid(inner(_checked(requests, key, call), context), call, context)

    return behavior


def _while_key_valid(responses: Iterator[Any], call: _Call, context: grpc.ServicerContext) -> Iterator[Any]:
    """A response stream, ended with UNAUTHENTICATED once the call's key is revoked."""
    try:
        for r in responses:
            try:
                call.key_still_valid()
            except TiermemError as e:
                _abort(context, e)
            yield r
    finally:
        close = getattr(responses, "close", None)
        if close is not None:
            close()  # (now, not when collected: an export's read transaction and stream slot)
