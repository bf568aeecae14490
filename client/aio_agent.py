"""``AsyncMemoryClient``'s methods for agent memory: observations, reflections and summaries, the
graph, and context assembly (a mixin, as ``agent.py`` is for ``MemoryClient``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tiermem.client.requests as rq  # not "from . import requests": that imports the package, a cycle
from tiermem.v1 import memory_pb2 as pb

from .connection import CallMetadata
from .messages import TimeLike


class AsyncAgentMethods:
    """``AgentMethods`` awaited, through the ``stub`` and ``_call`` of ``AsyncMemoryClient``."""

    stub: Any
    if TYPE_CHECKING:

        async def _call(
            self, method: Any, request: Any, timeout: float | None, call_metadata: CallMetadata | None
        ) -> Any: ...

    # -- agent memory: reflection and summaries ------------------------------------------------
    async def observe(
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
        req = rq.observe_request(
            namespace, content, kind=kind, request_id=request_id, allow_duplicates=allow_duplicates, **fields
        )
        return await self._call(self.stub.CreateMemory, req, timeout, call_metadata)

    async def reflection_candidates(
        self,
        namespace: str,
        *,
        limit: int = 0,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GetReflectionCandidatesResponse:
        req = rq.reflection_candidates_request(namespace, limit=limit)
        return await self._call(self.stub.GetReflectionCandidates, req, timeout, call_metadata)

    async def reflect(
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
        req = rq.reflect_request(
            namespace,
            insight,
            source_memory_ids=source_memory_ids,
            questions=questions,
            importance=importance,
            **fields,
        )
        return (await self._call(self.stub.CreateMemory, req, timeout, call_metadata)).memory

    async def build_summary(
        self,
        namespace: str,
        *,
        max_tokens: int = 0,
        since: TimeLike | None = None,
        until: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.BuildSummaryResponse:
        req = rq.build_summary_request(namespace, max_tokens=max_tokens, since=since, until=until)
        return await self._call(self.stub.BuildSummary, req, timeout, call_metadata)

    async def summarize(
        self,
        namespace: str,
        text: str,
        *,
        source_memory_ids: Iterable[str],
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
        **fields: Any,
    ) -> pb.Memory:
        req = rq.summarize_request(namespace, text, source_memory_ids=source_memory_ids, **fields)
        return (await self._call(self.stub.CreateMemory, req, timeout, call_metadata)).memory

    # -- graph memory ---------------------------------------------------------------------------
    async def upsert_node(
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
        req = rq.upsert_node_request(
            namespace, node_id, label=label, properties=properties, memory_ids=memory_ids
        )
        return (await self._call(self.stub.UpsertGraphNode, req, timeout, call_metadata)).node

    async def add_edge(
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
        req = rq.add_edge_request(
            namespace,
            source_id,
            relation,
            target_id,
            properties=properties,
            memory_ids=memory_ids,
            valid_from=valid_from,
            invalid_from=invalid_from,
        )
        return (await self._call(self.stub.AddGraphEdge, req, timeout, call_metadata)).edge

    async def invalidate_edge(
        self,
        namespace: str,
        edge_id: str,
        *,
        at: TimeLike | None = None,
        timeout: float | None = None,
        call_metadata: CallMetadata | None = None,
    ) -> pb.GraphEdge:
        req = rq.invalidate_edge_request(namespace, edge_id, at=at)
        return (await self._call(self.stub.InvalidateGraphEdge, req, timeout, call_metadata)).edge

    async def neighbors(
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
        req = rq.neighbors_request(
            namespace, node_id, depth=depth, limit=limit, as_of=as_of, include_invalid=include_invalid
        )
        return await self._call(self.stub.GetGraphNeighbors, req, timeout, call_metadata)

    # -- context assembly -------------------------------------------------------------------------
    async def build_context(
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
        req = rq.build_context_request(
            scopes,
            token_budget=token_budget,
            query=query,
            head_tail=head_tail,
            graph_facts=graph_facts,
            read_only=read_only,
            summarize_overflow=summarize_overflow,
        )
        return await self._call(self.stub.BuildContext, req, timeout, call_metadata)
