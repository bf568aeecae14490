"""The store's lifecycle counters: promotions, demotions, evictions and deletions per namespace and
tier, ever, in its ``meta`` database. ``Store`` (store.py) inherits these methods."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lmdb
import msgpack

from tiermem.server.config import TIERS
from tiermem.server.storage.keys import META_LSTAT, lstat_key

RETIRED = ""  # where deleted namespaces' counters go: counted in the server's totals only


class LifecycleCounters:
    meta: lmdb._Database
    _prefixed: Callable[[lmdb.Transaction, bytes], Iterator[tuple[bytes, bytes]]]  # (Store's)

    def lifecycle_counters(self, txn: lmdb.Transaction) -> dict[tuple[str, int], list[int]]:
        """(namespace, tier) -> [promotions, demotions, evictions, deleted], ever."""
        parts = ((k.rpartition(b"\x00"), v) for k, v in self._prefixed(txn, META_LSTAT))
        return {(ns.decode(), tier[0]): list(msgpack.unpackb(v)) for (ns, _, tier), v in parts}

    def lifecycle_counter(self, txn: lmdb.Transaction, namespace: str, tier: int) -> list[int]:
        """[promotions, demotions, evictions, deleted] of one namespace and tier, ever."""
        raw = txn.get(lstat_key(namespace, tier), db=self.meta)
        return list(msgpack.unpackb(raw)) if raw else [0, 0, 0, 0]

    def put_lifecycle_counters(
        self, txn: lmdb.Transaction, namespace: str, tier: int, counts: list[int]
    ) -> None:
        txn.put(lstat_key(namespace, tier), msgpack.packb(counts), db=self.meta)

    def retire_lifecycle_counters(
        self, txn: lmdb.Transaction, namespaces: set[str], under: str = ""
    ) -> set[str]:
        """The counters of deleted namespaces (and, with ``under``, of every namespace whose name
        starts with it) added to ``RETIRED``'s and dropped: a deleted namespace costs no stats call
        or start-up anything, one made again starts at zero, and the server's totals ever stay
        whole. Returns the namespaces retired."""
        namespaces = set(namespaces)
        if under:
            found = [k.rpartition(b"\x00")[0] for k, _ in self._prefixed(txn, META_LSTAT + under.encode())]
            namespaces.update(under + rest.decode() for rest in found)
        for ns in namespaces - {RETIRED}:
            for tier in TIERS:
                counts = self.lifecycle_counter(txn, ns, tier)
                if any(counts):
                    kept = self.lifecycle_counter(txn, RETIRED, tier)
                    self.put_lifecycle_counters(
                        txn, RETIRED, tier, [a + b for a, b in zip(kept, counts, strict=True)]
                    )
                txn.delete(lstat_key(ns, tier), db=self.meta)
        return namespaces
