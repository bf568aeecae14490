"""``MemoryClient``: typed Python access to a tiermem server.

Results are the generated ``tiermem.v1`` messages (``Memory``, ``SearchResult``), so every field of
the contract is there, typed by the shipped ``.pyi`` stubs. Failures raise ``TiermemError``
subclasses carrying ``code``, ``reason`` and the invalid ``fields``.

Creates always carry a ``request_id`` (a fresh one unless you pass yours), and the channel retries
calls that failed with UNAVAILABLE; a retried create returns the first result instead of storing
the memory twice. ``RecordFeedback`` is not retried (it counts accesses).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import grpc
from google.protobuf import field_mask_pb2
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tiermem._values import metadata_values, set_metadata, set_timestamp
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

from .errors import from_rpc_error

TimeLike = dt.datetime | float | int

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


def metadata_dict(memory: pb.Memory) -> dict[str, Any]:
    """A memory's metadata as plain Python values."""
    return {k: v for k, v in metadata_values(memory.metadata).items() if v is not None}


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
    time in 128)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        timeout: float = 30.0,
        channel: grpc.Channel | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        connections: int = 1,
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
        ]
        if connections > 1:  # channels with equal options would otherwise share one connection
            options.append(("grpc.use_local_subchannel_pool", 1))
        self.channels: list[grpc.Channel] = (
            [channel]
            if channel is not None
            else [grpc.insecure_channel(target, options=options) for _ in range(connections)]
        )
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

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until the server reports SERVING on every connection (raises UnavailableError
        after ``timeout``)."""
        from .errors import UnavailableError

        deadline = time.monotonic() + timeout  # for all the connections together
        for channel, health in zip(self.channels, self._healths, strict=True):
            try:
                grpc.channel_ready_future(channel).result(timeout=max(0.0, deadline - time.monotonic()))
                resp = health.Check(
                    health_pb2.HealthCheckRequest(service="tiermem.v1.MemoryService"),
                    timeout=max(0.001, deadline - time.monotonic()),
                    wait_for_ready=True,
                )
            except (grpc.FutureTimeoutError, grpc.RpcError) as e:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, f"server not ready: {e}") from None
            if resp.status != health_pb2.HealthCheckResponse.SERVING:
                raise UnavailableError(grpc.StatusCode.UNAVAILABLE, "server is not SERVING")

    # -- memories -------------------------------------------------------------------------------
    def create(
        self,
        namespace: str,
        content: str,
        *,
        request_id: str = "",
        dedup_similarity: float | None = None,
        allow_duplicates: bool = False,
        **fields: Any,
    ) -> pb.Memory:
        """Store one memory; ``fields`` are those of ``build_memory`` (tier, importance, tags, ...).

        An exact duplicate (same normalized content in the namespace, no client id) reinforces the
        existing memory and returns it, unless ``allow_duplicates``; ``dedup_similarity`` also
        catches near duplicates by vector similarity."""
        req = pb.CreateMemoryRequest(
            memory=build_memory(namespace, content, **fields),
            request_id=request_id or uuid.uuid4().hex,
            allow_duplicates=allow_duplicates,
        )
        if dedup_similarity is not None:
            req.dedup_similarity = dedup_similarity
        return self._call(self.stub.CreateMemory, req).memory

    def create_batch(
        self, memories: Iterable[pb.Memory | Mapping[str, Any]], *, request_id: str = ""
    ) -> list[pb.Memory]:
        """Store all memories or none; items are ``Memory`` messages or dicts of ``build_memory`` args."""
        msgs = [m if isinstance(m, pb.Memory) else build_memory(**m) for m in memories]
        req = pb.BatchCreateMemoriesRequest(memories=msgs, request_id=request_id or uuid.uuid4().hex)
        return list(self._call(self.stub.BatchCreateMemories, req).memories)

    def get(self, namespace: str, id: str, *, include_embedding: bool = False) -> pb.Memory:
        req = pb.GetMemoryRequest(namespace=namespace, id=id, include_embedding=include_embedding)
        return self._call(self.stub.GetMemory, req).memory

    def update(self, namespace: str, id: str, *, confirm: bool = False, **fields: Any) -> pb.Memory:
        """Change the given fields only (e.g. ``update(ns, id, importance=0.9, tags=["x"])``);
        ``confirm=True`` is needed in a protected namespace."""
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
        return self._call(self.stub.UpdateMemory, req).memory

    def delete(self, namespace: str, id: str, *, confirm: bool = False) -> None:
        """Delete a memory (``confirm=True`` in a protected namespace)."""
        self._call(
            self.stub.DeleteMemory, pb.DeleteMemoryRequest(namespace=namespace, id=id, confirm=confirm)
        )

    def list_page(
        self,
        namespace: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        include_embedding: bool = False,
        **filter_fields: Any,
    ) -> tuple[list[pb.Memory], str]:
        """One page of a namespace, oldest first, and the token of the next page ('' at the end)."""
        req = pb.ListMemoriesRequest(
            namespace=namespace,
            page_size=page_size,
            page_token=page_token,
            filter=build_filter(**filter_fields),
            include_embedding=include_embedding,
        )
        resp = self._call(self.stub.ListMemories, req)
        return list(resp.memories), resp.next_page_token

    def list_memories(
        self, namespace: str, *, page_size: int = 0, include_embedding: bool = False, **filter_fields: Any
    ) -> Iterator[pb.Memory]:
        """Every memory of a namespace (matching the filter), fetched page by page."""
        token = ""
        while True:
            page, token = self.list_page(
                namespace,
                page_size=page_size,
                page_token=token,
                include_embedding=include_embedding,
                **filter_fields,
            )
            yield from page
            if not token:
                return

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
        created_after, created_before.
        """
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
        return list(self._call(self.stub.SearchMemories, req).results)

    def feedback(
        self, namespace: str, items: Iterable[Mapping[str, Any]], *, as_of: TimeLike | None = None
    ) -> list[pb.Memory]:
        """Report use of retrieved memories: each item has ``id`` and optionally
        ``predicted_relevance``, ``actual_usefulness`` (both in [0, 1]) and ``success``."""
        req = pb.RecordFeedbackRequest(namespace=namespace, items=[pb.Feedback(**dict(i)) for i in items])
        if as_of is not None:
            req.as_of.CopyFrom(_timestamp(as_of))
        return list(self._call(self.stub.RecordFeedback, req).memories)

    # -- server and namespaces ------------------------------------------------------------------
    def stats(self, namespace: str = "") -> pb.GetStatsResponse:
        return self._call(self.stub.GetStats, pb.GetStatsRequest(namespace=namespace))

    def list_namespaces(self, prefix: str = "", *, page_size: int = 0) -> Iterator[pb.NamespaceInfo]:
        token = ""
        while True:
            resp = self._call(
                self.stub.ListNamespaces,
                pb.ListNamespacesRequest(prefix=prefix, page_size=page_size, page_token=token),
            )
            yield from resp.namespaces
            token = resp.next_page_token
            if not token:
                return

    def delete_namespace(
        self, namespace: str, *, include_children: bool = False, confirm: bool = False
    ) -> int:
        """Delete every memory of a namespace (and of ``namespace/...`` with ``include_children``):
        the one call that clears a task or session scope. Returns how many were deleted."""
        req = pb.DeleteNamespaceRequest(
            namespace=namespace, include_children=include_children, confirm=confirm
        )
        return int(self._call(self.stub.DeleteNamespace, req).deleted_count)

    # -- lifecycle ------------------------------------------------------------------------------
    def get_namespace_config(self, namespace: str) -> pb.GetNamespaceConfigResponse:
        """The namespace's stored settings (``.config``) and the complete policy in effect (``.effective``)."""
        return self._call(self.stub.GetNamespaceConfig, pb.GetNamespaceConfigRequest(namespace=namespace))

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
        reset_policy: bool = False,
        confirm: bool = False,
    ) -> pb.UpdateNamespaceConfigResponse:
        """Change only what is given. ``tiers`` maps a tier to overrides of ttl_seconds, max_items,
        importance_threshold, half_life_hours, cadence_seconds (it replaces earlier tier overrides);
        ``retention`` is importance_weighted, recency, fifo or lru; ``reset_policy`` drops every
        lifecycle override first. Unprotecting a protected namespace needs ``confirm=True``."""
        cfg = pb.NamespaceConfig(namespace=namespace, protected=bool(protected))
        paths = ["protected"] if protected is not None else []
        if reset_policy:
            paths.append("policy")
        if tiers is not None:
            for tier, fields in tiers.items():
                cfg.policy.tiers.add(tier=tier_value(tier), **fields)
            paths.append("policy.tiers")
        if retention is not None:
            chosen = (
                retention
                if isinstance(retention, int)
                else pb.RetentionPolicy.Value(f"RETENTION_POLICY_{retention.upper()}")
            )
            cfg.policy.retention = chosen  # type: ignore[assignment,unused-ignore]
            paths.append("policy.retention")
        for name, value in (
            ("delete_from_glacial", delete_from_glacial),
            ("promote_access_count", promote_access_count),
            ("promote_surprise", promote_surprise),
            ("promote_success_count", promote_success_count),
        ):
            if value is not None:
                setattr(cfg.policy, name, value)
                paths.append(f"policy.{name}")
        if not paths:
            raise ValueError("update_namespace_config needs something to change")
        req = pb.UpdateNamespaceConfigRequest(
            config=cfg, update_mask=field_mask_pb2.FieldMask(paths=paths), confirm=confirm
        )
        return self._call(self.stub.UpdateNamespaceConfig, req)

    def consolidate(
        self, namespace: str = "", *, dry_run: bool = False, max_reported_moves: int = 0
    ) -> pb.ConsolidateMemoriesResponse:
        """Run a lifecycle pass now over one namespace or all (expiry, promotion, demotion, capacity);
        ``dry_run`` reports the moves without making them."""
        req = pb.ConsolidateMemoriesRequest(
            namespace=namespace, dry_run=dry_run, max_reported_moves=max_reported_moves
        )
        return self._call(self.stub.ConsolidateMemories, req)

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
        return self._call(self.stub.TransferMemory, req).memory

    # -- streams, debates, backup ---------------------------------------------------------------
    def timeline(
        self,
        namespace: str,
        *,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        page_size: int = 0,
        **filter_fields: Any,
    ) -> Iterator[pb.Memory]:
        """An agent's memory stream, newest first, optionally within [since, until)."""
        where: dict[str, Any] = {}
        if since is not None:
            where["create_time"] = {"$gte": _seconds(since)}
        if until is not None:
            where.setdefault("create_time", {})["$lt"] = _seconds(until)
        token = ""
        while True:
            req = pb.ListMemoriesRequest(
                namespace=namespace,
                page_size=page_size,
                page_token=token,
                newest_first=True,
                filter=build_filter(where=where or None, **filter_fields),
            )
            resp = self._call(self.stub.ListMemories, req)
            yield from resp.memories
            token = resp.next_page_token
            if not token:
                return

    def find_similar_debates(
        self, namespaces: str | Sequence[str], topic: str, *, limit: int = 5, **kwargs: Any
    ) -> list[pb.SearchResult]:
        """Consensus and dissent records (kinds "consensus", "dissent") closest to ``topic``."""
        return self.search(namespaces, topic, limit=limit, kinds=["consensus", "dissent"], **kwargs)

    def export_memories(
        self, namespace: str = "", *, include_children: bool = False
    ) -> Iterator[pb.ExportMemoriesResponse]:
        """Stream a consistent snapshot: the header chunk, then every memory with its vector, the
        namespaces' progress toward a reflection and a summary, and the graph."""
        try:
            yield from self.stub.ExportMemories(
                pb.ExportMemoriesRequest(namespace=namespace, include_children=include_children), timeout=None
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def import_memories(
        self, chunks: Iterable[pb.ExportMemoriesResponse], *, target_namespace: str = ""
    ) -> pb.ImportMemoriesResponse:
        """Restore the chunks of an export (e.g. ``export_memories``' output, possibly saved and
        read back), optionally under another namespace."""

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

        try:
            return self.stub.ImportMemories(requests(), timeout=None)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # -- agent memory: reflection and summaries ------------------------------------------------
    def observe(
        self, namespace: str, content: str, *, kind: str = "observation", request_id: str = "", **fields: Any
    ) -> pb.CreateMemoryResponse:
        """Store an observation and return the whole response: ``.memory``, ``.reflection_due`` and
        ``.summary_due`` tell the agent when to reflect or summarize."""
        req = pb.CreateMemoryRequest(
            memory=build_memory(namespace, content, kind=kind, **fields),
            request_id=request_id or uuid.uuid4().hex,
        )
        return self._call(self.stub.CreateMemory, req)

    def reflection_candidates(self, namespace: str, *, limit: int = 0) -> pb.GetReflectionCandidatesResponse:
        """The most recent observations (newest first) and the reflection accumulator."""
        req = pb.GetReflectionCandidatesRequest(namespace=namespace, limit=limit)
        return self._call(self.stub.GetReflectionCandidates, req)

    def reflect(
        self,
        namespace: str,
        insight: str,
        *,
        source_memory_ids: Iterable[str],
        questions: Iterable[str] = (),
        importance: float = 0.9,
        **fields: Any,
    ) -> pb.Memory:
        """Store a reflection (kind "reflection", importance >= 0.8) derived from observations;
        it resets the namespace's reflection accumulator."""
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
        return self._call(self.stub.CreateMemory, req).memory

    def build_summary(self, namespace: str, *, max_tokens: int = 0) -> pb.BuildSummaryResponse:
        """A built-in extractive summary of the memories since the last summary (no LLM)."""
        req = pb.BuildSummaryRequest(namespace=namespace, max_tokens=max_tokens)
        return self._call(self.stub.BuildSummary, req)

    def summarize(
        self, namespace: str, text: str, *, source_memory_ids: Iterable[str], **fields: Any
    ) -> pb.Memory:
        """Store a rolling summary of the scope: it replaces the previous summary and resets the
        summary token count."""
        return self.create(namespace, text, kind="summary", source_memory_ids=source_memory_ids, **fields)

    # -- graph memory ---------------------------------------------------------------------------
    def upsert_node(
        self,
        namespace: str,
        node_id: str,
        *,
        label: str = "",
        properties: Mapping[str, Any] | None = None,
        memory_ids: Iterable[str] = (),
    ) -> pb.GraphNode:
        """Create or replace a graph node (an entity the agent records explicitly)."""
        node = pb.GraphNode(id=node_id, label=label, memory_ids=list(memory_ids))
        if properties:
            set_metadata(node.properties, properties)
        return self._call(
            self.stub.UpsertGraphNode, pb.UpsertGraphNodeRequest(namespace=namespace, node=node)
        ).node

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
        return self._call(self.stub.AddGraphEdge, pb.AddGraphEdgeRequest(namespace=namespace, edge=edge)).edge

    def invalidate_edge(self, namespace: str, edge_id: str, *, at: TimeLike | None = None) -> pb.GraphEdge:
        """End a fact's validity (it stays in history)."""
        req = pb.InvalidateGraphEdgeRequest(namespace=namespace, edge_id=edge_id)
        if at is not None:
            req.invalid_from.CopyFrom(_timestamp(at))
        return self._call(self.stub.InvalidateGraphEdge, req).edge

    def neighbors(
        self,
        namespace: str,
        node_id: str,
        *,
        depth: int = 1,
        limit: int = 0,
        as_of: TimeLike | None = None,
        include_invalid: bool = False,
    ) -> pb.GetGraphNeighborsResponse:
        """Nodes (breadth first) and edges around ``node_id`` that hold at ``as_of``."""
        req = pb.GetGraphNeighborsRequest(
            namespace=namespace, node_id=node_id, depth=depth, limit=limit, include_invalid=include_invalid
        )
        if as_of is not None:
            req.as_of.CopyFrom(_timestamp(as_of))
        return self._call(self.stub.GetGraphNeighbors, req)

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
    ) -> pb.BuildContextResponse:
        """A token-budgeted context package for an agent turn: ``scopes`` narrowest first (namespace
        strings, or dicts with namespace, share, semantic_k, recent_window)."""
        req = pb.BuildContextRequest(
            query_text=query,
            token_budget=token_budget,
            head_tail=head_tail,
            graph_facts=graph_facts,
            read_only=read_only,
        )
        for scope in scopes:
            req.scopes.add(**({"namespace": scope} if isinstance(scope, str) else dict(scope)))
        return self._call(self.stub.BuildContext, req)
