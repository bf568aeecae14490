"""``TiermemStore``: LangGraph's ``BaseStore`` (long-term memory for graphs) on a tiermem server.

Each item is one memory of kind ``langgraph_item``: its namespace tuple a namespace path under the
store's ``namespace_prefix`` and its key the memory's client id (keys.py), its value the memory's
content and metadata (values.py). Operations map onto client calls:

- get: ``GetMemory``; put: ``CreateMemory`` with the client id (several puts of a batch in one
  ``BatchCreateMemories``), and on ALREADY_EXISTS ``UpdateMemory`` of content, kind, metadata and
  expire_time (the replace keeps the memory, its creation time and its tier); delete:
  ``DeleteMemory``.
- search: ``ListNamespaces`` under the prefix, then with a query one ``SearchMemories`` over those
  namespaces (tiermem's default ranking; more than 64 namespaces: ``BatchSearchMemories`` of 64 each
  with the comprehensive strategy, whose scores compare across searches), without one the newest
  items by windows of creation time over groups of 64 namespaces (newest.py); ``filter`` as in
  filters.py.
- list_namespaces: ``ListNamespaces``, matched, cut to ``max_depth`` and paged in the client.
- TTL (minutes): ``expire_time``; reads with ``refresh_ttl`` move it on (``UpdateMemory``).

A batch runs its reads, then its writes (the last put of a key wins), as LangGraph's own stores do:
a read never sees a write of its own batch. Each operation is written once, as steps (calls.py):
``batch`` makes their calls with the store's ``MemoryClient``, ``abatch`` with an
``AsyncMemoryClient`` of the running event loop (one per loop, opened on first use), independent
calls of a batch at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
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
    AsyncMemoryClient,
    InvalidArgumentError,
    Memory,
    MemoryClient,
    NotFoundError,
    PermissionDeniedError,
    metadata_dict,
)

from . import calls, filters, keys, values
from .calls import All, Call, Steps, one
from .newest import created, newest

DEFAULT_KIND = "langgraph_item"
# tiermem's limits: results of one search (max_search_limit), namespaces of one search, searches of
# one BatchSearchMemories, page size (max_page_size), memories of one batch create (max_batch_size).
MAX_RESULTS = 1000
# How deep a query search ranks when offset + limit is within it: tiermem's ranking normalizes its
# signals over what it ranks, so pages of one depth are slices of one ranking (beyond: MAX_RESULTS).
RANKED_DEPTH = 100
NAMESPACES_PER_SEARCH = 64
SEARCHES_PER_CALL = 100
MAX_PAGE = 1000
MAX_BATCH = 1000
_UNINDEXED = {f"metadata.{values.UNINDEXED}": {"$ne": True}}

T = TypeVar("T")


class ForeignMemoryError(ValueError):
    """A put whose key is the id of a tiermem memory of another kind (not an item of this store),
    stored in the namespace by other means: the put changes nothing."""

    def __init__(self, namespace: str, memory_id: str, kind: str, own: str) -> None:
        super().__init__(
            f"namespace {namespace!r} holds a memory of kind {kind!r} under id {memory_id!r}: it is no "
            f"item of this store (kind {own!r}), and a put does not replace it"
        )
        self.namespace, self.memory_id, self.kind = namespace, memory_id, kind


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


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
        _check_put(op)
    if isinstance(op, SearchOp):
        _check_search(op)
    if isinstance(op, SearchOp | ListNamespacesOp) and (op.limit < 0 or op.offset < 0):
        raise ValueError(f"limit and offset must not be negative (limit {op.limit}, offset {op.offset})")
    if isinstance(op, ListNamespacesOp):
        if op.max_depth is not None and op.max_depth < 0:
            raise ValueError(f"max_depth must not be negative, got {op.max_depth}")
        for condition in op.match_conditions or ():
            if condition.match_type not in ("prefix", "suffix"):
                raise ValueError(f"Unsupported match type: {condition.match_type}")


def _check_search(op: SearchOp) -> None:
    # The filter is checked here, not when first applied: a search that finds nothing to apply it
    # to (an empty namespace) would let an unsupported operator pass.
    filters.where(op.filter)
    if op.query is not None:
        if not isinstance(op.query, str):
            raise TypeError(f"query is a str, not {type(op.query).__name__}")
        if not values.storable(op.query):
            raise ValueError("query must be valid Unicode text (it holds a lone surrogate)")


def _check_put(op: PutOp) -> None:
    if not op.namespace:
        raise InvalidNamespaceError("Namespace cannot be empty.")
    if op.namespace[0] == "langgraph":
        raise InvalidNamespaceError(f'Root label for namespace cannot be "langgraph". Got: {op.namespace}')
    assert op.value is not None
    values.check_put(op.key, op.value, op.ttl)
    if op.index is not None and op.index is not False and not isinstance(op.index, list | tuple):
        raise TypeError(f"index is a list of paths or False, not {type(op.index).__name__}")


class TiermemStore(BaseStore):
    """A LangGraph store whose items are memories of a tiermem server (docs/langgraph.md).

    ``target``, ``api_key``, ``tls`` and ``timeout`` open a ``MemoryClient`` (see it for ``tls``),
    and for the async methods an ``AsyncMemoryClient`` per event loop; ``client`` uses one of yours
    instead (it stays open on ``close``; the async methods then make its calls on worker threads).
    ``namespace_prefix``: the tiermem namespace the store's namespaces live under ('' for the root:
    ``("users", "ana")`` is ``users/ana``; ``"app:x"`` makes it ``app:x/users/ana``). ``kind``: the
    kind of the store's memories (other kinds in the same namespaces are not items). ``index``:
    ``{"fields": [...]}``, the paths of a value whose text is searched when a put gives no ``index``
    (default: the whole value as JSON); tiermem embeds it on the server, so ``embed`` and ``dims``
    do not apply. ``ttl``: LangGraph's ``TTLConfig`` (``default_ttl`` minutes, ``refresh_on_read``).

    ``close()``, ``await aclose()``, ``with`` and ``async with`` close the clients the store opened:
    calls still under way fail with ``TiermemError`` CANCELLED, and the store cannot be used again
    (one on a client of yours stays usable)."""

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
        if ttl is not None:  # (checked here: a bad default would fail every put that takes it)
            values.check_ttl("ttl's default_ttl", ttl.get("default_ttl"))
        self.kind = kind
        self.fields: list[str] | None = fields
        self.ttl_config = ttl
        self._own_client = client is None
        self._connection = {"target": target, "timeout": timeout, "api_key": api_key, "tls": tls}
        self.client = client or MemoryClient(target, timeout=timeout, api_key=api_key, tls=tls)
        self._last_time = 0.0
        self._lock = threading.Lock()  # _last_time, _aclients, _closed
        # The async clients, one per event loop (a grpc.aio channel belongs to the loop it was made on).
        self._aclients: dict[asyncio.AbstractEventLoop, AsyncMemoryClient] = {}
        self._closing: set[concurrent.futures.Future[None]] = set()  # async clients closing on their loops
        self._closed = False

    def _now(self) -> float:
        """The time of a put: now, but always after this store's previous put (by a microsecond),
        so the puts of one batch, and quick ones in a row, list newest first in the order made."""
        with self._lock:
            self._last_time = max(time.time(), self._last_time + 1e-6)
            return self._last_time

    # -- clients ----------------------------------------------------------------------------------
    def _aclient(self) -> AsyncMemoryClient:
        """The async client of the running event loop, opened on its first use there."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_open()
            for gone in [other for other in self._aclients if other.is_closed()]:
                del self._aclients[gone]  # its channel went with its loop (closed once collected)
            client = self._aclients.get(loop)
            if client is None:
                client = self._aclients[loop] = AsyncMemoryClient(**self._connection)
            return client

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the TiermemStore is closed")

    def _take_clients(self) -> dict[asyncio.AbstractEventLoop, AsyncMemoryClient]:
        """Mark the store closed (if it opened its clients) and hand over its async clients."""
        with self._lock:
            self._closed = self._own_client
            clients, self._aclients = self._aclients, {}
        return clients

    def _close_on(self, loop: asyncio.AbstractEventLoop, client: AsyncMemoryClient) -> None:
        """Close ``client`` on its own loop, without waiting for another thread's loop."""
        if loop.is_closed():
            return  # its channel went with its loop
        if loop.is_running():
            # In this thread (close() inside one of its coroutines): once that coroutine yields; in
            # another thread: there.
            closing = asyncio.run_coroutine_threadsafe(client.close(), loop)
            self._closing.add(closing)  # (the loop holds its task only weakly)
            closing.add_done_callback(self._closing.discard)
        else:
            loop.run_until_complete(client.close())  # a loop between runs

    def close(self) -> None:
        """Close the clients the store opened (those of other event loops on their loops)."""
        for loop, client in self._take_clients().items():
            self._close_on(loop, client)
        if self._own_client:
            self.client.close()

    async def aclose(self) -> None:
        """``close``, waiting for the async client of the running loop to close."""
        clients = self._take_clients()
        mine = clients.pop(asyncio.get_running_loop(), None)
        for loop, client in clients.items():
            self._close_on(loop, client)
        if mine is not None:
            await mine.close()
        if self._own_client:
            self.client.close()

    def __enter__(self) -> TiermemStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> TiermemStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- batches ----------------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            _check(op)
        with self._lock:
            self._check_open()
        return calls.run(self._batch(ops), self.client)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            _check(op)
        if not self._own_client:  # a client of yours: its calls on worker threads
            client = self.client
            return await calls.arun(
                self._batch(ops), lambda call: asyncio.to_thread(calls.perform, client, call)
            )
        aclient = self._aclient()
        return await calls.arun(self._batch(ops), lambda call: calls.perform_async(aclient, call))

    def _batch(self, ops: list[Op]) -> Steps[list[Result]]:
        results: list[Result] = [None] * len(ops)
        reads: list[tuple[int, Steps[Result]]] = []
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                reads.append((i, self._get(op)))
            elif isinstance(op, SearchOp):
                reads.append((i, self._search(op)))
            elif isinstance(op, ListNamespacesOp):
                reads.append((i, self._list_namespaces(op)))
            elif isinstance(op, PutOp):
                puts[(op.namespace, op.key)] = op  # the last put of a key wins
        if reads:
            found = yield All([steps for _, steps in reads])
            for (i, _), result in zip(reads, found, strict=True):
                results[i] = result
        if puts:
            yield from self._put(list(puts.values()))
        return results

    # -- items ------------------------------------------------------------------------------------
    def _path(self, namespace: tuple[str, ...]) -> str:
        return keys.namespace_path(self.prefix, namespace)

    def _fields(self, memory: Memory, namespace: tuple[str, ...]) -> dict[str, Any]:
        """An item's fields from its memory: created_at is the memory's creation, updated_at the
        time of the last put (the metadata's: a TTL refresh is no update)."""
        meta = metadata_dict(memory)
        first = created(memory)
        updated = meta.get(values.UPDATED)
        return {
            "namespace": namespace,
            "key": values.key(memory.id, meta),
            "value": values.load(memory.content, meta),
            "created_at": _when(first),
            "updated_at": _when(float(updated) if isinstance(updated, int | float) else first),
        }

    def _found(self, memory: Memory, namespace: tuple[str, ...], score: float | None = None) -> SearchItem:
        return SearchItem(**self._fields(memory, namespace), score=score)

    def _get(self, op: GetOp) -> Steps[Item | None]:
        if not op.namespace:
            return None  # nothing is stored at the root
        try:
            memory = yield Call.to("get", self._path(op.namespace), keys.memory_id(op.key))
        except NotFoundError:
            return None
        except InvalidArgumentError as e:
            if "namespace" not in e.fields:
                raise
            return None  # (a namespace too long to hold anything, as a search finds nothing there)
        if memory.kind != self.kind:
            return None
        if op.refresh_ttl:
            yield from self._refresh([memory])
        return Item(**self._fields(memory, op.namespace))

    def _refresh(self, memories: Iterable[Memory]) -> Steps[None]:
        """Move the expiry of those with a TTL to their TTL from now (a read's refresh; best
        effort: a read key may not write)."""
        now = time.time()
        refreshes = [self._refreshone(memory, now) for memory in memories]
        if refreshes:
            yield All(refreshes)

    def _refreshone(self, memory: Memory, now: float) -> Steps[None]:
        """A put that lands between the read and the refresh wins: the refresh is undone to what
        that put's own TTL says."""
        meta = metadata_dict(memory)
        ttl = values.ttl_minutes(meta)
        if ttl is None:
            return
        try:
            after = yield Call.to("update", memory.namespace, memory.id, expire_time=now + ttl * 60)
        except (NotFoundError, PermissionDeniedError):  # deleted meanwhile; a read-only key
            return
        newer = metadata_dict(after)
        if newer.get(values.UPDATED) != meta.get(values.UPDATED):
            own = values.ttl_minutes(newer)
            expire = None if own is None else time.time() + own * 60
            with contextlib.suppress(NotFoundError):
                yield Call.to("update", after.namespace, after.id, expire_time=expire)

    def _put(self, ops: list[PutOp]) -> Steps[None]:
        # (the values first: one that cannot be stored fails the batch before anything is deleted)
        memories = [self._memory(op, self._now()) for op in ops if op.value is not None]
        deletes = [self._delete(op) for op in ops if op.value is None and op.namespace]
        if deletes:
            yield All(deletes)
        for chunk in _chunks(memories, MAX_BATCH):
            if len(chunk) > 1:
                try:
                    yield Call.to("create_batch", chunk)  # all or none
                    continue
                except AlreadyExistsError:
                    pass  # some keys exist: one by one
            yield All([self._write(memory) for memory in chunk])

    def _delete(self, op: PutOp) -> Steps[None]:
        """Delete the item; a memory of another kind under its id is no item, and stays."""
        path, memory_id = self._path(op.namespace), keys.memory_id(op.key)
        try:
            memory = yield Call.to("get", path, memory_id)
            if memory.kind == self.kind:
                yield Call.to("delete", path, memory_id)
        except NotFoundError:
            pass
        except InvalidArgumentError as e:
            if "namespace" not in e.fields:  # (nothing is stored under a namespace too long to hold it)
                raise

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

    def _write(self, memory: dict[str, Any]) -> Steps[None]:
        """Create the memory, or replace the one stored under its id. Deletes and other puts racing
        this one may keep changing which it finds: it tries again, 9 times; if a delete still
        removed the memory between its create (ALREADY_EXISTS) and its update (NOT_FOUND), it
        leaves it deleted, the put being ordered just before that delete (which did come after it).
        A memory of another kind under the id is no item of this store: the put fails
        (``ForeignMemoryError``) and leaves it as it is."""
        changes = {name: memory[name] for name in ("content", "metadata", "expire_time")}
        for _ in range(9):
            try:
                yield Call.to("create", **memory)
                return
            except AlreadyExistsError:  # put before, or meanwhile
                pass
            try:
                held = yield Call.to("get", memory["namespace"], memory["id"])
                if held.kind != self.kind:
                    raise ForeignMemoryError(memory["namespace"], memory["id"], held.kind, self.kind)
                yield Call.to("update", memory["namespace"], memory["id"], **changes)
                return
            except NotFoundError:  # deleted meanwhile
                pass

    # -- search -----------------------------------------------------------------------------------
    def _namespaces(self, prefix: tuple[str, ...]) -> Steps[dict[str, tuple[str, ...]]]:
        """The store's namespaces at or under ``prefix`` holding memories: tiermem path -> tuple."""
        base = self._path(prefix)
        out: dict[str, tuple[str, ...]] = {}
        for info in (yield Call.listing("list_namespaces", base, page_size=MAX_PAGE)):
            name = info.name
            if prefix and name != base and not name.startswith(base + "/"):
                continue  # "users/ana" lists "users/anabel" too
            namespace = keys.namespace_tuple(self.prefix, name)
            if namespace:
                out[name] = namespace
        return out

    def _search(self, op: SearchOp) -> Steps[list[SearchItem]]:
        if op.limit == 0:
            return []
        spaces = yield from self._namespaces(op.namespace_prefix)
        if not spaces:
            return []
        if op.query:
            found = yield from self._ranked(spaces, op)
        else:
            found = yield from self._newest(spaces, op)
        if op.refresh_ttl:
            yield from self._refresh(memory for memory, _ in found)
        return [item for _, item in found]

    def _ranked(
        self, spaces: dict[str, tuple[str, ...]], op: SearchOp
    ) -> Steps[list[tuple[Memory, SearchItem]]]:
        """The items best for ``op.query`` by tiermem's ranking, from ``op.offset`` on: cut from the
        best ``RANKED_DEPTH`` (or ``MAX_RESULTS``, the deepest a query search reaches, for a page
        ending beyond), whatever the page. A filter the server applies only in part is made up by
        ranking ``MAX_RESULTS`` when too few of the first pass."""
        assert op.query
        needed = op.offset + op.limit
        where, _ = filters.where(op.filter, extra=[_UNINDEXED])
        fetch = RANKED_DEPTH if needed <= RANKED_DEPTH else MAX_RESULTS
        while True:
            hits = yield from self._search_memories(list(spaces), op.query, fetch, where)
            kept = []
            for memory, score in hits:
                item = self._found(memory, spaces[memory.namespace], score)
                if filters.matches(item.value, op.filter):
                    kept.append((memory, item))
            if len(kept) >= needed or len(hits) < fetch or fetch >= MAX_RESULTS:
                return kept[op.offset : needed]
            fetch = MAX_RESULTS

    def _search_memories(
        self, paths: list[str], query: str, limit: int, where: Mapping[str, Any] | None
    ) -> Steps[list[tuple[Memory, float]]]:
        # read_only: a store's searches do not count as accesses (which would reorder later pages)
        common: dict[str, Any] = {"limit": limit, "kinds": [self.kind], "where": where, "read_only": True}
        if len(paths) <= NAMESPACES_PER_SEARCH:
            results = yield Call.to("search", paths, query, **common)
            return [(r.memory, r.score) for r in results]
        groups = list(_chunks(paths, NAMESPACES_PER_SEARCH))
        batches = [
            [{"namespaces": list(g), "query": query, "strategy": "comprehensive", **common} for g in calls]
            for calls in _chunks(groups, SEARCHES_PER_CALL)
        ]
        answers = yield All([one(Call.to("search_many", searches)) for searches in batches])
        hits = [(r.memory, r.score) for answer in answers for results in answer for r in results]
        hits.sort(key=lambda hit: -hit[1])
        return hits[:limit]

    def _newest(
        self, spaces: dict[str, tuple[str, ...]], op: SearchOp
    ) -> Steps[list[tuple[Memory, SearchItem]]]:
        """The items newest first (by creation), from ``op.offset`` on (newest.py)."""
        needed = op.offset + op.limit
        where, complete = filters.where(op.filter)

        def keep(memory: Memory) -> bool:
            return filters.matches(values.load(memory.content, metadata_dict(memory)), op.filter)

        found = yield from newest(
            list(spaces),
            kind=self.kind,
            where=where,
            keep=keep if op.filter else None,
            needed=needed,
            want=min(MAX_PAGE, needed if complete else max(2 * needed, 50)),
        )
        return [(memory, self._found(memory, spaces[memory.namespace])) for memory in found[op.offset :]]

    # -- namespaces -------------------------------------------------------------------------------
    def _list_namespaces(self, op: ListNamespacesOp) -> Steps[list[tuple[str, ...]]]:
        conditions = op.match_conditions or ()
        fixed: tuple[str, ...] = ()  # the labels before a prefix's first wildcard narrow the listing
        for condition in conditions:
            if condition.match_type == "prefix":
                fixed = tuple(itertools.takewhile(lambda label: label != "*", condition.path))
                break
        spaces = yield from self._namespaces(fixed)
        found = [ns for ns in spaces.values() if all(_does_match(c, ns) for c in conditions)]
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        return sorted(found)[op.offset : op.offset + op.limit]
