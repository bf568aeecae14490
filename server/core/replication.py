"""Replicas on other hosts (docs/scaling.md): the leader's side turns its commit log into batches of
changes (``feed``), the replica's side stores them (``store_batch``).

A batch carries the current state of what the commits changed, not the operations: each memory
written (its record, vector and whether it waits for one) or deleted, the settings (namespace
configs, embedding spaces, scope routing) when they changed, the whole graph of each namespace
whose graph changed, and the reflection and summary progress of the namespaces written. Stored in
one write transaction with the leader's commit it reaches (with the other parts of a backlog split
into several), a batch is applied whole or not at all,
and applying one twice changes nothing: a replica that reconnects continues from its last commit.
A replica that holds no copy of this leader's data, or one the commit log no longer reaches, gets
a full copy first (``full_copy_start``: what it held is dropped).

Encoding: msgpack maps, ``{"v": 1, ...}``; fields an older replica does not know are ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from tiermem.server.core import follow
from tiermem.server.core.spool import Spool
from tiermem.server.core.state import EngineState
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.model.records import Record
from tiermem.server.model.reports import ScopeState
from tiermem.server.storage.store import Txn

FORMAT = 1
BATCH_RECORDS = 512  # memories a batch carries at most (a backlog is split)
BATCH_GRAPH = 2048  # graph items a batch of a full copy carries at most
POLL_SECONDS = 0.01  # how often the feed looks for new commits
SPOOL_MEMORY_BYTES = 16 << 20  # the parts of a backlog past this go to a temporary file


class Parts(Spool):
    """The packed parts of a backlog (``Spool``): neither side ever holds a long backlog whole in
    memory (the leader between packing and sending them, a replica until the last one arrives);
    a write the writer retries reads them again."""

    def __init__(self, directory: Path | None, memory_bytes: int | None = None) -> None:
        limit = SPOOL_MEMORY_BYTES if memory_bytes is None else memory_bytes
        super().__init__(directory, limit, "a replica's changes")


# -- the leader's side --------------------------------------------------------------------------
def feed(
    st: EngineState,
    instance: str,
    after: int,
    wanted: Callable[[], bool],
    done: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[int, bool, bytes]]:
    """(commit reached or 0 within a split batch, full_copy_start, batch) for a replica at commit
    ``after`` of data ``instance``, until ``wanted()`` is false, or ``done()`` once caught up."""
    if not st.store.log_commits:
        raise FailedPrecondition(
            "this server keeps no commit log: start it with replication", "NOT_REPLICATING"
        )
    with st.store.read() as txn:
        committed = st.store.committed_seq(txn)
        continuable = (  # (a replica past the last commit holds another history: a full copy)
            instance == st.store.instance
            and 0 < after <= committed
            and (after == committed or st.store.commit_log_entry(txn, after + 1) is not None)
        )
    token = object()
    try:
        if not continuable:
            if committed == 0:  # (a copy ends with its commit: an empty one, so a replica sees the end)
                st.writer.submit(lambda txn: None, lambda _: None)
            after = yield from _full_copy(st, token)
        st.feed_floors[token] = after  # (the commit log keeps what this feed has yet to send)
        while wanted():
            # Packed into a spool under the read transaction, sent after it closed: a replica
            # that stops reading never holds a transaction open (nor map growth, which waits
            # for readers), and a long backlog is never whole in memory.
            with st.store.read() as txn:
                seq = st.store.committed_seq(txn)
                parts = None if seq == after else _changes_since(st, txn, after, seq)
            if parts is None:
                if done():
                    return
                time.sleep(POLL_SECONDS)
                continue
            yield from _sent(parts, seq)
            after = st.feed_floors[token] = seq
    finally:
        st.feed_floors.pop(token, None)


def _changes_since(st: EngineState, txn: Txn, after: int, seq: int) -> Parts:
    """The batches that bring a replica from commit ``after`` to ``seq``, packed into a spool (the
    last one is the one that reaches ``seq``); FailedPrecondition when the commit log no longer
    reaches back."""
    settings, rids, graph, scopes = False, set(), set(), set()
    every_scope = False  # (an entry written before the log named them: all progress is sent)
    for s in range(after + 1, seq + 1):
        entry = st.store.commit_log_entry(txn, s)
        if entry is None:  # (dropped from the log: the replica starts over with a full copy)
            raise FailedPrecondition(f"commit {s} is no longer in the commit log", "REPLICA_TOO_FAR_BEHIND")
        settings = settings or entry[0]
        rids.update(entry[1])
        graph.update(entry[2])
        if entry[3] is None:
            every_scope = True
        else:
            scopes.update(entry[3])
    ordered = sorted(rids)
    parts = [ordered[i : i + BATCH_RECORDS] for i in range(0, len(ordered), BATCH_RECORDS)] or [[]]
    out = Parts(st.config.data_dir)
    try:
        for i, part in enumerate(parts):
            batch = _records(st, txn, part)
            if i == 0 and settings:  # (first: a copy's parts are stored one by one, spaces before vectors)
                batch.update(_settings(st, txn))
            if i == len(parts) - 1:
                batch["graph"] = [
                    [ns, children, _graph(st, txn, ns, children)] for ns, children in sorted(graph)
                ]
                if every_scope:
                    batch["scopes"] = _scopes(st.store.scope_states(txn))
                    batch["scopes_whole"] = True
                else:
                    _add_scopes(st, txn, batch, scopes)
            out.add(_pack(st, txn, batch))
    except BaseException:
        out.close()
        raise
    return out


def _full_copy(st: EngineState, token: object) -> Generator[tuple[int, bool, bytes], None, int]:
    """A whole copy, then the commits made while it was read; returns the commit the copy reaches
    (its last batch carries it). Each batch is read in a short read transaction of its own and
    sent after it closed: a replica that stops reading holds no transaction (nor map growth,
    which waits for readers), and of the memories the leader holds one batch at a time.
    Batches are current state, so the commits since the first read (kept in the commit log by
    ``token``'s floor) bring whatever the later reads missed or saw half-way to one commit; the
    scan stops at the records that existed at the first read (it would chase new ones)."""
    with st.store.read() as txn:
        start = st.store.committed_seq(txn)
        st.feed_floors[token] = start
        first = _settings(st, txn)
        first["scopes"] = _scopes(st.store.scope_states(txn))
        spaces = first["spaces"]
        payload = _pack(st, txn, first)
        # (a record from here on was written after ``start``: it comes with the commits since)
        end = max(first["next_rid"], st.store.last_rid(txn) + 1)
    yield 0, True, payload
    after = 0  # (the records from this rid on are still to send)
    while after < end:
        with st.store.read() as txn:
            part = [rid for rid in st.store.record_rids(txn, after, BATCH_RECORDS) if rid < end]
            if not part:
                break
            batch = _records(st, txn, part)
            if (now := st.store.spaces(txn)) != spaces:  # (a space declared before its vectors come)
                batch.update(_settings(st, txn))
                spaces = now
            payload = _pack(st, txn, batch)
        yield 0, False, payload
        after = part[-1] + 1 if len(part) == BATCH_RECORDS else end  # (a short one was the last)
    with st.store.read() as txn:  # (the replica was emptied: items are only put)
        graph = _graph(st, txn, "", True)
        payloads = [
            _pack(st, txn, {"graph_items": graph[i : i + BATCH_GRAPH]})
            for i in range(0, len(graph), BATCH_GRAPH)
        ]
    for payload in payloads:
        yield 0, False, payload
    with st.store.read() as txn:
        seq = st.store.committed_seq(txn)
        parts = _changes_since(st, txn, start, seq)  # (an empty batch reaching ``seq`` if none)
    yield from _sent(parts, seq)
    return seq


def _sent(parts: Parts, seq: int) -> Iterator[tuple[int, bool, bytes]]:
    """The feed's items of a spool's parts (the last one reaches ``seq``); the spool closed after."""
    try:
        for i, payload in enumerate(parts):
            yield seq if i == parts.count - 1 else 0, False, payload
    finally:
        parts.close()


def _records(st: EngineState, txn: Txn, rids: list[int]) -> dict[str, Any]:
    """The memories of ``rids`` as they are (or deleted), with their namespaces' progress."""
    written, deleted, names = [], [], set()
    for rid, rec in zip(rids, st.store.get_many(txn, rids), strict=True):
        if rec is None:
            deleted.append(rid)
            continue
        vec = st.store.get_vector(txn, rid)
        raw = None if vec is None else np.ascontiguousarray(vec, np.float32).tobytes()
        written.append([rid, rec.pack(), raw, st.store.is_pending(txn, rid)])
        names.add(rec.namespace)
    states = [(ns, st.store.scope_state(txn, ns)) for ns in sorted(names)]
    return {"records": written, "deleted": deleted, "scopes": _scopes(states)}


def _add_scopes(st: EngineState, txn: Txn, batch: dict[str, Any], names: set[str]) -> None:
    """The progress of the namespaces ``names`` whose progress the commits changed, beside that of
    the namespaces of the memories written (a namespace whose memories were all deleted or moved
    has none written); ``scopes_gone``: those whose progress was dropped."""
    names = names - {ns for ns, _ in batch["scopes"]}
    held = [(ns, st.store.stored_scope_state(txn, ns)) for ns in sorted(names)]
    batch["scopes"] += _scopes([(ns, s) for ns, s in held if s is not None])
    batch["scopes_gone"] = [ns for ns, s in held if s is None]


def _scopes(states: list[tuple[str, ScopeState]]) -> list[list[Any]]:
    return [
        [ns, [s.reflection_importance, s.summary_tokens, s.summary_rid, s.covered_rid]] for ns, s in states
    ]


def _settings(st: EngineState, txn: Txn) -> dict[str, Any]:
    routing = st.store.scope_routing(txn)
    return {
        "configs": st.store.namespace_configs(txn),
        "spaces": st.store.spaces(txn),
        "routing": [[scope, state, moved_to] for scope, (state, moved_to) in routing.items()],
    }


def _graph(st: EngineState, txn: Txn, namespace: str, children: bool) -> list[list[Any]]:
    return [[kind, ns, item] for kind, ns, item in st.store.graph_items(txn, namespace, children)]


def _pack(st: EngineState, txn: Txn, batch: dict[str, Any]) -> bytes:
    batch["next_rid"], batch["next_vk"] = st.store.counters(txn)
    batch["v"] = FORMAT
    return msgpack.packb(batch, use_bin_type=True)


# -- the replica's side -------------------------------------------------------------------------
def position(st: EngineState) -> tuple[str, int]:
    """(the leader data this replica copies, the last of its commits stored here)."""
    with st.store.read() as txn:
        return st.store.replica_position(txn)


def store_batch(st: EngineState, instance: str, seq: int, start: bool, payloads: Iterable[bytes]) -> None:
    """Store batches (durably, in one commit) and bring the columns and indexes in line: the parts
    of one split backlog together, so that no reader and no promotion sees a part of a commit.
    ``payloads`` is read once per attempt, a batch at a time (a list, or ``Parts``)."""

    def prepare(txn: Txn) -> tuple[list[int], bool]:
        touched = _wipe(st, txn) if start else []
        settings = False
        for payload in payloads:
            batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
            if batch.get("v", 0) > FORMAT:  # (nothing of the commit is stored)
                raise FailedPrecondition(
                    f"the leader sends batches of format {batch['v']}: upgrade this replica", "FORMAT"
                )
            touched += _store_batch(st, txn, batch)
            settings = settings or "configs" in batch
        if seq or start:
            st.store.put_replica_position(txn, instance, seq)
        return touched, settings or start

    def publish(result: tuple[list[int], bool]) -> None:
        touched, settings = result
        if start or seq:
            st.replica_copying = seq == 0  # (reads are refused from a copy's first batch to its last)
        with st.store.read() as txn:
            if settings:
                follow.follow_settings(st, txn)
            follow.follow_records(st, txn, np.array(sorted(set(touched)), np.int64))

    st.writer.submit(prepare, publish)


def _store_batch(st: EngineState, txn: Txn, batch: dict[str, Any]) -> list[int]:
    """Store one batch's records, settings, graph and progress; returns the rids it touched."""
    touched = _store_records(st, txn, batch)
    if "configs" in batch:
        _store_settings(st, txn, batch)
    for ns, children, items in batch.get("graph", []):
        st.store.delete_graph(txn, ns, children)
        _put_graph(st, txn, items)
    _put_graph(st, txn, batch.get("graph_items", []))
    for ns, (refl, tokens, summary_rid, covered) in batch.get("scopes", []):
        st.store.put_scope_state(txn, ns, ScopeState(refl, tokens, summary_rid, covered))
    gone = batch.get("scopes_gone", [])
    if batch.get("scopes_whole"):  # (every namespace's progress: any other is gone)
        held = {ns for ns, _ in batch["scopes"]}
        gone = [ns for ns, _ in st.store.scope_states(txn) if ns not in held]
    for ns in gone:
        st.store.put_scope_state(txn, ns, None)
    # (written with the commit by EngineState.before_commit: a promoted replica never reuses a rid)
    st.next_rid = max(st.next_rid, int(batch.get("next_rid", 1)))
    st.next_vk = max(st.next_vk, int(batch.get("next_vk", 1)))
    return touched


def _put_graph(st: EngineState, txn: Txn, items: list[list[Any]]) -> None:
    for kind, ns, item in items:
        (st.store.put_node if kind == "node" else st.store.put_edge)(txn, ns, item)


def _wipe(st: EngineState, txn: Txn) -> list[int]:
    """Drop what the replica held (a full copy replaces it): the rids deleted."""
    gone = list(st.store.iter_records(txn))
    for rec in gone:
        st.store.delete(txn, rec)
    st.store.delete_graph(txn, "", True)
    for ns in st.store.namespace_configs(txn):
        st.store.put_namespace_config(txn, ns, {})
    for scope in st.store.scope_routing(txn):
        st.store.put_scope_routing(txn, scope, 0, "")
    for ns, _ in st.store.scope_states(txn):
        st.store.put_scope_state(txn, ns, None)
    return [rec.rid for rec in gone]


def _store_records(st: EngineState, txn: Txn, batch: dict[str, Any]) -> list[int]:
    touched = []
    for rid in batch.get("deleted", []):  # (first: a written record may reuse a deleted one's id)
        old = st.store.get(txn, rid)
        if old is not None:
            st.store.delete(txn, old)
            touched.append(rid)
    for rid, packed, raw, pending in batch.get("records", []):
        rec = Record.unpack(packed)
        old = st.store.get(txn, rid)
        if old is not None and (old.namespace, old.id) != (rec.namespace, rec.id):
            st.store.delete(txn, old)
            old = None
        if old is None:
            st.store.put(txn, rec)
        else:
            st.store.replace(txn, old, rec)
        if raw is not None:
            st.store.put_vector(txn, rid, np.frombuffer(raw, np.float32))
        st.store.mark_pending(txn, rid, bool(pending))
        touched.append(rid)
    return touched


def _store_settings(st: EngineState, txn: Txn, batch: dict[str, Any]) -> None:
    configs = batch["configs"]
    for ns in st.store.namespace_configs(txn):
        if ns not in configs:
            st.store.put_namespace_config(txn, ns, {})
    for ns, cfg in configs.items():
        st.store.put_namespace_config(txn, ns, cfg)
    for model, dim in batch["spaces"].items():
        declared = st.config.declared_spaces.get(model, dim)
        if declared != dim:  # (stored, it would stop this replica's next start)
            raise FailedPrecondition(
                f"embedding_spaces declares {model}={declared}, but the leader's vectors of it have "
                f"dimension {dim}: declare the leader's spaces",
                "EMBEDDING_SPACE_CONFLICT",
            )
        if st.store.space(txn, model) is None:
            st.store.put_space(txn, model, int(dim))
    wanted = {scope: (int(state), str(moved_to)) for scope, state, moved_to in batch["routing"]}
    for scope in st.store.scope_routing(txn):
        if scope not in wanted:
            st.store.put_scope_routing(txn, scope, 0, "")
    for scope, (state, moved_to) in wanted.items():
        st.store.put_scope_routing(txn, scope, state, moved_to)
