"""The gRPC MemoryService: validate the shape, call the engine, build the response. Nothing else."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

from . import convert
from .engine import Engine
from .errors import TiermemError, Unavailable
from .records import NewMemory
from .status import to_status

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


def _rpc(method: F) -> F:
    """Turn domain errors into rich gRPC statuses; anything else is INTERNAL and logged."""

    @functools.wraps(method)
    def wrapper(self: MemoryServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if self.engine is None:
                raise Unavailable("server is starting", reason="STARTING")
            return method(self, request, context)
        except TiermemError as e:
            context.abort_with_status(to_status(e))
        except Exception as e:
            logger.exception("%s failed", method.__name__)
            context.abort_with_status(to_status(TiermemError(f"internal error: {type(e).__name__}")))

    return wrapper  # type: ignore[return-value]


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    def __init__(self, engine: Engine | None = None) -> None:
        self.engine: Engine | None = engine

    @_rpc
    def CreateMemory(
        self, request: pb.CreateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.CreateMemoryResponse:
        spec = convert.new_memory_from_pb(request.memory, "memory.")
        [rec] = self.engine.create([spec], request.request_id)  # type: ignore[union-attr]
        return pb.CreateMemoryResponse(memory=convert.memory_to_pb(rec))

    @_rpc
    def BatchCreateMemories(
        self, request: pb.BatchCreateMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.BatchCreateMemoriesResponse:
        specs = [convert.new_memory_from_pb(m, f"memories[{i}].") for i, m in enumerate(request.memories)]
        recs = self.engine.create(specs, request.request_id, batch=True)  # type: ignore[union-attr]
        resp = pb.BatchCreateMemoriesResponse()
        for rec in recs:
            convert.memory_to_pb(rec, out=resp.memories.add())
        return resp

    @_rpc
    def GetMemory(self, request: pb.GetMemoryRequest, context: grpc.ServicerContext) -> pb.GetMemoryResponse:
        rec, vec = self.engine.get(request.namespace, request.id, request.include_embedding)  # type: ignore[union-attr]
        return pb.GetMemoryResponse(memory=convert.memory_to_pb(rec, vec))

    @_rpc
    def UpdateMemory(
        self, request: pb.UpdateMemoryRequest, context: grpc.ServicerContext
    ) -> pb.UpdateMemoryResponse:
        m = request.memory
        changes: NewMemory = convert.new_memory_from_pb(m, "memory.")
        rec = self.engine.update(m.namespace, m.id, changes, list(request.update_mask.paths))  # type: ignore[union-attr]
        return pb.UpdateMemoryResponse(memory=convert.memory_to_pb(rec))

    @_rpc
    def DeleteMemory(
        self, request: pb.DeleteMemoryRequest, context: grpc.ServicerContext
    ) -> pb.DeleteMemoryResponse:
        self.engine.delete(request.namespace, request.id)  # type: ignore[union-attr]
        return pb.DeleteMemoryResponse()

    @_rpc
    def ListMemories(
        self, request: pb.ListMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.ListMemoriesResponse:
        eng = self.engine
        assert eng is not None
        flt = eng.check_filter(convert.filter_from_pb(request.filter))
        recs, token = eng.list_memories(request.namespace, request.page_size, request.page_token, flt)
        vecs = eng.vectors_of(recs) if request.include_embedding else [None] * len(recs)
        resp = pb.ListMemoriesResponse(next_page_token=token)
        for rec, vec in zip(recs, vecs, strict=True):
            convert.memory_to_pb(rec, vec, out=resp.memories.add())
        return resp

    @_rpc
    def SearchMemories(
        self, request: pb.SearchMemoriesRequest, context: grpc.ServicerContext
    ) -> pb.SearchMemoriesResponse:
        hits = self.engine.search(convert.search_from_pb(request), request.include_embedding)  # type: ignore[union-attr]
        resp = pb.SearchMemoriesResponse()
        for hit in hits:
            convert.hit_to_pb(hit, resp.results.add())
        return resp

    @_rpc
    def RecordFeedback(
        self, request: pb.RecordFeedbackRequest, context: grpc.ServicerContext
    ) -> pb.RecordFeedbackResponse:
        as_of = convert.ts_to_float(request, "as_of")
        recs = self.engine.feedback(request.namespace, convert.feedback_from_pb(request.items), as_of)  # type: ignore[union-attr]
        resp = pb.RecordFeedbackResponse()
        for rec in recs:
            convert.memory_to_pb(rec, out=resp.memories.add())
        return resp

    @_rpc
    def GetStats(self, request: pb.GetStatsRequest, context: grpc.ServicerContext) -> pb.GetStatsResponse:
        s = self.engine.stats(request.namespace)  # type: ignore[union-attr]
        return pb.GetStatsResponse(
            memory_count=s["memory_count"],
            namespace_count=s["namespace_count"],
            tiers=[
                pb.TierStats(
                    tier=t["tier"],
                    memory_count=t["count"],
                    avg_importance=t["avg_importance"],
                    avg_surprise=t["avg_surprise"],
                )
                for t in s["tiers"]
            ],
            spaces=[
                pb.EmbeddingSpaceStats(
                    embedding_model=sp["model"],
                    dimension=sp["dim"],
                    live_vectors=sp["live"],
                    indexed_vectors=sp["indexed"],
                )
                for sp in s["spaces"]
            ],
            writes_committed=s["writes_committed"],
            commit_groups=s["commit_groups"],
            uptime_seconds=s["uptime_seconds"],
            storage_bytes=s["storage_bytes"],
            server_version=s["version"],
        )

    @_rpc
    def ListNamespaces(
        self, request: pb.ListNamespacesRequest, context: grpc.ServicerContext
    ) -> pb.ListNamespacesResponse:
        page, token = self.engine.list_namespaces(request.prefix, request.page_size, request.page_token)  # type: ignore[union-attr]
        return pb.ListNamespacesResponse(
            namespaces=[pb.NamespaceInfo(name=n, memory_count=c) for n, c in page], next_page_token=token
        )

    @_rpc
    def DeleteNamespace(
        self, request: pb.DeleteNamespaceRequest, context: grpc.ServicerContext
    ) -> pb.DeleteNamespaceResponse:
        return pb.DeleteNamespaceResponse(deleted_count=self.engine.delete_namespace(request.namespace))  # type: ignore[union-attr]
