"""Graph memory (seed 003): nodes and edges per namespace, written explicitly by the agent.

Edges hold over [valid_from, invalid_from): invalidating one keeps the superseded fact in history
(visible at an earlier ``as_of`` or with ``include_invalid``) but out of current answers. Everything
lives in LMDB (``Store`` graph methods) and is written through the engine's writer.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import lmdb

from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument, NotFound

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine


class GraphMemory:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def upsert_node(self, namespace: str, node: dict[str, Any]) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("node.id", node["id"])
        check.text("node.label", node.get("label", ""))
        check.metadata("node.properties", node.get("properties", {}), self.engine.config)
        for i, mid in enumerate(node.get("memory_ids", [])):
            check.memory_id(f"node.memory_ids[{i}]", mid)
        node = {**node, "updated": self.engine.clock()}

        def prepare(txn: lmdb.Transaction) -> dict[str, Any]:
            self.engine.store.put_node(txn, namespace, node)
            return node

        return dict(self.engine.writer.submit(prepare, lambda n: n))

    def add_edge(self, namespace: str, edge: dict[str, Any]) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("edge.source_id", edge["source_id"])
        check.memory_id("edge.target_id", edge["target_id"])
        if not edge.get("relation"):
            raise InvalidArgument("edge.relation", "is required")
        check.text("edge.relation", edge["relation"], 128)
        check.metadata("edge.properties", edge.get("properties", {}), self.engine.config)
        now = self.engine.clock()
        vf = edge.get("valid_from")
        vf = now if vf is None else check.finite_time("edge.valid_from", vf)
        inv = edge.get("invalid_from")
        if inv is not None and check.finite_time("edge.invalid_from", inv) <= vf:
            raise InvalidArgument("edge.invalid_from", "must be after valid_from")
        edge = {**edge, "id": uuid.uuid4().hex, "valid_from": vf, "invalid_from": inv, "created": now}

        def prepare(txn: lmdb.Transaction) -> dict[str, Any]:
            for end in ("source_id", "target_id"):
                if self.engine.store.get_node(txn, namespace, edge[end]) is None:
                    raise NotFound(
                        f"edge.{end}: node {edge[end]!r} not found in namespace {namespace!r}",
                        reason="NODE_NOT_FOUND",
                    )
            self.engine.store.put_edge(txn, namespace, edge)
            return edge

        return dict(self.engine.writer.submit(prepare, lambda e: e))

    def invalidate_edge(self, namespace: str, edge_id: str, invalid_from: float | None) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("edge_id", edge_id)
        when = (
            self.engine.clock() if invalid_from is None else check.finite_time("invalid_from", invalid_from)
        )

        def prepare(txn: lmdb.Transaction) -> dict[str, Any]:
            edge = self.engine.store.get_edge(txn, namespace, edge_id)
            if edge is None:
                raise NotFound(
                    f"edge {edge_id!r} not found in namespace {namespace!r}", reason="EDGE_NOT_FOUND"
                )
            if when <= edge["valid_from"]:
                raise InvalidArgument("invalid_from", "must be after the edge's valid_from")
            edge["invalid_from"] = when
            self.engine.store.put_edge(txn, namespace, edge)
            return edge

        return dict(self.engine.writer.submit(prepare, lambda e: e))

    def neighbors(
        self,
        namespace: str,
        node_id: str,
        depth: int = 1,
        limit: int = 100,
        as_of: float | None = None,
        include_invalid: bool = False,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Breadth-first from ``node_id`` over edges valid at ``as_of``: (nodes, edges)."""
        check.namespace("namespace", namespace)
        check.memory_id("node_id", node_id)
        if not 0 <= depth <= 5:
            raise InvalidArgument("depth", "must be in 0..5")
        if limit < 0:
            raise InvalidArgument("limit", "must not be negative")
        limit = min(limit or 100, 1000)
        t = self.engine.clock() if as_of is None else check.finite_time("as_of", as_of)
        with self.engine.store.read() as txn:
            start = self.engine.store.get_node(txn, namespace, node_id)
            if start is None:
                raise NotFound(
                    f"node {node_id!r} not found in namespace {namespace!r}", reason="NODE_NOT_FOUND"
                )
            nodes, edges, seen_edges = [start], [], set()
            frontier, seen = [node_id], {node_id}
            for _ in range(depth or 1):
                nxt = []
                for nid in frontier:
                    for eid in self.engine.store.edges_of(txn, namespace, nid):
                        if eid in seen_edges:
                            continue
                        edge = self.engine.store.get_edge(txn, namespace, eid)
                        if edge is None:
                            continue
                        valid = edge["valid_from"] <= t and (
                            edge["invalid_from"] is None or t < edge["invalid_from"]
                        )
                        if not valid and not include_invalid:
                            continue
                        other = edge["target_id"] if edge["source_id"] == nid else edge["source_id"]
                        if other not in seen:
                            if len(nodes) >= limit:
                                continue
                            node = self.engine.store.get_node(txn, namespace, other)
                            if node is None:
                                continue
                            seen.add(other)
                            nodes.append(node)
                            nxt.append(other)
                        seen_edges.add(eid)
                        edges.append(edge)
                frontier = nxt
                if depth == 0:
                    edges = []
                    break
        return nodes, edges
