"""Creating memories: checks, embedding, idempotent retries (request ids), deduplication (exact
content, or vector similarity against the indexes and the commit group being written), and each
namespace's progress toward a reflection and a summary.

Concurrency: the caller embeds and checks on its own thread; everything that reads or writes LMDB
runs in the writer thread (``prepare``), and the columns and indexes change after the commit
(``apply``)."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

import msgpack
import numpy as np

from tiermem.server.config import IMPORTANCE_HEURISTICS
from tiermem.server.core import upkeep
from tiermem.server.core.group_vectors import GroupVectors
from tiermem.server.core.lifecycle import enforce_caps, flush_working
from tiermem.server.core.namespaces import CONFIRMED_KINDS, check_protected
from tiermem.server.core.state import EngineState
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.model import importance
from tiermem.server.model import validation as check
from tiermem.server.model.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from tiermem.server.model.records import NewMemory, Record
from tiermem.server.model.reports import CreateOutcome, Due, ScopeProgress, ScopeState
from tiermem.server.model.text import estimate_tokens
from tiermem.server.model.types import NO_VECTOR
from tiermem.server.storage.store import Txn

logger = logging.getLogger(__name__)

CUES = IMPORTANCE_HEURISTICS["cues"]  # the heuristic validation applies itself


def create_detailed(
    st: EngineState,
    memories: list[NewMemory],
    request_id: str = "",
    *,
    batch: bool = False,
    dedup_similarity: float | None = None,
    allow_duplicates: bool = False,
    confirm: bool = False,
    summary_covers: SummaryCovers | None = None,
) -> CreateOutcome:
    """Store memories all-or-nothing; returns the records, per memory whether it was a duplicate
    that reinforced an existing memory instead of adding one, and per namespace whether a
    reflection and a summary are due.

    Deduplication (unless ``allow_duplicates``, and only for memories without a client id): a
    memory whose normalized content equals one already in its namespace, or, with
    ``dedup_similarity``, whose vector is at least that similar to one there, reinforces it
    (importance raised to the larger, one more access, tags merged) and is not stored again.
    ``batch`` only changes field names in errors. In a protected namespace a preference or a summary
    (which replaces the previous one) needs ``confirm``. ``summary_covers``: what a summary the
    server built covers (see ``SummaryCovers``); an agent's covers everything before it.
    """
    check.batch("memories", memories, st.config.max_batch_size)
    check.request_id("request_id", request_id)
    if dedup_similarity is not None and not -1.0 <= dedup_similarity <= 1.0:
        raise InvalidArgument("dedup_similarity", "must be in [-1, 1]")
    # Of the request as sent: what the server derives (a vector, an estimated importance) may
    # differ on a retry (the embedder back up, the memory older), and the retry is the same request.
    fingerprint = hashlib.blake2b(
        msgpack.packb([m.fingerprint_parts() for m in memories], use_bin_type=True), digest_size=16
    ).digest()
    _check_and_embed(st, memories, batch)
    _check_confirmed(st, memories, confirm)
    op = _CreateOp(st, memories, request_id, batch, dedup_similarity, allow_duplicates, fingerprint, confirm)
    op.summary_covers = summary_covers
    weight = sum(len(m.content) + 4 * m.embedding.shape[0] + 512 for m in memories)
    outcome: CreateOutcome = st.writer.submit(op.prepare, op.apply, weight)
    flushed = settle(st, op.namespaces, frozenset(r.rid for r in outcome.records))
    for ns in sorted(op.namespaces):
        if outcome.due[ns].summary_kept:
            st.request_summary(ns)
    if flushed:  # (the answer shows the memories as stored: moved to MEDIUM)
        with st.store.read() as txn:
            now = st.store.get_many(txn, [r.rid for r in outcome.records])
        outcome.records = [r if n is None else n for r, n in zip(outcome.records, now, strict=True)]
    return outcome


def settle(st: EngineState, namespaces: Iterable[str], keep: frozenset[int]) -> int:
    """What a write that stored memories into ``namespaces`` does once committed, before it answers:
    the working memory's flush past its limit, and the namespace's and kinds' caps (not evicting
    ``keep``, the rows it stored). The memories flushed."""
    flushed = 0
    for ns in sorted(set(namespaces)):
        policy = st.policy_for(ns)
        if policy.working_token_limit:
            flushed += _after_commit(st, ns, "flushing the working memory", partial(flush_working, st, ns))
        if policy.evict_on_create:
            _after_commit(st, ns, "applying the caps", partial(enforce_caps, st, ns, keep))
    return flushed


def _after_commit(st: EngineState, namespace: str, what: str, step: Callable[[], int]) -> int:
    """A step a create takes once committed (the caps it crossed, without touching what it stored;
    the working memory's flush), and what it returned: a failure is logged (the next pass applies
    the caps, the next create flushes), not the caller's, whose memories are stored (0)."""
    try:
        return step()
    except Exception:
        logger.exception("%s of %s after a create failed", what, namespace)
        return 0


def _check_and_embed(st: EngineState, memories: list[NewMemory], batch: bool) -> None:
    seen: dict[tuple[str, str], int] = {}
    now = st.clock()
    for i, m in enumerate(memories):
        prefix = f"memories[{i}]." if batch else "memory."
        policy = st.policy_for(m.namespace) if m.importance is None else None
        if policy is not None and policy.default_importance is not None:
            # the namespace's, not an estimate (a reflection's at least 0.8)
            m.importance = (
                max(policy.default_importance, 0.8) if m.kind == "reflection" else policy.default_importance
            )
        check.new_memory(prefix, m, st.config)  # (without importance: rated by the cues heuristic)
        if policy is not None and policy.default_importance is None and policy.importance_heuristic != CUES:
            age_hours = 0.0 if m.created_at is None else (now - m.created_at) / 3600.0
            m.importance = importance.estimate_by(policy.importance_heuristic, m.content, m.kind, age_hours)
        if m.id:
            j = seen.setdefault((m.namespace, m.id), i)
            if j != i:
                raise InvalidArgument(f"{prefix}id", f"repeats memories[{j}].id in the same batch")
    # The memories without a vector, embedded in one call (batched by the embedder). Those it
    # could not embed are stored anyway; the maintenance pass embeds them later.
    unembedded = [m for m in memories if m.embedding is None]
    failed: dict[str, int] = {}
    for m, vec in zip(unembedded, st.embedder.embed_many([m.content for m in unembedded]), strict=True):
        m.embedding_model = st.embedder.model
        if isinstance(vec, EmbedderError):
            failed[str(vec)] = failed.get(str(vec), 0) + 1
            vec = NO_VECTOR
        m.embedding = vec
    for why, count in failed.items():
        logger.warning("storing %d memories without their embedding for now: %s", count, why)


@dataclass
class _Written:
    """What a create's transaction did: each memory's record with its vector (None: a reinforced
    duplicate), the records it deleted (expired ids reused, replaced summaries) and what is due; or
    the outcome of the earlier request it replays."""

    items: list[tuple[Record, np.ndarray | None]]
    freed: list[Record]
    due: dict[str, Due]
    replayed: CreateOutcome | None = None


def _check_confirmed(
    st: EngineState, memories: list[NewMemory], confirm: bool, txn: Txn | None = None
) -> None:
    for m in memories:
        if m.kind in CONFIRMED_KINDS:
            check_protected(st, m.namespace, confirm, f"storing a {m.kind}", txn)


class _CreateOp:
    """One create's write: ``prepare`` in the writer's transaction, ``apply`` after the commit."""

    def __init__(
        self,
        st: EngineState,
        memories: list[NewMemory],
        request_id: str,
        batch: bool,
        dedup_similarity: float | None,
        allow_duplicates: bool,
        fingerprint: bytes,
        confirm: bool = False,
    ) -> None:
        self.st, self.memories, self.request_id, self.batch = st, memories, request_id, batch
        self.dedup_similarity, self.allow_duplicates = dedup_similarity, allow_duplicates
        self.fingerprint, self.confirm = fingerprint, confirm
        self.now = st.clock()
        self.namespaces = {m.namespace for m in memories}
        self.summary_covers: SummaryCovers | None = None

    def prepare(self, txn: Txn) -> _Written:
        st, now = self.st, self.now
        if self.request_id:
            replayed = self._replay(txn)
            if replayed is not None:
                return _Written([], [], replayed.due, replayed)
        _check_confirmed(st, self.memories, self.confirm, txn)  # (a protection queued ahead counts)
        spaces: dict[str, int | None] = {}  # dimension by model, as this transaction sees it
        out: list[tuple[Record, np.ndarray | None]] = []
        freed: list[Record] = []
        scopes: dict[str, ScopeState] = {}
        made: set[int] = set()  # (a duplicate of one of these changes nothing stored before)
        for i, m in enumerate(self.memories):
            self._check_space(txn, spaces, i, m)
            if not m.id and not self.allow_duplicates:
                dup = find_duplicate(st, txn, m, self.dedup_similarity)
                if dup is not None:
                    if dup.rid not in made:
                        what = (
                            f"reinforcing memory {dup.id!r} (duplicated; allow_duplicates stores it instead)"
                        )
                        check_protected(st, m.namespace, self.confirm, what, txn)
                    _reinforce(
                        dup,
                        m,
                        now,
                        st.config.max_tags,
                        f"memories[{i}].tags" if self.batch else "memory.tags",
                    )
                    st.store.put(txn, dup)
                    # An earlier item of this batch that was the same memory answers with its
                    # state now too (its vector, if new, is still indexed from that item).
                    out = [(dup if r.rid == dup.rid else r, v) for r, v in out]
                    out.append((dup, None))
                    continue
            freed += self._free_id(txn, m)
            rec = self._insert(txn, m)
            made.add(rec.rid)
            out.append((rec, m.embedding))
            freed += track_scope(st, txn, scopes, rec, self.summary_covers)
        for ns, state in scopes.items():
            st.store.put_scope_state(txn, ns, state)
        due = {
            ns: due_of(st, ns, scopes[ns]) if ns in scopes else due_for(st, txn, ns) for ns in self.namespaces
        }
        if self.request_id:
            dups = [v is None for _, v in out]
            rids = [r.rid for r, _ in out]
            ns = self.memories[0].namespace
            st.store.put_request(txn, ns, self.request_id, self.fingerprint, rids, now, dups)
        return _Written(out, freed, due)

    def apply(self, written: _Written) -> CreateOutcome:
        if written.replayed is not None:
            return written.replayed
        st = self.st
        upkeep.index_new(st, [(rec, vec) for rec, vec in written.items if vec is not None])
        # After indexing: the reinforced memory may be new in this batch.
        upkeep.refresh_rows(st, [rec for rec, vec in written.items if vec is None])
        # After indexing: a summary replaced by a later one of the same batch is in both lists.
        upkeep.unindex(st, written.freed)
        return CreateOutcome(
            records=[rec for rec, _ in written.items],
            reinforced=[vec is None for _, vec in written.items],
            due=written.due,
        )

    def _replay(self, txn: Txn) -> CreateOutcome | None:
        """The outcome of an earlier create with this request id (None: there was none)."""
        st = self.st
        prior = st.store.get_request(txn, self.memories[0].namespace, self.request_id)
        if prior is None:
            return None
        if prior["fp"] != self.fingerprint:
            raise AlreadyExists(
                f"request_id {self.request_id!r} was used for a different request",
                reason="REQUEST_ID_REUSED",
            )
        replayed = [st.store.get(txn, rid) for rid in prior["rids"]]
        # (an expired memory is deleted for every read, before the sweep removes it)
        records = [r for r in replayed if r is not None and not r.expired(self.now)]
        if len(records) != len(replayed):
            raise NotFound(
                f"memories created by request_id {self.request_id!r} were deleted since",
                reason="REQUEST_RESULT_DELETED",
            )
        return CreateOutcome(
            records=records,
            reinforced=list(prior.get("dups") or [False] * len(records)),
            due={ns: due_for(st, txn, ns) for ns in self.namespaces},
        )

    def _check_space(self, txn: Txn, spaces: dict[str, int | None], i: int, m: NewMemory) -> None:
        """INVALID_ARGUMENT unless m's vector fits its embedding space; a new space is stored."""
        dim = int(m.embedding.shape[0])
        if m.embedding_model not in spaces:
            # Spaces in memory are committed (added once indexed) and never change.
            sp = self.st.spaces.get(m.embedding_model)
            spaces[m.embedding_model] = sp.dim if sp else self.st.store.space(txn, m.embedding_model)
        known = spaces[m.embedding_model]
        if dim == 0:
            return  # no vector yet (embedder failed): the space is checked when it is embedded
        prefix = f"memories[{i}]." if self.batch else "memory."
        self.st.claim_space(txn, f"{prefix}embedding", m.embedding_model, dim, known)
        spaces[m.embedding_model] = dim

    def _free_id(self, txn: Txn, m: NewMemory) -> list[Record]:
        """ALREADY_EXISTS when m's client id is taken; an expired memory frees it (returned)."""
        return free_id(self.st, txn, m.namespace, m.id, self.now) if m.id else []

    def _insert(self, txn: Txn, m: NewMemory) -> Record:
        st = self.st
        rid, vk = st.alloc_ids()
        created = self.now if m.created_at is None else m.created_at
        # (a create_time ahead of this clock would hold off idle demotion until then: as an import's)
        entered = min(created, self.now)
        rec = Record(
            rid=rid,
            id=m.id or uuid.uuid4().hex,
            namespace=m.namespace,
            content=m.content,
            kind=m.kind,
            tier=m.tier,
            importance=float(m.importance or 0.0),
            source=m.source,
            topic=m.topic,
            tags=m.tags,
            metadata=m.metadata,
            embedding_model=m.embedding_model,
            created_at=created,
            updated_at=entered,
            accessed_at=entered,
            tier_since=entered,
            token_cost=m.token_cost or estimate_tokens(m.content),
            source_ids=list(m.source_ids),
            expire_at=m.expire_at,
            vk=vk,
            questions=list(m.questions),
        )
        st.store.insert(txn, rec)
        if m.embedding.shape[0]:
            st.store.put_vector(txn, rid, m.embedding, new=True)
            group = st.group_vectors.get((m.namespace, m.embedding_model))
            if group is None:
                group = st.group_vectors[(m.namespace, m.embedding_model)] = GroupVectors(
                    st.config.tuning.dedup_group_limit
                )
            group.add(rid, vk, m.embedding)
        else:
            st.store.mark_pending(txn, rid, True)
        return rec


def free_id(st: EngineState, txn: Txn, namespace: str, memory_id: str, now: float) -> list[Record]:
    """ALREADY_EXISTS when a live memory holds ``memory_id`` in ``namespace``; an expired one frees
    it: deleted here, and returned (to be unindexed)."""
    old_rid = st.store.lookup(txn, namespace, memory_id)
    old = None if old_rid is None else st.store.get(txn, old_rid)
    if old is None:
        return []
    if not old.expired(now):
        raise AlreadyExists(f"memory {memory_id!r} already exists in namespace {namespace!r}")
    st.store.delete(txn, old)
    return [old]


def find_duplicate(st: EngineState, txn: Txn, m: NewMemory, min_similarity: float | None) -> Record | None:
    """An existing memory of m's namespace and kind with the same normalized content or, with
    ``min_similarity``, a vector in m's space at least that similar (writer thread). (Of another
    kind it is another memory: a summary or a reflection worded as an observation is stored.)"""
    rec = st.store.find_content(txn, m.namespace, m.content, m.kind, usable=lambda r: not st.expired(r))
    if rec is not None:
        return rec
    if min_similarity is None or m.embedding.shape[0] == 0:
        return None
    best_rid, best_vk, best = _most_similar_indexed(st, m)
    found = None if best_rid < 0 or best < min_similarity else st.store.get(txn, best_rid)
    if found is not None and (found.vk != best_vk or found.kind != m.kind or st.expired(found)):
        found = None  # (its vector, model or tier changed earlier in this group: not compared)
    # Memories created earlier in this commit group (this batch or another write queued with
    # it): not in the indexes yet. Those a failed write rolled back are gone from the txn.
    group = st.group_vectors.get((m.namespace, m.embedding_model))
    for rid, vk in group.similar(m.embedding, best if found is not None else min_similarity) if group else []:
        rec = st.store.get(txn, rid)
        # (vk moves when a later write of the group changed its vector or model)
        if rec is not None and rec.vk == vk and rec.kind == m.kind and not st.expired(rec):
            return rec
    return found


def _most_similar_indexed(st: EngineState, m: NewMemory) -> tuple[int, int, float]:
    """(rid, vk, similarity) of the committed memory of m's namespace, kind and space most similar
    to m's vector, through the indexes; rid -1 when there is none."""
    best_rid, best_vk, best = -1, -1, -np.inf
    sp = st.spaces.get(m.embedding_model)
    nid, kid = st.columns.namespaces.get(m.namespace), st.columns.kinds.get(m.kind)
    if sp is None or nid < 0 or kid < 0:
        return best_rid, best_vk, best
    view = st.columns.view()
    allowed = view.alive & (view.ns == nid) & (view.kind == kid) & (view.space == sp.id)
    allowed &= view.expire > st.clock()
    for index in list(sp.indexes.values()):
        rows, sims, _ = index.search(m.embedding, 1, allowed, st.config.hnsw_ef_search)
        # A short filtered answer may miss a duplicate; that memory is then simply stored.
        if rows.shape[0] and sims[0] > best:
            row = int(rows[0])
            best_rid, best_vk, best = int(view.rid[row]), int(view.vk[row]), float(sims[0])
    return best_rid, best_vk, best


def _reinforce(rec: Record, dup: NewMemory, now: float, max_tags: int, field: str) -> None:
    """A duplicate of ``rec`` was stored again: it counts as an access and can only gain.
    INVALID_ARGUMENT (nothing changed) when the tags merged would pass ``max_tags``: cut, the
    caller's new tags would be lost without a word."""
    tags = list(dict.fromkeys([*rec.tags, *dup.tags]))
    if len(tags) > max_tags:
        raise InvalidArgument(
            field,
            f"merged into the memory this duplicates ({rec.id!r}, {len(rec.tags)} tags) would make "
            f"{len(tags)} tags, the limit is {max_tags}: update that memory's tags, or store this "
            "one apart (allow_duplicates)",
            reason="FIELD_TOO_LARGE",
        )
    rec.importance = max(rec.importance, float(dup.importance or 0.0))
    rec.access_count += 1
    rec.accessed_at = max(rec.accessed_at, now)
    rec.tags = tags
    rec.updated_at = now


# -- reflection and summary progress ---------------------------------------------------------------
@dataclass(frozen=True)
class SummaryCovers:
    """What a summary the server built covers: the records up to ``last_rid`` (whose tokens,
    ``tokens``, it takes off the count), read when the scope's summary was ``summary_rid`` and
    covered records up to ``covered_rid``. Stored only if those still hold and the last record
    read is still there (else FailedPrecondition SUMMARY_STALE: the summarizer builds it again)."""

    last_rid: int
    tokens: int
    summary_rid: int
    covered_rid: int


def track_scope(
    st: EngineState,
    txn: Txn,
    scopes: dict[str, ScopeState],
    rec: Record,
    covers: SummaryCovers | None = None,
) -> list[Record]:
    """Count a new memory toward its namespace's reflection and summary thresholds. A reflection
    resets the importance; a summary resets the tokens and replaces the previous summary, which
    is returned to be unindexed. ``covers``: a summary the server built (the tokens it did not
    cover stay counted)."""
    state = scopes.get(rec.namespace)
    if state is None:
        state = scopes[rec.namespace] = st.store.scope_state(txn, rec.namespace)
    replaced: list[Record] = []
    if rec.kind == "reflection":
        state.reflection_importance = 0.0
    elif rec.kind == "observation":
        state.reflection_importance += rec.importance
    if rec.kind == "summary":
        if covers is not None:
            _check_still_covers(st, txn, state, rec.namespace, covers)
        replaced += replace_summary(st, txn, state, rec)
        if covers is None:
            state.summary_tokens, state.covered_rid = 0, rec.rid
        else:
            state.covered_rid = covers.last_rid
            state.summary_tokens = max(0, state.summary_tokens - covers.tokens)
    else:
        state.summary_tokens += rec.token_cost
    return replaced


def replace_summary(st: EngineState, txn: Txn, state: ScopeState, rec: Record) -> list[Record]:
    """Make ``rec`` the namespace's summary in ``state``, deleting the current one (returned, to be
    unindexed)."""
    prev = st.store.get(txn, state.summary_rid) if state.summary_rid else None
    state.summary_rid = rec.rid
    if (
        prev is not None
        and prev.rid != rec.rid
        and prev.namespace == rec.namespace
        and prev.kind == "summary"
    ):
        st.store.delete(txn, prev)
        return [prev]
    return []


def _check_still_covers(
    st: EngineState, txn: Txn, state: ScopeState, namespace: str, c: SummaryCovers
) -> None:
    """A summary built from what the scope held is stale when another summary was stored since,
    or the records it read were deleted (the namespace cleared)."""
    last = st.store.get(txn, c.last_rid)
    if (
        (state.summary_rid, state.covered_rid) != (c.summary_rid, c.covered_rid)
        or last is None
        or last.namespace != namespace
    ):
        raise FailedPrecondition(f"the summary of {namespace!r} changed while one was built", "SUMMARY_STALE")


def due_of(st: EngineState, namespace: str, state: ScopeState) -> Due:
    """Whether a reflection and a summary are due, from a namespace's scope state and policy (a
    threshold of 0 turns the signal off)."""
    p = st.policy_for(namespace)
    summary = 0 < p.summary_token_threshold < state.summary_tokens  # "exceeds"
    return Due(
        # (importances are stored as float32: 0.7 + 0.7 sums to 1.3999999, which must reach 1.4)
        reflection=0 < p.reflection_threshold * (1 - 1e-6) <= state.reflection_importance,
        summary=summary and not p.auto_summarize,  # (the server keeps it: no agent should race it)
        summary_kept=summary and p.auto_summarize,
    )


def due_for(st: EngineState, txn: Txn, namespace: str) -> Due:
    return due_of(st, namespace, st.store.scope_state(txn, namespace))


def scope_progress(st: EngineState, namespace: str) -> ScopeProgress:
    """A namespace's reflection and summary accumulators, with the thresholds applied."""
    with st.store.read() as txn:
        state = st.store.scope_state(txn, namespace)
    due = due_of(st, namespace, state)
    return ScopeProgress(
        reflection_importance=state.reflection_importance,
        reflection_due=due.reflection,
        summary_tokens=state.summary_tokens,
        summary_due=due.summary or due.summary_kept,
        summary_rid=state.summary_rid,
        covered_rid=state.covered_rid,
    )
