"""One-time changes to data directories written by earlier versions, made when a writer opens them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import lmdb

from tiermem.server.model.errors import StorageError
from tiermem.server.model.records import Record
from tiermem.server.storage.keys import META_CONTENT_RIDS, META_CONTENTS_BY_KIND, content_key

logger = logging.getLogger(__name__)


def with_room(env: lmdb.Environment, max_map_size: int, open_databases: Callable[[], None]) -> None:
    """``open_databases()`` (its new databases and one-time changes write), the map doubled up to
    ``max_map_size`` while they need more room than it has: a directory that grew past the
    configured ``map_size`` while serving opens with no room to spare, and a write at open would
    otherwise fail the start-up. Each write is one transaction, so a try that ran out wrote nothing."""
    while True:
        try:
            open_databases()
            return
        except lmdb.MapFullError as e:
            size = int(env.info()["map_size"])
            if size >= max_map_size:
                raise StorageError(
                    f"the data directory needs more than max_map_size ({max_map_size} bytes) to open"
                ) from e
            env.set_mapsize(min(2 * size, max_map_size))
            logger.warning("LMDB map grown at open from %d to %d bytes", size, int(env.info()["map_size"]))


def drop_retired_postings(env: lmdb.Environment) -> None:
    """Data directories written before the keyword index moved into memory hold a ``postings``
    database nothing reads any more: free its pages once."""
    try:
        db = env.open_db(b"postings", dupsort=True, create=False)
    except lmdb.NotFoundError:
        return
    with env.begin(write=True) as txn:
        txn.drop(db, delete=True)


def index_every_copy(
    env: lmdb.Environment, meta: lmdb._Database, records: lmdb._Database, contents: lmdb._Database
) -> None:
    """Earlier versions kept one memory per namespace, kind and words in the exact-duplicate index
    (a ``contents`` database; before that, keyed by words alone): deleting that memory left its
    copies unfound. Build the index of every memory from the records, and drop the old one, in one
    transaction: once, and again if an earlier version wrote to the directory since (it sets its
    own flag again, and its memories are missing here)."""
    try:
        old: lmdb._Database | None = env.open_db(b"contents", create=False)
    except lmdb.NotFoundError:
        old = None
    with env.begin(write=True) as txn:
        built = txn.get(META_CONTENT_RIDS, db=meta) is not None
        if built and txn.get(META_CONTENTS_BY_KIND, db=meta) is None:
            if old is not None:  # (left by a build that stopped before its drop: earlier code)
                txn.drop(old, delete=True)
            return
        t0 = time.perf_counter()
        txn.drop(contents, delete=False)
        n = 0
        for key, raw in txn.cursor(db=records):
            rec = Record.unpack(raw)
            txn.put(content_key(rec.namespace, rec.content, rec.kind), bytes(key), db=contents)
            n += 1
        txn.put(META_CONTENT_RIDS, b"1", db=meta)
        txn.delete(META_CONTENTS_BY_KIND, db=meta)
        if old is not None:
            txn.drop(old, delete=True)
    if n:  # (at the first open of a directory an earlier version wrote)
        logger.info("exact-duplicate index built from %d records in %.2f s", n, time.perf_counter() - t0)
