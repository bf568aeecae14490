"""``TiermemStore``: LangGraph's ``BaseStore`` (long-term memory for graphs) on a tiermem server.

Each item is one memory of kind ``langgraph_item``: its namespace tuple a namespace path under the
store's ``namespace_prefix`` and its key the memory's client id (keys.py), its value the memory's
content and metadata (values.py). Operations map onto ``MemoryClient`` calls:

- get: ``GetMemory``; put: ``CreateMemory`` with the client id (several puts of a batch in one
  ``BatchCreateMemories``), and on ALREADY_EXISTS ``UpdateMemory`` of content, kind, metadata and
  expire_time (the replace keeps the memory, its creation time and its tier); delete:
  ``DeleteMemory``.
- search: ``ListNamespaces`` under the prefix, then with a query one ``SearchMemories`` over those
  namespaces (tiermem's default ranking; more than 64 namespaces: ``BatchSearchMemories`` of 64 each
  with the comprehensive strategy, whose scores compare across searches), without one each
  namespace's timeline (``ListMemories`` newest first) merged newest first; ``filter`` as in
  filters.py.
- list_namespaces: ``ListNamespaces``, matched, cut to ``max_depth`` and paged in the client.
- TTL (minutes): ``expire_time``; reads with ``refresh_ttl`` move it on (``UpdateMemory``).

A batch runs its reads in order, then its writes (the last put of a key wins), as LangGraph's own
stores do: a read never sees a write of its own batch. The async methods run the same calls on a
worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from tiermem.client import (
    AlreadyExistsError,
    Memory,
    MemoryClient,
    NotFoundError,
    PermissionDeniedError,
    metadata_dict,
)

from . import filters, keys, values

DEFAULT_KIND = "langgraph_item"
# tiermem's limits: results of one search (max_search_limit), namespaces of one search, searches of
# one BatchSearchMemories, page size (max_page_size), memories of one batch create (max_batch_size).
MAX_RESULTS = 1000
NAMESPACES_PER_SEARCH = 64
SEARCHES_PER_CALL = 100
MAX_PAGE = 1000
MAX_BATCH = 1000
_UNINDEXED = {f"metadata.{values.UNINDEXED}": {"$ne": True}}

T = TypeVar("T")


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _seconds(ts: Any) -> float:
    return float(ts.seconds + ts.nanos / 1e9)


def _when(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def _does_match(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (or ends) with ``condition.path``, '*' matching any label."""
    path = condition.path
    if len(namespace) < len(path):
        return False
    pairs = (
        zip(namespace, path, strict=False)
        if condition.match_type == "prefix"
        else zip(reversed(namespace), reversed(path), strict=False)
    )
    return all(p == "*" or label == p for label, p in pairs)


def _labels(op: Op) -> list[tuple[str, ...]]:
    """The namespaces (or namespace patterns) an op names."""
    if isinstance(op, GetOp | PutOp):
        return [op.namespace]
    if isinstance(op, SearchOp):
        return [op.namespace_prefix]
    return [tuple(c.path) for c in op.match_conditions or ()]


def _check(op: Op) -> None:
    if not isinstance(op, GetOp | SearchOp | ListNamespacesOp | PutOp):
        raise ValueError(f"Unknown operation type: {type(op)}")
    # LangGraph's label rule, which keys.py's escaping relies on ('.' never in a label); ops given
    # to batch directly skip BaseStore's own check.
    for labels in _labels(op):
        for label in labels:
            if not isinstance(label, str) or not label or "." in label or "\x00" in label:
                raise InvalidNamespaceError(
                    f"Invalid namespace label {label!r} in {labels}: labels are non-empty strings "
                    "without '.' or NUL"
                )
    if isinstance(op, PutOp) and op.value is not None:
        if not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if op.namespace[0] == "langgraph":
            raise InvalidNamespaceError(
                f'Root label for namespace cannot be "langgraph". Got: {op.namespace}'
            )
    if isinstance(op, SearchOp | ListNamespacesOp) and (op.limit < 0 or op.offset < 0):
        raise ValueError(f"limit and offset must not be negative (limit {op.limit}, offset {op.offset})")
    if isinstance(op, ListNamespacesOp):
        if op.max_depth is not None and op.max_depth < 0:
            raise ValueError(f"max_depth must not be negative, got {op.max_depth}")
        for condition in op.match_conditions or ():
            if condition.match_type not in ("prefix", "suffix"):
                raise ValueError(f"Unsupported match type: {condition.match_type}")


class TiermemStore(BaseStore):
    """A LangGraph store whose items are memories of a tiermem server (docs/langgraph.md).

    ``target``, ``api_key``, ``tls`` and ``timeout`` open a ``MemoryClient`` (see it for ``tls``);
    ``client`` uses one of yours instead (it stays open on ``close``). ``namespace_prefix``: the
    tiermem namespace the store's namespaces live under ('' for the root: ``("users", "ana")`` is
    ``users/ana``; ``"app:x"`` makes it ``app:x/users/ana``). ``kind``: the kind of the store's
    memories (other kinds in the same namespaces are not items). ``index``: ``{"fields": [...]}``,
    the paths of a value whose text is searched when a put gives no ``index`` (default: the whole
    value as JSON); tiermem embeds it on the server, so ``embed`` and ``dims`` do not apply.
    ``ttl``: LangGraph's ``TTLConfig`` (``default_ttl`` minutes, ``refresh_on_read``)."""

    supports_ttl = True

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        api_key: str | None = None,
        tls: Any = False,
        namespace_prefix: str = "",
        client: MemoryClient | None = None,
        timeout: float = 30.0,
        kind: str = DEFAULT_KIND,
        index: Mapping[str, Any] | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        if client is not None and (api_key is not None or tls is not False):
            raise ValueError("api_key and tls configure a new client: give them to your MemoryClient")
        fields = None
        if index is not None:
            if index.get("embed") is not None:
                raise ValueError("tiermem embeds on the server: index takes only 'fields'")
            fields = [str(f) for f in index.get("fields") or ()]
            if fields in ([], ["$"]):
                fields = None  # the whole value (as its JSON), the default
        self.prefix = keys.check_prefix(namespace_prefix)
        self.kind = kind
        self.fields: list[str] | None = fields
        self.ttl_config = ttl
        self._own_client = client is None
        self.client = client or MemoryClient(target, timeout=timeout, api_key=api_key, tls=tls)
        self._last_time = 0.0
        self._time_lock = threading.Lock()

    def _now(self) -> float:
        """The time of a put: now, but always after this store's previous put (by a microsecond),
        so the puts of one batch, and quick ones in a row, list newest first in the order made."""
        with self._time_lock:
            self._last_time = max(time.time(), self._last_time + 1e-6)
            return self._last_time

    def close(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> TiermemStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches ----------------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            _check(op)
        results: list[Result] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                puts[(op.namespace, op.key)] = op  # the last put of a key wins
                results.append(None)
        if puts:
            self._put(list(puts.values()))
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- items ------------------------------------------------------------------------------------
    def _path(self, namespace: tuple[str, ...]) -> str:
        return keys.namespace_path(self.prefix, namespace)

    def _fields(self, memory: Memory, namespace: tuple[str, ...]) -> dict[str, Any]:
        """An item's fields from its memory: created_at is the memory's creation, updated_at the
        time of the last put (the metadata's: a TTL refresh is no update)."""
        meta = metadata_dict(memory)
        created = _seconds(memory.create_time)
        updated = meta.get(values.UPDATED)
        return {
            "namespace": namespace,
            "key": values.key(memory.id, meta),
            "value": values.load(memory.content, meta),
            "created_at": _when(created),
            "updated_at": _when(float(updated) if isinstance(updated, int | float) else created),
        }

    def _found(self, memory: Memory, namespace: tuple[str, ...], score: float | None = None) -> SearchItem:
        return SearchItem(**self._fields(memory, namespace), score=score)

    def _get(self, op: GetOp) -> Item | None:
        if not op.namespace:
            return None  # nothing is stored at the root
        try:
            memory = self.client.get(self._path(op.namespace), keys.memory_id(op.key))
        except NotFoundError:
            return None
        if memory.kind != self.kind:
            return None
        if op.refresh_ttl:
            self._refresh([memory])
        return Item(**self._fields(memory, op.namespace))

    def _refresh(self, memories: Iterable[Memory]) -> None:
        """Move the expiry of those with a TTL to their TTL from now (a read's refresh; best
        effort: a read key may not write). A put that lands between the read and the refresh
        wins: the refresh is undone to what that put's own TTL says."""
        now = time.time()
        for memory in memories:
            meta = metadata_dict(memory)
            ttl = values.ttl_minutes(meta)
            if ttl is None:
                continue
            try:
                after = self.client.update(memory.namespace, memory.id, expire_time=now + ttl * 60)
            except (NotFoundError, PermissionDeniedError):  # deleted meanwhile; a read-only key
                continue
            newer = metadata_dict(after)
            if newer.get(values.UPDATED) != meta.get(values.UPDATED):
                own = values.ttl_minutes(newer)
                with contextlib.suppress(NotFoundError):
                    self.client.update(
                        after.namespace, after.id, expire_time=None if own is None else time.time() + own * 60
                    )

    def _put(self, ops: list[PutOp]) -> None:
        for op in ops:
            if op.value is None and op.namespace:
                with contextlib.suppress(NotFoundError):
                    self.client.delete(self._path(op.namespace), keys.memory_id(op.key))
        memories = [self._memory(op, self._now()) for op in ops if op.value is not None]
        for chunk in _chunks(memories, MAX_BATCH):
            if len(chunk) > 1:
                try:
                    self.client.create_batch(chunk)  # all or none
                    continue
                except AlreadyExistsError:
                    pass  # some keys exist: one by one
            for memory in chunk:
                self._write(memory)

    def _memory(self, op: PutOp, now: float) -> dict[str, Any]:
        """The create arguments of a put (``build_memory``'s)."""
        assert op.value is not None
        paths = self.fields if op.index is None else op.index
        stored = values.store(op.key, op.value, paths, op.ttl, now)
        return {
            "namespace": self._path(op.namespace),
            "content": stored.content,
            "id": keys.memory_id(op.key),
            "kind": self.kind,
            "metadata": stored.metadata,
            "create_time": now,
            "expire_time": None if op.ttl is None else now + op.ttl * 60,
        }

    def _write(self, memory: dict[str, Any]) -> None:
        """Create the memory, or replace the one stored under its id."""
        try:
            self.client.create(**memory)
            return
        except AlreadyExistsError:
            pass
        changes = {name: memory[name] for name in ("content", "kind", "metadata", "expire_time")}
        for _ in range(8):  # a delete and another put may keep racing this one: try again
            try:
                self.client.update(memory["namespace"], memory["id"], **changes)
                return
            except NotFoundError:  # deleted meanwhile
                pass
            try:
                self.client.create(**memory)
                return
            except AlreadyExistsError:  # put again meanwhile
                pass
        self.client.update(memory["namespace"], memory["id"], **changes)

    # -- search -----------------------------------------------------------------------------------
    def _namespaces(self, prefix: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        """The store's namespaces at or under ``prefix`` holding memories: tiermem path -> tuple."""
        base = self._path(prefix)
        out: dict[str, tuple[str, ...]] = {}
        for info in self.client.list_namespaces(base, page_size=MAX_PAGE):
            name = info.name
            if prefix and name != base and not name.startswith(base + "/"):
                continue  # "users/ana" lists "users/anabel" too
            namespace = keys.namespace_tuple(self.prefix, name)
            if namespace:
                out[name] = namespace
        return out

    def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.limit == 0:
            return []
        spaces = self._namespaces(op.namespace_prefix)
        if not spaces:
            return []
        found = self._ranked(spaces, op) if op.query else self._newest(spaces, op)
        if op.refresh_ttl:
            self._refresh(memory for memory, _ in found)
        return [item for _, item in found]

    def _ranked(self, spaces: dict[str, tuple[str, ...]], op: SearchOp) -> list[tuple[Memory, SearchItem]]:
        """The items best for ``op.query`` by tiermem's ranking, from ``op.offset`` on. A filter the
        server applies only in part is made up by asking for more until enough pass (at most
        ``MAX_RESULTS``: the deepest a query search reaches)."""
        assert op.query
        needed = op.offset + op.limit
        where, complete = filters.where(op.filter, extra=[_UNINDEXED])
        fetch = min(MAX_RESULTS, needed if complete else max(2 * needed, 50))
        while True:
            hits = self._search_memories(list(spaces), op.query, fetch, where)
            kept = []
            for memory, score in hits:
                item = self._found(memory, spaces[memory.namespace], score)
                if filters.matches(item.value, op.filter):
                    kept.append((memory, item))
            if len(kept) >= needed or len(hits) < fetch or fetch >= MAX_RESULTS:
                return kept[op.offset : needed]
            fetch = min(MAX_RESULTS, 4 * fetch)

    def _search_memories(
        self, paths: list[str], query: str, limit: int, where: Mapping[str, Any] | None
    ) -> list[tuple[Memory, float]]:
        # read_only: a store's searches do not count as accesses (which would reorder later pages)
        common: dict[str, Any] = {"limit": limit, "kinds": [self.kind], "where": where, "read_only": True}
        if len(paths) <= NAMESPACES_PER_SEARCH:
            return [(r.memory, r.score) for r in self.client.search(paths, query, **common)]
        groups = list(_chunks(paths, NAMESPACES_PER_SEARCH))
        hits: list[tuple[Memory, float]] = []
        for calls in _chunks(groups, SEARCHES_PER_CALL):
            searches = [
                {"namespaces": list(g), "query": query, "strategy": "comprehensive", **common} for g in calls
            ]
            for results in self.client.search_many(searches):
                hits.extend((r.memory, r.score) for r in results)
        hits.sort(key=lambda hit: -hit[1])
        return hits[:limit]

    def _newest(self, spaces: dict[str, tuple[str, ...]], op: SearchOp) -> list[tuple[Memory, SearchItem]]:
        """The items newest first (by creation), from ``op.offset`` on: each namespace's timeline,
        read page by page as the merge needs it."""
        needed = op.offset + op.limit
        where, complete = filters.where(op.filter)
        page = min(MAX_PAGE, needed if complete else max(2 * needed, 50))
        timelines = [
            self.client.timeline(path, kinds=[self.kind], where=where, page_size=page) for path in spaces
        ]
        kept: list[tuple[Memory, SearchItem]] = []
        for memory in heapq.merge(*timelines, key=lambda m: -_seconds(m.create_time)):
            item = self._found(memory, spaces[memory.namespace])
            if filters.matches(item.value, op.filter):
                kept.append((memory, item))
                if len(kept) >= needed:
                    break
        return kept[op.offset :]

    # -- namespaces -------------------------------------------------------------------------------
    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = op.match_conditions or ()
        fixed: tuple[str, ...] = ()  # the labels before a prefix's first wildcard narrow the listing
        for condition in conditions:
            if condition.match_type == "prefix":
                fixed = tuple(itertools.takewhile(lambda label: label != "*", condition.path))
                break
        found = [ns for ns in self._namespaces(fixed).values() if all(_does_match(c, ns) for c in conditions)]
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        return sorted(found)[op.offset : op.offset + op.limit]
