"""``AsyncMemoryClient``: ``MemoryClient`` for asyncio, over grpc.aio.

The same methods with the same arguments, defaults, results and errors, awaited: ``await
client.create(...)``; ``list_memories``, ``list_namespaces``, ``timeline`` and ``export_memories``
are async iterators (``async for m in client.list_memories(ns)``), and ``import_memories`` takes an
iterable or an async iterable of chunks. Each method's request is built by ``requests.py``, as
``MemoryClient``'s is, and its documentation is ``MemoryClient``'s. Calls wait for the connection,
are retried as ``MemoryClient``'s are, and fail with the same ``TiermemError`` subclasses.

Create the client inside the event loop that uses it (in a coroutine): its channels belong to that
loop. ``async with AsyncMemoryClient(target) as client:`` closes it; so does ``await client.close()``.
Calls under way when it closes fail as ``MemoryClient``'s do then, with ``TiermemError`` CANCELLED
("Channel closed!"); a call whose task is cancelled (``task.cancel()``, a timeout around it) raises
``asyncio.CancelledError`` as any awaitable does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2_grpc

import tiermem.client.requests as rq  # not "from . import requests": that imports the package, a cycle
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

from .aio_agent import AsyncAgentMethods
from .client import MemoryClient
from .connection import (
    HEALTH_REQUEST,
    Attempts,
    CallMetadata,
    Readiness,
    channel_options,
    check_connections,
    check_timeout,
    checked_metadata,
    client_closed,
    last_error,
    one_stub,
    open_aio_channel,
    ready_deadline,
    with_tls_hint,
)
from .errors import DeadlineExceededError, TiermemError, from_rpc_error, unreached
from .messages import TimeLike
from .routing import ROUTE_HEADER, aio_route_interceptors, peek_route, top_scope


def _channel_closed() -> TiermemError:
    """The error of a call under way when its channel closed: ``MemoryClient``'s (gRPC's status)."""
    return TiermemError(grpc.StatusCode.CANCELLED, "Channel closed!")


async def _unreachable(
    health: health_pb2_grpc.HealthStub, call_metadata: CallMetadata | None, *, only_refused: bool = False
) -> str:
    """Why the server cannot be reached (e.g. connection refused), from one call that does not wait
    for the connection; '' if it answers. ``only_refused`` (a call's deadline passed): '' also when
    it fails otherwise than UNAVAILABLE (overloaded, say: it is reachable)."""
    try:
        await health.Check(HEALTH_REQUEST, timeout=0.25, metadata=call_metadata)
    except grpc.RpcError as e:
        return "" if only_refused and e.code() != grpc.StatusCode.UNAVAILABLE else last_error(e)
    return ""


class _Requests:
    """The requests of an import from its chunks (an iterable or an async iterable), keeping the
    exception that stopped them: grpc.aio only cancels the call then."""

    def __init__(
        self,
        chunks: Iterable[pb.ExportMemoriesResponse] | AsyncIterable[pb.ExportMemoriesResponse],
        target_namespace: str,
        confirm: bool,
    ) -> None:
        self.chunks, self.target_namespace, self.confirm = chunks, target_namespace, confirm
        self.failure: Exception | None = None

    async def __aiter__(self) -> AsyncIterator[pb.ImportMemoriesRequest]:
        try:
            if isinstance(self.chunks, AsyncIterable):
                i = 0
                async for chunk in self.chunks:
                    yield rq.import_request(i, chunk, self.target_namespace, self.confirm)
                    i += 1
            else:
                for i, chunk in enumerate(self.chunks):
                    yield rq.import_request(i, chunk, self.target_namespace, self.confirm)
            yield rq.IMPORT_END
        except Exception as e:
            self.failure = e
            raise


class AsyncMemoryClient(AsyncAgentMethods):
    """A connection to one tiermem server for asyncio: ``MemoryClient``'s arguments and methods,
    awaited (see the module's documentation). ``channel``: a ``grpc.aio`` channel of your own
    (then ``api_key`` cannot be added to it: give the channel an interceptor)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float = 30.0,
        channel: grpc.aio.Channel | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        connections: int = 1,
        api_key: str | None = None,
        tls: bool | str | bytes | grpc.ChannelCredentials = False,
        sharded: bool = False,
    ) -> None:
        check_connections(connections, channel)
        check_timeout(timeout)
        if channel is not None and (api_key or sharded):
            raise ValueError(
                "api_key and sharded are added to the client's own channels, not to a channel given"
            )
        if channel is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "create AsyncMemoryClient in a coroutine: its channels belong to the running event loop"
                ) from None
        self.timeout = timeout
        self._plain_target = target if channel is None and not tls else None  # (for a hint about TLS)
        self.sharded = sharded
        self._own_channel = channel is None
        options = channel_options(max_message_bytes, connections)
        more = aio_route_interceptors() if sharded else []
        self.channels: list[grpc.aio.Channel] = (
            [channel]
            if channel is not None
            else [open_aio_channel(target, options, tls, api_key, more) for _ in range(connections)]
        )
        self.channel = self.channels[0]
        self.stub: pb_grpc.MemoryServiceStub = one_stub([pb_grpc.MemoryServiceStub(c) for c in self.channels])
        self._healths = [health_pb2_grpc.HealthStub(c) for c in self.channels]
        self._closing = False

    async def close(self) -> None:
        """Close the client's own channels (not a channel given); calls under way fail with
        TiermemError CANCELLED."""
        if self._own_channel:
            self._closing = True
            for c in self.channels:
                await c.close()

    @contextlib.contextmanager
    def _closing_fails(self) -> Iterator[None]:
        """Around awaiting a call: the CancelledError of a call cancelled by its channel closing
        becomes MemoryClient's TiermemError CANCELLED; one of the awaiting task itself
        (``task.cancel()``) goes on up."""
        try:
            yield
        except asyncio.CancelledError:
            task = asyncio.current_task()
            cancelling = getattr(task, "cancelling", None)  # Python 3.11+: cancellations asked of it
            by_task = bool(cancelling()) if cancelling is not None else not self._closing  # (3.10)
            if by_task:
                raise
            raise _channel_closed() from None

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, method: Any, request: Any, timeout: float | None, call_metadata: CallMetadata | None
    ) -> Any:
        """Make one unary call, as ``MemoryClient._call`` does: within ``timeout`` (None: the
        client's), with ``call_metadata``, waiting for the connection, made again while the server
        says it did not run it (starting or stopping)."""
        if self._closing:  # (grpc.aio's own error for a closed channel is a UsageError)
            raise client_closed()
        call_metadata = checked_metadata(call_metadata)
        attempts = Attempts(self.timeout if timeout is None else timeout, again=True)
        while True:
            try:
                with self._closing_fails():
                    return await method(
                        request, timeout=attempts.left(), metadata=call_metadata, wait_for_ready=True
                    )
            except grpc.RpcError as e:
                error = await self._reached(from_rpc_error(e), call_metadata)
            await asyncio.sleep(attempts.pause_after(error))  # raises the error if it is not made again

    async def _reached(self, error: TiermemError, call_metadata: CallMetadata | None) -> TiermemError:
        """``error``, saying why the server could not be reached if it is a deadline that passed
        while the call waited for its connection."""
        if isinstance(error, DeadlineExceededError) and not error.reason:
            why = await _unreachable(self._healths[0], call_metadata, only_refused=True)
            if why:
                return unreached(error, await asyncio.to_thread(with_tls_hint, why, self._plain_target))
        return error

    async def _stream(
        self, method: Any, request: Any, timeout: float | None, call_metadata: CallMetadata | None
    ) -> AsyncIterator[Any]:
        """The responses of a streaming call (no deadline unless ``timeout``), failing with
        TiermemError; a call that fails before its first response is made again as ``_call``'s are.
        A stream left unread is cancelled."""
        if self._closing:
            raise client_closed()
        call_metadata = checked_metadata(call_metadata)
        attempts = Attempts(timeout, again=True)
        while True:
            call = method(request, timeout=attempts.left(), metadata=call_metadata, wait_for_ready=True)
            try:
                with self._closing_fails():
                    response = await call.read()
                break
            except grpc.RpcError as e:
                error = await self._reached(from_rpc_error(e), call_metadata)
            await asyncio.sleep(attempts.pause_after(error))
        try:
            while response is not grpc.aio.EOF:
                yield response
                with self._closing_fails():
                    response = await call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    async def _upload(
        self, method: Any, requests: _Requests, timeout: float | None, call_metadata: CallMetadata | None
    ) -> Any:
        """A call streaming ``requests`` (not made again: they are consumed), with no deadline
        unless ``timeout``. Requests that fail fail the call as in ``MemoryClient``: TiermemError
        UNKNOWN, caused by their exception."""
        call_metadata = checked_metadata(call_metadata)
        try:
            with self._closing_fails():
                return await method(requests, timeout=timeout, metadata=call_metadata, wait_for_ready=True)
        except grpc.RpcError as e:
            raise await self._reached(from_rpc_error(e), call_metadata) from None
        except (asyncio.CancelledError, TiermemError):
            if requests.failure is None:
                raise
            # grpc.aio cancels the call when its requests fail (a CancelledError not the task's)
            raise TiermemError(grpc.StatusCode.UNKNOWN, "Exception iterating requests!") from requests.failure

    async def _pages(
        self, req: pb.ListMemoriesRequest, timeout: float | None, call_metadata: CallMetadata | None
    ) -> AsyncIterator[pb.Memory]:
        """The memories of every page of a list, from its first page on (``req`` is reused)."""
        while True:
            resp = await self._call(self.stub.ListMemories, req, timeout, call_metadata)
            for memory in resp.memories:
                yield memory
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    async def wait_ready(
        self, timeout: float | None = None, *, call_metadata: CallMetadata | None = None
    ) -> None:
        """Wait until the server reports SERVING on every connection, as ``MemoryClient.wait_ready``
        does; after ``timeout`` (None: the client's) raise UnavailableError saying what it last saw."""
        timeout = self.timeout if timeout is None else timeout
        if self._closing:
            raise client_closed()
        call_metadata = checked_metadata(call_metadata)
        deadline = ready_deadline(timeout)  # for all the connections together
        for health in self._healths:
            seen = Readiness(deadline, timeout)
            while True:
                left = seen.left()
                if left <= 0:
                    why = "" if seen.answered else await _unreachable(health, call_metadata)
                    raise seen.not_ready(await asyncio.to_thread(with_tls_hint, why, self._plain_target))
                try:
                    with self._closing_fails():
                        response = await health.Check(
                            HEALTH_REQUEST,
                            timeout=seen.check_timeout(),
                            metadata=call_metadata,
                            wait_for_ready=True,
                        )
                except grpc.RpcError as e:
                    seen.failed(e)
                else:
                    if seen.serving(response.status):
                        break
                await asyncio.sleep(seen.pause())

    # -- memories -------------------------------------------------------------------------------
    async def create(
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
        req = rq.create_request(
            namespace,
            content,
            request_id=request_id,
            dedup_similarity=dedup_similarity,
            allow_duplicates=allow_duplicates,
            confirm=confirm,
            **fields,
        )
        return (await self._call(self.stub.CreateMemory, req, timeout, call_metadata)).memory

    async def create_batch(
        self,
        memories: Iterable[pb.Memory | Mapping[str, Any]],
        *,
        request_id: str = "",
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[pb.Memory]:
        req = rq.create_batch_request(memories, request_id=request_id, confirm=confirm)
        return list((await self._call(self.stub.BatchCreateMemories, req, timeout, call_metadata)).memories)

    async def get(
        self,
        namespace: str,
        id: str,
        *,
        include_embedding: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.Memory:
        req = rq.get_request(namespace, id, include_embedding=include_embedding)
        return (await self._call(self.stub.GetMemory, req, timeout, call_metadata)).memory

    async def update(
        self,
        namespace: str,
        id: str,
        *,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        req = rq.update_request(namespace, id, confirm=confirm, **fields)
        return (await self._call(self.stub.UpdateMemory, req, timeout, call_metadata)).memory

    async def delete(
        self,
        namespace: str,
        id: str,
        *,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> None:
        req = rq.delete_request(namespace, id, confirm=confirm)
        await self._call(self.stub.DeleteMemory, req, timeout, call_metadata)

    async def list_page(
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
        req = rq.list_request(
            "list_page",
            namespace,
            page_size=page_size,
            page_token=page_token,
            include_embedding=include_embedding,
            **filter_fields,
        )
        resp = await self._call(self.stub.ListMemories, req, timeout, call_metadata)
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
    ) -> AsyncIterator[pb.Memory]:
        req = rq.list_request(
            "list_memories",
            namespace,
            page_size=page_size,
            include_embedding=include_embedding,
            **filter_fields,
        )
        return self._pages(req, timeout, call_metadata)

    async def search(
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
        return list((await self._call(self.stub.SearchMemories, req, timeout, call_metadata)).results)

    async def search_many(
        self,
        searches: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[list[pb.SearchResult]]:
        req = rq.search_many_request(searches)
        resp = await self._call(self.stub.BatchSearchMemories, req, timeout, call_metadata)
        return [list(r.results) for r in resp.responses]

    async def feedback(
        self,
        namespace: str,
        items: Iterable[Mapping[str, Any]],
        *,
        as_of: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> list[pb.Memory]:
        req = rq.feedback_request(namespace, items, as_of=as_of)
        return list((await self._call(self.stub.RecordFeedback, req, timeout, call_metadata)).memories)

    # -- server and namespaces ------------------------------------------------------------------
    async def stats(
        self, namespace: str = "", *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetStatsResponse:
        return await self._call(self.stub.GetStats, rq.stats_request(namespace), timeout, call_metadata)

    async def list_namespaces(
        self,
        prefix: str = "",
        *,
        page_size: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> AsyncIterator[pb.NamespaceInfo]:
        token = ""
        while True:
            req = rq.list_namespaces_request(prefix, page_size=page_size, page_token=token)
            resp = await self._call(self.stub.ListNamespaces, req, timeout, call_metadata)
            for namespace in resp.namespaces:
                yield namespace
            token = resp.next_page_token
            if not token:
                return

    async def delete_namespace(
        self,
        namespace: str,
        *,
        include_children: bool = False,
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> int:
        req = rq.delete_namespace_request(namespace, include_children=include_children, confirm=confirm)
        return int((await self._call(self.stub.DeleteNamespace, req, timeout, call_metadata)).deleted_count)

    # -- lifecycle ------------------------------------------------------------------------------
    async def get_namespace_config(
        self, namespace: str, *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetNamespaceConfigResponse:
        req = rq.get_namespace_config_request(namespace)
        return await self._call(self.stub.GetNamespaceConfig, req, timeout, call_metadata)

    async def update_namespace_config(
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
        req = rq.update_namespace_config_request(
            namespace,
            protected=protected,
            tiers=tiers,
            reset_policy=reset_policy,
            confirm=confirm,
            policy=rq.policy_arguments(locals()),
        )
        return await self._call(self.stub.UpdateNamespaceConfig, req, timeout, call_metadata)

    async def consolidate(
        self,
        namespace: str = "",
        *,
        dry_run: bool = False,
        max_reported_moves: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.ConsolidateMemoriesResponse:
        req = rq.consolidate_request(namespace, dry_run=dry_run, max_reported_moves=max_reported_moves)
        return await self._call(self.stub.ConsolidateMemories, req, timeout, call_metadata)

    async def transfer(
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
        return (await self._call(self.stub.TransferMemory, req, timeout, call_metadata)).memory

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
    ) -> AsyncIterator[pb.Memory]:
        req = rq.timeline_request(
            namespace, since=since, until=until, page_size=page_size, where=where, **filter_fields
        )
        return self._pages(req, timeout, call_metadata)

    async def find_similar_debates(
        self,
        namespaces: str | Sequence[str],
        topic: str,
        *,
        limit: int = 5,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **kwargs: Any,
    ) -> list[pb.SearchResult]:
        req = rq.find_similar_debates_request(namespaces, topic, limit=limit, **kwargs)
        return list((await self._call(self.stub.SearchMemories, req, timeout, call_metadata)).results)

    def export_memories(
        self,
        namespace: str = "",
        *,
        include_children: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> AsyncIterator[pb.ExportMemoriesResponse]:
        # The stream itself (not wrapped): closing it, or leaving its loop, cancels the call at once.
        req = rq.export_request(namespace, include_children=include_children)
        return self._stream(self.stub.ExportMemories, req, timeout, call_metadata)

    async def import_memories(
        self,
        chunks: Iterable[pb.ExportMemoriesResponse] | AsyncIterable[pb.ExportMemoriesResponse],
        *,
        target_namespace: str = "",
        confirm: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.ImportMemoriesResponse:
        if self.sharded and not any(k == ROUTE_HEADER for k, _ in call_metadata or ()):
            # (a client stream's key is in its metadata, sent before the first chunk)
            route: str | None
            if target_namespace:
                route = top_scope(target_namespace)
            elif isinstance(chunks, AsyncIterable):
                raise ValueError(
                    "a sharded client imports an async stream of chunks only with target_namespace, "
                    "or with call_metadata=[('tiermem-route', SCOPE)]"
                )
            else:
                route, peeked = peek_route(iter(chunks))
                chunks = cast(Iterator[pb.ExportMemoriesResponse], peeked)
            call_metadata = [*(call_metadata or ()), *([(ROUTE_HEADER, route)] if route else [])]
        requests = _Requests(chunks, target_namespace, confirm)
        return await self._upload(self.stub.ImportMemories, requests, timeout, call_metadata)

    async def promote_replica(
        self,
        *,
        leader_instance_id: str = "",
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.PromoteReplicaResponse:
        req = pb.PromoteReplicaRequest(leader_instance_id=leader_instance_id)
        return await self._call(self.stub.PromoteReplica, req, timeout, call_metadata)

    async def set_scope_routing(
        self,
        scope: str,
        routing: int | str,
        *,
        moved_to: str = "",
        purge: bool = False,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.SetScopeRoutingResponse:
        req = rq.set_scope_routing_request(scope, routing, moved_to, purge)
        return await self._call(self.stub.SetScopeRouting, req, timeout, call_metadata)

    async def get_scope_routing(
        self, scope: str, *, timeout: float | None = None, call_metadata: CallMetadata | None = None
    ) -> pb.GetScopeRoutingResponse:
        req = pb.GetScopeRoutingRequest(scope=scope)
        return await self._call(self.stub.GetScopeRouting, req, timeout, call_metadata)


def _share_docstrings() -> None:
    """Each public method without a docstring of its own takes ``MemoryClient``'s: one text for both."""
    for cls in (AsyncMemoryClient, AsyncAgentMethods):
        for name, method in vars(cls).items():
            if not name.startswith("_") and callable(method) and method.__doc__ is None:
                method.__doc__ = getattr(MemoryClient, name).__doc__


_share_docstrings()
