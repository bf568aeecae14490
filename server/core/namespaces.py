"""Namespace settings (protection, lifecycle policy overrides), the protection check every
destructive write makes, clearing a namespace, and listing namespaces.

Concurrency: settings change in the writer thread; the in-memory copy (``EngineState.ns_config``)
lags writes queued in the same commit group, so every write re-checks against its transaction."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from tiermem.server.core import upkeep
from tiermem.server.core.lifecycle import compact_indexes
from tiermem.server.core.overrides import check_overrides
from tiermem.server.core.pages import decode_token, encode_token
from tiermem.server.core.policy import POLICY_FIELDS, Policy
from tiermem.server.core.state import EngineState
from tiermem.server.model import validation as check
from tiermem.server.model.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from tiermem.server.model.records import Record
from tiermem.server.model.types import Under
from tiermem.server.storage.store import Txn

CONFIRMED_KINDS = ("preference", "summary")  # stored in a protected namespace only with confirm


def check_protected(
    st: EngineState, namespace: str, confirm: bool, action: str, txn: Txn | None = None
) -> None:
    """FAILED_PRECONDITION unless ``confirm`` when ``namespace`` is protected. Checked once on
    arrival (fails fast, before queueing) and again inside the write's transaction (``txn``),
    which sees every protection committed or queued ahead of it: a write that was checked just
    before a protection landed cannot slip past it."""
    if confirm:
        return
    settings = st.ns_config.get(namespace, {}) if txn is None else st.store.namespace_config(txn, namespace)
    if settings.get("protected"):
        raise FailedPrecondition(
            f"namespace {namespace!r} is protected: {action} needs confirm=true",
            reason="NAMESPACE_PROTECTED",
        )


def get_namespace_config(st: EngineState, namespace: str) -> tuple[dict[str, Any], Policy]:
    check.namespace("namespace", namespace)
    return dict(st.ns_config.get(namespace, {})), st.policy_for(namespace)


def update_namespace_config(
    st: EngineState,
    namespace: str,
    protected: bool,
    policy: dict[str, Any],
    mask: list[str],
    confirm: bool = False,
) -> tuple[dict[str, Any], Policy]:
    """Change ``protected`` and/or policy overrides (stored form, see policy.check_overrides)."""
    check.namespace("config.namespace", namespace)
    fields_ = set(mask or ["protected", "policy"])
    allowed = {"protected", "policy", "policy.tiers", *(f"policy.{f}" for f in POLICY_FIELDS)}
    for f in fields_:
        if f not in allowed:
            raise InvalidArgument(
                "update_mask", f"{f!r} cannot be updated; updatable: {', '.join(sorted(allowed))}"
            )
    change = SettingsChange(namespace, protected, check_overrides(policy), fields_, confirm)
    change.merged(st.ns_config.get(namespace, {}))  # fail fast, before queueing
    result = store_settings(st, [change])[namespace]
    return dict(result), st.policy_of(result)


def store_settings(st: EngineState, changes: list[SettingsChange]) -> dict[str, dict[str, Any]]:
    """Apply ``changes`` (one a namespace) in one commit; each namespace's settings after it."""

    def prepare(txn: Txn) -> dict[str, dict[str, Any]]:
        # Merged with what the transaction sees, not the settings in memory: those lag the
        # writes queued ahead in the same commit group, whose changes would otherwise be lost.
        out = {}
        for change in changes:
            out[change.namespace] = change.merged(st.store.namespace_config(txn, change.namespace))
            st.store.put_namespace_config(txn, change.namespace, out[change.namespace])
        return out

    def apply(settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for namespace in settings:
            st.columns.namespaces.id(namespace)  # tables get a row for it
        # A new dict, not this one changed: other threads copy and iterate it without a lock.
        configs = {ns: s for ns, s in st.ns_config.items() if ns not in settings}
        configs.update((ns, s) for ns, s in settings.items() if s)
        st.ns_config = configs
        st.config_version += 1
        for namespace in settings:  # (a policy can make its summary due: the summarizer checks)
            st.request_summary(namespace)
        return settings

    return dict(st.writer.submit(prepare, apply))


class SettingsChange:
    """The masked fields of a settings update, applied to the settings stored before it."""

    def __init__(
        self, namespace: str, protected: bool, policy: dict[str, Any], fields_: set[str], confirm: bool
    ) -> None:
        self.namespace, self.protected, self.policy = namespace, protected, policy
        self.fields, self.confirm = fields_, confirm

    def merged(self, current: dict[str, Any]) -> dict[str, Any]:
        """The settings to store: ``current`` with the masked fields replaced."""
        fields_, policy = self.fields, self.policy
        if "protected" in fields_ and current.get("protected") and not self.protected and not self.confirm:
            raise FailedPrecondition(
                f"namespace {self.namespace!r} is protected: unprotecting it needs confirm=true",
                reason="NAMESPACE_PROTECTED",
            )
        new_protected = self.protected if "protected" in fields_ else bool(current.get("protected"))
        new_policy = dict(policy) if "policy" in fields_ else dict(current.get("policy") or {})
        for f in fields_:
            if f.startswith("policy."):
                name = f.split(".", 1)[1]
                if name in policy:
                    new_policy[name] = policy[name]
                else:
                    new_policy.pop(name, None)
        if current.get("protected") and new_policy != (current.get("policy") or {}) and not self.confirm:
            # A policy (capacities, deletion from GLACIAL) can empty a namespace at the next pass.
            raise FailedPrecondition(
                f"namespace {self.namespace!r} is protected: changing its policy needs confirm=true",
                reason="NAMESPACE_PROTECTED",
            )
        stored: dict[str, Any] = {}
        if new_protected:
            stored["protected"] = True
        if new_policy:
            stored["policy"] = new_policy
        return stored


def delete_namespace(
    st: EngineState, namespace: str, include_children: bool = False, confirm: bool = False
) -> int:
    """Delete every memory of ``namespace`` (and of ``namespace/...`` with include_children)."""
    check.namespace("namespace", namespace)
    under = namespace + "/"
    for name in [
        namespace,
        *(n for n in (list(st.ns_config) if include_children else []) if n.startswith(under)),
    ]:
        check_protected(st, name, confirm, "clearing the namespace")

    parted: set[str] = set()

    def prepare(txn: Txn) -> tuple[list[Record], set[str]]:
        # Read the ids from LMDB, not the columns: this sees writes of the same commit group.
        recs = list(st.store.namespace_records(txn, namespace, include_children))
        # Every namespace it clears, including children with no memories (their graph facts go).
        children = list(st.store.namespace_configs(txn, under)) if include_children else []
        # (and children whose memories had all gone already: their progress is stored still)
        progress = [ns for ns, _ in st.store.scope_states(txn, namespace, include_children)]
        # (with the namespaces of memories deleted in parts before, on a full disk)
        cleared = {namespace, *children, *progress, *parted, *(r.namespace for r in recs)}
        for ns in sorted(cleared):
            check_protected(st, ns, confirm, "clearing the namespace", txn)
        for rec in recs:
            st.store.delete(txn, rec)
        st.store.delete_graph(txn, namespace, include_children)
        for ns in {namespace, *progress, *(r.namespace for r in recs)}:
            st.store.put_scope_state(txn, ns, None)
        cleared = st.store.retire_lifecycle_counters(txn, cleared, under if include_children else "")
        return recs, cleared

    def apply(prepared: tuple[list[Record], set[str]]) -> int:
        recs, cleared = prepared
        upkeep.unindex(st, recs)
        st.lifecycle.retire(cleared)
        st.searches.forget(cleared)
        st.summaries.forget(cleared)
        return len(recs)

    try:
        deleted: int = st.writer.submit(prepare, apply)
    except ResourceExhausted as e:
        if e.reason != "STORAGE_FULL":
            raise
        # A disk with no room left: one commit freeing the whole namespace needs new pages it
        # frees only once committed; commits of fewer memories each free room for the next.
        deleted = _delete_in_parts(st, namespace, include_children, confirm, parted)
        deleted += st.writer.submit(prepare, apply)
    if deleted:
        compact_indexes(st)
    return deleted


def _delete_in_parts(
    st: EngineState, namespace: str, include_children: bool, confirm: bool, parted: set[str]
) -> int:
    """Delete the namespace's memories in commits of at most PART_RECORDS, fewer after a commit
    the disk refuses (down to one memory a commit); how many were deleted. ``parted`` gathers the
    namespaces of the memories deleted (cleared with the rest at the end)."""
    part, deleted = PART_RECORDS, 0

    def prepare(txn: Txn) -> list[Record]:
        recs = list(itertools.islice(st.store.namespace_records(txn, namespace, include_children), part))
        for ns in sorted({namespace, *(r.namespace for r in recs)}):
            check_protected(st, ns, confirm, "clearing the namespace", txn)
        for rec in recs:
            st.store.delete(txn, rec)
        return recs

    def apply(recs: list[Record]) -> int:
        upkeep.unindex(st, recs)
        parted.update(r.namespace for r in recs)
        return len(recs)

    while True:
        try:
            done = st.writer.submit(prepare, apply)
        except ResourceExhausted as e:
            if e.reason != "STORAGE_FULL" or part == 1:
                raise
            part = max(1, part // 4)
            continue
        if not done:
            return deleted
        deleted += done


PART_RECORDS = 256  # memories a commit deletes when a namespace is cleared on a full disk


def list_namespaces(
    st: EngineState,
    prefix: str,
    page_size: int,
    page_token: str,
    within: Callable[[str], bool] | None = None,
) -> tuple[list[tuple[str, int]], str]:
    """A page of (namespace, memory count) in name order under ``prefix`` (and, with ``within``,
    only the namespaces it accepts: an API key's), and the next token."""
    size = check.page_size("page_size", page_size, st.config)
    listing = f"namespaces:{prefix}"
    after = decode_token("page_token", page_token, str, st.page_secret, listing) if page_token else ""
    if isinstance(within, Under):  # (an API key's: its names by bisection, however far apart)
        page, more = st.columns.namespaces_page_under(within, prefix, after, size)
        return page, (encode_token(page[-1][0], st.page_secret, listing) if more and page else "")
    out: list[tuple[str, int]] = []
    # With ``within``, a next token only when a namespace it accepts follows: one it hides must not
    # show through the token.
    wanted = size if within is None else size + 1
    chunk = size if within is None else max(size, 256)  # (a narrow key's names may lie far apart)
    while True:
        page, more = st.columns.namespaces_page(prefix, after, chunk)
        out += page if within is None else [(n, c) for n, c in page if within(n)]
        if len(out) >= wanted or not more or not page:
            break
        after = page[-1][0]
    cut = len(out) > size
    out = out[:size]
    more_to_see = out and (cut or (more and within is None))
    return out, (encode_token(out[-1][0], st.page_secret, listing) if more_to_see else "")


# Routing states of a top-level scope (the proto's ScopeRouting): served, writes fenced while it
# moves to another shard, moved (every call refused: it is served elsewhere), and served while a
# move copies it here (a mark: an unfinished move's copy, which ending the move may delete).
SERVING, FENCED, MOVED, RECEIVING = 0, 1, 2, 3


def set_scope_routing(
    st: EngineState,
    scope: str,
    state: int,
    moved_to: str,
    purge: bool,
    drain: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Set the routing state of top-level ``scope`` (durable when it returns); ``drain`` then waits
    for the scope's writes in flight (the transport's); with ``purge`` (MOVED only) delete its
    memories and graph facts, children included: (state, memories purged)."""
    _check_top_scope(scope)
    if state not in (SERVING, FENCED, MOVED, RECEIVING):
        raise InvalidArgument("routing", f"unknown routing state {state}")
    check.text("moved_to", moved_to, 256)
    if purge and state != MOVED:
        raise InvalidArgument("purge", "only a scope that has MOVED can be purged")

    def prepare(txn: Txn) -> None:
        st.store.put_scope_routing(txn, scope, state, moved_to)

    def publish(_: None) -> None:
        routing = dict(st.routing)
        if state == SERVING:
            routing.pop(scope, None)
        else:
            routing[scope] = (state, moved_to)
        st.routing = routing

    st.writer.submit(prepare, publish)
    if drain is not None and state in (FENCED, MOVED):
        drain()
    purged = delete_namespace(st, scope, include_children=True, confirm=True) if purge else 0
    return state, purged


def get_scope_routing(st: EngineState, scope: str) -> tuple[int, str]:
    """The routing state of top-level ``scope`` and what it was set with (SERVING, "" when none)."""
    _check_top_scope(scope)
    return st.routing.get(scope, (SERVING, ""))


def _check_top_scope(scope: str) -> None:
    check.namespace("scope", scope)
    if "/" in scope:
        raise InvalidArgument("scope", f"{scope!r} is not a top-level scope (it has a '/')")
