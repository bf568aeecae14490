"""The lifecycle policy of each namespace and the tables the kernels read, kept between calls.

With one namespace per session or task a server holds tens of thousands of them, and every search
reads the tables: a namespace appearing must not rebuild them, nor a settings change recompute
every namespace's policy.
- Each namespace's ``Policy`` is kept with the settings it came from (the settings are replaced,
  never changed in place, when they change), and namespaces whose overrides are equal share one.
- The tables have room for more namespaces than exist, filled with the server's policy: a
  namespace interned since they were built needs nothing more (one without settings of its own
  has the server's policy; one with settings is interned when they are stored, and that moves
  the settings version, which rebuilds them). A rebuild fills each distinct policy's rows at once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tiermem.server.core.policy import Policy, Tables
from tiermem.server.index.columns import Interner

MIN_ROOM = 1024  # namespace rows the tables hold at least


class PolicyCache:
    def __init__(self, base: Policy) -> None:
        self.base = base
        self._lock = threading.Lock()  # (one rebuild at a time: the others wait for its tables)
        # Held to change or copy the two dicts below: a copy made while another thread adds to
        # them can fail ("dictionary changed size during iteration") whenever the copy lets the
        # GIL go, as a collection it triggers may.
        self._entries = threading.Lock()
        self._policies: dict[str, tuple[dict[str, Any], Policy]] = {}  # namespace: (settings, policy)
        self._shared: dict[str, Policy] = {}  # the overrides' canonical form: their policy
        # (settings version, namespaces then, whether a namespace interned later needs a rebuild, tables)
        self._tables: tuple[int, int, bool, Tables] | None = None

    def policy_of(self, settings: dict[str, Any], namespace: str = "") -> Policy:
        """The policy in effect under a namespace's stored settings (kept for ``namespace``)."""
        overrides = settings.get("policy")
        if not overrides:
            return self.base
        kept = self._policies.get(namespace) if namespace else None
        if kept is not None and kept[0] is settings:
            return kept[1]
        try:
            key = json.dumps(overrides, sort_keys=True, default=str)
        except TypeError:  # (keys of mixed types: not shared)
            key = ""
        policy = self._shared.get(key) if key else None
        if policy is None:
            policy = self.base.with_overrides(overrides)
        with self._entries:
            if key:
                policy = self._shared.setdefault(key, policy)
            if namespace:
                self._policies[namespace] = (settings, policy)
        return policy

    def tables(
        self, names: Interner, settings: Callable[[], dict[str, dict[str, Any]]], version: int
    ) -> Tables:
        """Tables for every namespace ``names`` holds under the ``settings`` of ``version``."""
        n = len(names)
        kept = self._tables
        if kept is not None and _current(kept, n, version):
            return kept[3]
        with self._lock:
            kept = self._tables
            if kept is None or not _current(kept, n, version):
                kept = self._build(names, settings(), version)
                self._tables = kept
            return kept[3]

    def _build(
        self, names: Interner, settings: dict[str, dict[str, Any]], version: int
    ) -> tuple[int, int, bool, Tables]:
        n = len(names)
        groups: dict[int, tuple[Policy, list[int]]] = {}  # (the namespaces of one policy: filled at once)
        growable = True
        for ns, s in list(settings.items()):
            if s.get("policy"):
                i = names.get(ns)
                if i < 0:  # (not interned yet: the tables are rebuilt once it is)
                    growable = False
                    continue
                p = self.policy_of(s, ns)
                groups.setdefault(id(p), (p, []))[1].append(i)
        # Forget the namespaces whose settings went, and the policies no namespace shares any more.
        with self._entries:
            self._policies = {ns: kept for ns, kept in self._policies.items() if settings.get(ns) is kept[0]}
            self._shared = {k: p for k, p in self._shared.items() if id(p) in groups}
        # Always room beyond n: a search's view may be taken after the tables, with a namespace more.
        room = max(MIN_ROOM, 1 << n.bit_length())
        tables = Tables.build(room, self.base, [(p, np.array(ids, np.int64)) for p, ids in groups.values()])
        return version, n, growable, tables


def _current(kept: tuple[int, int, bool, Tables], n: int, version: int) -> bool:
    version_then, n_then, growable, tables = kept
    return version_then == version and (n == n_then or (growable and n <= tables.max_items.shape[0]))
