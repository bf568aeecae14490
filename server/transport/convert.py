"""Conversion between tiermem.v1 messages and the server's types (engine records, reports, export
items, context packages). No logic beyond field mapping."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiermem._values import metadata_values, set_metadata, set_timestamp, timestamp_seconds
from tiermem.server.agent.context import ContextPackage, ScopeSpec
from tiermem.server.config import TIERS
from tiermem.server.core.policy import POLICY_FIELDS, TIER_FIELDS, Policy
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.reports import (
    ConsolidationReport,
    ExportedGraphItem,
    ExportedMemory,
    ExportedScope,
    ExportedSettings,
    ExportHeader,
    ExportItem,
    ScopeProgress,
    StatsReport,
)
from tiermem.server.model.types import FeedbackItem, Filter
from tiermem.server.model.validation import EARLIEST_TIME, LATEST_TIME, LATEST_TIMESTAMP, TIME_RANGE
from tiermem.server.model.validation import new_memory as check_new_memory
from tiermem.server.search.query import DEFAULT_RRF_K, FUSED, SearchHit, SearchQuery
from tiermem.v1 import memory_pb2 as pb

_INT32_MAX = 2**31 - 1


def ts_to_float(msg: Any, name: str, prefix: str = "", bound: bool = False) -> float | None:
    """``msg.<name>`` in seconds (None when unset); INVALID_ARGUMENT naming ``<prefix><name>`` for a
    Timestamp outside its own spec (nanos outside [0, 1e9) would shift the time the other way) or,
    unless it is a ``bound`` of a range (a filter's, a summary's window: any Timestamp), past the
    times a memory holds."""
    if not msg.HasField(name):
        return None
    ts = getattr(msg, name)
    if not 0 <= ts.nanos <= 999_999_999:
        raise InvalidArgument(f"{prefix}{name}", f"nanos must be in [0, 999999999], got {ts.nanos}")
    if not EARLIEST_TIME <= ts.seconds <= (LATEST_TIMESTAMP if bound else LATEST_TIME):
        raise InvalidArgument(f"{prefix}{name}", "must be between years 1 and 9999" if bound else TIME_RANGE)
    return timestamp_seconds(ts)


def metadata_from_pb(values: Any, field: str) -> dict[str, Any]:
    out = metadata_values(values)
    for key, v in out.items():
        if v is None:
            raise InvalidArgument(f"{field}[{key!r}]", "must have a value")
    return out


def new_memory_from_pb(m: pb.Memory, field: str) -> NewMemory:
    return _memory_from_pb(m, field, None)


def memory_changes_from_pb(m: pb.Memory, paths: list[str]) -> NewMemory:
    """UpdateMemory's new values: the fields whose conversion can refuse (metadata, the timestamps)
    are read only when ``update_mask`` names them, so a field the update leaves alone refuses
    nothing (create_time is never updated)."""
    return _memory_from_pb(m, "memory.", set(paths))


def _memory_from_pb(m: pb.Memory, field: str, named: set[str] | None) -> NewMemory:
    """``m`` as a NewMemory; ``named``: only these of the refusable fields are read (None: all)."""
    every, named = named is None, named or set()
    return NewMemory(
        namespace=m.namespace,
        content=m.content,
        id=m.id,
        kind=m.kind,
        tier=int(m.tier),
        importance=m.importance if m.HasField("importance") else None,
        source=m.source,
        topic=m.topic,
        tags=list(m.tags),
        metadata=metadata_from_pb(m.metadata, f"{field}metadata") if every or "metadata" in named else {},
        embedding=np.asarray(m.embedding, dtype=np.float32) if len(m.embedding) else None,
        embedding_model=m.embedding_model,
        created_at=ts_to_float(m, "create_time", field) if every else None,
        token_cost=m.token_cost,
        source_ids=list(m.source_memory_ids),
        expire_at=ts_to_float(m, "expire_time", field) if every or "expire_time" in named else None,
        questions=list(m.questions),
    )


def memory_to_pb(rec: Record, vector: np.ndarray | None = None, out: pb.Memory | None = None) -> pb.Memory:
    # Every search result goes through here: empty fields are skipped (proto3 leaves them unset
    # anyway), which saves ~20% per memory.
    m = pb.Memory() if out is None else out
    m.id = rec.id
    m.namespace = rec.namespace
    m.content = rec.content
    m.kind = rec.kind
    m.tier = rec.tier  # type: ignore[assignment,unused-ignore]
    m.importance = rec.importance
    if rec.source:
        m.source = rec.source
    if rec.topic:
        m.topic = rec.topic
    if rec.tags:
        m.tags.extend(rec.tags)
    if rec.metadata:
        set_metadata(m.metadata, rec.metadata)
    if vector is not None:
        m.embedding.extend(vector.tolist())
    m.embedding_model = rec.embedding_model
    set_timestamp(m.create_time, rec.created_at)
    set_timestamp(m.update_time, rec.updated_at)
    set_timestamp(m.last_access_time, rec.accessed_at)
    m.access_count = rec.access_count
    m.surprise_score = rec.surprise
    m.success_count = rec.success_count
    m.token_cost = rec.token_cost
    if rec.source_ids:
        m.source_memory_ids.extend(rec.source_ids)
    if rec.questions:
        m.questions.extend(rec.questions)
    if rec.expire_at is not None:
        set_timestamp(m.expire_time, rec.expire_at)
    set_timestamp(m.tier_time, rec.tier_since or rec.created_at)
    if rec.origin:
        ns, mid, tier, when = rec.origin
        m.origin.namespace, m.origin.id, m.origin.tier = ns, mid, tier
        set_timestamp(m.origin.transfer_time, when)
    return m


def filter_from_pb(f: pb.MemoryFilter, prefix: str = "filter.") -> Filter:
    return Filter(
        tiers=[int(t) for t in f.tiers],
        kinds=list(f.kinds),
        tags_any=list(f.tags_any),
        tags_all=list(f.tags_all),
        source=f.source,
        topic=f.topic,
        created_after=ts_to_float(f, "created_after", prefix, bound=True),
        created_before=ts_to_float(f, "created_before", prefix, bound=True),
        where=f.where,
    )


def tier_weights_from_pb(entries: Any) -> dict[int, float]:
    """One weight a tier: with a tier named twice, the first weight would go unchecked and unused."""
    if len(entries) > len(TIERS):
        raise InvalidArgument(
            "tier_weights", f"has more than {len(TIERS)} entries (one a tier)", reason="FIELD_TOO_LARGE"
        )
    out: dict[int, float] = {}
    for i, tw in enumerate(entries):
        if int(tw.tier) in out:
            raise InvalidArgument(f"tier_weights[{i}].tier", "names a tier an earlier entry named")
        out[int(tw.tier)] = tw.weight
    return out


def searches_from_pb(
    searches: Sequence[pb.SearchMemoriesRequest],
) -> tuple[list[tuple[SearchQuery, bool]], InvalidArgument | None]:
    """A batch's searches (with their include_embedding) up to the first that cannot be converted,
    and its error (named as ``searches[i]``; None: all were)."""
    out: list[tuple[SearchQuery, bool]] = []
    for i, r in enumerate(searches):
        try:
            out.append((search_from_pb(r), r.include_embedding))
        except InvalidArgument as e:
            return out, e.within(f"searches[{i}].")
    return out, None


def search_from_pb(r: pb.SearchMemoriesRequest) -> SearchQuery:
    return SearchQuery(
        namespaces=list(r.namespaces),
        embedding=np.asarray(r.query_embedding, dtype=np.float32) if len(r.query_embedding) else None,
        embedding_model=r.embedding_model,
        text=r.query_text,
        filter=filter_from_pb(r.filter),
        limit=r.limit,
        min_similarity=r.min_similarity if r.HasField("min_similarity") else None,
        alpha=r.alpha if r.HasField("alpha") else None,
        beta=r.beta if r.HasField("beta") else None,
        gamma=r.gamma if r.HasField("gamma") else None,
        recency_tau_seconds=r.recency_tau_seconds if r.HasField("recency_tau_seconds") else None,
        as_of=ts_to_float(r, "as_of"),
        strategy=int(r.strategy),
        tier_weights=tier_weights_from_pb(r.tier_weights),
        include_ancestors=r.include_ancestors,
        scope_weights=list(r.scope_weights),
        read_only=r.read_only,
        hybrid=r.hybrid.enabled,
        rrf_k=r.hybrid.rrf_k if r.hybrid.HasField("rrf_k") else DEFAULT_RRF_K,
        vector_weight=r.hybrid.vector_weight if r.hybrid.HasField("vector_weight") else 1.0,
        keyword_weight=r.hybrid.keyword_weight if r.hybrid.HasField("keyword_weight") else 1.0,
    )


def hit_to_pb(hit: SearchHit, out: pb.SearchResult, explain: bool = False) -> None:
    memory_to_pb(hit.record, hit.vector, out.memory)
    out.score = hit.score
    out.relevance = hit.relevance
    out.recency = hit.recency
    out.importance = hit.importance
    if explain:
        e = out.explanation
        e.strategy = hit.strategy  # type: ignore[assignment,unused-ignore]
        e.alpha, e.beta, e.gamma = hit.weights
        e.tier_weight, e.scope_weight = hit.tier_weight, hit.scope_weight
        e.vector_rank, e.keyword_rank, e.keyword_score = hit.vector_rank, hit.keyword_rank, hit.keyword_score
        e.combined_score = hit.base
        if hit.strategy == FUSED:  # its weights apply to the normalized signals: the base is its own
            e.base_score = hit.base
        else:
            e.base_score = (
                hit.weights[0] * hit.relevance
                + hit.weights[1] * hit.recency
                + hit.weights[2] * hit.importance
            )


def feedback_from_pb(items: Any) -> list[FeedbackItem]:
    return [
        FeedbackItem(
            id=f.id,
            predicted_relevance=f.predicted_relevance if f.HasField("predicted_relevance") else None,
            actual_usefulness=f.actual_usefulness if f.HasField("actual_usefulness") else None,
            success=f.success,
        )
        for f in items
    ]


# Fields set or not by presence; the enums (0 unset), the preset ("" unset) and the kind caps
# (a list) are converted apart.
_ENUM_FIELDS = tuple(f.name for f in pb.LifecyclePolicy.DESCRIPTOR.fields if f.enum_type is not None)
_TOP_FIELDS = tuple(f for f in POLICY_FIELDS if f not in (*_ENUM_FIELDS, "preset", "kind_capacities"))


def policy_overrides_from_pb(p: pb.LifecyclePolicy, prefix: str = "config.policy.") -> dict[str, Any]:
    """A LifecyclePolicy message as stored overrides (only the fields that are set); ``prefix``
    names its fields in errors."""
    out: dict[str, Any] = {}
    tiers: dict[int, dict[str, Any]] = {}
    for i, tp in enumerate(p.tiers):
        if tp.tier == pb.TIER_UNSPECIFIED:
            raise InvalidArgument(f"{prefix}tiers[{i}].tier", "is required")
        if int(tp.tier) in tiers:
            raise InvalidArgument(f"{prefix}tiers[{i}].tier", "appears twice")
        tiers[int(tp.tier)] = {f: getattr(tp, f) for f in TIER_FIELDS if tp.HasField(f)}
    if tiers:
        out["tiers"] = tiers
    for f in _ENUM_FIELDS:
        if getattr(p, f):
            out[f] = int(getattr(p, f))
    for f in _TOP_FIELDS:
        if p.HasField(f):
            out[f] = getattr(p, f)
    if p.preset:
        out["preset"] = p.preset
    if p.kind_capacities:
        out["kind_capacities"] = _kind_capacities_from_pb(p.kind_capacities, prefix)
    return out


def _kind_capacities_from_pb(caps: Any, prefix: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, c in enumerate(caps):
        if not c.kind:
            raise InvalidArgument(f"{prefix}kind_capacities[{i}].kind", "is required")
        if c.kind in out:
            raise InvalidArgument(f"{prefix}kind_capacities[{i}].kind", "appears twice")
        out[c.kind] = int(c.max_items)
    return out


def overrides_to_pb(overrides: dict[str, Any], out: pb.LifecyclePolicy) -> None:
    for tier, fields in sorted((overrides.get("tiers") or {}).items()):
        tp = out.tiers.add(tier=int(tier))
        for f, v in fields.items():
            setattr(tp, f, v)
    for f in (*_ENUM_FIELDS, "preset"):
        if overrides.get(f):
            setattr(out, f, overrides[f])
    for f in _TOP_FIELDS:
        if overrides.get(f) is not None:
            setattr(out, f, overrides[f])
    for kind, n in sorted((overrides.get("kind_capacities") or {}).items()):
        out.kind_capacities.add(kind=kind, max_items=n)


def policy_to_pb(policy: Policy, out: pb.LifecyclePolicy) -> None:
    """A complete (effective) policy."""
    for tier, s in sorted(policy.tiers.items()):
        out.tiers.add(
            tier=tier,
            ttl_seconds=s.ttl_seconds,
            max_items=s.max_items,
            importance_threshold=s.importance_threshold,
            half_life_hours=s.half_life_hours,
            cadence_seconds=s.cadence_seconds,
        )
    for f in (*_ENUM_FIELDS, "preset"):
        setattr(out, f, getattr(policy, f))
    for f in _TOP_FIELDS:
        if getattr(policy, f) is not None:  # (default_importance None: estimated, left unset)
            setattr(out, f, getattr(policy, f))
    for kind, n in sorted(policy.kind_capacities.items()):
        out.kind_capacities.add(kind=kind, max_items=n)


def namespace_config_to_pb(namespace: str, stored: dict[str, Any], effective: Policy) -> tuple[Any, Any]:
    cfg = _stored_config_to_pb(namespace, stored)
    eff = pb.LifecyclePolicy()
    policy_to_pb(effective, eff)
    return cfg, eff


def _stored_config_to_pb(namespace: str, stored: dict[str, Any]) -> pb.NamespaceConfig:
    """A namespace's stored settings (protection, policy overrides) as its NamespaceConfig."""
    cfg = pb.NamespaceConfig(namespace=namespace, protected=bool(stored.get("protected")))
    overrides_to_pb(stored.get("policy") or {}, cfg.policy)
    return cfg


def record_from_pb(m: pb.Memory, field: str, config: Any) -> tuple[Record, np.ndarray | None]:
    """An exported memory as a record to restore: content fields validated, history kept."""
    spec = new_memory_from_pb(m, field)
    if spec.embedding is None:
        spec.embedding_model = ""  # (exported while its embedding was pending: embedded on import)
    spec = check_new_memory(field, spec, config)
    created = spec.created_at if spec.created_at is not None else math.nan  # (unset: the import's time)
    rec = Record(
        rid=0,
        id=m.id,
        namespace=spec.namespace,
        content=spec.content,
        kind=spec.kind,
        tier=spec.tier,
        importance=float(spec.importance or 0.0),
        source=spec.source,
        topic=spec.topic,
        tags=spec.tags,
        metadata=spec.metadata,
        embedding_model=m.embedding_model,
        created_at=created,
        updated_at=ts_to_float(m, "update_time", field) or created,
        accessed_at=ts_to_float(m, "last_access_time", field) or created,
        access_count=m.access_count,
        surprise=m.surprise_score,
        success_count=m.success_count,
        token_cost=m.token_cost,
        source_ids=list(m.source_memory_ids),
        expire_at=spec.expire_at,
        tier_since=ts_to_float(m, "tier_time", field) or created,
        origin=[
            m.origin.namespace,
            m.origin.id,
            int(m.origin.tier),
            ts_to_float(m.origin, "transfer_time", f"{field}origin.") or created,
        ]
        if m.HasField("origin")
        else None,
        questions=spec.questions,
    )
    return rec, (np.asarray(m.embedding, dtype=np.float32) if len(m.embedding) else None)


def header_to_pb(h: ExportHeader) -> pb.ExportHeader:
    out = pb.ExportHeader(
        format_version=h.format_version,
        server_version=h.server_version,
        embedder_model=h.embedder_model,
        namespace=h.namespace,
    )
    set_timestamp(out.export_time, h.export_time)
    return out


def header_from_pb(h: pb.ExportHeader) -> ExportHeader:
    if h.format_version != 1:
        raise InvalidArgument(
            "header.format_version", f"{h.format_version} is not a format this server reads (1)"
        )
    return ExportHeader(
        format_version=1,
        server_version=h.server_version,
        export_time=ts_to_float(h, "export_time", "header.") or 0.0,
        embedder_model=h.embedder_model,
        namespace=h.namespace,
    )


def export_chunk_to_pb(item: ExportHeader | ExportItem) -> pb.ExportMemoriesResponse:
    """One item of an export stream (its header first) as its chunk."""
    if isinstance(item, ExportHeader):
        return pb.ExportMemoriesResponse(header=header_to_pb(item))
    if isinstance(item, ExportedMemory):
        return pb.ExportMemoriesResponse(memory=memory_to_pb(item.record, item.vector))
    if isinstance(item, ExportedSettings):
        return pb.ExportMemoriesResponse(settings=_stored_config_to_pb(item.namespace, item.settings))
    if isinstance(item, ExportedScope):
        scope = pb.ScopeState(
            namespace=item.namespace,
            reflection_importance=item.reflection_importance,
            summary_tokens=item.summary_tokens,
        )
        return pb.ExportMemoriesResponse(scope=scope)
    if item.kind == "node":
        return pb.ExportMemoriesResponse(node=node_to_pb(item.item), graph_namespace=item.namespace)
    return pb.ExportMemoriesResponse(edge=edge_to_pb(item.item), graph_namespace=item.namespace)


def import_item_from_pb(chunk: pb.ImportMemoriesRequest, i: int, config: Any) -> ExportItem:
    """The ``i``-th chunk of an import after its header as the item to restore (a memory's content
    validated, its history kept)."""
    which = chunk.WhichOneof("chunk")
    if which == "memory":
        rec, vector = record_from_pb(chunk.memory, f"chunks[{i + 1}].memory.", config)
        return ExportedMemory(rec, vector)
    if which == "node":
        node = node_from_pb(chunk.node, f"chunks[{i + 1}].node.")
        node["updated"] = ts_to_float(chunk.node, "update_time", f"chunks[{i + 1}].node.")
        return ExportedGraphItem("node", chunk.graph_namespace, node)
    if which == "edge":
        edge = edge_from_pb(chunk.edge, f"chunks[{i + 1}].edge.")
        edge["id"], edge["created"] = (
            chunk.edge.id,
            ts_to_float(chunk.edge, "create_time", f"chunks[{i + 1}].edge."),
        )
        return ExportedGraphItem("edge", chunk.graph_namespace, edge)
    if which == "scope":
        s = chunk.scope
        return ExportedScope(s.namespace, s.reflection_importance, s.summary_tokens)
    if which == "settings":
        cfg = chunk.settings
        policy = policy_overrides_from_pb(cfg.policy, f"chunks[{i + 1}].settings.policy.")
        return ExportedSettings(cfg.namespace, {"protected": cfg.protected, "policy": policy})
    raise InvalidArgument(
        f"chunks[{i + 1}]", "after the header, chunks are settings, memories, scope states or graph items"
    )


def node_from_pb(n: pb.GraphNode, prefix: str = "node.") -> dict[str, Any]:
    return {
        "id": n.id,
        "label": n.label,
        "properties": metadata_from_pb(n.properties, f"{prefix}properties"),
        "memory_ids": list(n.memory_ids),
    }


def node_to_pb(node: dict[str, Any]) -> pb.GraphNode:
    out = pb.GraphNode(id=node["id"], label=node.get("label", ""), memory_ids=node.get("memory_ids", []))
    set_metadata(out.properties, node.get("properties", {}))
    set_timestamp(out.update_time, node.get("updated", 0.0))
    return out


def edge_from_pb(e: pb.GraphEdge, prefix: str = "edge.") -> dict[str, Any]:
    return {
        "source_id": e.source_id,
        "target_id": e.target_id,
        "relation": e.relation,
        "properties": metadata_from_pb(e.properties, f"{prefix}properties"),
        "memory_ids": list(e.memory_ids),
        "valid_from": ts_to_float(e, "valid_from", prefix),
        "invalid_from": ts_to_float(e, "invalid_from", prefix),
    }


def edge_to_pb(edge: dict[str, Any]) -> pb.GraphEdge:
    out = pb.GraphEdge(
        id=edge["id"],
        source_id=edge["source_id"],
        target_id=edge["target_id"],
        relation=edge["relation"],
        memory_ids=edge.get("memory_ids", []),
    )
    set_metadata(out.properties, edge.get("properties", {}))
    set_timestamp(out.valid_from, edge["valid_from"])
    if edge.get("invalid_from") is not None:
        set_timestamp(out.invalid_from, edge["invalid_from"])
    set_timestamp(out.create_time, edge.get("created", 0.0))
    return out


def stats_to_pb(s: StatsReport, scope: ScopeProgress | None) -> pb.GetStatsResponse:
    """Server statistics, with a namespace's progress when one was asked for."""
    hits, misses = s.search_hits, s.search_misses
    out = pb.GetStatsResponse(
        memory_count=s.memory_count,
        namespace_count=s.namespace_count,
        tiers=[
            pb.TierStats(
                tier=t.tier,  # type: ignore[arg-type,unused-ignore]
                memory_count=t.count,
                avg_importance=t.avg_importance,
                avg_surprise=t.avg_surprise,
                promotions_total=t.totals[0],
                demotions_total=t.totals[1],
                evictions_total=t.totals[2],
                deleted_total=t.totals[3],
                promotions_last_hour=t.last_hour[0],
                demotions_last_hour=t.last_hour[1],
                evictions_last_hour=t.last_hour[2],
            )
            for t in s.tiers
        ],
        spaces=[
            pb.EmbeddingSpaceStats(
                embedding_model=sp.model,
                dimension=sp.dim,
                live_vectors=sp.live,
                indexed_vectors=sp.indexed,
                pending_vectors=sp.pending,
            )
            for sp in s.spaces
        ],
        writes_committed=s.writes_committed,
        commit_groups=s.commit_groups,
        uptime_seconds=s.uptime_seconds,
        storage_bytes=s.storage_bytes,
        server_version=s.version,
        search_hits=hits,
        search_misses=misses,
        hit_rate=hits / (hits + misses) if hits + misses else 0.0,
        summaries_stored=s.summaries_stored,
        summary_tokens_saved=s.summary_tokens_saved,
        summary_failures=s.summary_failures,
    )
    if scope is not None:
        out.reflection_importance = scope.reflection_importance
        out.reflection_due = scope.reflection_due
        out.summary_tokens = scope.summary_tokens
        out.summary_due = scope.summary_due
    return out


def consolidation_to_pb(r: ConsolidationReport) -> pb.ConsolidateMemoriesResponse:
    return pb.ConsolidateMemoriesResponse(
        moves=[
            pb.TierMove(
                namespace=m.namespace,
                id=m.id,
                from_tier=m.from_tier,  # type: ignore[arg-type,unused-ignore]
                to_tier=m.to_tier,  # type: ignore[arg-type,unused-ignore]
                reason=m.reason,  # type: ignore[arg-type,unused-ignore]
            )
            for m in r.moves
        ],
        promoted=r.promoted,
        demoted=r.demoted,
        evicted=r.evicted,
        deleted=r.deleted,
        over_capacity=r.over_capacity,
        skipped=r.skipped,
        plan_seconds=r.plan_seconds,
        apply_seconds=r.apply_seconds,
        max_search_pause_seconds=r.max_pause_seconds,
    )


def scope_specs_from_pb(scopes: Any) -> list[ScopeSpec]:
    return [
        ScopeSpec(
            s.namespace,
            s.share if s.HasField("share") else None,
            s.semantic_k if s.HasField("semantic_k") else None,
            s.recent_window if s.HasField("recent_window") else None,
            s.fill if s.HasField("fill") else True,
        )
        for s in scopes
    ]


def context_to_pb(package: ContextPackage) -> pb.BuildContextResponse:
    return pb.BuildContextResponse(
        sections=[
            pb.ContextSection(
                namespace=s.namespace,
                kind=s.kind,
                tokens=s.tokens,
                items=[pb.ContextItem(memory_id=x.memory_id, text=x.text, tokens=x.tokens) for x in s.items],
            )
            for s in package.sections
        ],
        tokens_used=min(package.tokens_used, _INT32_MAX),  # (token costs are the clients': clamped)
        candidate_tokens=min(package.candidate_tokens, _INT32_MAX),
        compression_ratio=package.compression_ratio,
        warnings=package.warnings,
    )
