"""Tenant shards from the outside (docs/scaling.md): ``Shards`` asks every shard what names no
namespace (the namespaces, server-wide figures), and ``move_scope`` moves a tenant, a top-level
scope with its whole tree, from one shard to another without losing or repeating a write.

A move, with ``switch`` the caller's way to point the proxy at the target:

1. copy: export the scope at the source (children, graph) and import it at the target, while the
   tenant keeps writing at the source;
2. fence: the source refuses the scope's writes (UNAVAILABLE, SCOPE_FENCED, with retry info:
   clients make them again), so what it holds no longer changes;
3. catch up: export again and bring the target to exactly that: memories created or changed
   meanwhile imported, those deleted meanwhile deleted, the graph and the namespaces' reflection
   and summary progress written (all in the export); then both sides are compared memory by
   memory, and the namespaces' settings (in the export too) set at the target;
4. switch: ``switch()`` routes the scope to the target;
5. retire: the source answers every call of the scope with UNAVAILABLE SCOPE_MOVED (so a client
   whose proxy has not switched yet retries instead of reading an empty scope) and deletes it.

A write acknowledged by the source before the fence is in the export of step 3; a write refused
by the fence is made again by its client and lands, after the switch, at the target. A failure
before step 4 lifts the fence and leaves the source serving (the target's partial copy is deleted).
The target's copy is marked RECEIVING until the switch, so ``end_move`` can end a move that was
killed or could not undo itself: finish it if the proxy had switched, else undo it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tiermem.v1 import memory_pb2 as pb

from .client import MemoryClient
from .errors import NotFoundError, TiermemError
from .routing import ROUTE_HEADER

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Shards:
    """Clients of every shard, by name (``{"a": "10.0.0.1:50051", ...}``; ``options`` are
    ``MemoryClient``'s: api_key, tls, timeout), for what a proxy cannot route: calls that name no
    namespace. Use as a context manager or call ``close``."""

    def __init__(self, shards: Mapping[str, str], **options: Any) -> None:
        if not shards:
            raise ValueError("shards: give at least one shard")
        self.clients = {name: MemoryClient(address, **options) for name, address in shards.items()}

    def close(self) -> None:
        for c in self.clients.values():
            c.close()

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def locate(self, scope: str) -> list[str]:
        """The shards holding memories of top-level ``scope`` (one, unless a move is under way)."""
        route = [(ROUTE_HEADER, scope)]
        return [name for name, c in self.clients.items() if _namespaces(c, scope, route)]

    def list_namespaces(self, prefix: str = "") -> list[tuple[str, pb.NamespaceInfo]]:
        """(shard, namespace) of every namespace holding memories on any shard, in name order."""
        found = [
            (name, ns)
            for name, c in self.clients.items()
            for ns in _of_shard(name, functools.partial(_listed, c, prefix))
        ]
        return sorted(found, key=lambda pair: (pair[1].name, pair[0]))

    def stats(self) -> dict[str, Any]:
        """Each shard's server-wide figures, and the memories and namespaces of all of them."""
        per_shard = {name: _of_shard(name, c.stats) for name, c in self.clients.items()}
        return {
            "memory_count": sum(s.memory_count for s in per_shard.values()),
            "namespace_count": sum(s.namespace_count for s in per_shard.values()),
            "shards": per_shard,
        }


def _listed(client: MemoryClient, prefix: str) -> list[pb.NamespaceInfo]:
    return list(client.list_namespaces(prefix))


def _of_shard(name: str, call: Callable[[], T]) -> T:
    """``call()``; a failure names the shard it came from (its message names only an address)."""
    try:
        return call()
    except TiermemError as e:
        if hasattr(e, "add_note"):  # (Python 3.11+)
            e.add_note(f"(shard {name!r})")
        raise


@dataclass
class MoveReport:
    """What ``move_scope`` did: memories copied in the first pass and caught up in the second (and
    deleted at the target because they were deleted meanwhile), the memories of the scope at the
    end, how long writes were fenced, and the steps with their times."""

    scope: str
    copied: int = 0
    caught_up: int = 0
    deleted: int = 0
    memories: int = 0
    fenced_seconds: float = 0.0
    steps: list[tuple[str, float]] = field(default_factory=list)


def move_scope(
    scope: str,
    source: MemoryClient,
    target: MemoryClient,
    switch: Callable[[], None],
    *,
    moved_to: str = "",
    on_step: Callable[[str], None] | None = None,
) -> MoveReport:
    """Move top-level ``scope`` from ``source`` to ``target`` (clients of the shards themselves, not
    of the proxy, with an admin key); ``switch`` routes the scope to the target. See the module
    docstring for the steps and their guarantees."""
    if not scope or "/" in scope:
        raise ValueError(f"scope: {scope!r} is not a top-level scope (a namespace without '/')")
    route = [(ROUTE_HEADER, scope)]
    report = MoveReport(scope)
    started = time.monotonic()

    def step(name: str) -> None:
        report.steps.append((name, round(time.monotonic() - started, 3)))
        if on_step is not None:
            on_step(name)

    held = _namespaces(target, scope, route)
    if held:
        left = target.get_scope_routing(scope, call_metadata=route).routing == pb.SCOPE_ROUTING_RECEIVING
        hint = " (the copy of a move that did not end: tiermem shard end-move)" if left else ""
        raise ValueError(f"the target already holds {len(held)} namespaces of {scope!r} ({held[0]}){hint}")
    # (marked as this move's copy until the switch; it may have moved away from the target once)
    move_id = f"move:{uuid.uuid4().hex[:16]}"
    target.set_scope_routing(scope, "receiving", moved_to=move_id, call_metadata=route)
    fenced_at = None
    fencing = False
    try:
        step("copy")
        first = _export(source, scope, route)
        # (progress at the catch-up, settings last: an undone copy leaves no settings behind)
        copy = [c for c in first if c.WhichOneof("chunk") not in ("scope", "settings")]
        report.copied = _import(target, copy, route)
        step("fence")
        fencing = True  # (from here a failure lifts the fence: the call may have set it and failed after)
        source.set_scope_routing(scope, "fenced", moved_to=moved_to, call_metadata=route)
        fenced_at = time.monotonic()
        step("catch up")
        final = _export(source, scope, route)
        report.caught_up, report.deleted = _catch_up(target, final, route)
        report.memories = _verify(source, target, scope, route)
        _still_this_move(source, target, scope, route, move_id)
        settings = [c for c in final if c.WhichOneof("chunk") == "settings"]
        if settings:  # (after every check: from here only a failed switch leaves them at the target)
            _import(target, [final[0], *settings], route)
    except BaseException as failure:
        # Each undo is tried even if the other fails (a source that died cannot be unfenced, but the
        # target's copy, never routed to before the switch, still goes); what failed is noted.
        undo: list[tuple[str, Callable[[], object]]] = []
        if fencing:
            undo.append(
                ("lift the fence", lambda: source.set_scope_routing(scope, "serving", call_metadata=route))
            )
        undo.append(("delete the target's copy", lambda: _drop_copy(target, scope, route)))
        for what, action in undo:
            try:
                action()
            except Exception as e:
                note = f"the move failed, and could not {what}: {e} (docs/scaling.md: after a failed move)"
                logger.error("%s", note)
                if hasattr(failure, "add_note"):  # (Python 3.11+)
                    failure.add_note(note)
        raise
    step("switch")
    try:
        switch()
    except BaseException as failure:
        note = (
            f"the move of {scope!r} stopped at its switch, the source fenced and the target holding "
            "the copy: end it with `tiermem shard end-move` (end_move), which finishes the move if the "
            "proxy switched and undoes it if not"
        )
        logger.error("%s", note)
        if hasattr(failure, "add_note"):  # (Python 3.11+)
            failure.add_note(note)
        raise
    target.set_scope_routing(scope, "serving", call_metadata=route)
    step("retire")
    source.set_scope_routing(scope, "moved", moved_to=moved_to, purge=True, call_metadata=route)
    report.fenced_seconds = round(time.monotonic() - (fenced_at or started), 3)
    step("done")
    return report


@dataclass
class EndReport:
    """What ``end_move`` did: ``ended`` is "finished" (the source retired and purged), "undone"
    (the fence lifted, the target's copy deleted) or "nothing to end"; the states each side was in
    before, and the memories deleted."""

    scope: str
    ended: str
    switched: bool
    source_was: str
    target_was: str
    purged: int = 0  # at the source (finished)
    deleted: int = 0  # of the target's copy (undone)


def end_move(
    scope: str,
    source: MemoryClient,
    target: MemoryClient,
    switched: bool,
    *,
    switch: Callable[[], None] | None = None,
    moved_to: str = "",
) -> EndReport:
    """End a move of top-level ``scope`` from ``source`` to ``target`` that stopped midway (the
    command killed, or a shard unreachable while it undid itself). ``switched``: whether the proxy
    routes the scope to the target. If it does, the move is finished (``switch`` first makes the
    route durable again; the target's copy was compared before the switch): the target serves the
    scope and the source retires and purges it. If not, it is undone: the source's fence is lifted
    and the target's copy, marked RECEIVING by the move, is deleted. ValueError, changing nothing,
    when the states are not those of a move from ``source`` to ``target``."""
    if not scope or "/" in scope:
        raise ValueError(f"scope: {scope!r} is not a top-level scope (a namespace without '/')")
    route = [(ROUTE_HEADER, scope)]
    src = source.get_scope_routing(scope, call_metadata=route).routing
    tgt = target.get_scope_routing(scope, call_metadata=route).routing
    report = EndReport(scope, "nothing to end", switched, _state_name(src), _state_name(tgt))
    at_source = bool(_namespaces(source, scope, route))  # (also when MOVED: a purge may not have run)
    if switched:
        if tgt in (pb.SCOPE_ROUTING_FENCED, pb.SCOPE_ROUTING_MOVED):
            raise ValueError(
                f"the target is {report.target_was} for {scope!r}: it is not where a move to it ends"
            )
        if src in (pb.SCOPE_ROUTING_UNSPECIFIED, pb.SCOPE_ROUTING_RECEIVING):
            raise ValueError(
                f"the proxy routes {scope!r} to the target, but the source never fenced it "
                f"({report.source_was}): not a move from it; check --from and --to"
            )
        if at_source and not _namespaces(target, scope, route):
            raise ValueError(
                f"the source holds {scope!r} and the target nothing of it: not purging the source; "
                "check --to (docs/scaling.md: after a failed move)"
            )
        if src == pb.SCOPE_ROUTING_FENCED or at_source or tgt == pb.SCOPE_ROUTING_RECEIVING:
            if switch is not None:
                switch()
            target.set_scope_routing(scope, "serving", call_metadata=route)
            retired = source.set_scope_routing(
                scope, "moved", moved_to=moved_to, purge=True, call_metadata=route
            )
            report.ended, report.purged = "finished", int(retired.purged_count)
        return report
    _check_undo(scope, src, tgt, at_source, _namespaces(target, scope, route), report)
    if src == pb.SCOPE_ROUTING_FENCED:
        source.set_scope_routing(scope, "serving", call_metadata=route)
        report.ended = "undone"
    if tgt == pb.SCOPE_ROUTING_RECEIVING:
        report.deleted = _drop_copy(target, scope, route)
        report.ended = "undone"
    return report


def _check_undo(scope: str, src: int, tgt: int, at_source: bool, held: list[str], report: EndReport) -> None:
    """ValueError unless undoing is ending a move from this source to this target."""
    if src == pb.SCOPE_ROUTING_MOVED:
        raise ValueError(
            f"the source has retired {scope!r} but the proxy does not route it to the target: "
            "not undone (docs/scaling.md: after a failed move)"
        )
    if held and tgt != pb.SCOPE_ROUTING_RECEIVING:
        raise ValueError(
            f"the target holds {scope!r} ({held[0]}) and it is {report.target_was}, not a move's copy: "
            "not deleted; check --from and --to"
        )
    if tgt == pb.SCOPE_ROUTING_RECEIVING and src == pb.SCOPE_ROUTING_UNSPECIFIED and not at_source:
        raise ValueError(
            f"the source neither holds nor fenced {scope!r}: it is not where the move came from; check --from"
        )


def _still_this_move(
    source: MemoryClient, target: MemoryClient, scope: str, route: list[tuple[str, str]], move_id: str
) -> None:
    """RuntimeError unless the source is still fenced and the target still holds this move's copy
    (an end-move run meanwhile would have undone them): checked just before the switch."""
    src = source.get_scope_routing(scope, call_metadata=route)
    tgt = target.get_scope_routing(scope, call_metadata=route)
    if src.routing != pb.SCOPE_ROUTING_FENCED or (tgt.routing, tgt.moved_to) != (
        pb.SCOPE_ROUTING_RECEIVING,
        move_id,
    ):
        raise RuntimeError(
            f"the move of {scope!r} was changed by another command while it ran (the source is "
            f"{_state_name(src.routing)}, the target {_state_name(tgt.routing)}): not switched"
        )


def _state_name(state: int) -> str:
    """The name of a routing state: "serving" for UNSPECIFIED, else the proto's ("fenced", ...)."""
    if state == pb.SCOPE_ROUTING_UNSPECIFIED:
        return "serving"
    known = state in pb.ScopeRouting.values()
    return pb.ScopeRouting.Name(state).removeprefix("SCOPE_ROUTING_").lower() if known else f"state {state}"


def _drop_copy(target: MemoryClient, scope: str, route: list[tuple[str, str]]) -> int:
    """Delete the target's copy of ``scope`` and its RECEIVING mark: the memories deleted."""
    deleted = target.delete_namespace(scope, include_children=True, confirm=True, call_metadata=route)
    target.set_scope_routing(scope, "serving", call_metadata=route)
    return deleted


def _namespaces(client: MemoryClient, scope: str, route: list[tuple[str, str]]) -> list[str]:
    """The namespaces of ``scope``'s tree that hold memories on ``client``'s server."""
    return [
        ns.name
        for ns in client.list_namespaces(scope, call_metadata=route)
        if ns.name == scope or ns.name.startswith(scope + "/")
    ]


def _export(
    source: MemoryClient, scope: str, route: list[tuple[str, str]]
) -> list[pb.ExportMemoriesResponse]:
    # Streams have no deadline and wait for their connection: a shard that is down would hold
    # the move forever, so it must answer within the client's timeout first.
    source.wait_ready(call_metadata=route)
    return list(source.export_memories(scope, include_children=True, call_metadata=route))


def _import(
    target: MemoryClient, chunks: list[pb.ExportMemoriesResponse], route: list[tuple[str, str]]
) -> int:
    if not any(c.WhichOneof("chunk") != "header" for c in chunks):
        return 0
    target.wait_ready(call_metadata=route)  # (as in _export)
    # (a move copies what the source already held: protection was checked when it was stored)
    return int(target.import_memories(chunks, confirm=True, call_metadata=route).imported)


def _key(m: pb.Memory) -> tuple[str, str]:
    return m.namespace, m.id


def _version(m: pb.Memory) -> bytes:
    """What a write can change of a memory (feedback and tier moves included), without its vector
    (not listed) and what reads change (accesses: searches still run while writes are fenced)."""
    copy = pb.Memory()
    copy.CopyFrom(m)
    for name in ("embedding", "access_count", "last_access_time"):
        copy.ClearField(name)
    return copy.SerializeToString(deterministic=True)


def _stored(
    client: MemoryClient, scope: str, route: list[tuple[str, str]]
) -> dict[tuple[str, str], pb.Memory]:
    return {
        _key(m): m
        for ns in _namespaces(client, scope, route)
        for m in client.list_memories(ns, call_metadata=route)
    }


def _catch_up(
    target: MemoryClient, final: list[pb.ExportMemoriesResponse], route: list[tuple[str, str]]
) -> tuple[int, int]:
    """Bring the target to the fenced source's export ``final``: (memories imported, deleted)."""
    scope = route[0][1]
    at_target = _stored(target, scope, route)
    wanted = {_key(c.memory): c.memory for c in final if c.WhichOneof("chunk") == "memory"}
    stale = [k for k, m in at_target.items() if k not in wanted or _version(m) != _version(wanted[k])]
    for ns, id_ in stale:
        with contextlib.suppress(NotFoundError):  # (expired since it was listed: gone all the same)
            target.delete(ns, id_, confirm=True, call_metadata=route)
    missing = {k for k in wanted if k not in at_target or k in stale}
    chunks = [
        c
        for c in final
        if c.WhichOneof("chunk") != "settings"
        and (c.WhichOneof("chunk") != "memory" or _key(c.memory) in missing)
    ]  # the header, the new and changed memories, the scopes' progress and the graph (idempotent)
    imported = _import(target, chunks, route)
    return imported, len([k for k in stale if k not in wanted])


def _verify(source: MemoryClient, target: MemoryClient, scope: str, route: list[tuple[str, str]]) -> int:
    """The number of memories of ``scope``, once both sides hold the same ones, each at the same
    version; else RuntimeError naming the first difference."""
    here, there = _stored(source, scope, route), _stored(target, scope, route)
    for key in sorted(here.keys() | there.keys()):
        if key not in there or key not in here or _version(here[key]) != _version(there[key]):
            raise RuntimeError(f"the copy of {scope!r} differs at memory {key}: the move was not switched")
    return len(here)
