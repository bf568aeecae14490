"""How every LMDB key of the store is encoded (the ``Store`` alone reads and writes them).

One environment with named sub-databases:

- ``meta``:     schema version, id counters, embedding spaces (model -> dimension), namespace
  settings, scope states, lifecycle counters and the routing states of top-level scopes moving
  between shards (each under its own key prefix)
- ``records``:  rid (8-byte big-endian, so LMDB order is creation order) -> msgpack Record
  (an array of its fields, see ``Record.pack``)
- ``ids``:      namespace NUL id -> rid
- ``vectors``:  rid -> float32 bytes of the normalized vector
- ``requests``: namespace NUL request_id -> msgpack {fingerprint, rids, time} for idempotent retries
- ``request_times``: time (ms, 8-byte big-endian) + requests key, to forget old request ids
- ``content_rids`` (dupsort): namespace NUL blake2b(kind NUL normalized content) -> the rid of every
  memory of those words and kind, for exact-duplicate detection (``contents``, earlier versions'
  index of one rid a key, is replaced at open)
- ``graph``: namespace NUL "n" NUL node id -> node; namespace NUL "e" NUL edge id -> edge;
  namespace NUL "a" NUL node id NUL edge id -> b"" (adjacency, both ends)
- ``pending``: rid -> b"" for memories stored without a vector (the embedder failed); retried
- (``postings``, the keyword index of earlier versions, is dropped at open: keywords are indexed in
  memory, see index/keyword_index.py)
- ``changes``: rid -> commit sequence number (8 bytes) of the last change of that record, kept until
  a columns snapshot that includes it is on disk: start-up reloads only these records on top of the
  snapshot (``meta`` holds the sequence number of the last commit)
- ``commits``: commit sequence number (8 bytes) -> msgpack [time, settings changed, rids (uint64
  array)]: what each commit changed, in order, so a search follower process catches up with a
  cursor from the last commit it applied instead of scanning ``changes``; written only while
  followers may read it, entries dropped once ``Tuning.commit_log_seconds`` old (a follower further
  behind loads again)

Namespaces and ids never contain NUL (validated), so keys joined with NUL are unambiguous.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import lmdb
import msgpack

RID = struct.Struct(">Q")
COUNT = struct.Struct(">I")
META_SCHEMA = b"schema_version"
META_NEXT_RID = b"next_rid"
META_NEXT_VK = b"next_vk"
META_SPACE = b"space:"
META_NSCONF = b"nsconf:"
META_SCOPE = b"scope:"
META_REPLICA = b"replica_of"  # on a replica: [leader data's instance id, last commit of it stored]
META_ROUTING = b"routing:"  # top-level scope -> [state, moved_to]: fenced or moved to another shard
META_LSTAT = b"lstat:"
META_SEQ = b"commit_seq"
META_CONTENTS_BY_KIND = b"contents_by_kind"  # (earlier versions': their index keyed by kind)
META_CONTENT_RIDS = b"content_rids"  # set once the exact-duplicate index holds every memory
META_INSTANCE = b"instance_id"  # random id of this environment, stamped on index snapshots


def rid_key(rid: int) -> bytes:
    return RID.pack(rid)


def rid_of(key: bytes) -> int:
    return int(RID.unpack(key)[0])


def normalize(content: str) -> str:
    """Content as compared for exact-duplicate detection: case-folded, whitespace collapsed."""
    return " ".join(content.casefold().split())


def content_key(namespace: str, content: str, kind: str) -> bytes:
    """The exact-duplicate key of a content of ``kind`` in ``namespace``."""
    text = f"{kind}\x00{normalize(content)}"
    return namespace.encode() + b"\x00" + hashlib.blake2b(text.encode(), digest_size=16).digest()


def id_key(namespace: str, memory_id: str) -> bytes:
    return namespace.encode() + b"\x00" + memory_id.encode()


def namespace_prefixes(namespace: str, include_children: bool) -> list[bytes]:
    """Key prefixes of a namespace's entries in ``ids`` and ``graph`` (and of its children's);
    ``""``: every namespace."""
    if not namespace:
        return [b""]
    return [namespace.encode() + b"\x00"] + ([namespace.encode() + b"/"] if include_children else [])


def graph_key(namespace: str, kind: bytes, *parts: str) -> bytes:
    return b"\x00".join([namespace.encode(), kind, *(p.encode() for p in parts)])


def time_key(t: float) -> bytes:
    return RID.pack(max(0, int(t * 1000)))


def lstat_key(namespace: str, tier: int) -> bytes:
    return META_LSTAT + namespace.encode() + b"\x00" + bytes([tier])


def unpack_config(raw: bytes | memoryview) -> dict[str, Any]:
    return dict(msgpack.unpackb(raw, raw=False, strict_map_key=False))


def put_maybe_append(txn: lmdb.Transaction, key: bytes, value: bytes, db: Any, new: bool) -> None:
    """A put; ``new`` keys (fresh rids, above every key of ``db``) are appended: LMDB then fills
    pages instead of splitting them in half, so the file and the pages mapped into memory are
    ~2x smaller. A key that is not the highest falls back to an ordinary put."""
    if not (new and txn.put(key, value, db=db, append=True)):
        txn.put(key, value, db=db)
