"""The namespaces each request names, by method: what API keys are checked against (auth.py) and
what a shard's routing key must match (routing.py); and the embedding models of the vectors it
carries (what a key may name). A client stream's messages are named one by one (``import_chunk``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def ancestors(namespace: str) -> list[str]:
    """ "a/b/c" -> ["a/b", "a"]."""
    parts = namespace.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def searched(namespaces: Any, with_ancestors: bool) -> list[str]:
    out = list(namespaces)
    if with_ancestors:
        out += [a for ns in out for a in ancestors(ns)]
    return out


def import_chunk(r: Any, target: str) -> list[str]:
    """Where a chunk of an import lands: under ``target`` (the first chunk's target_namespace) when
    there is one, else the namespace the chunk carries."""
    if target:
        return [target]
    chunk = r.WhichOneof("chunk")
    if chunk == "header":
        return [r.header.namespace] if r.header.namespace else []
    if chunk == "memory":
        return [r.memory.namespace]
    if chunk == "scope":
        return [r.scope.namespace]
    if chunk == "settings":
        return [r.settings.namespace]
    if chunk in ("node", "edge"):
        return [r.graph_namespace]
    return []


# Method -> the namespaces a request of it names ([]: none, it acts on the whole server).
NAMES: dict[str, Callable[[Any], list[str]]] = {
    "CreateMemory": lambda r: [r.memory.namespace],
    "BatchCreateMemories": lambda r: [m.namespace for m in r.memories],
    "GetMemory": lambda r: [r.namespace],
    "UpdateMemory": lambda r: [r.memory.namespace],
    "DeleteMemory": lambda r: [r.namespace],
    "ListMemories": lambda r: [r.namespace],
    "SearchMemories": lambda r: searched(r.namespaces, r.include_ancestors),
    "BatchSearchMemories": lambda r: [
        ns for s in r.searches for ns in searched(s.namespaces, s.include_ancestors)
    ],
    "RecordFeedback": lambda r: [r.namespace],
    "GetStats": lambda r: [r.namespace] if r.namespace else [],
    "ListNamespaces": lambda r: [],
    "DeleteNamespace": lambda r: [r.namespace],
    "GetNamespaceConfig": lambda r: [r.namespace],
    "UpdateNamespaceConfig": lambda r: [r.config.namespace],
    "ConsolidateMemories": lambda r: [r.namespace] if r.namespace else [],
    "TransferMemory": lambda r: [r.namespace] + ([r.target_namespace] if r.target_namespace else []),
    "GetReflectionCandidates": lambda r: [r.namespace],
    "BuildSummary": lambda r: [r.namespace],
    "UpsertGraphNode": lambda r: [r.namespace],
    "AddGraphEdge": lambda r: [r.namespace],
    "InvalidateGraphEdge": lambda r: [r.namespace],
    "GetGraphNeighbors": lambda r: [r.namespace],
    "BuildContext": lambda r: [s.namespace for s in r.scopes],
    "ExportMemories": lambda r: [r.namespace] if r.namespace else [],
    "SetScopeRouting": lambda r: [r.scope],
    "GetScopeRouting": lambda r: [r.scope],
}


def _vector_model(m: Any) -> list[str]:
    return [m.embedding_model] if len(m.embedding) else []


def _query_model(s: Any) -> list[str]:
    return [s.embedding_model] if len(s.query_embedding) else []


def import_chunk_models(r: Any) -> list[str]:
    """The embedding model of a chunk of an import that carries a vector."""
    return _vector_model(r.memory) if r.WhichOneof("chunk") == "memory" else []


# Method -> the embedding models of the vectors a request carries (what a key may name: auth.py).
MODELS: dict[str, Callable[[Any], list[str]]] = {
    "CreateMemory": lambda r: _vector_model(r.memory),
    "BatchCreateMemories": lambda r: [m for x in r.memories for m in _vector_model(x)],
    "UpdateMemory": lambda r: (
        _vector_model(r.memory) if {"embedding", "embedding_model"} & set(r.update_mask.paths) else []
    ),
    "SearchMemories": _query_model,
    "BatchSearchMemories": lambda r: [m for s in r.searches for m in _query_model(s)],
}
