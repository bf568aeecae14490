"""``MemoryClient``: typed Python access to a tiermem server.

Results are the generated ``tiermem.v1`` messages (``Memory``, ``SearchResult``), so every field of
the contract is there, typed by the shipped ``.pyi`` stubs; ``metadata_dict(m)`` gives a memory's
metadata as plain Python values and ``to_python(result)`` any result as dicts, lists and scalars
(``plain.py``). Failures raise ``TiermemError``
subclasses carrying ``code``, ``reason`` and the invalid ``fields``.

Creates always carry a ``request_id`` (a fresh one unless you pass yours), and the channel retries
calls that failed with UNAVAILABLE; a retried create returns the first result instead of storing
the memory twice. ``RecordFeedback`` is not retried (it counts accesses).

Every call waits for the connection (``wait_for_ready``) and reconnects quickly, and a call the
server refused because it was starting or stopping (so did not run) is made again: a server restart
within a call's deadline only delays it. Every method takes ``timeout`` (seconds, for that call; the
client's by default) and ``call_metadata`` (pairs sent with the call).
"""

from __future__ import annotations

import datetime as dt
import difflib
import inspect
import itertools
import json
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from google.protobuf import field_mask_pb2
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiermem._values import set_metadata, set_timestamp
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

from .errors import UnavailableError, from_rpc_error
from .plain import metadata_dict as metadata_dict  # re-exported: it lived here
from .policy import POLICY_ARGUMENTS, set_policy_fields

TimeLike = dt.datetime | float | int
CallMetadata = Sequence[tuple[str, str]]

_RETRY_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "tiermem.v1.MemoryService", "method": m}
                    for m in (
                        "CreateMemory",
                        "BatchCreateMemories",
                        "GetMemory",
                        "UpdateMemory",
                        "ListMemories",
                        "SearchMemories",
                        "BatchSearchMemories",
                        "GetStats",
                        "ListNamespaces",
                    )  # not deletes or feedback: a retry after a lost reply would not repeat their result
                ],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


# Reconnect within 100 ms to 1 s of a server coming back (gRPC's default backoff grows to 2 min).
# ``min_reconnect_backoff_ms`` is the least time one connection attempt gets, not a backoff.
_RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 5000),
]

# Reasons of UNAVAILABLE errors for calls the server did not run (it was starting or stopping):
# making them again is safe for every method.
_NOT_RUN = frozenset({"STARTING", "SHUTTING_DOWN"})

_HEALTH_SERVICE = "tiermem.v1.MemoryService"


def tier_value(tier: int | str | None) -> int:
    """Tier from an enum value or a name: 'fast', 'FAST' or 'TIER_FAST'; None means unspecified."""
    if tier is None:
        return pb.TIER_UNSPECIFIED
    if isinstance(tier, str):
        name = tier.upper()
        try:
            return int(pb.Tier.Value(name if name.startswith("TIER_") else f"TIER_{name}"))
        except ValueError:
            raise ValueError(f"unknown tier {tier!r}") from None
    return int(tier)


def strategy_value(strategy: int | str | None) -> int:
    """Search strategy from an enum value or a name: 'weighted', 'WEIGHTED' or
    'SEARCH_STRATEGY_WEIGHTED'; None means unspecified (fused, the default)."""
    if strategy is None:
        return pb.SEARCH_STRATEGY_UNSPECIFIED
    if isinstance(strategy, str):
        name = strategy.upper()
        full = name if name.startswith("SEARCH_STRATEGY_") else f"SEARCH_STRATEGY_{name}"
        try:
            return int(pb.SearchStrategy.Value(full))
        except ValueError:
            raise ValueError(f"unknown search strategy {strategy!r}") from None
    return int(strategy)


def _timestamp(value: TimeLike) -> Timestamp:
    ts = Timestamp()
    if isinstance(value, dt.datetime):
        ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc))
    else:
        set_timestamp(ts, float(value))
    return ts


def _seconds(value: TimeLike) -> float:
    return value.timestamp() if isinstance(value, dt.datetime) else float(value)


def _set_query(
    req: pb.SearchMemoriesRequest, query: str | Sequence[float] | Any, keywords: str | None
) -> None:
    """The query of a search: text, or a vector (with ``keywords`` as its text: the default strategy
    and hybrid search match them)."""
    if isinstance(query, str):
        if keywords is not None and keywords != query:
            raise ValueError("keywords are the query text when the query is text; pass one")
        req.query_text = query
    elif query is not None:
        req.query_embedding.extend([float(x) for x in query])
        if keywords is not None:
            req.query_text = keywords


def _set_hybrid(
    req: pb.SearchMemoriesRequest,
    hybrid: bool,
    *,
    keywords: str | None,
    rrf_k: float | None,
    vector_weight: float | None,
    keyword_weight: float | None,
) -> None:
    """Hybrid search and its settings; ValueError for hybrid settings without ``hybrid``."""
    if not hybrid:
        extra = [
            name
            for name, value in (
                ("rrf_k", rrf_k),
                ("vector_weight", vector_weight),
                ("keyword_weight", keyword_weight),
            )
            if value is not None
        ]
        if extra:
            raise ValueError(f"{', '.join(extra)} only apply with hybrid=True")
        return
    req.hybrid.enabled = True
    _set_given(req.hybrid, rrf_k=rrf_k, vector_weight=vector_weight, keyword_weight=keyword_weight)


def _set_given(message: Any, **values: float | None) -> None:
    """Set the optional fields of ``message`` whose value was given (not None)."""
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)


def build_memory(
    namespace: str,
    content: str,
    *,
    id: str = "",
    kind: str = "",
    tier: int | str | None = None,
    importance: float | None = None,
    source: str = "",
    topic: str = "",
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    embedding: Sequence[float] | Any = None,
    embedding_model: str = "",
    create_time: TimeLike | None = None,
    expire_time: TimeLike | None = None,
    token_cost: int = 0,
    source_memory_ids: Iterable[str] = (),
) -> pb.Memory:
    """A ``Memory`` message from Python values (numpy arrays are fine for ``embedding``)."""
    m = pb.Memory(
        namespace=namespace,
        content=content,
        id=id,
        kind=kind,
        tier=tier_value(tier),  # type: ignore[arg-type,unused-ignore]
        source=source,
        topic=topic,
        tags=list(tags),
        embedding_model=embedding_model,
        token_cost=token_cost,
        source_memory_ids=list(source_memory_ids),
    )
    if importance is not None:
        m.importance = importance
    if metadata:
        set_metadata(m.metadata, metadata)
    if embedding is not None:
        m.embedding.extend([float(x) for x in embedding])
    if create_time is not None:
        m.create_time.CopyFrom(_timestamp(create_time))
    if expire_time is not None:
        m.expire_time.CopyFrom(_timestamp(expire_time))
    return m


def build_filter(
    *,
    tiers: Iterable[int | str] = (),
    kinds: Iterable[str] = (),
    tags_any: Iterable[str] = (),
    tags_all: Iterable[str] = (),
    source: str = "",
    topic: str = "",
    created_after: TimeLike | None = None,
    created_before: TimeLike | None = None,
    where: str | Mapping[str, Any] | None = None,
) -> pb.MemoryFilter:
    f = pb.MemoryFilter(
        tiers=[tier_value(t) for t in tiers],  # type: ignore[misc,unused-ignore]
        kinds=list(kinds),
        tags_any=list(tags_any),
        tags_all=list(tags_all),
        source=source,
        topic=topic,
    )
    if created_after is not None:
        f.created_after.CopyFrom(_timestamp(created_after))
    if created_before is not None:
        f.created_before.CopyFrom(_timestamp(created_before))
    if where is not None:
        f.where = where if isinstance(where, str) else json.dumps(where)
    return f


_FILTER_FIELDS = frozenset(inspect.signature(build_filter).parameters)
_MEMORY_FIELDS = frozenset(inspect.signature(build_memory).parameters) - {"namespace", "content"}


def _check_names(method: str, given: Iterable[str], accepted: Collection[str], where: str = "") -> None:
    """A TypeError for a keyword ``method`` does not take, worded as Python's own: forwarded
    ``**fields`` would otherwise fail inside a helper, naming it instead of the caller's method."""
    for name in given:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            raise TypeError(
                f"{method}() got an unexpected keyword argument {name!r}{where}"
                + (f". Did you mean {close[0]!r}?" if close else "")
            )


def _within(
    where: str | Mapping[str, Any] | None, since: TimeLike | None, until: TimeLike | None
) -> str | Mapping[str, Any] | None:
    """A ``where`` filter that also keeps create_time in [since, until) (``$and`` of both)."""
    bounds: dict[str, float] = {}
    if since is not None:
        bounds["$gte"] = _seconds(since)
    if until is not None:
        bounds["$lt"] = _seconds(until)
    if not bounds:
        return where
    in_range = {"create_time": bounds}
    if where is None or (isinstance(where, str) and not where.strip()):
        return in_range
    given: Any = where
    if isinstance(where, str):
        try:
            given = json.loads(where)
        except ValueError:
            return where  # the server rejects it, naming filter.where
    return {"$and": [given, in_range]}


def _search_request(
    namespaces: str | Sequence[str],
    query: str | Sequence[float] | Any = None,
    *,
    embedding_model: str = "",
    limit: int = 10,
    min_similarity: float | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    gamma: float | None = None,
    recency_tau_seconds: float | None = None,
    as_of: TimeLike | None = None,
    include_embedding: bool = False,
    strategy: int | str | None = None,
    tier_weights: Mapping[int | str, float] | None = None,
    include_ancestors: bool = False,
    scope_weights: Sequence[float] | None = None,
    read_only: bool = False,
    hybrid: bool = False,
    keywords: str | None = None,
    rrf_k: float | None = None,
    vector_weight: float | None = None,
    keyword_weight: float | None = None,
    explain: bool = False,
    **filter_fields: Any,
) -> pb.SearchMemoriesRequest:
    """The request of ``MemoryClient.search`` and of each of ``search_many``'s searches (the callers
    check the names of ``filter_fields``)."""
    req = pb.SearchMemoriesRequest(
        namespaces=[namespaces] if isinstance(namespaces, str) else list(namespaces),
        limit=limit,
        filter=build_filter(**filter_fields),
        include_embedding=include_embedding,
        embedding_model=embedding_model,
        strategy=strategy_value(strategy),  # type: ignore[arg-type,unused-ignore]
        include_ancestors=include_ancestors,
        scope_weights=[] if scope_weights is None else [float(w) for w in scope_weights],
        read_only=read_only,
        explain=explain,
    )
    _set_query(req, query, keywords)
    for tier, weight in (tier_weights or {}).items():
        req.tier_weights.add(tier=tier_value(tier), weight=weight)
    _set_hybrid(
        req,
        hybrid,
        keywords=keywords,
        rrf_k=rrf_k,
        vector_weight=vector_weight,
        keyword_weight=keyword_weight,
    )
    _set_given(
        req,
        min_similarity=min_similarity,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        recency_tau_seconds=recency_tau_seconds,
    )
    if as_of is not None:
        req.as_of.CopyFrom(_timestamp(as_of))
    return req


# What a search takes besides timeout and call_metadata: _search_request's arguments and the filters.
_SEARCH_ARGS = (frozenset(inspect.signature(_search_request).parameters) - {"filter_fields"}) | _FILTER_FIELDS

_END = object()


def _rest_of(first: Any, call: Any) -> Iterator[Any]:
    """A response stream from its first message (``_END``: none) on, failing with TiermemError; a
    stream left unread is cancelled."""
    try:
        if first is _END:
            return
        yield first
        yield from call
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
    finally:
        call.cancel()


def _code(err: grpc.RpcError) -> grpc.StatusCode:
    return err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN


def _last_error(err: grpc.RpcError) -> str:
    return f"last error {_code(err).name}: {err.details() if hasattr(err, 'details') else err}"


def _unreachable(
    health: health_pb2_grpc.HealthStub,
    request: health_pb2.HealthCheckRequest,
    call_metadata: CallMetadata | None,
) -> str:
    """Why the server cannot be reached (e.g. connection refused), from one call that does not wait
    for the connection; '' if it answers."""
    try:
        health.Check(request, timeout=0.25, metadata=call_metadata)
    except grpc.RpcError as e:
        return _last_error(e)
    return ""


def _open_channel(target: str, options: list[tuple[str, Any]], tls: Any) -> grpc.Channel:
    if tls is False or tls is None:
        return grpc.insecure_channel(target, options=options)
    if isinstance(tls, grpc.ChannelCredentials):
        creds = tls
    elif tls is True:
        creds = grpc.ssl_channel_credentials()
    else:
        pem = tls if isinstance(tls, bytes) else Path(tls).read_bytes()
        creds = grpc.ssl_channel_credentials(root_certificates=pem)
    return grpc.secure_channel(target, creds, options=options)


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call (health checks included)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(
        self,
        method: str,
        timeout: Any,
        metadata: Any,
        credentials: Any,
        wait_for_ready: Any,
        compression: Any,
    ) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


class _Spread:
    """Stubs over several connections: each call (each method looked up) takes the next one."""

    def __init__(self, stubs: list[pb_grpc.MemoryServiceStub]) -> None:
        self._stubs = stubs
        self._turn = itertools.count()  # next() is atomic: threads may share the client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stubs[next(self._turn) % len(self._stubs)], name)


class MemoryClient:
    """A connection to one tiermem server. Thread-safe; use as a context manager or call ``close``.

    ``connections``: open this many connections and spread the calls over them, one call each in
    turn. A server with search followers (``--search-processes``) serves each connection from one
    of its processes, so one connection gains nothing from them; with several, the kernel spreads
    them over the processes (at random: with 2 processes, 8 connections all land on one of them 1
    time in 128).

    ``timeout`` is the deadline of each call in seconds, unless the call gives its own; export and
    import streams have none unless given.

    ``api_key``: the token every call carries (``authorization: Bearer <token>``), for a server
    with API keys. ``tls``: connect with TLS: True trusts the system's certificate authorities, a
    path (or PEM bytes) trusts that CA certificate, ``grpc.ssl_channel_credentials(...)`` anything
    else (a client certificate for mutual TLS)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float = 30.0,
        channel: grpc.Channel | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        connections: int = 1,
        api_key: str | None = None,
        tls: bool | str | bytes | grpc.ChannelCredentials = False,
    ) -> None:
        if connections < 1 or (channel is not None and connections != 1):
            raise ValueError("connections must be >= 1, and 1 with a channel of your own")
        self.timeout = timeout
        self._own_channel = channel is None
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.service_config", _RETRY_CONFIG),
            ("grpc.enable_retries", 1),
            *_RECONNECT_OPTIONS,
        ]
        if connections > 1:  # channels with equal options would otherwise share one connection
            options.append(("grpc.use_local_subchannel_pool", 1))
        self.channels: list[grpc.Channel] = (
            [channel]
            if channel is not None
            else [_open_channel(target, options, tls) for _ in range(connections)]
        )
        if api_key:
            self.channels = [grpc.intercept_channel(c, _BearerToken(api_key)) for c in self.channels]
        self.channel = self.channels[0]
        stubs = [pb_grpc.MemoryServiceStub(c) for c in self.channels]
        self.stub: pb_grpc.MemoryServiceStub = stubs[0] if len(stubs) == 1 else cast(Any, _Spread(stubs))
        self._healths = [health_pb2_grpc.HealthStub(c) for c in self.channels]

    def close(self) -> None:
        if self._own_channel:
            for c in self.channels:
                c.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: Any,
        request: Any,
        timeout: float | None,
        call_metadata: CallMetadata | None,
        *,
        stream: bool = False,
    ) -> Any:
        """Make one call, the way every method does: within ``timeout`` (None: the client's, or no
        deadline for a ``stream``: export and import), with ``call_metadata``, waiting for the
        connection. A call the server did not run because it was starting or stopping is made again
        until its deadline (not a streamed upload: its requests are consumed). ``stream``: the
        response is a stream, returned as an iterator (which fails with TiermemError too)."""
        if timeout is None and not stream:
            timeout = self.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        again = isinstance(request, Message)
        pause = 0.05
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                result = method(request, timeout=left, metadata=call_metadata, wait_for_ready=True)
                if stream and again:  # a failed call raises from its first message
                    return _rest_of(next(result, _END), result)
                return result
            except grpc.RpcError as e:
                error = from_rpc_error(e)
            if not again or error.reason not in _NOT_RUN:
                raise error
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise error
            time.sleep(pause)
            pause = min(2 * pause, 1.0)

    def wait_ready(self, timeout: float | None = None, *, call_metadata: CallMetadata | None = None) -> None:
        """Block until the server reports SERVING on every connection, asking again while it says
        NOT_SERVING (a starting server does, for up to a minute when it compiles its kernels) or
        cannot be reached. After ``timeout`` (None: the client's) raise UnavailableError saying
        what it last saw."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout  # for all the connections together
        for health in self._healths:
            self._wait_serving(health, deadline, timeout, call_metadata)

    def _wait_serving(
        self,
        health: health_pb2_grpc.HealthStub,
        deadline: float,
        timeout: float,
        call_metadata: CallMetadata | None,
    ) -> None:
        request = health_pb2.HealthCheckRequest(service=_HEALTH_SERVICE)
        last, answered, pause = "", False, 0.02
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if not answered:  # a call waiting for the connection only learns that time ran out
                    last = _unreachable(health, request, call_metadata) or last
                raise UnavailableError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"server not ready after {timeout:g} s: {last or 'no answer'}",
                )
            try:
                status = health.Check(
                    request, timeout=left, metadata=call_metadata, wait_for_ready=True
                ).status
            except grpc.RpcError as e:
                if _code(e) != grpc.StatusCode.DEADLINE_EXCEEDED or not last:  # time ran out: keep the cause
                    last = _last_error(e)
            else:
                answered = True
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = f"last status {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            pause = min(2 * pause, 0.5)

    # -- memories -------------------------------------------------------------------------------
    def create(
        self,
        namespace: str,
        content: str,
        *,
        request_id: str = "",
        dedup_similarity: float | None = None,
        allow_duplicates: bool = False,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        """Store one memory; ``fields`` are those of ``build_memory`` (tier, importance, tags, ...).

        An exact duplicate (same normalized content in the namespace, no client id) reinforces the
        existing memory and returns it, unless ``allow_duplicates``; ``dedup_similarity`` also
        catches near duplicates by vector similarity. A preference or a summary in a protected
        namespace needs ``confirm=True``."""
        _check_names("create", fields, _MEMORY_FIELDS)
        req = pb.CreateMemoryRequest(
            memory=build_memory(namespace, content, **fields),
            request_id=request_id or uuid.uuid4().hex,
            allow_duplicates=allow_duplicates,
            confirm=confirm,
        )
        if dedup_similarity is not None:
            req.dedup_similarity = dedup_similarity
        return self._call(self.stub.CreateMemory, req, timeout, call_metadata).memory

    def create_batch(
        self,
        memories: Iterable[pb.Memory | Mapping[str, Any]],
        *,
        request_id: str = "",
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[pb.Memory]:
        """Store all memories or none; items are ``Memory`` messages or dicts of ``build_memory`` args
        (``confirm``: as in ``create``)."""
        msgs: list[pb.Memory] = []
        for i, m in enumerate(memories):
            if not isinstance(m, pb.Memory):
                _check_names(
                    "create_batch", m, _MEMORY_FIELDS | {"namespace", "content"}, f" in memories[{i}]"
                )
                m = build_memory(**m)
            msgs.append(m)
        req = pb.BatchCreateMemoriesRequest(
            memories=msgs, request_id=request_id or uuid.uuid4().hex, confirm=confirm
        )
        return list(self._call(self.stub.BatchCreateMemories, req, timeout, call_metadata).memories)

    def get(
        self,
        namespace: str,
        id: str,
        *,
        include_embedding: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.Memory:
        req = pb.GetMemoryRequest(namespace=namespace, id=id, include_embedding=include_embedding)
        return self._call(self.stub.GetMemory, req, timeout, call_metadata).memory

    def update(
        self,
        namespace: str,
        id: str,
        *,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        """Change the given fields only (e.g. ``update(ns, id, importance=0.9, tags=["x"])``);
        ``confirm=True`` is needed in a protected namespace."""
        _check_names("update", fields, (_MEMORY_FIELDS - {"id"}) | {"content"})
        if not fields:
            raise ValueError("update needs at least one field")
        memory = build_memory(
            namespace, fields.get("content", ""), id=id, **{k: v for k, v in fields.items() if k != "content"}
        )
        paths = list(fields)
        if "embedding" in fields and "embedding_model" not in fields:
            raise ValueError("embedding needs embedding_model")
        req = pb.UpdateMemoryRequest(
            memory=memory, update_mask=field_mask_pb2.FieldMask(paths=paths), confirm=confirm
        )
        return self._call(self.stub.UpdateMemory, req, timeout, call_metadata).memory

    def delete(
        self,
        namespace: str,
        id: str,
        *,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> None:
        """Delete a memory (``confirm=True`` in a protected namespace)."""
        req = pb.DeleteMemoryRequest(namespace=namespace, id=id, confirm=confirm)
        self._call(self.stub.DeleteMemory, req, timeout, call_metadata)

    def list_page(
        self,
        namespace: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        include_embedding: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **filter_fields: Any,
    ) -> tuple[list[pb.Memory], str]:
        """One page of a namespace, oldest first, and the token of the next page ('' at the end)."""
        _check_names("list_page", filter_fields, _FILTER_FIELDS)
        req = pb.ListMemoriesRequest(
            namespace=namespace,
            page_size=page_size,
            page_token=page_token,
            filter=build_filter(**filter_fields),
            include_embedding=include_embedding,
        )
        resp = self._call(self.stub.ListMemories, req, timeout, call_metadata)
        return list(resp.memories), resp.next_page_token

    def list_memories(
        self,
        namespace: str,
        *,
        page_size: int = 0,
        include_embedding: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **filter_fields: Any,
    ) -> Iterator[pb.Memory]:
        """Every memory of a namespace (matching the filter), fetched page by page (``timeout`` is
        per page)."""
        _check_names("list_memories", filter_fields, _FILTER_FIELDS)
        req = pb.ListMemoriesRequest(
            namespace=namespace,
            page_size=page_size,
            filter=build_filter(**filter_fields),
            include_embedding=include_embedding,
        )
        return self._pages(req, timeout, call_metadata)

    def _pages(
        self, req: pb.ListMemoriesRequest, timeout: float | None, call_metadata: CallMetadata | None
    ) -> Iterator[pb.Memory]:
        """The memories of every page of a list, from its first page on (``req`` is reused)."""
        while True:
            resp = self._call(self.stub.ListMemories, req, timeout, call_metadata)
            yield from resp.memories
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def search(
        self,
        namespaces: str | Sequence[str],
        query: str | Sequence[float] | Any = None,
        *,
        embedding_model: str = "",
        limit: int = 10,
        min_similarity: float | None = None,
        alpha: float | None = None,
        beta: float | None = None,
        gamma: float | None = None,
        recency_tau_seconds: float | None = None,
        as_of: TimeLike | None = None,
        include_embedding: bool = False,
        strategy: int | str | None = None,
        tier_weights: Mapping[int | str, float] | None = None,
        include_ancestors: bool = False,
        scope_weights: Sequence[float] | None = None,
        read_only: bool = False,
        hybrid: bool = False,
        keywords: str | None = None,
        rrf_k: float | None = None,
        vector_weight: float | None = None,
        keyword_weight: float | None = None,
        explain: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **filter_fields: Any,
    ) -> list[pb.SearchResult]:
        """Rank memories by alpha*relevance + beta*recency + gamma*importance, best first.

        ``query`` is text (embedded by the server's built-in embedder), a vector of the space
        named by ``embedding_model``, or None for orderings that need none (strategy 'recency' or
        'importance'). ``strategy``: 'fused' (default: similarity and the query text's keywords,
        normalized, first; recency and importance between near ties), 'comprehensive', 'weighted',
        'fast_first', 'similarity', 'recency' or 'importance'; ``tier_weights`` by tier ('fast', ... or value).
        ``include_ancestors`` also searches the namespaces' ancestors ("a/b/c" -> "a/b", "a"),
        weighted by ``scope_weights`` (default 1, 0.8, 0.6, 0.4 by distance). ``read_only``: the
        results do not count as accessed. ``keywords``: the text of a vector query (the fused
        strategy and hybrid search match its words). ``hybrid`` fuses the ranking with keyword (BM25)
        matches of the query text (``rrf_k``, ``vector_weight``, ``keyword_weight``; ValueError
        without ``hybrid``); ``explain`` fills
        each result's explanation. Filters: tiers, kinds, tags_any, tags_all, source, topic,
        created_after, created_before, where.
        """
        _check_names("search", filter_fields, _FILTER_FIELDS)
        req = _search_request(
            namespaces,
            query,
            embedding_model=embedding_model,
            limit=limit,
            min_similarity=min_similarity,
            alpha=alpha,
            beta=beta,
            gamma=gamma,
            recency_tau_seconds=recency_tau_seconds,
            as_of=as_of,
            include_embedding=include_embedding,
            strategy=strategy,
            tier_weights=tier_weights,
            include_ancestors=include_ancestors,
            scope_weights=scope_weights,
            read_only=read_only,
            hybrid=hybrid,
            keywords=keywords,
            rrf_k=rrf_k,
            vector_weight=vector_weight,
            keyword_weight=keyword_weight,
            explain=explain,
            **filter_fields,
        )
        return list(self._call(self.stub.SearchMemories, req, timeout, call_metadata).results)

    def search_many(
        self,
        searches: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[list[pb.SearchResult]]:
        """Several searches in one call (``BatchSearchMemories``: 1 to 100, run side by side on the
        server), saving round trips for an agent that fans out. Each mapping holds the arguments of
        ``search`` (``namespaces``, ``query``, ``limit``, filters, ...) but timeout and
        call_metadata, which are the call's. Returns each search's results, in order."""
        req = pb.BatchSearchMemoriesRequest()
        for i, search in enumerate(searches):
            _check_names("search_many", search, _SEARCH_ARGS, f" in searches[{i}]")
            if "namespaces" not in search:
                raise TypeError(f"search_many() searches[{i}] has no 'namespaces'")
            req.searches.append(_search_request(**search))
        resp = self._call(self.stub.BatchSearchMemories, req, timeout, call_metadata)
        return [list(r.results) for r in resp.responses]

    def feedback(
        self,
        namespace: str,
        items: Iterable[Mapping[str, Any]],
        *,
        as_of: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[pb.Memory]:
        """Report use of retrieved memories: each item has ``id`` and optionally
        ``predicted_relevance``, ``actual_usefulness`` (both in [0, 1]) and ``success``."""
        req = pb.RecordFeedbackRequest(namespace=namespace, items=[pb.Feedback(**dict(i)) for i in items])
        if as_of is not None:
            req.as_of.CopyFrom(_timestamp(as_of))
        return list(self._call(self.stub.RecordFeedback, req, timeout, call_metadata).memories)

    # -- server and namespaces ------------------------------------------------------------------
    def stats(
        self, namespace: str = "", *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetStatsResponse:
        return self._call(self.stub.GetStats, pb.GetStatsRequest(namespace=namespace), timeout, call_metadata)

    def list_namespaces(
        self,
        prefix: str = "",
        *,
        page_size: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> Iterator[pb.NamespaceInfo]:
        """Every namespace holding memories (under ``prefix``), page by page (``timeout`` is per page)."""
        token = ""
        while True:
            req = pb.ListNamespacesRequest(prefix=prefix, page_size=page_size, page_token=token)
            resp = self._call(self.stub.ListNamespaces, req, timeout, call_metadata)
            yield from resp.namespaces
            token = resp.next_page_token
            if not token:
                return

    def delete_namespace(
        self,
        namespace: str,
        *,
        include_children: bool = False,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> int:
        """Delete every memory of a namespace (and of ``namespace/...`` with ``include_children``):
        the one call that clears a task or session scope. Returns how many were deleted."""
        req = pb.DeleteNamespaceRequest(
            namespace=namespace, include_children=include_children, confirm=confirm
        )
        return int(self._call(self.stub.DeleteNamespace, req, timeout, call_metadata).deleted_count)

    # -- lifecycle ------------------------------------------------------------------------------
    def get_namespace_config(
        self, namespace: str, *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetNamespaceConfigResponse:
        """The namespace's stored settings (``.config``) and the complete policy in effect (``.effective``)."""
        req = pb.GetNamespaceConfigRequest(namespace=namespace)
        return self._call(self.stub.GetNamespaceConfig, req, timeout, call_metadata)

    def update_namespace_config(
        self,
        namespace: str,
        *,
        protected: bool | None = None,
        tiers: Mapping[int | str, Mapping[str, float]] | None = None,
        retention: str | int | None = None,
        delete_from_glacial: bool | None = None,
        promote_access_count: int | None = None,
        promote_surprise: float | None = None,
        promote_success_count: int | None = None,
        reflection_threshold: float | None = None,
        summary_token_threshold: int | None = None,
        default_importance: float | None = None,
        importance_decay: str | int | None = None,
        importance_floor: float | None = None,
        importance_heuristic: str | int | None = None,
        promote_through_tiers: bool | None = None,
        decay_grace: bool | None = None,
        summarize_evictions: bool | None = None,
        max_items: int | None = None,
        kind_capacities: Mapping[str, int] | None = None,
        evict_share: float | None = None,
        evict_on_create: bool | None = None,
        preset: str | None = None,
        recency_basis: str | int | None = None,
        auto_summarize: bool | None = None,
        summary_max_tokens: int | None = None,
        summary_strategy: str | int | None = None,
        working_token_limit: int | None = None,
        reset_policy: bool = False,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.UpdateNamespaceConfigResponse:
        """Change only what is given (each field named in the update mask as ``policy.<name>``).
        ``tiers`` maps a tier to overrides of ttl_seconds, max_items, importance_threshold,
        half_life_hours, cadence_seconds (it replaces earlier tier overrides); ``reset_policy`` drops
        every lifecycle override first. Enums by name: ``retention`` importance_weighted, recency,
        fifo, lru, importance or ten_point_weighted; ``importance_decay`` half_life or none;
        ``importance_heuristic`` cues, ten_point or phrases; ``recency_basis`` creation or
        last_access; ``summary_strategy`` rolling or hierarchical (an unknown name is a ValueError
        naming the argument). ``kind_capacities`` maps a kind to its cap, 0 for none (replacing the
        earlier ones); ``preset`` names a design's set of overrides (docs/lifecycle.md has every
        field). Unprotecting a protected namespace, or changing its policy, needs ``confirm=True``."""
        cfg = pb.NamespaceConfig(namespace=namespace, protected=bool(protected))
        paths = ["protected"] if protected is not None else []
        if reset_policy:
            paths.append("policy")
        if tiers is not None:
            for tier, fields in tiers.items():
                cfg.policy.tiers.add(tier=tier_value(tier), **fields)
            paths.append("policy.tiers")
        given = locals()  # each policy field is an argument of the same name
        paths += set_policy_fields(cfg.policy, {name: given[name] for name in POLICY_ARGUMENTS})
        if not paths:
            raise ValueError("update_namespace_config needs something to change")
        req = pb.UpdateNamespaceConfigRequest(
            config=cfg, update_mask=field_mask_pb2.FieldMask(paths=paths), confirm=confirm
        )
        return self._call(self.stub.UpdateNamespaceConfig, req, timeout, call_metadata)

    def consolidate(
        self,
        namespace: str = "",
        *,
        dry_run: bool = False,
        max_reported_moves: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.ConsolidateMemoriesResponse:
        """Run a lifecycle pass now over one namespace or all (expiry, promotion, demotion, capacity);
        ``dry_run`` reports the moves without making them."""
        req = pb.ConsolidateMemoriesRequest(
            namespace=namespace, dry_run=dry_run, max_reported_moves=max_reported_moves
        )
        return self._call(self.stub.ConsolidateMemories, req, timeout, call_metadata)

    def transfer(
        self,
        namespace: str,
        id: str,
        *,
        mode: str = "copy",
        target_namespace: str = "",
        target_tier: int | str | None = None,
        target_id: str = "",
        overwrite: bool = False,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.Memory:
        """Copy or move (``mode``) a memory to another namespace and/or tier, e.g. task -> project ->
        global; the result's ``origin`` names the source."""
        req = pb.TransferMemoryRequest(
            namespace=namespace,
            id=id,
            target_namespace=target_namespace,
            target_tier=tier_value(target_tier),  # type: ignore[arg-type,unused-ignore]
            mode=pb.TransferMode.Value(f"TRANSFER_MODE_{mode.upper()}"),  # type: ignore[arg-type,unused-ignore]
            target_id=target_id,
            overwrite=overwrite,
            confirm=confirm,
        )
        return self._call(self.stub.TransferMemory, req, timeout, call_metadata).memory

    # -- streams, debates, backup ---------------------------------------------------------------
    def timeline(
        self,
        namespace: str,
        *,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        page_size: int = 0,
        where: str | Mapping[str, Any] | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **filter_fields: Any,
    ) -> Iterator[pb.Memory]:
        """An agent's memory stream, newest first, optionally within [since, until) and matching
        the filters (``where`` too); ``timeout`` is per page."""
        _check_names("timeline", filter_fields, _FILTER_FIELDS - {"where"})
        req = pb.ListMemoriesRequest(
            namespace=namespace,
            page_size=page_size,
            newest_first=True,
            filter=build_filter(where=_within(where, since, until), **filter_fields),
        )
        return self._pages(req, timeout, call_metadata)

    def find_similar_debates(
        self,
        namespaces: str | Sequence[str],
        topic: str,
        *,
        limit: int = 5,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **kwargs: Any,
    ) -> list[pb.SearchResult]:
        """Consensus and dissent records (kinds "consensus", "dissent") closest to ``topic``;
        ``kwargs`` are other arguments of ``search``."""
        _check_names("find_similar_debates", kwargs, _SEARCH_ARGS - {"namespaces", "query", "kinds"})
        return self.search(
            namespaces,
            topic,
            limit=limit,
            kinds=["consensus", "dissent"],
            timeout=timeout,
            call_metadata=call_metadata,
            **kwargs,
        )

    def export_memories(
        self,
        namespace: str = "",
        *,
        include_children: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> Iterator[pb.ExportMemoriesResponse]:
        """Stream a consistent snapshot: the header chunk, then every memory with its vector, the
        namespaces' progress toward a reflection and a summary, and the graph. No deadline unless
        ``timeout`` (for the whole stream): a large export takes a while."""
        req = pb.ExportMemoriesRequest(namespace=namespace, include_children=include_children)
        yield from self._call(self.stub.ExportMemories, req, timeout, call_metadata, stream=True)

    def import_memories(
        self,
        chunks: Iterable[pb.ExportMemoriesResponse],
        *,
        target_namespace: str = "",
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.ImportMemoriesResponse:
        """Restore the chunks of an export (e.g. ``export_memories``' output, possibly saved and
        read back), optionally under another namespace. No deadline unless ``timeout``."""

        def requests() -> Iterator[pb.ImportMemoriesRequest]:
            for i, chunk in enumerate(chunks):
                req = pb.ImportMemoriesRequest(target_namespace=target_namespace if i == 0 else "")
                which = chunk.WhichOneof("chunk")
                if which == "header":
                    req.header.CopyFrom(chunk.header)
                elif which == "memory":
                    req.memory.CopyFrom(chunk.memory)
                elif which == "scope":
                    req.scope.CopyFrom(chunk.scope)
                elif which == "node":
                    req.node.CopyFrom(chunk.node)
                    req.graph_namespace = chunk.graph_namespace
                elif which == "edge":
                    req.edge.CopyFrom(chunk.edge)
                    req.graph_namespace = chunk.graph_namespace
                else:
                    raise ValueError(f"chunk {i} of the export is empty")
                yield req

        return self._call(self.stub.ImportMemories, requests(), timeout, call_metadata, stream=True)

    # -- agent memory: reflection and summaries ------------------------------------------------
    def observe(
        self,
        namespace: str,
        content: str,
        *,
        kind: str = "observation",
        request_id: str = "",
        allow_duplicates: bool = True,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.CreateMemoryResponse:
        """Store an observation and return the whole response: ``.memory``, ``.reflection_due`` and
        ``.summary_due`` tell the agent when to reflect or summarize. An event log keeps every
        event, a repeated one too; ``allow_duplicates=False`` merges one with the same content
        into the memory already stored, as ``create`` does."""
        _check_names("observe", fields, _MEMORY_FIELDS)
        req = pb.CreateMemoryRequest(
            memory=build_memory(namespace, content, kind=kind, **fields),
            request_id=request_id or uuid.uuid4().hex,
            allow_duplicates=allow_duplicates,
        )
        return self._call(self.stub.CreateMemory, req, timeout, call_metadata)

    def reflection_candidates(
        self,
        namespace: str,
        *,
        limit: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GetReflectionCandidatesResponse:
        """The most recent observations (newest first) and the reflection accumulator."""
        req = pb.GetReflectionCandidatesRequest(namespace=namespace, limit=limit)
        return self._call(self.stub.GetReflectionCandidates, req, timeout, call_metadata)

    def reflect(
        self,
        namespace: str,
        insight: str,
        *,
        source_memory_ids: Iterable[str],
        questions: Iterable[str] = (),
        importance: float = 0.9,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        """Store a reflection (kind "reflection", importance >= 0.8) derived from observations;
        it resets the namespace's reflection accumulator."""
        _check_names("reflect", fields, _MEMORY_FIELDS - {"kind"})
        m = build_memory(
            namespace,
            insight,
            kind="reflection",
            importance=importance,
            source_memory_ids=source_memory_ids,
            **fields,
        )
        m.questions.extend(questions)
        req = pb.CreateMemoryRequest(memory=m, request_id=uuid.uuid4().hex)
        return self._call(self.stub.CreateMemory, req, timeout, call_metadata).memory

    def build_summary(
        self,
        namespace: str,
        *,
        max_tokens: int = 0,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.BuildSummaryResponse:
        """A built-in extractive summary (no LLM) of the memories since the last summary, or, with
        ``since``/``until``, of those created in [since, until)."""
        req = pb.BuildSummaryRequest(namespace=namespace, max_tokens=max_tokens)
        if since is not None:
            req.created_after.CopyFrom(_timestamp(since))
        if until is not None:
            req.created_before.CopyFrom(_timestamp(until))
        return self._call(self.stub.BuildSummary, req, timeout, call_metadata)

    def summarize(
        self,
        namespace: str,
        text: str,
        *,
        source_memory_ids: Iterable[str],
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        """Store a rolling summary of the scope: it replaces the previous summary and resets the
        summary token count."""
        accepted = (_MEMORY_FIELDS - {"kind"}) | {
            "request_id",
            "dedup_similarity",
            "allow_duplicates",
            "confirm",
        }
        _check_names("summarize", fields, accepted)
        return self.create(
            namespace,
            text,
            kind="summary",
            source_memory_ids=source_memory_ids,
            timeout=timeout,
            call_metadata=call_metadata,
            **fields,
        )

    # -- graph memory ---------------------------------------------------------------------------
    def upsert_node(
        self,
        namespace: str,
        node_id: str,
        *,
        label: str = "",
        properties: Mapping[str, Any] | None = None,
        memory_ids: Iterable[str] = (),
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GraphNode:
        """Create or replace a graph node (an entity the agent records explicitly)."""
        node = pb.GraphNode(id=node_id, label=label, memory_ids=list(memory_ids))
        if properties:
            set_metadata(node.properties, properties)
        req = pb.UpsertGraphNodeRequest(namespace=namespace, node=node)
        return self._call(self.stub.UpsertGraphNode, req, timeout, call_metadata).node

    def add_edge(
        self,
        namespace: str,
        source_id: str,
        relation: str,
        target_id: str,
        *,
        properties: Mapping[str, Any] | None = None,
        memory_ids: Iterable[str] = (),
        valid_from: TimeLike | None = None,
        invalid_from: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GraphEdge:
        """Link two nodes: ``source_id relation target_id``, valid over [valid_from, invalid_from)."""
        edge = pb.GraphEdge(
            source_id=source_id, target_id=target_id, relation=relation, memory_ids=list(memory_ids)
        )
        if properties:
            set_metadata(edge.properties, properties)
        if valid_from is not None:
            edge.valid_from.CopyFrom(_timestamp(valid_from))
        if invalid_from is not None:
            edge.invalid_from.CopyFrom(_timestamp(invalid_from))
        req = pb.AddGraphEdgeRequest(namespace=namespace, edge=edge)
        return self._call(self.stub.AddGraphEdge, req, timeout, call_metadata).edge

    def invalidate_edge(
        self,
        namespace: str,
        edge_id: str,
        *,
        at: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GraphEdge:
        """End a fact's validity (it stays in history)."""
        req = pb.InvalidateGraphEdgeRequest(namespace=namespace, edge_id=edge_id)
        if at is not None:
            req.invalid_from.CopyFrom(_timestamp(at))
        return self._call(self.stub.InvalidateGraphEdge, req, timeout, call_metadata).edge

    def neighbors(
        self,
        namespace: str,
        node_id: str,
        *,
        depth: int = 1,
        limit: int = 0,
        as_of: TimeLike | None = None,
        include_invalid: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GetGraphNeighborsResponse:
        """Nodes (breadth first) and edges around ``node_id`` that hold at ``as_of``."""
        req = pb.GetGraphNeighborsRequest(
            namespace=namespace, node_id=node_id, depth=depth, limit=limit, include_invalid=include_invalid
        )
        if as_of is not None:
            req.as_of.CopyFrom(_timestamp(as_of))
        return self._call(self.stub.GetGraphNeighbors, req, timeout, call_metadata)

    # -- context assembly -------------------------------------------------------------------------
    def build_context(
        self,
        scopes: Sequence[str | Mapping[str, Any]],
        *,
        token_budget: int,
        query: str = "",
        head_tail: int = 0,
        graph_facts: bool = True,
        read_only: bool = False,
        summarize_overflow: bool = True,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.BuildContextResponse:
        """A token-budgeted context package for an agent turn: ``scopes`` narrowest first (namespace
        strings, or dicts with namespace, share, semantic_k, recent_window, and fill: False leaves
        the rest of the scope's share unfilled, no "important" section). ``summarize_overflow``
        False: no "overflow" section summarizing what did not fit. The response's ``warnings`` name
        the steps that failed without stopping the build."""
        req = pb.BuildContextRequest(
            query_text=query,
            token_budget=token_budget,
            head_tail=head_tail,
            graph_facts=graph_facts,
            read_only=read_only,
            summarize_overflow=summarize_overflow,
        )
        for scope in scopes:
            req.scopes.add(**({"namespace": scope} if isinstance(scope, str) else dict(scope)))
        return self._call(self.stub.BuildContext, req, timeout, call_metadata)
