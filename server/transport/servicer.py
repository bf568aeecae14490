"""The gRPC MemoryService: validate the shape, call the engine (or the agent services over it: graph
memory, context assembly, summaries), build the response. Nothing else."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

from tiermem.server.agent.context import Assembler
from tiermem.server.agent.graph import GraphMemory
from tiermem.server.agent.summaries import build_summary
from tiermem.server.core.engine import Engine
from tiermem.server.model.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    ResourceExhausted,
    ResponseTooLarge,
    TiermemError,
    Unavailable,
)
from tiermem.server.model.records import Record
from tiermem.server.model.reports import (
    ExportItem,
)
from tiermem.server.model.validation import MAX_LINKED_IDS, MAX_TAG, batch
from tiermem.server.search.searcher import SearchHit, SearchHits
from tiermem.server.transport import convert, logs
from tiermem.server.transport.auth import caller, key_still_valid
from tiermem.server.transport.replication import ReplicaAcks, ReplicaFollower, serve_changes
from tiermem.server.transport.routing import WriteGate
from tiermem.server.transport.status import to_status
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _rpc(method: F) -> F:
    """Turn domain errors into rich gRPC statuses; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    def wrapper(self: MemoryServicer, request: Any, context: grpc.ServicerContext) -> Any:
        left = context.time_remaining()
        try:
            return method(self, request, context)
        except Exception as e:
            _abort(method.__name__, e, context, left, self.stopping)

    return wrapper  # type: ignore[return-value]


def _abort(
    name: str, e: Exception, context: grpc.ServicerContext, left: float | None, stopping: bool
) -> None:
    """End the call with ``e`` as its status: a domain error as it is, anything else as INTERNAL
    (logged); one that ended meanwhile (nobody is left to answer) as why it ended, so that it is
    counted so: its caller cancelled, its deadline passed, the server stopping (``left``: the time
    it had when its handler began)."""
    if isinstance(e, (DeadlineExceeded, grpc.RpcError)) and not context.is_active():
        code = logs.ended_early(context, left, stopping)
        logger.info("%s: %s", name, logs.ENDED[code])
        context.abort(getattr(grpc.StatusCode, code), logs.ENDED[code])
    if isinstance(e, TiermemError):
        status = to_status(e)
    else:
        logger.error("%s failed", name, exc_info=e)
        status = to_status(TiermemError(f"internal error: {type(e).__name__}"))
    context.abort_with_status(status)


def _rpc_stream(method: F) -> F:
    """``_rpc`` for server-streaming methods: errors raised while streaming become statuses too."""

    @functools.wraps(method)
    def wrapper(self: MemoryServicer, request: Any, context: grpc.ServicerContext) -> Any:
        left = context.time_remaining()
        try:
            yield from method(self, request, context)
        except Exception as e:
            _abort(method.__name__, e, context, left, self.stopping)

    return wrapper  # type: ignore[return-value]


def _still_wanted(context: grpc.ServicerContext | None) -> Callable[[], bool] | None:
    """Is the caller still waiting: the call is active and its deadline (if any) not passed."""
    if context is None:
        return None

    def wanted() -> bool:
        left = context.time_remaining()
        return bool(context.is_active()) and (left is None or left > 0)

    return wanted


_SET_BY_SERVER = 768  # most bytes an answer adds to a stored memory (id, times, counters, framing)


def _tell_fallback(hits: list[SearchHit], resp: pb.SearchMemoriesResponse) -> None:
    """A search whose query text could not be embedded says it was ranked by keywords alone."""
    if isinstance(hits, SearchHits) and hits.keyword_only:
        resp.keyword_only = True
        resp.warnings.extend(hits.warnings)


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """Serves calls once ``attach`` gave it an engine (until then: UNAVAILABLE, STARTING). Without
    an assembler and a graph (a search follower's servicer), their calls are UNAVAILABLE too."""

    def __init__(
        self,
        engine: Engine | None = None,
        assembler: Assembler | None = None,
        graph: GraphMemory | None = None,
    ) -> None:
        self.engine: Engine | None = None  # None while the server starts (health: NOT_SERVING)
        self.gate: WriteGate | None = None  # the write calls in flight per scope (fences wait for them)
        self.acks: ReplicaAcks | None = None  # with replication: what each replica has stored
        self.replica_follower: ReplicaFollower | None = None  # on a replica: its call to the leader
        self.stopping = False  # set as the server stops: the calls it cancels end UNAVAILABLE
        self.assembler: Assembler | None = None
        self.graph: GraphMemory | None = None
        self._streams: threading.BoundedSemaphore | None = None
        self._streams_lock = threading.Lock()
        self._key_streams: dict[str, int] = {}  # API key id -> its streams running
        if engine is not None:
            self.attach(engine, assembler, graph)

    def attach(self, engine: Engine, assembler: Assembler | None, graph: GraphMemory | None) -> None:
        """Start serving with ``engine`` (set last: calls see the agent services once it is set)."""
        self.assembler, self.graph = assembler, graph
        self.engine = engine

    @contextlib.contextmanager
    def _stream_slot(self) -> Iterator[None]:
        """A streaming export or import holds a handler thread for as long as it runs: at most half
        of them may be streams, so unary calls always find a thread, and one API key holds all
        but one of those at most, so one tenant's streams cannot shut out every other tenant's
        (RESOURCE_EXHAUSTED beyond)."""
        workers = self._engine.config.max_workers
        slots = max(1, workers // 2)
        key = caller()
        with self._streams_lock:
            if self._streams is None:
                self._streams = threading.BoundedSemaphore(slots)
            gate = self._streams
            held = self._key_streams.get(key.id, 0) if key is not None else 0
            if key is not None and held >= max(1, slots - 1):
                raise ResourceExhausted(
                    f"this API key runs {held} export/import streams already, the most one key may"
                    " (one is kept for other keys); retry when one finishes",
                    reason="TOO_MANY_STREAMS",
                )
            if not gate.acquire(blocking=False):
                raise ResourceExhausted(
                    f"at most {slots} export/import streams run at once "
                    f"(max_workers={workers}); retry when one finishes",
                    reason="TOO_MANY_STREAMS",
                )
            if key is not None:
                self._key_streams[key.id] = held + 1
        try:
            yield
        finally:
            with self._streams_lock:
                if key is not None:
                    left = self._key_streams.pop(key.id) - 1
                    if left:
                        self._key_streams[key.id] = left
            gate.release()

    @property
    def _engine(self) -> Engine:
        if self.engine is None:
            raise Unavailable("server is starting", reason="STARTING")
        return self.engine

    @property
    def _graph(self) -> GraphMemory:
        if self.engine is None or self.graph is None:
            raise Unavailable("server is starting", reason="STARTING")
        return self.graph

    @property
    def _assembler(self) -> Assembler:
        if self.engine is None or self.assembler is None:
            raise Unavailable("server is starting", reason="STARTING")
        return self.assembler

    @_rpc
    def CreateMemory(
        self, request: pb.CreateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.CreateMemoryResponse:
        spec = convert.new_memory_from_pb(request.memory, "memory.")
        out = self._engine.create_detailed(
            [spec],
            request.request_id,
            allow_duplicates=request.allow_duplicates,
            confirm=request.confirm,
            dedup_similarity=request.dedup_similarity if request.HasField("dedup_similarity") else None,
        )
        [rec], [dup] = out.records, out.reinforced
        due = out.due[rec.namespace]
        [pending] = self._embedding_pending(out.records)
        return pb.CreateMemoryResponse(
            memory=convert.memory_to_pb(rec),
            deduplicated=dup,
            reflection_due=due.reflection,
            summary_due=due.summary,
            embedding_pending=pending,
        )

    @_rpc
    def BatchCreateMemories(
        self, request: pb.BatchCreateMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.BatchCreateMemoriesResponse:
        batch("memories", request.memories, self._engine.config.max_batch_size)  # (first: what to change)
        specs = [convert.new_memory_from_pb(m, f"memories[{i}].") for i, m in enumerate(request.memories)]
        self._check_batch_answer_fits(request)
        out = self._engine.create_detailed(
            specs,
            request.request_id,
            batch=True,
            allow_duplicates=request.allow_duplicates,
            confirm=request.confirm,
            dedup_similarity=request.dedup_similarity if request.HasField("dedup_similarity") else None,
        )
        resp = pb.BatchCreateMemoriesResponse(
            deduplicated=out.reinforced,
            reflection_due_namespaces=sorted(ns for ns, due in out.due.items() if due.reflection),
            summary_due_namespaces=sorted(ns for ns, due in out.due.items() if due.summary),
            embedding_pending=self._embedding_pending(out.records),
        )
        for rec in out.records:
            convert.memory_to_pb(rec, out=resp.memories.add())
        return resp

    def _check_batch_answer_fits(self, request: pb.BatchCreateMemoriesRequest) -> None:
        """RESOURCE_EXHAUSTED before a batch is stored whose answer (the memories as stored, without
        vectors, with the fields the server sets) could not be sent: stored, but answered with an
        error, a retry would find its request id taken or store the batch twice."""
        cfg = self._engine.config
        vectors = sum(4 * len(m.embedding) for m in request.memories)
        if (
            request.ByteSize() - vectors + _SET_BY_SERVER * len(request.memories) + 1024
            > cfg.max_message_bytes
        ):
            raise ResponseTooLarge(
                f"the answer would take over the {cfg.max_message_bytes} bytes a message may hold:"
                " send the memories in smaller batches"
            )

    def _embedding_pending(self, records: list[Record]) -> list[bool]:
        """Per record, whether it is stored without its vector for now (the embedder failed; the
        maintenance pass embeds it): as stored, so a duplicate or a replayed create answers with the
        memory's state now."""
        return self._engine.embedding_pending(records)

    @_rpc
    def GetMemory(self, request: pb.GetMemoryRequest, context: grpc.ServicerContext) -> pb.GetMemoryResponse:
        rec, vec = self._engine.get(request.namespace, request.id, request.include_embedding)
        return pb.GetMemoryResponse(memory=convert.memory_to_pb(rec, vec))

    @_rpc
    def UpdateMemory(
        self, request: pb.UpdateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.UpdateMemoryResponse:
        m, paths = request.memory, list(request.update_mask.paths)
        changes = convert.memory_changes_from_pb(m, paths)
        rec = self._engine.update(m.namespace, m.id, changes, paths, request.confirm)
        return pb.UpdateMemoryResponse(memory=convert.memory_to_pb(rec))

    @_rpc
    def DeleteMemory(
        self, request: pb.DeleteMemoryRequest, context: grpc.ServicerContext
    ) -> pb.DeleteMemoryResponse:
        self._engine.delete(request.namespace, request.id, request.confirm)
        return pb.DeleteMemoryResponse()

    @_rpc
    def ListMemories(
        self, request: pb.ListMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.ListMemoriesResponse:
        eng = self._engine
        flt = eng.check_filter(convert.filter_from_pb(request.filter))
        recs, token = eng.list_memories(
            request.namespace,
            request.page_size,
            request.page_token,
            flt,
            request.newest_first,
            request.include_embedding,
            eng.config.max_message_bytes // 2,  # (a page always fits: it ends early, with its token)
        )
        vecs = eng.vectors_of(recs) if request.include_embedding else [None] * len(recs)
        resp = pb.ListMemoriesResponse(next_page_token=token)
        for rec, vec in zip(recs, vecs, strict=True):
            convert.memory_to_pb(rec, vec, out=resp.memories.add())
        return resp

    @_rpc
    def SearchMemories(
        self, request: pb.SearchMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.SearchMemoriesResponse:
        self._tell_process(context)
        return self._search(request, context)

    def _check_fits(self, searches: Any) -> None:
        """RESOURCE_EXHAUSTED, before any work, when the answers could not fit one message: each hit
        with its vector takes 4 bytes a dimension of the query's vector. (A text query's hits are
        measured once found: sizing them by the widest space would tell a key that another
        tenant's space exists, and how wide it is.)"""
        eng = self._engine
        least = 0
        for s in searches:
            if s.include_embedding:  # (the common search without vectors costs nothing here)
                limit = min(max(s.limit, 0) or 10, eng.config.max_search_limit)  # (as query.py takes it)
                least += limit * 4 * len(s.query_embedding)
        if least > eng.config.max_message_bytes:
            raise ResponseTooLarge(
                f"the answer would take at least {least} bytes, over the {eng.config.max_message_bytes}"
                " a message may hold: ask for fewer results, or without include_embedding"
            )

    def _check_sent_whole(self, resp: Any, hits: int) -> None:
        """RESOURCE_EXHAUSTED, before the hits count as accessed, when the answer is over the
        message limit (measured only when its hits could reach it)."""
        cfg = self._engine.config
        most_a_hit = (  # (every field at its limit: a linked id takes 132 bytes, a question 1028)
            cfg.max_content_bytes
            + 2 * cfg.max_metadata_bytes
            + cfg.max_tags * (MAX_TAG + 4 + 1028)
            + 132 * MAX_LINKED_IDS
            + 4 * cfg.max_dimension
            + 4096
        )
        if hits * most_a_hit > cfg.max_message_bytes:
            self._refuse_if_over(resp.ByteSize(), "ask for fewer results (or fewer searches in a batch)")

    def _refuse_if_over(self, size: int, advice: str) -> None:
        most = self._engine.config.max_message_bytes
        if size > most:
            raise ResponseTooLarge(
                f"the answer takes {size} bytes, over the {most} a message may hold: {advice}"
            )

    def _tell_process(self, context: grpc.ServicerContext) -> None:
        """With search followers, a search's trailing metadata names the process that ranked it."""
        if self._engine.config.search_processes > 1:
            context.set_trailing_metadata((("tiermem-search-process", str(os.getpid())),))

    def _search(
        self, request: pb.SearchMemoriesRequest, context: grpc.ServicerContext | None
    ) -> pb.SearchMemoriesResponse:
        self._check_fits([request])
        q = convert.search_from_pb(request)
        hits = self._engine.search(q, request.include_embedding, _still_wanted(context), record=False)
        resp = pb.SearchMemoriesResponse()
        for hit in hits:
            convert.hit_to_pb(hit, resp.results.add(), request.explain)
        _tell_fallback(hits, resp)
        self._check_sent_whole(resp, len(hits))
        self._engine.record_hits(q, hits)
        return resp

    @_rpc
    def BatchSearchMemories(
        self, request: pb.BatchSearchMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.BatchSearchMemoriesResponse:
        self._tell_process(context)
        if not 1 <= len(request.searches) <= 100:
            raise InvalidArgument("searches", "must hold 1 to 100 searches")
        self._check_fits(request.searches)
        queries, malformed = convert.searches_from_pb(request.searches)
        results = self._engine.search_many(queries, _still_wanted(context), record=False)
        if malformed is not None:  # (after those before it: the first failing search is the error)
            raise malformed
        resp = pb.BatchSearchMemoriesResponse()
        for search, hits in zip(request.searches, results, strict=True):
            out = resp.responses.add()
            for hit in hits:
                convert.hit_to_pb(hit, out.results.add(), search.explain)
            _tell_fallback(hits, out)
        self._check_sent_whole(resp, sum(len(hits) for hits in results))
        for (q, _), hits in zip(queries, results, strict=True):
            self._engine.record_hits(q, hits)
        return resp

    @_rpc
    def RecordFeedback(
        self, request: pb.RecordFeedbackRequest, context: grpc.ServicerContext
    ) -> pb.RecordFeedbackResponse:
        as_of = convert.ts_to_float(request, "as_of")
        recs = self._engine.feedback(request.namespace, convert.feedback_from_pb(request.items), as_of)
        resp = pb.RecordFeedbackResponse()
        for rec in recs:
            convert.memory_to_pb(rec, out=resp.memories.add())
        return resp

    @_rpc
    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> pb.GetStatsResponse:
        key = caller()
        within = None if key is None or key.everything else key.under
        report = self._engine.stats(request.namespace, within=within)
        scope = self._engine.scope(request.namespace) if request.namespace else None
        return convert.stats_to_pb(report, scope)

    @_rpc
    def ListNamespaces(
        self, request: pb.ListNamespacesRequest, context: grpc.ServicerContext
    ) -> pb.ListNamespacesResponse:
        key = caller()
        within = None if key is None or key.everything else key.under
        page, token = self._engine.list_namespaces(
            request.prefix, request.page_size, request.page_token, within=within
        )
        return pb.ListNamespacesResponse(
            namespaces=[pb.NamespaceInfo(name=n, memory_count=c) for n, c in page], next_page_token=token
        )

    @_rpc
    def DeleteNamespace(
        self, request: pb.DeleteNamespaceRequest, context: grpc.ServicerContext
    ) -> pb.DeleteNamespaceResponse:
        count = self._engine.delete_namespace(request.namespace, request.include_children, request.confirm)
        return pb.DeleteNamespaceResponse(deleted_count=count)

    @_rpc_stream
    def ReplicateChanges(
        self, requests: Iterator[pb.ReplicateChangesRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ReplicateChangesResponse]:
        first = next(requests, None)  # (read first: an undecodable request is INVALID_ARGUMENT)
        if first is None:
            return
        if self.acks is None:
            raise FailedPrecondition(
                "this server feeds no replicas: start it with replication", "NOT_REPLICATING"
            )
        with self._stream_slot():
            context.send_initial_metadata(())  # (the replica knows it is fed, before any change comes)
            still = _still_wanted(context) or (lambda: True)

            def wanted() -> bool:  # (an idle feed looks at its key as it waits: a revoked one ends it)
                key_still_valid()
                return still()

            yield from serve_changes(self._engine, first, requests, wanted, self.acks)

    @_rpc
    def PromoteReplica(
        self, request: pb.PromoteReplicaRequest, context: grpc.ServicerContext
    ) -> pb.PromoteReplicaResponse:
        follower = self.replica_follower
        instance, seq, count = self._engine.promote(
            request.leader_instance_id, follower.stop if follower is not None else lambda: None
        )
        return pb.PromoteReplicaResponse(leader_instance_id=instance, applied_seq=seq, memory_count=count)

    @_rpc
    def SetScopeRouting(
        self, request: pb.SetScopeRoutingRequest, context: grpc.ServicerContext
    ) -> pb.SetScopeRoutingResponse:
        gate = self.gate

        def drain() -> None:  # the writes admitted before the fence end before it answers
            if gate is not None:
                left = context.time_remaining()
                gate.drain(request.scope, 30.0 if left is None else max(0.0, left - 0.1))

        state, purged = self._engine.set_scope_routing(
            request.scope, request.routing, request.moved_to, request.purge, drain
        )
        return pb.SetScopeRoutingResponse(routing=state, purged_count=purged)  # type: ignore[arg-type]

    @_rpc
    def GetScopeRouting(
        self, request: pb.GetScopeRoutingRequest, context: grpc.ServicerContext
    ) -> pb.GetScopeRoutingResponse:
        state, moved_to = self._engine.get_scope_routing(request.scope)
        return pb.GetScopeRoutingResponse(routing=state, moved_to=moved_to)  # type: ignore[arg-type]

    @_rpc
    def GetNamespaceConfig(
        self, request: pb.GetNamespaceConfigRequest, context: grpc.ServicerContext
    ) -> pb.GetNamespaceConfigResponse:
        stored, effective = self._engine.get_namespace_config(request.namespace)
        cfg, eff = convert.namespace_config_to_pb(request.namespace, stored, effective)
        return pb.GetNamespaceConfigResponse(config=cfg, effective=eff)

    @_rpc
    def UpdateNamespaceConfig(
        self, request: pb.UpdateNamespaceConfigRequest, context: grpc.ServicerContext
    ) -> pb.UpdateNamespaceConfigResponse:
        c = request.config
        stored, effective = self._engine.update_namespace_config(
            c.namespace,
            c.protected,
            convert.policy_overrides_from_pb(c.policy),
            list(request.update_mask.paths),
            request.confirm,
        )
        cfg, eff = convert.namespace_config_to_pb(c.namespace, stored, effective)
        return pb.UpdateNamespaceConfigResponse(config=cfg, effective=eff)

    @_rpc
    def ConsolidateMemories(
        self, request: pb.ConsolidateMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.ConsolidateMemoriesResponse:
        report = self._engine.consolidate(
            request.namespace, dry_run=request.dry_run, max_reported=request.max_reported_moves or 1000
        )
        return convert.consolidation_to_pb(report)

    @_rpc
    def TransferMemory(
        self, request: pb.TransferMemoryRequest, context: grpc.ServicerContext
    ) -> pb.TransferMemoryResponse:
        if request.mode not in (pb.TRANSFER_MODE_COPY, pb.TRANSFER_MODE_MOVE):
            raise InvalidArgument("mode", "must be TRANSFER_MODE_COPY or TRANSFER_MODE_MOVE")
        rec = self._engine.transfer(
            request.namespace,
            request.id,
            target_namespace=request.target_namespace,
            target_tier=int(request.target_tier),
            move=request.mode == pb.TRANSFER_MODE_MOVE,
            target_id=request.target_id,
            overwrite=request.overwrite,
            confirm=request.confirm,
        )
        return pb.TransferMemoryResponse(memory=convert.memory_to_pb(rec))

    @_rpc_stream
    def ExportMemories(
        self, request: pb.ExportMemoriesRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ExportMemoriesResponse]:
        with self._stream_slot():
            key, ns = caller(), request.namespace
            if (
                key is None
                or key.everything
                or (ns and key.covers(ns))
                or (not request.include_children and ns)
            ):
                for item in self._engine.export(ns, request.include_children, _still_wanted(context)):
                    yield convert.export_chunk_to_pb(item)
                return
            # A key for some prefixes, asking for more: the export of what it covers below the
            # namespace asked for (only those subtrees are read), one snapshot under one header.
            parts = [p for p in key.namespaces if not ns or p == ns or p.startswith(ns + "/")]
            if not parts:
                raise PermissionDenied(
                    f"this key covers no namespace under {ns!r}",
                    reason="NAMESPACE_NOT_COVERED",
                    metadata={"namespace": ns, "key_id": key.id},
                )
            for item in self._engine.export(ns, True, _still_wanted(context), within=parts):
                yield convert.export_chunk_to_pb(item)

    @_rpc
    def ImportMemories(
        self, request_iterator: Iterator[pb.ImportMemoriesRequest], context: grpc.ServicerContext
    ) -> pb.ImportMemoriesResponse:
        with self._stream_slot():
            return self._import(request_iterator, context)

    def _import(
        self, request_iterator: Iterator[pb.ImportMemoriesRequest], context: grpc.ServicerContext
    ) -> pb.ImportMemoriesResponse:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("chunk") != "header":
            raise InvalidArgument("header", "the first chunk of an import must be the export header")
        header = convert.header_from_pb(first.header)
        engine = self._engine

        if first.end:
            raise InvalidArgument("chunks[0].end", "is set on a request with a chunk (the header)")

        def items() -> Iterator[ExportItem]:
            for i, chunk in enumerate(request_iterator):
                if chunk.end:
                    if chunk.WhichOneof("chunk") is not None:
                        raise InvalidArgument(
                            f"chunks[{i + 1}].end", "is set on a request that carries a chunk"
                        )
                    return
                yield convert.import_item_from_pb(chunk, i, engine.config)
            if first.end_marked:  # (a cancel can reach us as the stream's end: the rest is not stored)
                raise InvalidArgument(
                    "end",
                    "the stream ended without the end request its first chunk promised (cut short?): "
                    "the batches committed before stay",
                )

        result = engine.restore(
            header, items(), first.target_namespace, confirm=first.confirm, wanted=_still_wanted(context)
        )
        return pb.ImportMemoriesResponse(**vars(result))  # (the same fields)

    @_rpc
    def GetReflectionCandidates(
        self, request: pb.GetReflectionCandidatesRequest, context: grpc.ServicerContext
    ) -> pb.GetReflectionCandidatesResponse:
        recs, st = self._engine.reflection_candidates(request.namespace, request.limit)
        return pb.GetReflectionCandidatesResponse(
            observations=[convert.memory_to_pb(r) for r in recs],
            accumulated_importance=st.reflection_importance,
            threshold=self._engine.policy_for(request.namespace).reflection_threshold,
            reflection_due=st.reflection_due,
        )

    @_rpc
    def BuildSummary(
        self, request: pb.BuildSummaryRequest, context: grpc.ServicerContext
    ) -> pb.BuildSummaryResponse:
        if request.max_tokens < 0:
            raise InvalidArgument("max_tokens", "must not be negative")
        summary = build_summary(
            self._engine,
            request.namespace,
            request.max_tokens or 500,
            convert.ts_to_float(request, "created_after", bound=True),
            convert.ts_to_float(request, "created_before", bound=True),
        )
        return pb.BuildSummaryResponse(
            text=summary.text, source_memory_ids=summary.source_ids, token_count=summary.tokens
        )

    @_rpc
    def UpsertGraphNode(
        self, request: pb.UpsertGraphNodeRequest, context: grpc.ServicerContext
    ) -> pb.UpsertGraphNodeResponse:
        node = self._graph.upsert_node(request.namespace, convert.node_from_pb(request.node))
        return pb.UpsertGraphNodeResponse(node=convert.node_to_pb(node))

    @_rpc
    def AddGraphEdge(
        self, request: pb.AddGraphEdgeRequest, context: grpc.ServicerContext
    ) -> pb.AddGraphEdgeResponse:
        edge = self._graph.add_edge(request.namespace, convert.edge_from_pb(request.edge))
        return pb.AddGraphEdgeResponse(edge=convert.edge_to_pb(edge))

    @_rpc
    def InvalidateGraphEdge(
        self, request: pb.InvalidateGraphEdgeRequest, context: grpc.ServicerContext
    ) -> pb.InvalidateGraphEdgeResponse:
        edge = self._graph.invalidate_edge(
            request.namespace, request.edge_id, convert.ts_to_float(request, "invalid_from")
        )
        return pb.InvalidateGraphEdgeResponse(edge=convert.edge_to_pb(edge))

    @_rpc
    def GetGraphNeighbors(
        self, request: pb.GetGraphNeighborsRequest, context: grpc.ServicerContext
    ) -> pb.GetGraphNeighborsResponse:
        nodes, edges = self._graph.neighbors(
            request.namespace,
            request.node_id,
            request.depth or 1,
            request.limit,
            convert.ts_to_float(request, "as_of"),
            request.include_invalid,
        )
        resp = pb.GetGraphNeighborsResponse(
            nodes=[convert.node_to_pb(n) for n in nodes], edges=[convert.edge_to_pb(e) for e in edges]
        )
        self._refuse_if_over(resp.ByteSize(), "ask for a smaller limit or depth")
        return resp

    @_rpc
    def BuildContext(
        self, request: pb.BuildContextRequest, context: grpc.ServicerContext
    ) -> pb.BuildContextResponse:
        package = self._assembler.build(
            convert.scope_specs_from_pb(request.scopes),
            request.query_text,
            request.token_budget,
            request.head_tail,
            request.graph_facts if request.HasField("graph_facts") else True,
            request.read_only,
            request.summarize_overflow if request.HasField("summarize_overflow") else True,
            record=False,
        )
        resp = convert.context_to_pb(package)
        self._refuse_if_over(resp.ByteSize(), "ask for a smaller token_budget")  # (before accesses count)
        if not request.read_only:
            self._assembler.record_accesses(package)
        return resp
