"""Export and import of memories with their vectors, their namespaces' settings and reflection
and summary progress, and their graph.

An export reads everything from one LMDB read transaction: a consistent snapshot while writes go
on, spooled and sent after the transaction closed. An import writes through the writer in batches;
the batches committed before a failure stay."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from tiermem import __version__
from tiermem.server.core import spool as spool_module
from tiermem.server.core import upkeep
from tiermem.server.core.create import free_id, replace_summary
from tiermem.server.core.namespaces import CONFIRMED_KINDS, SettingsChange, check_protected, store_settings
from tiermem.server.core.overrides import check_overrides
from tiermem.server.core.spool import Spool
from tiermem.server.core.state import EngineState
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.model import validation as check
from tiermem.server.model.errors import (
    AlreadyExists,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from tiermem.server.model.records import Record
from tiermem.server.model.reports import (
    ExportedGraphItem,
    ExportedMemory,
    ExportedScope,
    ExportedSettings,
    ExportHeader,
    ExportItem,
    ImportResult,
)
from tiermem.server.model.types import NO_VECTOR
from tiermem.server.storage.store import Txn

# Most progress one scope keeps: far past any threshold, and sums of imports stay within int64
# and finite (an overflow would make the namespace's stats and export fail for good).
MAX_SUMMARY_TOKENS = 2**53
MAX_REFLECTION_IMPORTANCE = 1e15
SPOOL_ITEMS = 256  # items of an export packed into one part of its spool
SPOOL_CHECK_BYTES = 64 << 20  # how much an export spools between two looks at the disk's room
SPOOL_RESERVE_BYTES = 1 << 30  # what an export's spool leaves free on the disk, at most


def export(
    st: EngineState,
    namespace: str = "",
    include_children: bool = False,
    wanted: Callable[[], bool] | None = None,
    within: list[str] | None = None,
) -> Iterator[ExportHeader | ExportItem]:
    """Yield the header, then the stored settings of each namespace that has any, then every
    unexpired memory of the namespace (or all; with ``within``, of those namespaces and their
    children instead, the header naming ``namespace``) with its vector, then the scope state of
    each namespace with progress toward a reflection or summary, then its graph (nodes before the
    edges using them).

    Everything is read from one read transaction, spooled, and sent after it closed: a client
    that reads slowly or stops holds no transaction (nor the map growth and the reuse of freed
    pages that wait for it). Where the disk has no room for the spool (``_has_room``), the rest
    is sent from the transaction itself, held until the client has read it all. ``wanted()``
    false (the client cancelled, the deadline passed) stops the spooling between two parts."""
    if namespace:
        check.namespace("namespace", namespace)
    yield ExportHeader(
        format_version=1,
        server_version=__version__,
        export_time=st.clock(),
        embedder_model=st.embedder.model,
        namespace=namespace,
    )
    now = st.clock()
    if within is None:
        parts = [(namespace, include_children)]
    else:  # (a subtree inside another is read with it, once)
        parts = [(ns, True) for ns in sorted(set(within)) if not any(ns.startswith(p + "/") for p in within)]
    spool = Spool(st.config.data_dir, what="an export")
    try:
        with st.store.read() as txn:
            if not _spooled(st, spool, _snapshot(st, txn, parts, now), wanted):
                spool.close()
                yield from _snapshot(st, txn, parts, now)
                return
        for payload in spool:
            for packed in msgpack.unpackb(payload, raw=False, strict_map_key=False):
                yield _unpacked(packed)
    finally:
        spool.close()


def _snapshot(st: EngineState, txn: Txn, parts: list[tuple[str, bool]], now: float) -> Iterator[ExportItem]:
    """What ``txn`` holds of each (namespace, with its children): settings, memories, progress,
    graph."""
    for namespace, children in parts:
        for ns, settings in sorted(st.store.namespace_configs(txn, namespace).items()):
            if settings and (
                ns == namespace or not namespace or (children and ns.startswith(namespace + "/"))
            ):
                yield ExportedSettings(ns, settings)
    for namespace, children in parts:
        for rec in st.store.namespace_records(txn, namespace, children, stored=True):
            if not rec.expired(now):
                yield ExportedMemory(rec, st.store.get_vector(txn, rec.rid))
    for namespace, children in parts:
        for ns, state in st.store.scope_states(txn, namespace, children):
            if state.reflection_importance or state.summary_tokens:
                yield ExportedScope(ns, float(state.reflection_importance), int(state.summary_tokens))
    graph = [item for namespace, children in parts for item in st.store.graph_items(txn, namespace, children)]
    for kind, ns, item in sorted(graph, key=lambda g: g[0] == "edge"):
        yield ExportedGraphItem(kind, ns, item)


def _spooled(
    st: EngineState, spool: Spool, items: Iterator[ExportItem], wanted: Callable[[], bool] | None
) -> bool:
    """Pack ``items`` into ``spool``, ``SPOOL_ITEMS`` to a part; False where the disk has no room."""
    checked = -SPOOL_CHECK_BYTES  # (the spool's size when the disk's room was last looked at)
    while part := [_packed(item) for item in itertools.islice(items, SPOOL_ITEMS)]:
        if wanted is not None and not wanted():
            raise DeadlineExceeded("the export was cancelled or its deadline passed")
        payload = msgpack.packb(part, use_bin_type=True)
        to_disk = spool.on_disk or spool.bytes + 8 + len(payload) > spool_module.MEMORY_BYTES
        if to_disk and spool.bytes - checked >= SPOOL_CHECK_BYTES:
            if not _has_room(st.config.data_dir):
                return False
            checked = spool.bytes
        try:
            spool.add(payload)
        except (ResourceExhausted, OSError):  # (the disk filled meanwhile, or refuses the file)
            return False
    return True


def _has_room(directory: Path) -> bool:
    """Whether the data directory's disk may take more of a spool: a spool never takes the last
    tenth of the disk, nor the last GiB, which the store's writes need."""
    free, total = spool_module.disk_space(directory)
    return free - SPOOL_CHECK_BYTES > min(SPOOL_RESERVE_BYTES, total // 10)


def _packed(item: ExportItem) -> list[Any]:
    if isinstance(item, ExportedMemory):
        vec = None if item.vector is None else np.ascontiguousarray(item.vector, np.float32).tobytes()
        return [0, item.record.pack(), vec]
    if isinstance(item, ExportedScope):
        return [1, item.namespace, item.reflection_importance, item.summary_tokens]
    if isinstance(item, ExportedSettings):
        return [3, item.namespace, item.settings]
    return [2, item.kind, item.namespace, item.item]


def _unpacked(packed: list[Any]) -> ExportItem:
    if packed[0] == 0:
        vec = None if packed[2] is None else np.frombuffer(packed[2], np.float32)
        return ExportedMemory(Record.unpack(packed[1]), vec)
    if packed[0] == 1:
        return ExportedScope(packed[1], packed[2], packed[3])
    if packed[0] == 3:
        return ExportedSettings(packed[1], packed[2])
    return ExportedGraphItem(packed[1], packed[2], packed[3])


@dataclass
class _Import:
    """An import in progress: the memories waiting for the next batch, the graph and the scope
    progress gathered (applied at the end), and the counts so far."""

    source_ns: str
    target_ns: str
    reembed_model: str
    confirm: bool
    now: float  # (the import's time: later times it carries count as this)
    pending: list[tuple[Record, np.ndarray | None, str]] = field(default_factory=list)  # (field prefix)
    graph: list[tuple[str, str, dict[str, Any], str]] = field(default_factory=list)  # (field prefix)
    scopes: dict[str, list[float]] = field(default_factory=dict)  # ns -> [importance, tokens]
    settings: dict[str, SettingsChange] = field(default_factory=dict)  # (set last)
    imported: int = 0
    reembedded: int = 0

    def rename(self, ns: str, field_: str) -> str:
        """The namespace here of an exported namespace (under ``target_ns`` when given: then a
        chunk from outside the exported namespace is refused, never stored elsewhere)."""
        if self.target_ns:
            if self.source_ns and (ns == self.source_ns or ns.startswith(self.source_ns + "/")):
                return self.target_ns + ns[len(self.source_ns) :]
            if not self.source_ns:
                return f"{self.target_ns}/{ns}"
            raise InvalidArgument(field_, f"is outside the exported namespace {self.source_ns!r}")
        return ns


def restore(
    st: EngineState,
    header: ExportHeader,
    items: Iterator[ExportItem],
    target_namespace: str = "",
    batch: int = 500,
    confirm: bool = False,
    wanted: Callable[[], bool] | None = None,
) -> ImportResult:
    """Store exported memories (ids, times, counters and tiers kept), in commits of ``batch``,
    then the exported graph, then the namespaces' progress toward a reflection and a summary,
    added to what the namespaces here have accumulated already, then the namespaces' settings
    (last: a protection does not hold off the import's own memories). Memories the exporting server
    embedded are re-embedded when this server's embedder differs. An id that exists already is
    ALREADY_EXISTS; the batches committed before it stay."""
    if target_namespace:
        check.namespace("target_namespace", target_namespace)
    imp = _Import(header.namespace, target_namespace, header.embedder_model, confirm, st.clock())
    for i, item in enumerate(items):
        if isinstance(item, ExportedGraphItem):
            f = f"chunks[{i + 1}].graph_namespace"
            ns = check.namespace(f, imp.rename(item.namespace, f))
            imp.graph.append(
                (item.kind, ns, _checked_graph_item(st, i, item), f"chunks[{i + 1}].{item.kind}.")
            )
        elif isinstance(item, ExportedScope):
            _add_scope(imp, i, item)
        elif isinstance(item, ExportedSettings):
            _add_settings(st, imp, i, item)
        elif (stored := _memory_to_store(st, imp, i, item)) is not None:
            imp.pending.append(stored)
            if len(imp.pending) >= batch:
                _check_wanted(wanted)
                _flush(st, imp)
    _check_wanted(wanted)  # (a cancelled stream can end like a whole one: its rest is not stored)
    _flush(st, imp)
    _store_graph(st, imp.graph, batch)
    _add_progress(st, imp.scopes)
    if imp.settings:
        store_settings(st, list(imp.settings.values()))
    return ImportResult(
        imported=imp.imported,
        reembedded=imp.reembedded,
        graph_items=len(imp.graph),
        settings=len(imp.settings),
    )


def _check_wanted(wanted: Callable[[], bool] | None) -> None:
    if wanted is not None and not wanted():
        raise DeadlineExceeded(
            "the import was cancelled or its deadline passed: the batches committed before stay"
        )


def _add_scope(imp: _Import, i: int, item: ExportedScope) -> None:
    field_ = f"chunks[{i + 1}].scope."  # (chunk 0 is the header)
    refl, tokens = item.reflection_importance, item.summary_tokens
    # (above the caps: kept at them, as a server that counted past them exports more)
    if not (math.isfinite(refl) and refl >= 0):
        raise InvalidArgument(field_ + "reflection_importance", "must be a finite number, 0 or more")
    if tokens < 0:
        raise InvalidArgument(field_ + "summary_tokens", "must be 0 or more")
    ns = check.namespace(field_ + "namespace", imp.rename(item.namespace, field_ + "namespace"))
    got = imp.scopes.setdefault(ns, [0.0, 0])
    got[0], got[1] = _capped_progress(got[0] + refl, got[1] + tokens)


def _add_settings(st: EngineState, imp: _Import, i: int, item: ExportedSettings) -> None:
    """A namespace's exported settings, checked now (before the memories after them are stored) and
    set at the end: protection added, never removed; a policy replacing the namespace's overrides."""
    field_ = f"chunks[{i + 1}].settings."
    ns = check.namespace(field_ + "namespace", imp.rename(item.namespace, field_ + "namespace"))
    if ns in imp.settings:
        raise InvalidArgument(field_ + "namespace", f"the import sets namespace {ns!r}'s settings twice")
    protected, policy = bool(item.settings.get("protected")), item.settings.get("policy") or {}
    fields_ = {"protected"} if protected else set()
    if policy:
        fields_.add("policy")
    change = SettingsChange(ns, protected, check_overrides(policy, field_ + "policy."), fields_, imp.confirm)
    change.merged(st.ns_config.get(ns, {}))  # (a protected namespace's policy needs confirm)
    imp.settings[ns] = change


def _capped_progress(refl: float, tokens: float) -> tuple[float, int]:
    return min(refl, MAX_REFLECTION_IMPORTANCE), min(int(tokens), MAX_SUMMARY_TOKENS)


def _memory_to_store(
    st: EngineState, imp: _Import, i: int, item: ExportedMemory
) -> tuple[Record, np.ndarray | None, str] | None:
    """The record renamed and checked, with its vector (re-embedded when the export's embedder
    made it and differs from this server's; None: stored now, embedded by the maintenance pass)
    and the prefix of its fields' names; None for a memory past its expire_time (deleted for every
    read: not stored, nor counted)."""
    rec, vec = item.record, item.vector
    field_ = f"chunks[{i + 1}].memory."  # (chunk 0 is the header)
    _dated(rec, imp.now)
    rec.namespace = imp.rename(rec.namespace, field_ + "namespace")
    check.namespace(field_ + "namespace", rec.namespace)
    check.memory_id(field_ + "id", rec.id)
    check.restored_history(field_, rec)
    # (an export carries no evidence toward leaving the tier: what it counted would promote again)
    rec.access_base, rec.success_base = rec.access_count, rec.success_count
    # (times ahead of this server's clock, from one that ran ahead, would hold off idle demotion)
    rec.accessed_at, rec.tier_since = min(rec.accessed_at, imp.now), min(rec.tier_since, imp.now)
    if rec.kind in CONFIRMED_KINDS:
        check_protected(st, rec.namespace, imp.confirm, f"restoring a {rec.kind}")
    if rec.expired(imp.now):
        return None
    model = st.embedder.model
    if (rec.embedding_model == imp.reembed_model and imp.reembed_model != model) or vec is None:
        try:
            vec = st.embedder.embed(rec.content)
            imp.reembedded += 1
        except EmbedderError:
            vec = None
        rec.embedding_model = model
        return rec, vec, field_
    return rec, check.vector(field_ + "embedding", vec, st.config), field_


def _dated(rec: Record, now: float) -> None:
    """A memory exported without a creation time (NaN: unset) was created at the import, or at the
    earliest of its other times if before; its other times, where unset, are its creation's."""
    if math.isnan(rec.created_at):
        given = (rec.updated_at, rec.accessed_at, rec.tier_since)
        rec.created_at = min([now, *(t for t in given if not math.isnan(t))])
    for name in ("updated_at", "accessed_at", "tier_since"):
        if math.isnan(getattr(rec, name)):
            setattr(rec, name, rec.created_at)
    if rec.origin is not None and math.isnan(rec.origin[3]):
        rec.origin[3] = rec.created_at


def _flush(st: EngineState, imp: _Import) -> None:
    if imp.pending:
        imp.imported += _restore_batch(st, list(imp.pending), imp.confirm)
        imp.pending.clear()


def _checked_graph_item(st: EngineState, i: int, item: ExportedGraphItem) -> dict[str, Any]:
    """An imported node or edge checked as UpsertGraphNode and AddGraphEdge check theirs; a time
    the export lacks is the import's."""
    f, g, now = f"chunks[{i + 1}].{item.kind}.", dict(item.item), st.clock()
    check.memory_id(f + "id", g.get("id", ""))
    check.metadata(f + "properties", g.get("properties", {}), st.config)
    check.memory_ids(f + "memory_ids", g.get("memory_ids", []))
    if item.kind == "node":
        check.text(f + "label", g.get("label", ""))
        g["updated"] = now if g.get("updated") is None else check.finite_time(f + "update_time", g["updated"])
        return g
    check.memory_id(f + "source_id", g.get("source_id", ""))
    check.memory_id(f + "target_id", g.get("target_id", ""))
    if not g.get("relation"):
        raise InvalidArgument(f + "relation", "is required")
    check.label(f + "relation", g["relation"], 128)
    g["created"] = now if g.get("created") is None else check.finite_time(f + "create_time", g["created"])
    g["valid_from"] = (
        g["created"] if g.get("valid_from") is None else check.finite_time(f + "valid_from", g["valid_from"])
    )
    inv = g.get("invalid_from")
    if inv is not None and check.finite_time(f + "invalid_from", inv) <= g["valid_from"]:
        raise InvalidArgument(f + "invalid_from", "must be after valid_from")
    return g


def _store_graph(st: EngineState, graph: list[tuple[str, str, dict[str, Any], str]], batch: int) -> None:
    """Nodes and edges in commits of ``batch``, after checking, before the first, that every
    edge's ends are nodes of its namespace, stored or imported (NOT_FOUND as AddGraphEdge)."""
    for lo in range(0, len(graph), batch):
        chunk = graph[lo : lo + batch]

        def prepare(
            txn: Txn, chunk: list[tuple[str, str, dict[str, Any], str]] = chunk, first: bool = not lo
        ) -> int:
            if first:
                _check_edge_ends(st, txn, graph)
            for kind, ns, item, _ in chunk:
                if kind == "node":
                    st.store.put_node(txn, ns, item)
                else:
                    st.store.put_edge(txn, ns, item)
            return len(chunk)

        st.writer.submit(prepare, lambda n: n)


def _check_edge_ends(
    st: EngineState,
    txn: Txn,
    graph: list[tuple[str, str, dict[str, Any], str]],
) -> None:
    # (the import's nodes, and the stored ends already looked up: each is read once)
    known = {(ns, item["id"]) for kind, ns, item, _ in graph if kind == "node"}
    for kind, ns, item, field_ in graph:
        if kind != "edge":
            continue
        for end in ("source_id", "target_id"):
            if (ns, item[end]) in known:
                continue
            known.add((ns, item[end]))
            if st.store.get_node(txn, ns, item[end]) is None:
                missing = NotFound(
                    f"{field_}{end}: node {item[end]!r} not found in namespace {ns!r}, nor in the import",
                    reason="NODE_NOT_FOUND",
                )
                missing.metadata["field"] = f"{field_}{end}"
                raise missing


def _add_progress(st: EngineState, scopes: dict[str, list[float]]) -> None:
    if not scopes:
        return

    def add(txn: Txn) -> None:
        for ns, (refl, tokens) in scopes.items():
            state = st.store.scope_state(txn, ns)
            state.reflection_importance, state.summary_tokens = _capped_progress(
                state.reflection_importance + refl, state.summary_tokens + int(tokens)
            )
            st.store.put_scope_state(txn, ns, state)

    st.writer.submit(add, lambda _: None)


def _restore_batch(st: EngineState, items: list[tuple[Record, np.ndarray | None, str]], confirm: bool) -> int:
    freed: list[Record] = []  # (expired memories whose ids the import takes; replaced summaries)
    superseded = 0  # (restored summaries older than their namespace's: stored and replaced at once)

    def prepare(txn: Txn) -> list[tuple[Record, np.ndarray]]:
        spaces, now = st.store.spaces(txn), st.clock()
        nonlocal superseded
        freed.clear()  # (a retried attempt starts again)
        superseded = 0
        out = []
        for rec, vec, field_ in items:
            if rec.kind in CONFIRMED_KINDS:  # (again: a protection may have landed since)
                check_protected(st, rec.namespace, confirm, f"restoring a {rec.kind}", txn)
            try:  # (an expired memory's id is free, as for a create)
                freed.extend(free_id(st, txn, rec.namespace, rec.id, now))
            except AlreadyExists as e:
                taken = AlreadyExists(
                    f"{field_}id: {e} (stored before the import, or by an earlier chunk of it)"
                )
                taken.metadata["field"] = f"{field_}id"  # (the chunk, for clients that read ErrorInfo)
                raise taken from None
            if vec is not None:
                dim = int(vec.shape[0])
                st.claim_space(
                    txn, field_ + "embedding", rec.embedding_model, dim, spaces.get(rec.embedding_model)
                )
                spaces[rec.embedding_model] = dim
            rec.rid, rec.vk = st.alloc_ids()
            st.store.insert(txn, rec)
            if rec.kind == "summary":
                gone = _make_current_summary(st, txn, rec)
                if any(g is rec for g in gone):  # (older than the namespace's: replaced at once)
                    superseded += 1
                    continue
                freed.extend(gone)
            if vec is None:
                st.store.mark_pending(txn, rec.rid, True)
                vec = NO_VECTOR
            else:
                st.store.put_vector(txn, rec.rid, vec, new=True)
            out.append((rec, vec))
        return out

    def apply(out: list[tuple[Record, np.ndarray]]) -> int:
        upkeep.index_new(st, out)
        upkeep.unindex(st, freed)  # (after indexing: a summary replaced by a later one is in both)
        return len(out) + superseded

    weight = sum(len(r.content) + 4 * (0 if v is None else v.shape[0]) + 512 for r, v, _ in items)
    return int(st.writer.submit(prepare, apply, weight))


def _make_current_summary(st: EngineState, txn: Txn, rec: Record) -> list[Record]:
    """A namespace keeps one summary, however one arrives: the newer of the restored one and the
    namespace's current one (by create time: restored records get ids in export order, not time
    order) is its summary, the other is deleted (returned, to be unindexed). What the summary
    covers is left as it was, so a summary the server builds next reads them all again."""
    state = st.store.scope_state(txn, rec.namespace)
    current = st.store.get(txn, state.summary_rid) if state.summary_rid else None
    if (
        current is not None
        and current.kind == "summary"
        and not st.expired(current)
        and current.created_at > rec.created_at
    ):
        st.store.delete(txn, rec)
        return [rec]
    gone = replace_summary(st, txn, state, rec)
    state.summary_tokens = 0
    st.store.put_scope_state(txn, rec.namespace, state)
    return gone
