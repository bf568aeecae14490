"""``MemoryClient``: typed Python access to a tiermem server (``AsyncMemoryClient``, in ``aio.py``, is
the same for asyncio).

Results are the generated ``tiermem.v1`` messages (``Memory``, ``SearchResult``), so every field of
the contract is there, typed by the shipped ``.pyi`` stubs; ``metadata_dict(m)`` gives a memory's
metadata as plain Python values and ``to_python(result)`` any result as dicts, lists and scalars
(``plain.py``). Failures raise ``TiermemError``
subclasses carrying ``code``, ``reason`` and the invalid ``fields``.

Creates always carry a ``request_id`` (a fresh one unless you pass yours), and the channel retries
the calls that are safe to repeat when they fail with UNAVAILABLE (up to 5 attempts): creates,
batch creates, gets, updates, lists, searches, stats, namespace lists, namespace settings reads and
graph neighbours; a retried create returns the first result instead of storing the memory twice.
Deletes, feedback (it counts accesses) and the other calls are not retried by the channel, whose
repeat after a lost reply would not give their first result.

Every call waits for the connection (``wait_for_ready``) and reconnects quickly, and a call the
server refused because it was starting or stopping (so did not run) is made again: a server restart
within a call's deadline only delays it. Every method takes ``timeout`` (seconds, for that call; the
client's by default) and ``call_metadata`` (pairs sent with the call).

Each method's request is built in ``requests.py`` (shared with ``AsyncMemoryClient``); here it is
sent and its result taken out of the response.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2_grpc

import tiermem.client.requests as rq  # not "from . import requests": that imports the package, a cycle
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

from .agent import AgentMethods
from .connection import (
    HEALTH_REQUEST,
    Attempts,
    Readiness,
    channel_options,
    check_connections,
    check_timeout,
    checked_metadata,
    client_closed,
    last_error,
    one_stub,
    open_channel,
    ready_deadline,
    with_tls_hint,
    with_token,
)
from .connection import CallMetadata as CallMetadata
from .errors import DeadlineExceededError, TiermemError, from_rpc_error, unreached
from .messages import TimeLike as TimeLike
from .messages import build_filter as build_filter
from .messages import build_memory as build_memory
from .messages import strategy_value as strategy_value
from .messages import tier_value as tier_value
from .plain import metadata_dict as metadata_dict  # re-exported, as the "X as X" names above: they lived here
from .routing import with_routes

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


def _unreachable(
    health: health_pb2_grpc.HealthStub, call_metadata: CallMetadata | None, *, only_refused: bool = False
) -> str:
    """Why the server cannot be reached (e.g. connection refused), from one call that does not wait
    for the connection; '' if it answers. ``only_refused`` (a call's deadline passed): '' also when
    it fails otherwise than UNAVAILABLE (overloaded, say: it is reachable)."""
    try:
        health.Check(HEALTH_REQUEST, timeout=0.25, metadata=call_metadata)
    except grpc.RpcError as e:
        return "" if only_refused and e.code() != grpc.StatusCode.UNAVAILABLE else last_error(e)
    return ""


class MemoryClient(AgentMethods):
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
    else (a client certificate for mutual TLS).

    ``sharded``: ``target`` is a proxy in front of tenant shards (docs/scaling.md): every call
    carries its routing key, the top-level scope of the namespaces it names (``routing.py``)."""

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
        sharded: bool = False,
    ) -> None:
        check_connections(connections, channel)
        check_timeout(timeout)
        self.timeout = timeout
        self._plain_target = target if channel is None and not tls else None  # (for a hint about TLS)
        self._own_channel = channel is None
        options = channel_options(max_message_bytes, connections)
        channels = (
            [channel]
            if channel is not None
            else [open_channel(target, options, tls) for _ in range(connections)]
        )
        self.channels = [with_token(with_routes(c) if sharded else c, api_key) for c in channels]
        self.channel = self.channels[0]
        self.stub: pb_grpc.MemoryServiceStub = one_stub([pb_grpc.MemoryServiceStub(c) for c in self.channels])
        self._healths = [health_pb2_grpc.HealthStub(c) for c in self.channels]
        self._closed = False

    def close(self) -> None:
        if self._own_channel:
            self._closed = True
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
        if self._closed:  # (gRPC's own error for a closed channel is a bare ValueError)
            raise client_closed()
        call_metadata = checked_metadata(call_metadata)
        attempts = Attempts(timeout, again=isinstance(request, Message))
        while True:
            try:
                result = method(request, timeout=attempts.left(), metadata=call_metadata, wait_for_ready=True)
                if stream and attempts.again:  # a failed call raises from its first message
                    return _rest_of(next(result, _END), result)
                return result
            except grpc.RpcError as e:
                error = self._reached(from_rpc_error(e), call_metadata)
            time.sleep(attempts.pause_after(error))  # raises the error if it is not made again

    def _reached(self, error: TiermemError, call_metadata: CallMetadata | None) -> TiermemError:
        """``error``, saying why the server could not be reached if it is a deadline that passed
        while the call waited for its connection."""
        if isinstance(error, DeadlineExceededError) and not error.reason:
            why = _unreachable(self._healths[0], call_metadata, only_refused=True)
            if why:
                return unreached(error, with_tls_hint(why, self._plain_target))
        return error

    def wait_ready(self, timeout: float | None = None, *, call_metadata: CallMetadata | None = None) -> None:
        """Block until the server reports SERVING on every connection, asking again while it says
        NOT_SERVING (a starting server does, for up to a minute when it compiles its kernels) or
        cannot be reached. After ``timeout`` (None: the client's) raise UnavailableError saying
        what it last saw."""
        timeout = self.timeout if timeout is None else timeout
        if self._closed:
            raise client_closed()
        call_metadata = checked_metadata(call_metadata)
        deadline = ready_deadline(timeout)  # for all the connections together
        for health in self._healths:
            self._wait_serving(health, Readiness(deadline, timeout), call_metadata)

    def _wait_serving(
        self, health: health_pb2_grpc.HealthStub, seen: Readiness, call_metadata: CallMetadata | None
    ) -> None:
        while True:
            left = seen.left()
            if left <= 0:
                why = "" if seen.answered else _unreachable(health, call_metadata)
                raise seen.not_ready(with_tls_hint(why, self._plain_target))
            try:
                response = health.Check(
                    HEALTH_REQUEST, timeout=seen.check_timeout(), metadata=call_metadata, wait_for_ready=True
                )
            except grpc.RpcError as e:
                seen.failed(e)
            else:
                if seen.serving(response.status):
                    return
            time.sleep(seen.pause())

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

        An exact duplicate (same normalized content and kind in the namespace, no client id)
        reinforces the existing memory and returns it, unless ``allow_duplicates``;
        ``dedup_similarity`` also catches near duplicates by vector similarity. A preference or a
        summary in a protected namespace, or reinforcing a memory there, needs ``confirm=True``."""
        req = rq.create_request(
            namespace,
            content,
            request_id=request_id,
            dedup_similarity=dedup_similarity,
            allow_duplicates=allow_duplicates,
            confirm=confirm,
            **fields,
        )
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
        req = rq.create_batch_request(memories, request_id=request_id, confirm=confirm)
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
        req = rq.get_request(namespace, id, include_embedding=include_embedding)
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
        req = rq.update_request(namespace, id, confirm=confirm, **fields)
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
        req = rq.delete_request(namespace, id, confirm=confirm)
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
        req = rq.list_request(
            "list_page",
            namespace,
            page_size=page_size,
            page_token=page_token,
            include_embedding=include_embedding,
            **filter_fields,
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
        req = rq.list_request(
            "list_memories",
            namespace,
            page_size=page_size,
            include_embedding=include_embedding,
            **filter_fields,
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

        ``query`` is text (embedded by the server's configured embedder), a vector of the space
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
        req = rq.search_memories_request(
            namespaces,
            query,
            filter_fields,
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
        req = rq.search_many_request(searches)
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
        req = rq.feedback_request(namespace, items, as_of=as_of)
        return list(self._call(self.stub.RecordFeedback, req, timeout, call_metadata).memories)

    # -- server and namespaces ------------------------------------------------------------------
    def stats(
        self, namespace: str = "", *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetStatsResponse:
        return self._call(self.stub.GetStats, rq.stats_request(namespace), timeout, call_metadata)

    def list_namespaces(
        self,
        prefix: str = "",
        *,
        page_size: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> Iterator[pb.NamespaceInfo]:
        """Every namespace holding memories whose name begins with ``prefix`` (a string prefix:
        ``team`` lists ``team-b`` too), page by page (``timeout`` is per page). Its arguments
        are checked at the call, as ``list_memories``' are, not when the first page is read."""
        req = rq.list_namespaces_request(prefix, page_size=page_size, page_token="")
        return self._namespace_pages(req, timeout, call_metadata)

    def _namespace_pages(
        self, req: pb.ListNamespacesRequest, timeout: float | None, call_metadata: CallMetadata | None
    ) -> Iterator[pb.NamespaceInfo]:
        while True:
            resp = self._call(self.stub.ListNamespaces, req, timeout, call_metadata)
            yield from resp.namespaces
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

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
        req = rq.delete_namespace_request(namespace, include_children=include_children, confirm=confirm)
        return int(self._call(self.stub.DeleteNamespace, req, timeout, call_metadata).deleted_count)

    # -- lifecycle ------------------------------------------------------------------------------
    def set_scope_routing(
        self,
        scope: str,
        routing: int | str,
        *,
        moved_to: str = "",
        purge: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.SetScopeRoutingResponse:
        """Fence (``"fenced"``: writes refused), retire (``"moved"``, with ``purge`` deleting its
        data) or serve again (``"serving"``) top-level ``scope`` on this server: what ``tiermem
        shard move`` does at the source (docs/scaling.md). Admin."""
        req = rq.set_scope_routing_request(scope, routing, moved_to, purge)
        return self._call(self.stub.SetScopeRouting, req, timeout, call_metadata)

    def get_scope_routing(
        self, scope: str, *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetScopeRoutingResponse:
        """Top-level ``scope``'s routing state on this server (``routing``: 0 serving, then
        ``pb.SCOPE_ROUTING_FENCED``, ``_MOVED``, ``_RECEIVING``) and its ``moved_to``. Admin."""
        req = pb.GetScopeRoutingRequest(scope=scope)
        return self._call(self.stub.GetScopeRouting, req, timeout, call_metadata)

    def promote_replica(
        self,
        *,
        leader_instance_id: str = "",
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.PromoteReplicaResponse:
        """Make this server, a replica, stop following its leader and take writes (docs/scaling.md).
        Admin; FAILED_PRECONDITION: NOT_A_REPLICA on a server that is not a replica,
        REPLICA_OF_ANOTHER when ``leader_instance_id`` is not the data it copies."""
        req = pb.PromoteReplicaRequest(leader_instance_id=leader_instance_id)
        return self._call(self.stub.PromoteReplica, req, timeout, call_metadata)

    def get_namespace_config(
        self, namespace: str, *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetNamespaceConfigResponse:
        """The namespace's stored settings (``.config``) and the complete policy in effect (``.effective``)."""
        req = rq.get_namespace_config_request(namespace)
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
        req = rq.update_namespace_config_request(
            namespace,
            protected=protected,
            tiers=tiers,
            reset_policy=reset_policy,
            confirm=confirm,
            policy=rq.policy_arguments(locals()),
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
        req = rq.consolidate_request(namespace, dry_run=dry_run, max_reported_moves=max_reported_moves)
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
        req = rq.transfer_request(
            namespace,
            id,
            mode=mode,
            target_namespace=target_namespace,
            target_tier=target_tier,
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
        req = rq.timeline_request(
            namespace, since=since, until=until, page_size=page_size, where=where, **filter_fields
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
        req = rq.find_similar_debates_request(namespaces, topic, limit=limit, **kwargs)
        return list(self._call(self.stub.SearchMemories, req, timeout, call_metadata).results)

    def export_memories(
        self,
        namespace: str = "",
        *,
        include_children: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> Iterator[pb.ExportMemoriesResponse]:
        """Stream a consistent snapshot: the header chunk, the namespaces' settings, then every
        memory with its vector, the namespaces' progress toward a reflection and a summary, and
        the graph. No deadline unless
        ``timeout`` (for the whole stream): a large export takes a while."""
        req = rq.export_request(namespace, include_children=include_children)
        yield from self._call(self.stub.ExportMemories, req, timeout, call_metadata, stream=True)

    def import_memories(
        self,
        chunks: Iterable[pb.ExportMemoriesResponse],
        *,
        target_namespace: str = "",
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.ImportMemoriesResponse:
        """Restore the chunks of an export (e.g. ``export_memories``' output, possibly saved and
        read back), optionally under another namespace. The namespaces' settings are set last
        (protection added, never removed; a policy replaces the namespace's own). ``confirm``:
        restoring preferences and summaries into a protected namespace, or a policy over a
        protected namespace's own, is intended. No deadline unless ``timeout``."""
        failure: list[Exception] = []  # (gRPC reports requests that fail without their exception)

        def requests() -> Iterator[pb.ImportMemoriesRequest]:
            try:
                for i, chunk in enumerate(chunks):
                    yield rq.import_request(i, chunk, target_namespace, confirm)
                yield rq.IMPORT_END
            except Exception as e:
                failure.append(e)
                raise

        try:
            return self._call(self.stub.ImportMemories, requests(), timeout, call_metadata, stream=True)
        except TiermemError as e:
            if not failure:
                raise
            raise e from failure[0]  # (UNKNOWN: the requests failed)
