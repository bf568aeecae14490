"""Graph memory: nodes and edges per namespace, written explicitly by the agent.

Edges hold over [valid_from, invalid_from): invalidating one keeps the superseded fact in history
(visible at an earlier ``as_of`` or with ``include_invalid``) but out of current answers
(``valid_at``, the one place that rule lives). Everything lives in LMDB (``Store`` graph methods)
and is written through the engine's writer; reads take their own read transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from tiermem.server.config import ServerConfig
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument, NotFound
from tiermem.server.storage.store import Store, Txn
from tiermem.server.storage.writer import Writer


def valid_at(edge: dict[str, Any], t: float) -> bool:
    """Whether an edge holds at time ``t``: valid_from <= t < invalid_from (None: still valid)."""
    return bool(edge["valid_from"] <= t and (edge["invalid_from"] is None or t < edge["invalid_from"]))


class GraphMemory:
    """Validated graph writes and reads over the store (``store``, ``writer``, ``config`` and
    ``clock`` are the engine's)."""

    def __init__(
        self, store: Store, writer: Writer, config: ServerConfig, clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.writer = writer
        self.config = config
        self.clock = clock

    def upsert_node(self, namespace: str, node: dict[str, Any]) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("node.id", node["id"])
        check.text("node.label", node.get("label", ""))
        check.metadata("node.properties", node.get("properties", {}), self.config)
        check.memory_ids("node.memory_ids", node.get("memory_ids", []))
        node = {**node, "updated": self.clock()}

        def prepare(txn: Txn) -> dict[str, Any]:
            self.store.put_node(txn, namespace, node)
            return node

        return dict(self.writer.submit(prepare, lambda n: n))

    def add_edge(self, namespace: str, edge: dict[str, Any]) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("edge.source_id", edge["source_id"])
        check.memory_id("edge.target_id", edge["target_id"])
        if not edge.get("relation"):
            raise InvalidArgument("edge.relation", "is required")
        check.label("edge.relation", edge["relation"], 128)
        check.metadata("edge.properties", edge.get("properties", {}), self.config)
        check.memory_ids("edge.memory_ids", edge.get("memory_ids", []))
        now = self.clock()
        vf = edge.get("valid_from")
        vf = now if vf is None else check.finite_time("edge.valid_from", vf)
        inv = edge.get("invalid_from")
        if inv is not None and check.finite_time("edge.invalid_from", inv) <= vf:
            raise InvalidArgument("edge.invalid_from", "must be after valid_from")
        edge = {**edge, "id": uuid.uuid4().hex, "valid_from": vf, "invalid_from": inv, "created": now}

        def prepare(txn: Txn) -> dict[str, Any]:
            for end in ("source_id", "target_id"):
                if self.store.get_node(txn, namespace, edge[end]) is None:
                    raise NotFound(
                        f"edge.{end}: node {edge[end]!r} not found in namespace {namespace!r}",
                        reason="NODE_NOT_FOUND",
                    )
            self.store.put_edge(txn, namespace, edge)
            return edge

        return dict(self.writer.submit(prepare, lambda e: e))

    def invalidate_edge(self, namespace: str, edge_id: str, invalid_from: float | None) -> dict[str, Any]:
        check.namespace("namespace", namespace)
        check.memory_id("edge_id", edge_id)
        when = self.clock() if invalid_from is None else check.finite_time("invalid_from", invalid_from)

        def prepare(txn: Txn) -> dict[str, Any]:
            edge = self.store.get_edge(txn, namespace, edge_id)
            if edge is None:
                raise NotFound(
                    f"edge {edge_id!r} not found in namespace {namespace!r}", reason="EDGE_NOT_FOUND"
                )
            if when <= edge["valid_from"]:
                raise InvalidArgument("invalid_from", "must be after the edge's valid_from")
            if edge["invalid_from"] is not None and edge["invalid_from"] <= when:
                return edge  # already invalid by then: a later time must not bring the fact back
            edge["invalid_from"] = when
            self.store.put_edge(txn, namespace, edge)
            return edge

        return dict(self.writer.submit(prepare, lambda e: e))

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
        t = self.clock() if as_of is None else check.finite_time("as_of", as_of)
        with self.store.read() as txn:
            start = self.store.get_node(txn, namespace, node_id)
            if start is None:
                raise NotFound(
                    f"node {node_id!r} not found in namespace {namespace!r}", reason="NODE_NOT_FOUND"
                )
            walk = _Walk(self.store, txn, namespace, (node_id, start), limit, t, include_invalid)
            for _ in range(depth or 1):
                walk.step()
            if depth == 0:
                walk.edges = []
        return walk.nodes, walk.edges

    def edges_of_memories(self, namespace: str, memory_ids: set[str], t: float) -> list[dict[str, Any]]:
        """The edges valid at ``t`` of every node linked to one of ``memory_ids`` (node by node, as
        stored; an edge between two such nodes comes once for each)."""
        out = []
        with self.store.read() as txn:
            for node in self.store.nodes(txn, namespace):
                if not memory_ids.intersection(node.get("memory_ids", [])):
                    continue
                for eid in self.store.edges_of(txn, namespace, node["id"]):
                    e = self.store.get_edge(txn, namespace, eid)
                    if e is not None and valid_at(e, t):
                        out.append(e)
        return out


class _Walk:
    """One breadth-first walk of ``neighbors``: the nodes and edges found so far and the frontier."""

    def __init__(
        self,
        store: Store,
        txn: Txn,
        namespace: str,
        start: tuple[str, dict[str, Any]],
        limit: int,
        t: float,
        include_invalid: bool,
    ) -> None:
        self.store, self.txn, self.namespace = store, txn, namespace
        self.limit, self.t, self.include_invalid = limit, t, include_invalid
        start_id, start_node = start
        self.nodes: list[dict[str, Any]] = [start_node]
        self.edges: list[dict[str, Any]] = []
        self.seen_edges: set[str] = set()
        self.frontier: list[str] = [start_id]
        self.seen: set[str] = {start_id}

    def step(self) -> None:
        """Follow every edge of the frontier one hop; the nodes reached become the next frontier."""
        nxt: list[str] = []
        for nid in self.frontier:
            for eid in self.store.edges_of(self.txn, self.namespace, nid):
                if eid in self.seen_edges:
                    continue
                edge = self.store.get_edge(self.txn, self.namespace, eid)
                if edge is None or not (self.include_invalid or valid_at(edge, self.t)):
                    continue
                other = edge["target_id"] if edge["source_id"] == nid else edge["source_id"]
                if other not in self.seen:
                    if len(self.nodes) >= self.limit:
                        continue
                    node = self.store.get_node(self.txn, self.namespace, other)
                    if node is None:
                        continue
                    self.seen.add(other)
                    self.nodes.append(node)
                    nxt.append(other)
                self.seen_edges.add(eid)
                self.edges.append(edge)
        self.frontier = nxt
