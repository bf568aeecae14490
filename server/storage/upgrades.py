"""One-time changes to data directories written by earlier versions, made when a writer opens them."""

from __future__ import annotations

import lmdb

from tiermem.server.model.records import Record
from tiermem.server.storage.keys import META_CONTENTS_BY_KIND, content_key


def drop_retired_postings(env: lmdb.Environment) -> None:
    """Data directories written before the keyword index moved into memory hold a ``postings``
    database nothing reads any more: free its pages once."""
    try:
        db = env.open_db(b"postings", dupsort=True, create=False)
    except lmdb.NotFoundError:
        return
    with env.begin(write=True) as txn:
        txn.drop(db, delete=True)


def key_contents_by_kind(
    env: lmdb.Environment, meta: lmdb._Database, records: lmdb._Database, contents: lmdb._Database
) -> None:
    """The exact-duplicate index was keyed by content alone, its entry held by whichever memory of
    any kind stored it last: rebuild it once from the records, keyed by kind and content, each
    entry held by the oldest memory."""
    with env.begin(write=True) as txn:
        if txn.get(META_CONTENTS_BY_KIND, db=meta) is not None:
            return
        txn.drop(contents, delete=False)
        for key, raw in txn.cursor(db=records):  # (in rid order: the oldest first)
            rec = Record.unpack(raw)
            txn.put(
                content_key(rec.namespace, rec.content, rec.kind), bytes(key), db=contents, overwrite=False
            )
        txn.put(META_CONTENTS_BY_KIND, b"1", db=meta)
