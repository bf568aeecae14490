"""The request of each client method, built once for ``MemoryClient`` and ``AsyncMemoryClient``:
``<method>_request`` takes the method's arguments but ``timeout`` and ``call_metadata``, checks
them (TypeError for a misspelled keyword, naming the method; ValueError for values that cannot go
together) and returns the message the method sends. The methods' documentation is
``MemoryClient``'s."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import field_mask_pb2

from tiermem._values import set_metadata
from tiermem.v1 import memory_pb2 as pb

from .messages import (
    FILTER_FIELDS,
    MEMORY_FIELDS,
    SEARCH_ARGS,
    TimeLike,
    build_filter,
    build_memory,
    check_names,
    dicts,
    search_request,
    strings,
    tier_value,
    timestamp,
    within,
)
from .policy import POLICY_ARGUMENTS, set_policy_fields

# -- memories -----------------------------------------------------------------------------------


def create_request(
    namespace: str,
    content: str,
    *,
    request_id: str = "",
    dedup_similarity: float | None = None,
    allow_duplicates: bool = False,
    confirm: bool = False,
    **fields: Any,
) -> pb.CreateMemoryRequest:
    check_names("create", fields, MEMORY_FIELDS)
    req = pb.CreateMemoryRequest(
        memory=build_memory(namespace, content, **fields),
        request_id=request_id or uuid.uuid4().hex,
        allow_duplicates=allow_duplicates,
        confirm=confirm,
    )
    if dedup_similarity is not None:
        req.dedup_similarity = dedup_similarity
    return req


def create_batch_request(
    memories: Iterable[pb.Memory | Mapping[str, Any]], *, request_id: str = "", confirm: bool = False
) -> pb.BatchCreateMemoriesRequest:
    msgs: list[pb.Memory] = []
    for i, m in enumerate(dicts("memories", memories, pb.Memory)):
        if not isinstance(m, pb.Memory):
            check_names("create_batch", m, MEMORY_FIELDS | {"namespace", "content"}, f" in memories[{i}]")
            m = build_memory(**m)
        msgs.append(m)
    return pb.BatchCreateMemoriesRequest(
        memories=msgs, request_id=request_id or uuid.uuid4().hex, confirm=confirm
    )


def get_request(namespace: str, id: str, *, include_embedding: bool = False) -> pb.GetMemoryRequest:
    return pb.GetMemoryRequest(namespace=namespace, id=id, include_embedding=include_embedding)


def update_request(
    namespace: str, id: str, *, confirm: bool = False, **fields: Any
) -> pb.UpdateMemoryRequest:
    check_names("update", fields, (MEMORY_FIELDS - {"id"}) | {"content"})
    if not fields:
        raise ValueError("update needs at least one field")
    memory = build_memory(
        namespace, fields.get("content", ""), id=id, **{k: v for k, v in fields.items() if k != "content"}
    )
    if "embedding" in fields and "embedding_model" not in fields:
        raise ValueError("embedding needs embedding_model")
    return pb.UpdateMemoryRequest(
        memory=memory, update_mask=field_mask_pb2.FieldMask(paths=list(fields)), confirm=confirm
    )


def delete_request(namespace: str, id: str, *, confirm: bool = False) -> pb.DeleteMemoryRequest:
    return pb.DeleteMemoryRequest(namespace=namespace, id=id, confirm=confirm)


def list_request(
    method: str,
    namespace: str,
    *,
    page_size: int = 0,
    page_token: str = "",
    include_embedding: bool = False,
    **filter_fields: Any,
) -> pb.ListMemoriesRequest:
    """The (first) page request of ``list_page`` or ``list_memories`` (``method``)."""
    check_names(method, filter_fields, FILTER_FIELDS)
    return pb.ListMemoriesRequest(
        namespace=namespace,
        page_size=page_size,
        page_token=page_token,
        filter=build_filter(**filter_fields),
        include_embedding=include_embedding,
    )


def search_memories_request(
    namespaces: str | Sequence[str],
    query: str | Sequence[float] | Any,
    filter_fields: Mapping[str, Any],
    **arguments: Any,
) -> pb.SearchMemoriesRequest:
    """``search``'s request: ``arguments`` are its other keyword arguments (``search_request``'s)."""
    check_names("search", filter_fields, FILTER_FIELDS)
    return search_request(namespaces, query, **arguments, **filter_fields)


def search_many_request(searches: Sequence[Mapping[str, Any]]) -> pb.BatchSearchMemoriesRequest:
    req = pb.BatchSearchMemoriesRequest()
    for i, search in enumerate(dicts("searches", searches)):
        check_names("search_many", search, SEARCH_ARGS, f" in searches[{i}]")
        if "namespaces" not in search:
            raise TypeError(f"search_many() searches[{i}] has no 'namespaces'")
        req.searches.append(search_request(**search))
    return req


def feedback_request(
    namespace: str, items: Iterable[Mapping[str, Any]], *, as_of: TimeLike | None = None
) -> pb.RecordFeedbackRequest:
    fields = pb.Feedback.DESCRIPTOR.fields_by_name
    for n, item in enumerate(items := dicts("items", items)):
        check_names("feedback", item, fields, f" in items[{n}]")
    req = pb.RecordFeedbackRequest(namespace=namespace, items=[pb.Feedback(**dict(i)) for i in items])
    if as_of is not None:
        req.as_of.CopyFrom(timestamp(as_of))
    return req


# -- server and namespaces ------------------------------------------------------------------------


def stats_request(namespace: str = "") -> pb.GetStatsRequest:
    return pb.GetStatsRequest(namespace=namespace)


def list_namespaces_request(
    prefix: str = "", *, page_size: int = 0, page_token: str = ""
) -> pb.ListNamespacesRequest:
    return pb.ListNamespacesRequest(prefix=prefix, page_size=page_size, page_token=page_token)


def delete_namespace_request(
    namespace: str, *, include_children: bool = False, confirm: bool = False
) -> pb.DeleteNamespaceRequest:
    return pb.DeleteNamespaceRequest(namespace=namespace, include_children=include_children, confirm=confirm)


def get_namespace_config_request(namespace: str) -> pb.GetNamespaceConfigRequest:
    return pb.GetNamespaceConfigRequest(namespace=namespace)


def policy_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The lifecycle policy fields among ``update_namespace_config``'s arguments (its ``locals()``:
    each policy field is an argument of the same name)."""
    return {name: arguments[name] for name in POLICY_ARGUMENTS}


def update_namespace_config_request(
    namespace: str,
    *,
    protected: bool | None = None,
    tiers: Mapping[int | str, Mapping[str, float]] | None = None,
    reset_policy: bool = False,
    confirm: bool = False,
    policy: Mapping[str, Any],
) -> pb.UpdateNamespaceConfigRequest:
    """``policy``: the policy fields, None where not given (``policy_arguments``)."""
    if protected is not None and not isinstance(protected, bool):  # ("no" would protect it)
        raise TypeError(f"protected must be True, False or None, not {type(protected).__name__}")
    cfg = pb.NamespaceConfig(namespace=namespace, protected=bool(protected))
    paths = ["protected"] if protected is not None else []
    if reset_policy:
        paths.append("policy")
    if tiers is not None:
        for tier, fields in tiers.items():
            cfg.policy.tiers.add(tier=tier_value(tier), **fields)
        paths.append("policy.tiers")
    paths += set_policy_fields(cfg.policy, policy)
    if not paths:
        raise ValueError("update_namespace_config needs something to change")
    return pb.UpdateNamespaceConfigRequest(
        config=cfg, update_mask=field_mask_pb2.FieldMask(paths=paths), confirm=confirm
    )


# -- lifecycle ------------------------------------------------------------------------------------


def consolidate_request(
    namespace: str = "", *, dry_run: bool = False, max_reported_moves: int = 0
) -> pb.ConsolidateMemoriesRequest:
    return pb.ConsolidateMemoriesRequest(
        namespace=namespace, dry_run=dry_run, max_reported_moves=max_reported_moves
    )


def transfer_request(
    namespace: str,
    id: str,
    *,
    mode: str = "copy",
    target_namespace: str = "",
    target_tier: int | str | None = None,
    target_id: str = "",
    overwrite: bool = False,
    confirm: bool = False,
) -> pb.TransferMemoryRequest:
    return pb.TransferMemoryRequest(
        namespace=namespace,
        id=id,
        target_namespace=target_namespace,
        target_tier=tier_value(target_tier),  # type: ignore[arg-type,unused-ignore]
        mode=pb.TransferMode.Value(f"TRANSFER_MODE_{mode.upper()}"),  # type: ignore[arg-type,unused-ignore]
        target_id=target_id,
        overwrite=overwrite,
        confirm=confirm,
    )


# -- streams, debates, backup ---------------------------------------------------------------------


def timeline_request(
    namespace: str,
    *,
    since: TimeLike | None = None,
    until: TimeLike | None = None,
    page_size: int = 0,
    where: str | Mapping[str, Any] | None = None,
    **filter_fields: Any,
) -> pb.ListMemoriesRequest:
    check_names("timeline", filter_fields, FILTER_FIELDS - {"where"})
    return pb.ListMemoriesRequest(
        namespace=namespace,
        page_size=page_size,
        newest_first=True,
        filter=build_filter(where=within(where, since, until), **filter_fields),
    )


def find_similar_debates_request(
    namespaces: str | Sequence[str], topic: str, *, limit: int = 5, **kwargs: Any
) -> pb.SearchMemoriesRequest:
    check_names("find_similar_debates", kwargs, SEARCH_ARGS - {"namespaces", "query", "kinds"})
    return search_request(namespaces, topic, limit=limit, kinds=["consensus", "dissent"], **kwargs)


def export_request(namespace: str = "", *, include_children: bool = False) -> pb.ExportMemoriesRequest:
    return pb.ExportMemoriesRequest(namespace=namespace, include_children=include_children)


# The last request of an import: a stream cut short (cancelled) ends without it, and the server then
# stores nothing after the last batch it committed.
IMPORT_END = pb.ImportMemoriesRequest(end=True)


def import_request(
    i: int, chunk: pb.ExportMemoriesResponse, target_namespace: str, confirm: bool = False
) -> pb.ImportMemoriesRequest:
    """The request carrying chunk ``i`` of an export (the first one names ``target_namespace``,
    carries ``confirm`` and promises the ``IMPORT_END`` request last)."""
    req = pb.ImportMemoriesRequest(
        target_namespace=target_namespace if i == 0 else "", confirm=confirm and i == 0, end_marked=i == 0
    )
    which = chunk.WhichOneof("chunk")
    if which == "header":
        req.header.CopyFrom(chunk.header)
    elif which == "memory":
        req.memory.CopyFrom(chunk.memory)
    elif which == "scope":
        req.scope.CopyFrom(chunk.scope)
    elif which == "settings":
        req.settings.CopyFrom(chunk.settings)
    elif which == "node":
        req.node.CopyFrom(chunk.node)
        req.graph_namespace = chunk.graph_namespace
    elif which == "edge":
        req.edge.CopyFrom(chunk.edge)
        req.graph_namespace = chunk.graph_namespace
    else:
        raise ValueError(f"chunk {i} of the export is empty")
    return req


# -- agent memory: reflection and summaries -------------------------------------------------------


def observe_request(
    namespace: str,
    content: str,
    *,
    kind: str = "observation",
    request_id: str = "",
    allow_duplicates: bool = True,
    **fields: Any,
) -> pb.CreateMemoryRequest:
    check_names("observe", fields, MEMORY_FIELDS)
    return pb.CreateMemoryRequest(
        memory=build_memory(namespace, content, kind=kind, **fields),
        request_id=request_id or uuid.uuid4().hex,
        allow_duplicates=allow_duplicates,
    )


def reflection_candidates_request(namespace: str, *, limit: int = 0) -> pb.GetReflectionCandidatesRequest:
    return pb.GetReflectionCandidatesRequest(namespace=namespace, limit=limit)


def reflect_request(
    namespace: str,
    insight: str,
    *,
    source_memory_ids: Iterable[str],
    questions: Iterable[str] = (),
    importance: float = 0.9,
    **fields: Any,
) -> pb.CreateMemoryRequest:
    check_names("reflect", fields, MEMORY_FIELDS - {"kind"})
    m = build_memory(
        namespace,
        insight,
        kind="reflection",
        importance=importance,
        source_memory_ids=source_memory_ids,
        **fields,
    )
    m.questions.extend(strings("questions", questions))
    return pb.CreateMemoryRequest(memory=m, request_id=uuid.uuid4().hex)


def build_summary_request(
    namespace: str,
    *,
    max_tokens: int = 0,
    since: TimeLike | None = None,
    until: TimeLike | None = None,
) -> pb.BuildSummaryRequest:
    req = pb.BuildSummaryRequest(namespace=namespace, max_tokens=max_tokens)
    if since is not None:
        req.created_after.CopyFrom(timestamp(since))
    if until is not None:
        req.created_before.CopyFrom(timestamp(until))
    return req


def summarize_request(
    namespace: str, text: str, *, source_memory_ids: Iterable[str], **fields: Any
) -> pb.CreateMemoryRequest:
    accepted = (MEMORY_FIELDS - {"kind"}) | {"request_id", "dedup_similarity", "allow_duplicates", "confirm"}
    check_names("summarize", fields, accepted)
    return create_request(namespace, text, kind="summary", source_memory_ids=source_memory_ids, **fields)


# -- graph memory ---------------------------------------------------------------------------------


def upsert_node_request(
    namespace: str,
    node_id: str,
    *,
    label: str = "",
    properties: Mapping[str, Any] | None = None,
    memory_ids: Iterable[str] = (),
) -> pb.UpsertGraphNodeRequest:
    node = pb.GraphNode(id=node_id, label=label, memory_ids=strings("memory_ids", memory_ids))
    if properties:
        set_metadata(node.properties, properties)
    return pb.UpsertGraphNodeRequest(namespace=namespace, node=node)


def add_edge_request(
    namespace: str,
    source_id: str,
    relation: str,
    target_id: str,
    *,
    properties: Mapping[str, Any] | None = None,
    memory_ids: Iterable[str] = (),
    valid_from: TimeLike | None = None,
    invalid_from: TimeLike | None = None,
) -> pb.AddGraphEdgeRequest:
    edge = pb.GraphEdge(
        source_id=source_id,
        target_id=target_id,
        relation=relation,
        memory_ids=strings("memory_ids", memory_ids),
    )
    if properties:
        set_metadata(edge.properties, properties)
    if valid_from is not None:
        edge.valid_from.CopyFrom(timestamp(valid_from))
    if invalid_from is not None:
        edge.invalid_from.CopyFrom(timestamp(invalid_from))
    return pb.AddGraphEdgeRequest(namespace=namespace, edge=edge)


def invalidate_edge_request(
    namespace: str, edge_id: str, *, at: TimeLike | None = None
) -> pb.InvalidateGraphEdgeRequest:
    req = pb.InvalidateGraphEdgeRequest(namespace=namespace, edge_id=edge_id)
    if at is not None:
        req.invalid_from.CopyFrom(timestamp(at))
    return req


def neighbors_request(
    namespace: str,
    node_id: str,
    *,
    depth: int = 1,
    limit: int = 0,
    as_of: TimeLike | None = None,
    include_invalid: bool = False,
) -> pb.GetGraphNeighborsRequest:
    req = pb.GetGraphNeighborsRequest(
        namespace=namespace, node_id=node_id, depth=depth, limit=limit, include_invalid=include_invalid
    )
    if as_of is not None:
        req.as_of.CopyFrom(timestamp(as_of))
    return req


# -- context assembly -----------------------------------------------------------------------------


def build_context_request(
    scopes: Sequence[str | Mapping[str, Any]],
    *,
    token_budget: int,
    query: str = "",
    head_tail: int = 0,
    graph_facts: bool = True,
    read_only: bool = False,
    summarize_overflow: bool = True,
) -> pb.BuildContextRequest:
    req = pb.BuildContextRequest(
        query_text=query,
        token_budget=token_budget,
        head_tail=head_tail,
        graph_facts=graph_facts,
        read_only=read_only,
        summarize_overflow=summarize_overflow,
    )
    if isinstance(scopes, str | bytes | Mapping):  # (a str would be a scope per character)
        raise TypeError(f"scopes must be a list of namespaces or scope dicts, not {type(scopes).__name__}")
    fields = pb.ContextScope.DESCRIPTOR.fields_by_name
    for n, scope in enumerate(scopes):
        if not isinstance(scope, str):
            check_names("build_context", scope, fields, f" in scopes[{n}]")
        req.scopes.add(**({"namespace": scope} if isinstance(scope, str) else dict(scope)))
    return req


def set_scope_routing_request(
    scope: str, routing: int | str, moved_to: str = "", purge: bool = False
) -> pb.SetScopeRoutingRequest:
    """``routing`` by value or name: "serving" (or "unspecified"), "fenced", "moved", "receiving"."""
    value = routing
    if not isinstance(routing, int) or isinstance(routing, bool):
        name = str(routing).upper().removeprefix("SCOPE_ROUTING_")
        name = "UNSPECIFIED" if name == "SERVING" else name
        try:
            value = pb.ScopeRouting.Value("SCOPE_ROUTING_" + name)
        except ValueError:
            raise ValueError(
                f"routing must be serving, fenced, moved or receiving (or an enum value), not {routing!r}"
            ) from None
    return pb.SetScopeRoutingRequest(scope=scope, routing=value, moved_to=moved_to, purge=purge)  # type: ignore[arg-type]
