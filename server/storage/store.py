"""LMDB storage: the source of truth for records, vectors, id lookups and idempotent requests.

The layout of the sub-databases and the encoding of their keys are in ``keys.py``; nothing outside
this package sees a key.

Writes happen only in the writer thread (``tiermem.server.storage.writer``), inside ``env.begin(write=True)``;
readers use short read transactions. Durability is explicit: with ``sync=True`` every commit fsyncs
data and meta pages, so a commit that returned survives kill -9 and power loss; ``writemap`` stays off
(nested transactions, used to roll back one failed operation of a group, need it off, and a stray
write through the map could corrupt the file).

Before LMDB maps ``data.mdb``, ``datafile.py`` checks it is whole (a truncated file would kill the
process with SIGBUS) and the writing server locks it for its lifetime (a second writer would reuse
record ids).

Space: the map grows (doubling) up to ``max_map_size``; past that the data may not grow, but
deletes may still commit into a reserve beyond it (``reserve_bytes``), so space can always be
freed: LMDB copies every page a delete touches, so a map filled to the last page refuses deletes
too. While the pages in use exceed ``max_map_size`` the writer refuses every operation that
stores records, vectors, request ids or graph items (``grows`` counts them), and lets the others
through. A disk that fills up (or a file that reaches the process's file-size limit) makes commits
fail with ENOSPC or EFBIG, or EIO for a short write: ``disk_full`` tells those from other I/O errors.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np

from tiermem.server.config import Tuning
from tiermem.server.model.errors import StorageError
from tiermem.server.model.locks import RWLock
from tiermem.server.model.records import Record
from tiermem.server.model.reports import ScopeState
from tiermem.server.storage import datafile, upgrades
from tiermem.server.storage.commit_log import CommitLog
from tiermem.server.storage.keys import (
    META_INSTANCE,
    META_NEXT_RID,
    META_NEXT_VK,
    META_NSCONF,
    META_REPLICA,
    META_ROUTING,
    META_SCHEMA,
    META_SCOPE,
    META_SPACE,
    content_key,
    graph_key,
    id_key,
    namespace_prefixes,
    normalize,
    put_maybe_append,
    rid_key,
    rid_of,
    time_key,
    unpack_config,
)
from tiermem.server.storage.lifecycle_counters import LifecycleCounters

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# errno values of a write that failed for want of disk space (EFBIG: the process's file-size limit)
DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# An EIO while this little is free (or this close to the file-size limit) is a short write of a full disk.
_NEARLY_FULL = 64 * 1024 * 1024
# The transaction type of Store's methods: the layers above name it without importing lmdb.
Txn = lmdb.Transaction


class Store(CommitLog, LifecycleCounters):
    """Owns the LMDB environment and the encoding of every key and value in it."""

    def __init__(
        self,
        path: Path,
        *,
        map_size: int,
        max_map_size: int,
        sync: bool = True,
        readonly: bool = False,
        log_commits: bool = False,
        commit_log_seconds: float = Tuning.commit_log_seconds,
        prune_every: int = Tuning.commit_log_prune_every,
    ) -> None:
        """``readonly``: a search follower's view of the environment another process writes
        (its commits appear at each new read transaction); any write attempt raises.
        ``log_commits``: keep the commit log (a writer with search followers), dropping entries
        ``commit_log_seconds`` old, looked for every ``prune_every`` commits."""
        self.path = path
        self.max_map_size = max_map_size
        # Beyond max_map_size, room only for writes that free space (see the module docstring).
        self.reserve_bytes = min(max(max_map_size // 16, 4 * 1024 * 1024), 1024**3)
        self.readonly = readonly
        self.log_commits = log_commits
        self.commit_log_seconds = commit_log_seconds
        self.prune_every = prune_every
        # The oldest commit a replica's feed still needs (None: none): the log keeps it whatever its age.
        self.retain_from: Callable[[], int | None] = lambda: None
        self.grows = 0  # calls that store records, vectors, request ids or graph items (see writer.py)
        # The writer's lock on data.mdb, taken once the file is checked whole. (A follower neither
        # locks nor checks it: its leader did both before it started, and the file changes under it.)
        self._lock_fd = -1 if readonly else datafile.open_and_lock(path)
        try:
            self.env = lmdb.open(
                str(path),
                map_size=map_size,
                max_dbs=16,
                subdir=True,
                sync=sync,
                metasync=sync,
                writemap=False,
                map_async=False,
                max_readers=1024,
                readahead=False,
                readonly=readonly,
                create=not readonly,
            )
        except lmdb.Error as e:
            self._unlock()
            if getattr(e, "code", 0) in datafile.NOT_WRITABLE and not readonly:
                raise datafile.not_writable(path, OSError(e.code, os.strerror(e.code))) from None
            raise StorageError(f"cannot open LMDB at {path}: {e}") from e
        try:
            upgrades.with_room(self.env, max_map_size, self._open_databases)
        except BaseException:
            self.close()
            raise

    def _open_databases(self) -> None:
        readonly = self.readonly
        self.map_size = int(self.env.info()["map_size"])
        self.page_size = int(self.env.stat()["psize"])
        # What the commit being written changed (rids; settings or spaces), for the commit log.
        self._log_rids: set[int] = set()
        self._log_settings = False
        self._log_graph: set[tuple[str, bool]] = set()  # (namespace, with its children) whose graph changed
        self._log_scopes: set[str] = set()  # namespaces whose progress changed
        self.meta = self.env.open_db(b"meta")
        self.records = self.env.open_db(b"records")
        self.ids = self.env.open_db(b"ids")
        self.vectors = self.env.open_db(b"vectors")
        self.requests = self.env.open_db(b"requests")
        self.request_times = self.env.open_db(b"request_times")
        # Every memory under its namespace, kind and normalized words (dupsort: copies each hold one)
        self.contents = self.env.open_db(b"content_rids", dupsort=True, dupfixed=True)
        self.pending = self.env.open_db(b"pending")
        self.graph = self.env.open_db(b"graph")
        self.changes = self.env.open_db(b"changes")
        self.commits = self.env.open_db(b"commits")
        self._dbs = [
            self.meta,
            self.records,
            self.ids,
            self.vectors,
            self.requests,
            self.request_times,
            self.contents,
            self.pending,
            self.graph,
            self.changes,
            self.commits,
        ]
        self._gate = RWLock()
        self.instance = self._check_schema()
        if not readonly:
            upgrades.drop_retired_postings(self.env)
            upgrades.index_every_copy(self.env, self.meta, self.records, self.contents)
        with self.env.begin() as txn:
            self.seq = self.committed_seq(txn)  # of the last commit (writer thread only)
        self.changed_count = 0
        if not readonly:
            self.clear_stale_readers()

    def clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died inside a read transaction (a follower
        killed while searching): LMDB keeps the pages such a slot pins until this runs, so the file
        would grow with every write. Returns how many were freed."""
        cleared = int(self.env.reader_check())
        if cleared:
            logger.warning("freed %d LMDB reader slots of processes that are gone", cleared)
        return cleared

    def _check_schema(self) -> str:
        """Check (or, for a new environment, write) the schema version; returns the instance id."""
        with self.env.begin(write=not self.readonly) as txn:
            raw = txn.get(META_SCHEMA, db=self.meta)
            if raw is None:
                if self.readonly:
                    raise StorageError(f"{self.path}: no tiermem data (schema version missing)")
                if txn.stat(self.records)["entries"]:
                    raise StorageError(f"{self.path}: records without a schema version")
                txn.put(META_SCHEMA, msgpack.packb(SCHEMA_VERSION), db=self.meta)
                instance = uuid.uuid4().hex
                txn.put(META_INSTANCE, instance.encode(), db=self.meta)
                return instance
            version = msgpack.unpackb(raw)
            if version != SCHEMA_VERSION:
                raise StorageError(
                    f"{self.path}: schema version {version}, this server reads version {SCHEMA_VERSION}",
                    reason="SCHEMA_VERSION_MISMATCH",
                )
            return bytes(txn.get(META_INSTANCE, db=self.meta) or b"").decode()

    def close(self) -> None:
        self.env.close()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases data.mdb for the next server
            self._lock_fd = -1

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A short read transaction. Readers share a gate that map growth takes exclusively:
        LMDB's set_mapsize must not run while any transaction of this process is open."""
        while True:
            with self._gate.read():
                try:
                    txn = self.env.begin(write=False)
                except lmdb.MapResizedError:
                    if not self.readonly:
                        raise
                    txn = None  # a follower: the writing process grew the file beyond this map
                if txn is not None:
                    with txn:
                        yield txn
                    return
            with self._gate.write():
                self.env.set_mapsize(0)  # 0: adopt the size the environment records

    def write(self) -> lmdb.Transaction:
        """The writer's transaction (each attempt of a commit group starts here)."""
        self._log_rids.clear()
        self._log_settings = False
        self._log_graph.clear()
        self._log_scopes.clear()
        return self.env.begin(write=True)

    def grow(self) -> int:
        """Double the map size up to ``max_map_size``; once there, add the reserve for writes that
        free space (no transaction may be open in this process's writer). Returns the new size, or
        -1 when the map has the reserve already."""
        size = self.map_size
        if size < self.max_map_size:
            new = min(size * 2, self.max_map_size)
        elif size < self.max_map_size + self.reserve_bytes:
            new = self.max_map_size + self.reserve_bytes
        else:
            return -1
        with self._gate.write():
            self.env.set_mapsize(new)
        self.map_size = int(self.env.info()["map_size"])
        logger.warning("LMDB map grown from %d to %d bytes", size, self.map_size)
        return self.map_size

    def over_limit(self, txn: lmdb.Transaction) -> bool:
        """Whether the pages ``txn`` uses exceed ``max_map_size`` (only once the map has its
        reserve: below that, LMDB's own MapFullError is the limit)."""
        return self.map_size > self.max_map_size and self.pages_in_use(txn) > self.max_map_size

    def pages_in_use(self, txn: lmdb.Transaction) -> int:
        """Bytes of the pages the databases use as ``txn`` sees them (not free pages, nor the
        free list itself)."""
        pages = 0
        for db in self._dbs:
            st = txn.stat(db)
            pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        return pages * self.page_size

    def disk_full(self, e: lmdb.Error) -> bool:
        """Whether a failed LMDB call failed for want of disk space: ENOSPC, EDQUOT or EFBIG, or
        EIO (LMDB's report of a short write) while the file system is (nearly) full or the file
        is at the process's file-size limit."""
        code = getattr(e, "code", 0)
        if isinstance(e, lmdb.DiskError) or code in DISK_FULL:
            return True
        if code != errno.EIO:
            return False
        try:
            fs = os.statvfs(self.path)
            free = (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail) * fs.f_frsize
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            size = os.stat(self.path / datafile.DATA_FILE).st_size
        except OSError:
            return False
        return free < _NEARLY_FULL or (limit != resource.RLIM_INFINITY and size > limit - _NEARLY_FULL)

    def used_bytes(self) -> int:
        info = self.env.info()
        return int((info["last_pgno"] + 1) * self.env.stat()["psize"])

    # -- counters ------------------------------------------------------------------------------
    def counters(self, txn: lmdb.Transaction) -> tuple[int, int]:
        rid = txn.get(META_NEXT_RID, db=self.meta)
        vk = txn.get(META_NEXT_VK, db=self.meta)
        return (msgpack.unpackb(rid) if rid else 1, msgpack.unpackb(vk) if vk else 1)

    def replica_position(self, txn: lmdb.Transaction) -> tuple[str, int]:
        """(the leader data's instance id, the last of its commits stored here); ("", 0): none."""
        raw = txn.get(META_REPLICA, db=self.meta)
        if raw is None:
            return "", 0
        instance, seq = msgpack.unpackb(raw)
        return str(instance), int(seq)

    def put_replica_position(self, txn: lmdb.Transaction, instance: str, seq: int) -> None:
        if instance:
            txn.put(META_REPLICA, msgpack.packb([instance, seq]), db=self.meta)
        else:
            txn.delete(META_REPLICA, db=self.meta)

    def put_counters(self, txn: lmdb.Transaction, next_rid: int, next_vk: int) -> None:
        txn.put(META_NEXT_RID, msgpack.packb(next_rid), db=self.meta)
        txn.put(META_NEXT_VK, msgpack.packb(next_vk), db=self.meta)

    # -- embedding spaces ----------------------------------------------------------------------
    def spaces(self, txn: lmdb.Transaction) -> dict[str, int]:
        return {k.decode(): int(msgpack.unpackb(v)) for k, v in self._prefixed(txn, META_SPACE)}

    def space(self, txn: lmdb.Transaction, model: str) -> int | None:
        """The dimension of one space (one lookup; ``spaces`` scans them all)."""
        raw = txn.get(META_SPACE + model.encode(), db=self.meta)
        return None if raw is None else int(msgpack.unpackb(raw))

    def put_space(self, txn: lmdb.Transaction, model: str, dimension: int) -> None:
        self._log_settings = True
        txn.put(META_SPACE + model.encode(), msgpack.packb(dimension), db=self.meta)

    # -- records -------------------------------------------------------------------------------
    def lookup(self, txn: lmdb.Transaction, namespace: str, memory_id: str) -> int | None:
        raw = txn.get(id_key(namespace, memory_id), db=self.ids)
        return None if raw is None else rid_of(bytes(raw))

    def get(self, txn: lmdb.Transaction, rid: int) -> Record | None:
        raw = txn.get(rid_key(rid), db=self.records)
        return None if raw is None else Record.unpack(raw)

    def get_many(self, txn: lmdb.Transaction, rids: list[int]) -> list[Record | None]:
        """``get`` of each rid, in one call from Python (py-lmdb still gives up and retakes the GIL
        around each lookup inside it, as it does for every get, put and commit)."""
        keys = [rid_key(r) for r in rids]
        with txn.cursor(db=self.records) as cur:
            found = dict(cur.getmulti(keys))
        return [None if (raw := found.get(k)) is None else Record.unpack(raw) for k in keys]

    def put(self, txn: lmdb.Transaction, rec: Record, new: bool = False) -> None:
        self.grows += 1
        self._changed(txn, rec.rid)
        put_maybe_append(txn, rid_key(rec.rid), rec.pack(), self.records, new)
        txn.put(id_key(rec.namespace, rec.id), rid_key(rec.rid), db=self.ids)
        ckey, key = content_key(rec.namespace, rec.content, rec.kind), rid_key(rec.rid)
        with txn.cursor(db=self.contents) as cur:
            if not cur.set_key_dup(ckey, key):  # (a put of a pair already there still dirties its page)
                cur.put(ckey, key)

    def insert(self, txn: lmdb.Transaction, rec: Record) -> None:
        """Store a new record."""
        self.put(txn, rec, new=True)

    def replace(self, txn: lmdb.Transaction, old: Record, rec: Record) -> None:
        """Store ``rec`` over ``old`` (the same memory): old's content, if its words or kind changed,
        no longer leads to it."""
        if (old.content, old.kind) != (rec.content, rec.kind):
            self._drop_content(txn, old)
        self.put(txn, rec)

    def _drop_content(self, txn: lmdb.Transaction, rec: Record) -> None:
        """Take ``rec`` out of the exact-duplicate index (its copies stay)."""
        txn.delete(content_key(rec.namespace, rec.content, rec.kind), rid_key(rec.rid), db=self.contents)

    def mark_pending(self, txn: lmdb.Transaction, rid: int, pending: bool) -> None:
        if self.log_commits:
            self._log_rids.add(rid)
        if pending:
            txn.put(rid_key(rid), b"", db=self.pending)
        else:
            txn.delete(rid_key(rid), db=self.pending)

    def is_pending(self, txn: lmdb.Transaction, rid: int) -> bool:
        return txn.get(rid_key(rid), db=self.pending) is not None

    def pending_rids(self, txn: lmdb.Transaction, limit: int | None = None) -> list[int]:
        out = []
        for key in txn.cursor(db=self.pending).iternext(keys=True, values=False):
            out.append(rid_of(bytes(key)))
            if limit is not None and len(out) >= limit:
                break
        return out

    def delete(self, txn: lmdb.Transaction, rec: Record) -> None:
        self._changed(txn, rec.rid)
        txn.delete(rid_key(rec.rid), db=self.pending)
        key = rid_key(rec.rid)
        txn.delete(key, db=self.records)
        txn.delete(key, db=self.vectors)
        ikey = id_key(rec.namespace, rec.id)
        if txn.get(ikey, db=self.ids) == key:  # (not when the id was given to another rid already)
            txn.delete(ikey, db=self.ids)
        self._drop_content(txn, rec)

    def find_content(
        self,
        txn: lmdb.Transaction,
        namespace: str,
        content: str,
        kind: str,
        usable: Callable[[Record], bool] = lambda rec: True,
    ) -> Record | None:
        """The oldest ``usable`` memory of ``namespace`` and ``kind`` whose normalized content equals
        ``content``'s, if any."""
        with txn.cursor(db=self.contents) as cur:
            if not cur.set_key(content_key(namespace, content, kind)):
                return None
            for raw in cur.iternext_dup(keys=False):  # (in rid order: the oldest first)
                rec = self._content_of(txn, raw, namespace, kind, content)
                if rec is not None and usable(rec):
                    return rec
        return None

    def _content_of(
        self, txn: lmdb.Transaction, key: bytes | memoryview, namespace: str, kind: str, content: str
    ) -> Record | None:
        """The record of ``key`` if it still holds that content (an entry may be stale: changed since)."""
        rec = self.get(txn, rid_of(bytes(key)))
        ok = rec is not None and (rec.namespace, rec.kind, normalize(rec.content)) == (
            namespace,
            kind,
            normalize(content),
        )
        return rec if ok else None

    def namespace_records(
        self, txn: lmdb.Transaction, namespace: str = "", include_children: bool = False, stored: bool = False
    ) -> Iterator[Record]:
        """The records of ``namespace`` (and of ``namespace/...`` with ``include_children``; ``""``:
        of every namespace), by namespace and id, or with ``stored`` in the order they were stored
        (an import stores in the order it reads: a restore keeps it), as ``txn`` sees them."""
        prefixes = namespace_prefixes(namespace, include_children)
        rids = (rid_of(v) for p in prefixes for _, v in self._prefixed(txn, p, self.ids))
        for rid in sorted(rids) if stored else rids:
            rec = self.get(txn, rid)
            if rec is not None:
                yield rec

    def iter_records(self, txn: lmdb.Transaction) -> Iterator[Record]:
        for _, raw in txn.cursor(db=self.records):
            yield Record.unpack(raw)

    def last_rid(self, txn: lmdb.Transaction) -> int:
        """The highest rid of a record (0: none)."""
        with txn.cursor(db=self.records) as cur:
            return rid_of(bytes(cur.key())) if cur.last() else 0

    def record_rids(self, txn: lmdb.Transaction, first: int, most: int) -> list[int]:
        """The rids of up to ``most`` records from ``first`` on, in order (keys only, none decoded)."""
        rids: list[int] = []
        with txn.cursor(db=self.records) as cur:
            if not cur.set_range(rid_key(first)):
                return rids
            for key in cur.iternext(keys=True, values=False):
                rids.append(rid_of(bytes(key)))
                if len(rids) == most:
                    break
        return rids

    def record_count(self, txn: lmdb.Transaction) -> int:
        return int(txn.stat(self.records)["entries"])

    # -- vectors -------------------------------------------------------------------------------
    def put_vector(self, txn: lmdb.Transaction, rid: int, vector: np.ndarray, new: bool = False) -> None:
        self.grows += 1
        raw = np.ascontiguousarray(vector, dtype=np.float32).tobytes()
        put_maybe_append(txn, rid_key(rid), raw, self.vectors, new)

    def get_vector(self, txn: lmdb.Transaction, rid: int) -> np.ndarray | None:
        raw = txn.get(rid_key(rid), db=self.vectors)
        return None if raw is None else np.frombuffer(raw, dtype=np.float32).copy()

    # -- namespace settings and lifecycle counters ----------------------------------------------
    def namespace_configs(self, txn: lmdb.Transaction, under: str = "") -> dict[str, dict[str, Any]]:
        """The stored settings of every namespace whose name starts with ``under``."""
        found = self._prefixed(txn, META_NSCONF + under.encode())
        return {under + k.decode(): unpack_config(v) for k, v in found}

    def scope_routing(self, txn: lmdb.Transaction) -> dict[str, tuple[int, str]]:
        """Top-level scope -> (routing state, moved_to), for the scopes not simply served."""
        out = {}
        for key, raw in self._prefixed(txn, META_ROUTING):
            state, moved_to = msgpack.unpackb(raw)
            out[key.decode()] = (int(state), str(moved_to))
        return out

    def put_scope_routing(self, txn: lmdb.Transaction, scope: str, state: int, moved_to: str) -> None:
        key = META_ROUTING + scope.encode()
        self._log_settings = True  # (followers reload the settings: they refuse the same calls)
        if state:
            txn.put(key, msgpack.packb([state, moved_to], use_bin_type=True), db=self.meta)
        else:
            txn.delete(key, db=self.meta)

    def namespace_config(self, txn: lmdb.Transaction, namespace: str) -> dict[str, Any]:
        raw = txn.get(META_NSCONF + namespace.encode(), db=self.meta)
        return {} if raw is None else unpack_config(raw)

    def put_namespace_config(self, txn: lmdb.Transaction, namespace: str, config: dict[str, Any]) -> None:
        key = META_NSCONF + namespace.encode()
        self._log_settings = True
        if config:
            txn.put(key, msgpack.packb(config, use_bin_type=True), db=self.meta)
        else:
            txn.delete(key, db=self.meta)

    def scope_state(self, txn: lmdb.Transaction, namespace: str) -> ScopeState:
        """A namespace's progress toward a reflection and a summary (all zero when none is stored)."""
        return self.stored_scope_state(txn, namespace) or ScopeState()

    def stored_scope_state(self, txn: lmdb.Transaction, namespace: str) -> ScopeState | None:
        raw = txn.get(META_SCOPE + namespace.encode(), db=self.meta)
        return _scope_of(raw) if raw else None

    def scope_states(
        self, txn: lmdb.Transaction, namespace: str = "", include_children: bool = False
    ) -> list[tuple[str, ScopeState]]:
        """(namespace, scope state) of ``namespace`` (and, with ``include_children``, of each
        ``namespace/...`` with a stored state, in name order); ``""``: of every namespace with one."""
        if namespace:
            out = [(namespace, self.scope_state(txn, namespace))]
            starts = [META_SCOPE + namespace.encode() + b"/"] if include_children else []
        else:
            out, starts = [], [META_SCOPE]
        cur = txn.cursor(db=self.meta)
        for start in starts:
            if not cur.set_range(start):
                continue
            for key, value in cur:
                key = bytes(key)
                if not key.startswith(start):
                    break
                out.append((key[len(META_SCOPE) :].decode(), _scope_of(value)))
        return out

    def put_scope_state(self, txn: lmdb.Transaction, namespace: str, state: ScopeState | None) -> None:
        key = META_SCOPE + namespace.encode()
        if self.log_commits:
            self._log_scopes.add(namespace)
        if state is None:
            txn.delete(key, db=self.meta)
        else:
            packed = [state.reflection_importance, state.summary_tokens, state.summary_rid, state.covered_rid]
            txn.put(key, msgpack.packb(packed), db=self.meta)

    # -- graph memory ---------------------------------------------------------------------------
    def get_node(self, txn: lmdb.Transaction, namespace: str, node_id: str) -> dict[str, Any] | None:
        raw = txn.get(graph_key(namespace, b"n", node_id), db=self.graph)
        return None if raw is None else msgpack.unpackb(raw, raw=False)

    def put_node(self, txn: lmdb.Transaction, namespace: str, node: dict[str, Any]) -> None:
        self.grows += 1
        if self.log_commits:
            self._log_graph.add((namespace, False))
        txn.put(graph_key(namespace, b"n", node["id"]), msgpack.packb(node, use_bin_type=True), db=self.graph)

    def get_edge(self, txn: lmdb.Transaction, namespace: str, edge_id: str) -> dict[str, Any] | None:
        raw = txn.get(graph_key(namespace, b"e", edge_id), db=self.graph)
        return None if raw is None else msgpack.unpackb(raw, raw=False)

    def put_edge(self, txn: lmdb.Transaction, namespace: str, edge: dict[str, Any]) -> None:
        self.grows += 1
        if self.log_commits:
            self._log_graph.add((namespace, False))
        key = graph_key(namespace, b"e", edge["id"])
        old = txn.get(key, db=self.graph)
        if old is not None:  # (an edge replaced, by an import: the ends it no longer has lose it)
            was = msgpack.unpackb(old, raw=False)
            for end in {was["source_id"], was["target_id"]} - {edge["source_id"], edge["target_id"]}:
                txn.delete(graph_key(namespace, b"a", end, edge["id"]), db=self.graph)
        txn.put(key, msgpack.packb(edge, use_bin_type=True), db=self.graph)
        for end in (edge["source_id"], edge["target_id"]):
            txn.put(graph_key(namespace, b"a", end, edge["id"]), b"", db=self.graph)

    def nodes(self, txn: lmdb.Transaction, namespace: str) -> Iterator[dict[str, Any]]:
        prefix = graph_key(namespace, b"n") + b"\x00"
        cur = txn.cursor(db=self.graph)
        if cur.set_range(prefix):
            for key, value in cur:
                if not bytes(key).startswith(prefix):
                    break
                yield msgpack.unpackb(value, raw=False)

    def edges_of(self, txn: lmdb.Transaction, namespace: str, node_id: str) -> list[str]:
        prefix = graph_key(namespace, b"a", node_id) + b"\x00"
        out = []
        cur = txn.cursor(db=self.graph)
        if cur.set_range(prefix):
            for key in cur.iternext(keys=True, values=False):
                key = bytes(key)
                if not key.startswith(prefix):
                    break
                out.append(key[len(prefix) :].decode())
        return out

    def graph_items(
        self, txn: lmdb.Transaction, namespace: str = "", include_children: bool = False
    ) -> list[tuple[str, str, dict[str, Any]]]:
        """("node" | "edge", namespace, item) of every graph entry of ``namespace`` (and of its
        children with ``include_children``; ``""``: of every namespace)."""
        out = []
        cur = txn.cursor(db=self.graph)
        for prefix in namespace_prefixes(namespace, include_children):
            if not cur.set_range(prefix):
                continue
            for key, value in cur:
                key = bytes(key)
                if not key.startswith(prefix):
                    break
                ns, kind, _ = key.split(b"\x00", 2)
                if kind in (b"n", b"e"):
                    out.append(
                        ("node" if kind == b"n" else "edge", ns.decode(), msgpack.unpackb(value, raw=False))
                    )
        return out

    def delete_graph(self, txn: lmdb.Transaction, namespace: str, include_children: bool) -> None:
        if self.log_commits:
            self._log_graph.add((namespace, include_children))
        cur = txn.cursor(db=self.graph)
        for prefix in namespace_prefixes(namespace, include_children):
            while cur.set_range(prefix) and bytes(cur.key()).startswith(prefix):
                cur.delete()

    def _prefixed(
        self, txn: lmdb.Transaction, prefix: bytes, db: Any = None
    ) -> Iterator[tuple[bytes, bytes]]:
        cur = txn.cursor(db=self.meta if db is None else db)
        if cur.set_range(prefix):
            for k, v in cur:
                key = bytes(k)
                if not key.startswith(prefix):
                    break
                yield key[len(prefix) :], bytes(v)

    # -- idempotent requests -------------------------------------------------------------------
    # Keyed by namespace (of the request's first memory) and request id, so one namespace can never
    # learn of another's request ids; ``request_times`` orders them by time for expiry.
    def get_request(self, txn: lmdb.Transaction, namespace: str, request_id: str) -> dict[str, Any] | None:
        raw = txn.get(id_key(namespace, request_id), db=self.requests)
        return None if raw is None else msgpack.unpackb(raw, raw=False)

    def put_request(
        self,
        txn: lmdb.Transaction,
        namespace: str,
        request_id: str,
        fingerprint: bytes,
        rids: list[int],
        now: float,
        dups: list[bool] | None = None,
    ) -> None:
        self.grows += 1
        key = id_key(namespace, request_id)
        value = {"fp": fingerprint, "rids": rids, "t": now, "dups": dups or []}
        txn.put(key, msgpack.packb(value, use_bin_type=True), db=self.requests)
        txn.put(time_key(now) + key, b"", db=self.request_times)

    def expire_requests(self, txn: lmdb.Transaction, before: float, limit: int) -> int:
        """Forget up to ``limit`` request ids recorded before ``before``; returns how many."""
        cutoff = time_key(before)
        done = 0
        cur = txn.cursor(db=self.request_times)
        while done < limit and cur.first():
            k = bytes(cur.key())
            if k[:8] >= cutoff:
                break
            txn.delete(k[8:], db=self.requests)
            cur.delete()
            done += 1
        return done


def _scope_of(raw: bytes | memoryview) -> ScopeState:
    refl, tokens, summary_rid, *rest = msgpack.unpackb(raw)  # (an older entry has no covered_rid)
    covered = rest[0] if rest else summary_rid
    return ScopeState(
        reflection_importance=refl, summary_tokens=tokens, summary_rid=summary_rid, covered_rid=covered
    )
