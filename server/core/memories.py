"""Reading and changing single memories: get, update, delete, feedback, list, copy or move
(transfer), and the reflection candidates of a namespace.

Concurrency: checks and embedding run on the caller's thread; reads use short LMDB read
transactions; writes go through the writer (``prepare`` in its transaction, ``apply`` after the
commit)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from tiermem import kernels
from tiermem.server.core import upkeep
from tiermem.server.core.create import replace_summary, scope_progress, settle, track_scope
from tiermem.server.core.namespaces import CONFIRMED_KINDS, check_protected
from tiermem.server.core.pages import decode_token, encode_token
from tiermem.server.core.state import EngineState
from tiermem.server.embedding.providers import EmbedderError
from tiermem.server.model import validation as check
from tiermem.server.model.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ResponseTooLarge,
    Unavailable,
)
from tiermem.server.model.records import NewMemory, Record, enter_tier
from tiermem.server.model.reports import ScopeProgress, ScopeState
from tiermem.server.model.text import estimate_tokens
from tiermem.server.model.types import NO_VECTOR, FeedbackItem, Filter
from tiermem.server.storage.store import Txn

UPDATABLE = frozenset(
    {
        "content",
        "kind",
        "tier",
        "importance",
        "source",
        "topic",
        "tags",
        "metadata",
        "embedding",
        "embedding_model",
        "token_cost",
        "source_memory_ids",
        "expire_time",
    }
)
# Fields an update copies from the request as they are.
_COPIED = ("kind", "tier", "importance", "source", "topic", "tags", "metadata", "token_cost")


def _not_found(namespace: str, memory_id: str) -> NotFound:
    return NotFound(f"memory {memory_id!r} not found in namespace {namespace!r}")


# -- read --------------------------------------------------------------------------------------
def get(
    st: EngineState, namespace: str, memory_id: str, include_embedding: bool = False
) -> tuple[Record, np.ndarray | None]:
    check.namespace("namespace", namespace)
    check.memory_id("id", memory_id)
    with st.store.read() as txn:
        rid = st.store.lookup(txn, namespace, memory_id)
        rec = None if rid is None else st.store.get(txn, rid)
        if rec is None or st.expired(rec):
            raise _not_found(namespace, memory_id)
        vec = st.store.get_vector(txn, rid) if include_embedding and rid is not None else None
    return rec, vec


def vectors_of(st: EngineState, records: list[Record]) -> list[np.ndarray | None]:
    with st.store.read() as txn:
        return [st.store.get_vector(txn, r.rid) for r in records]


def embedding_pending(st: EngineState, records: list[Record]) -> list[bool]:
    """Per record, whether it is stored without its vector for now (waiting for the embedder): its
    row has no embedding space. From the columns, which a create's apply has updated (no LMDB)."""
    space, rows = st.columns.column("space"), st.columns.rows
    return [(row := rows.get(r.rid)) is None or int(space[row]) < 0 for r in records]


def list_memories(
    st: EngineState,
    namespace: str,
    page_size: int,
    page_token: str,
    flt: Filter,
    newest_first: bool = False,
    with_vectors: bool = False,
    max_bytes: int = 0,
) -> tuple[list[Record], str]:
    """A page of a namespace in storage order, or newest first by creation time (an agent's timeline:
    memories stored late with an earlier ``create_time`` take their place in it; ties by arrival).
    ``max_bytes`` (0: no limit): the page ends early, with a token, where its memories
    (``with_vectors``: and their vectors) would take more, so that every page can be sent."""
    check.namespace("namespace", namespace)
    size = check.page_size("page_size", page_size, st.config)
    view = st.columns.view()
    mask, _ = st.allowed_rows(view, [namespace], flt, st.clock())
    rows = np.flatnonzero(mask)
    rids = view.rid[rows]  # rows are in arrival (rid) order
    secret = st.page_secret if page_token else b""  # (read once, when a token needs it: from LMDB)
    if newest_first:
        created = view.created[rows]
        order = np.lexsort((rids, created))[::-1]
        rids, created = rids[order], created[order]
        if page_token:
            at, after = _timeline_position(secret, namespace, page_token)
            keep = (created < at) | ((created == at) & (rids < after))
            rids, created = rids[keep], created[keep]
    elif page_token:
        rids = rids[rids > decode_token("page_token", page_token, int, secret, f"memories:{namespace}")]
    out: list[Record] = []
    pos, room = 0, max_bytes
    with st.store.read() as txn:
        while len(out) < size and pos < rids.shape[0]:
            rec = st.store.get(txn, int(rids[pos]))
            if rec is not None and rec.namespace == namespace:
                if max_bytes:  # (a vector by its own space's width: not another tenant's widest)
                    room -= rec.answer_bytes() + (_vector_bytes(st, rec) if with_vectors else 0)
                    if out and room < 0:
                        break
                out.append(rec)
            pos += 1
    token = ""
    if out and pos < rids.shape[0]:  # (newest first: continue after the last row looked at)
        value = [float(created[pos - 1]), int(rids[pos - 1])] if newest_first else out[-1].rid
        listing = f"{'timeline' if newest_first else 'memories'}:{namespace}"
        token = encode_token(value, secret or st.page_secret, listing)
    return out, token


def _vector_bytes(st: EngineState, rec: Record) -> int:
    """What a memory's vector adds to an answer, at most (0: it has none)."""
    sp = st.spaces.get(rec.embedding_model) if rec.embedding_model else None
    return 4 * sp.dim + 16 if sp is not None else 0


def _timeline_position(secret: bytes, namespace: str, token: str) -> tuple[float, int]:
    """(creation time, rid) of the last row a newest-first page looked at."""
    value = decode_token("page_token", token, list, secret, f"timeline:{namespace}")
    if len(value) != 2 or not isinstance(value[0], float) or type(value[1]) is not int:
        raise InvalidArgument("page_token", "is not a token this server issued")
    return value[0], value[1]


def reflection_candidates(st: EngineState, namespace: str, limit: int) -> tuple[list[Record], ScopeProgress]:
    """The most recent observations (default 100, at most 1000) and the scope's accumulators."""
    if limit < 0:
        raise InvalidArgument("limit", "must not be negative")
    flt = st.check_filter(Filter(kinds=["observation"]))
    recs, _ = list_memories(st, namespace, min(limit or 100, 1000), "", flt, newest_first=True)
    return recs, scope_progress(st, namespace)


# -- update ------------------------------------------------------------------------------------
def update(
    st: EngineState,
    namespace: str,
    memory_id: str,
    changes: NewMemory,
    mask: list[str],
    confirm: bool = False,
) -> Record:
    """Apply the fields named in ``mask`` from ``changes`` (a NewMemory holding new values)."""
    check.namespace("memory.namespace", namespace)
    check.memory_id("memory.id", memory_id)
    check_protected(st, namespace, confirm, "changing a memory")
    if not mask:
        raise InvalidArgument("update_mask", "must name at least one field")
    for path in mask:
        if path not in UPDATABLE:
            raise InvalidArgument(
                "update_mask",
                f"field {path!r} cannot be updated; updatable: {', '.join(sorted(UPDATABLE))}",
            )
    fields_ = set(mask)
    _check_fields(st, changes, fields_)
    _check_more_fields(st, changes, fields_)
    op = _UpdateOp(st, namespace, memory_id, changes, fields_, confirm)
    result: Record = st.writer.submit(op.prepare, op.apply)
    return result


def _check_fields(st: EngineState, c: NewMemory, fields_: set[str]) -> None:
    if "content" in fields_:
        if check.blank(c.content):
            raise InvalidArgument(
                "memory.content", "is required (white space or invisible characters alone are no content)"
            )
        check.text("memory.content", c.content, st.config.max_content_bytes)
    if "kind" in fields_:
        c.kind = check.kind("memory.kind", c.kind) if c.kind else st.config.default_kind
    if "tier" in fields_:
        check.tier("memory.tier", c.tier)
    if "importance" in fields_:
        if c.importance is None:
            raise InvalidArgument("memory.importance", "must be set when named in update_mask")
        check.unit_interval("memory.importance", c.importance)
    if "source" in fields_:
        check.text("memory.source", c.source)
    if "topic" in fields_:
        check.text("memory.topic", c.topic)
    if "tags" in fields_:
        c.tags = check.tags("memory.tags", c.tags, st.config)


def _check_more_fields(st: EngineState, c: NewMemory, fields_: set[str]) -> None:
    if "metadata" in fields_:
        check.metadata("memory.metadata", c.metadata, st.config)
    if "token_cost" in fields_ and c.token_cost < 0:
        raise InvalidArgument("memory.token_cost", "must be >= 0")
    if "source_memory_ids" in fields_:
        check.memory_ids("memory.source_memory_ids", c.source_ids)
    if "expire_time" in fields_ and c.expire_at is not None:
        check.finite_time("memory.expire_time", c.expire_at)


class _UpdateOp:
    """One update's write. The new vector is the request's embedding or, when the content
    changes and the memory is in the server embedder's space, the new content's embedding."""

    def __init__(
        self, st: EngineState, namespace: str, memory_id: str, c: NewMemory, fields_: set[str], confirm: bool
    ) -> None:
        self.st, self.namespace, self.memory_id, self.c = st, namespace, memory_id, c
        self.fields, self.confirm = fields_, confirm
        self.new_vec: np.ndarray | None = None
        self.replaced: list[Record] = []  # (the summary an update into one replaced)
        if "embedding" in fields_ or "embedding_model" in fields_:
            if "embedding" not in fields_ or c.embedding is None:
                raise InvalidArgument("memory.embedding", "must be set (with embedding_model) to change it")
            self.new_vec = check.vector("memory.embedding", c.embedding, st.config)
            check.model("memory.embedding_model", c.embedding_model)
        self.content_vec = None
        self.embed_error: EmbedderError | None = None  # (raised only for a memory of its space)
        if "content" in fields_ and self.new_vec is None:
            try:
                self.content_vec = st.embedder.embed(c.content)
            except EmbedderError as e:
                self.embed_error = e
        self.now = st.clock()

    def prepare(self, txn: Txn) -> tuple[Record, Record, np.ndarray | None]:
        st, c, fields_, now = self.st, self.c, self.fields, self.now
        self.replaced = []  # (a retried write prepares again)
        check_protected(st, self.namespace, self.confirm, "changing a memory", txn)
        rid = st.store.lookup(txn, self.namespace, self.memory_id)
        old = None if rid is None else st.store.get(txn, rid)
        if old is None or old.expired(now):
            raise _not_found(self.namespace, self.memory_id)
        rec = Record.unpack(old.pack())
        vec = self.new_vec
        if "content" in fields_:
            rec.content = c.content
            if vec is None and old.embedding_model == st.embedder.model:
                if self.embed_error is not None:
                    raise Unavailable(
                        f"the embedder failed, retry later: {self.embed_error}", reason="EMBEDDER_UNAVAILABLE"
                    )
                vec = self.content_vec  # built-in vectors follow their content
            if "token_cost" not in fields_:
                rec.token_cost = estimate_tokens(c.content)
        for name in _COPIED:
            if name in fields_:
                setattr(rec, name, getattr(c, name))
        if "source_memory_ids" in fields_:
            rec.source_ids = list(c.source_ids)
        if "expire_time" in fields_:
            rec.expire_at = c.expire_at
        # (checked only when either changes: an older reflection below the minimum keeps its other updates)
        if "importance" in fields_ or "kind" in fields_:
            which = "memory.importance" if "importance" in fields_ else "memory.kind"
            check.reflection_importance(which, rec.kind, rec.importance)
        if vec is not None:
            self._store_vector(txn, rec, vec)
        if rec.kind != old.kind and rec.kind in ("summary", "reflection"):
            self._as_if_stored(txn, rec)
        self._finish(txn, old, rec, vec is not None)
        return old, rec, vec

    def _as_if_stored(self, txn: Txn, rec: Record) -> None:
        """A memory updated into a reflection resets the importance accumulated toward the next;
        into a summary, it replaces the namespace's current one and covers what is stored now (its
        own tokens were counted when it was created)."""
        st = self.st
        state = st.store.scope_state(txn, rec.namespace)
        if rec.kind == "reflection":
            state.reflection_importance = 0.0
        else:
            self.replaced = replace_summary(st, txn, state, rec)
            state.summary_tokens, state.covered_rid = 0, st.next_rid - 1
        st.store.put_scope_state(txn, rec.namespace, state)

    def _store_vector(self, txn: Txn, rec: Record, vec: np.ndarray) -> None:
        st = self.st
        model = self.c.embedding_model if self.new_vec is not None else rec.embedding_model
        st.claim_space(txn, "memory.embedding", model, int(vec.shape[0]), st.store.space(txn, model))
        rec.embedding_model = model
        st.store.put_vector(txn, rec.rid, vec)
        st.store.mark_pending(txn, rec.rid, False)

    def _finish(self, txn: Txn, old: Record, rec: Record, new_vector: bool) -> None:
        """New tier and vector key when they moved, then store the record (its postings too when
        the content changed)."""
        st, now = self.st, self.now
        if rec.tier != old.tier:
            enter_tier(rec, rec.tier, now)
        if new_vector or rec.tier != old.tier:
            _, rec.vk = st.alloc_ids()
        rec.updated_at = now
        st.store.replace(txn, old, rec)

    def apply(self, prepared: tuple[Record, Record, np.ndarray | None]) -> Record:
        old, rec, vec = prepared
        upkeep.unindex(self.st, self.replaced)
        upkeep.reindex(self.st, old.vk, rec, vec)
        if rec.content != old.content:
            upkeep.post_content(self.st, self.st.columns.rows[rec.rid], rec)
        return rec


# -- delete ------------------------------------------------------------------------------------
def delete(st: EngineState, namespace: str, memory_id: str, confirm: bool = False) -> None:
    check.namespace("namespace", namespace)
    check.memory_id("id", memory_id)
    check_protected(st, namespace, confirm, "deleting a memory")

    def prepare(txn: Txn) -> list[Record]:
        check_protected(st, namespace, confirm, "deleting a memory", txn)
        rid = st.store.lookup(txn, namespace, memory_id)
        rec = None if rid is None else st.store.get(txn, rid)
        if rec is None or st.expired(rec):  # (gone for every read already: the sweep removes it)
            raise _not_found(namespace, memory_id)
        st.store.delete(txn, rec)
        return [rec]

    st.writer.submit(prepare, lambda recs: upkeep.unindex(st, recs))


# -- feedback ----------------------------------------------------------------------------------
def feedback(
    st: EngineState, namespace: str, items: list[FeedbackItem], as_of: float | None = None
) -> list[Record]:
    """Rate memories' usefulness: their surprise follows the rating's error (an EMA), and each
    item counts as an access (and a success when it says so)."""
    check.namespace("namespace", namespace)
    check.batch("items", items, st.config.max_batch_size)
    for i, it in enumerate(items):
        check.memory_id(f"items[{i}].id", it.id)
        if it.predicted_relevance is not None:
            check.unit_interval(f"items[{i}].predicted_relevance", it.predicted_relevance)
        if it.actual_usefulness is not None:
            check.unit_interval(f"items[{i}].actual_usefulness", it.actual_usefulness)
    # (never later than now, as a search's accesses: an access in the future would count as evidence
    # since every later tier entry, promoting the memory pass after pass)
    when = st.clock()
    if as_of is not None:
        when = min(check.finite_time("as_of", as_of), when)
    distinct = list(dict.fromkeys(it.id for it in items))
    position = {mid: j for j, mid in enumerate(distinct)}
    # An item rates the memory when it gives a prediction or a usefulness; the other takes its default.
    rated = [it for it in items if it.actual_usefulness is not None or it.predicted_relevance is not None]
    index = np.array([position[it.id] for it in rated], np.int64)
    default_pred, default_actual = st.config.default_predicted_relevance, st.config.default_actual_usefulness
    predicted = np.array(
        [default_pred if it.predicted_relevance is None else it.predicted_relevance for it in rated],
        np.float32,
    )
    actual = np.array(
        [default_actual if it.actual_usefulness is None else it.actual_usefulness for it in rated], np.float32
    )

    def prepare(txn: Txn) -> list[Record]:
        recs: list[Record] = []
        for mid in distinct:
            rid = st.store.lookup(txn, namespace, mid)
            rec = None if rid is None else st.store.get(txn, rid)
            if rec is None or st.expired(rec):
                i = next(i for i, it in enumerate(items) if it.id == mid)
                raise NotFound(f"items[{i}].id: memory {mid!r} not found in namespace {namespace!r}")
            recs.append(rec)
        _check_answer_fits(st, [recs[position[it.id]] for it in items])
        state = np.array([r.surprise for r in recs], np.float32)
        kernels.surprise_ema(state, index, predicted, actual, st.config.surprise_alpha)
        for it in items:
            rec = recs[position[it.id]]
            rec.access_count += 1
            rec.success_count += int(it.success)
            rec.accessed_at = max(rec.accessed_at, when)
        for rec, s in zip(recs, state.tolist(), strict=True):
            rec.surprise = float(s)
            st.store.put(txn, rec)
        return recs

    def apply(recs: list[Record]) -> list[Record]:
        upkeep.refresh_rows(st, recs)
        return [recs[position[it.id]] for it in items]

    result: list[Record] = st.writer.submit(prepare, apply)
    return result


def _check_answer_fits(st: EngineState, answer: list[Record]) -> None:
    """RESOURCE_EXHAUSTED, before anything changes, when the records could not be sent in one
    message."""
    sizes = {r.rid: r.answer_bytes() for r in answer}  # (an id given twice is answered twice)
    total = sum(sizes[r.rid] for r in answer)
    if total > st.config.max_message_bytes:
        raise ResponseTooLarge(
            f"the answer would take about {total} bytes, over the {st.config.max_message_bytes} a message"
            " may hold: send fewer items"
        )


# -- transfer ----------------------------------------------------------------------------------
@dataclass
class Transfer:
    """Where a memory is copied or moved to, and how."""

    target_namespace: str = ""  # "": the source's
    target_tier: int = 0  # 0: the source's
    move: bool = False  # delete the source in the same commit
    target_id: str = ""  # "": the source's id in another namespace, a new id in the same one
    overwrite: bool = False  # replace a memory holding the target id
    confirm: bool = False  # confirm moving out of / overwriting in a protected namespace


def transfer(st: EngineState, namespace: str, memory_id: str, how: Transfer) -> Record:
    """Copy or move a memory to another tier and/or namespace (task -> project -> global),
    recording its origin. A move deletes the source in the same commit."""
    check.namespace("namespace", namespace)
    check.memory_id("id", memory_id)
    dest_ns = check.namespace("target_namespace", how.target_namespace) if how.target_namespace else namespace
    if how.target_tier:
        check.tier("target_tier", how.target_tier)
    if how.target_id:
        check.memory_id("target_id", how.target_id)
    if how.move:
        check_protected(st, namespace, how.confirm, "moving a memory out")
    same_place = dest_ns == namespace and (not how.target_id or how.target_id == memory_id)
    if same_place and how.target_id:
        raise InvalidArgument("target_id", "names the source memory itself")
    if how.move and same_place:
        raise InvalidArgument(
            "target_namespace",
            "a move needs another namespace or target_id; use UpdateMemory to change only the tier",
        )
    now = st.clock()

    def prepare(txn: Txn) -> tuple[list[Record], Record, np.ndarray]:
        if how.move:
            check_protected(st, namespace, how.confirm, "moving a memory out", txn)
        rid = st.store.lookup(txn, namespace, memory_id)
        src = None if rid is None else st.store.get(txn, rid)
        if src is None or src.expired(now):
            raise _not_found(namespace, memory_id)
        dest_id = how.target_id or (memory_id if dest_ns != namespace or how.move else uuid.uuid4().hex)
        if src.kind in CONFIRMED_KINDS:  # (stored there as a create would be, its own namespace too)
            check_protected(st, dest_ns, how.confirm, f"storing a {src.kind}", txn)
        freed = _free_target(st, txn, dest_ns, dest_id, how, now)
        new, vec = _copy(st, txn, src, dest_ns, dest_id, how.target_tier or src.tier, now)
        if how.move:
            st.store.delete(txn, src)
            freed.append(src)
        if how.move and dest_ns == namespace:  # (renamed: counted already; the summary follows it)
            state = st.store.scope_state(txn, namespace)
            if state.summary_rid == src.rid:
                state.summary_rid = new.rid
                st.store.put_scope_state(txn, namespace, state)
        else:
            # It counts toward the target's reflection and summary as a create there would; a
            # summary replaces the target's current one.
            scopes: dict[str, ScopeState] = {}
            freed += track_scope(st, txn, scopes, new)
            st.store.put_scope_state(txn, dest_ns, scopes[dest_ns])
        return freed, new, vec

    def apply(prepared: tuple[list[Record], Record, np.ndarray]) -> Record:
        freed, new, vec = prepared
        upkeep.unindex(st, freed)
        upkeep.index_new(st, [(new, vec)])
        return new

    return _settled(st, st.writer.submit(prepare, apply))


def _settled(st: EngineState, rec: Record) -> Record:
    """A memory transferred as a create into its namespace: that working memory's flush and caps,
    the summary it made due; the memory as it is after them."""
    if settle(st, [rec.namespace], frozenset([rec.rid])):
        with st.store.read() as txn:
            rec = st.store.get(txn, rec.rid) or rec
    if st.policy_for(rec.namespace).auto_summarize:  # (the summarizer checks it is due)
        st.request_summary(rec.namespace)
    return rec


def _free_target(
    st: EngineState, txn: Txn, dest_ns: str, dest_id: str, how: Transfer, now: float
) -> list[Record]:
    """ALREADY_EXISTS when the target id is taken (unless overwriting, or it expired); the memory
    there is deleted and returned."""
    old_rid = st.store.lookup(txn, dest_ns, dest_id)
    existing = None if old_rid is None else st.store.get(txn, old_rid)
    if existing is None:
        return []
    if not how.overwrite and not existing.expired(now):
        raise AlreadyExists(f"memory {dest_id!r} already exists in namespace {dest_ns!r}")
    check_protected(st, dest_ns, how.confirm, "overwriting a memory", txn)
    st.store.delete(txn, existing)
    return [existing]


def _copy(
    st: EngineState, txn: Txn, src: Record, dest_ns: str, dest_id: str, tier: int, now: float
) -> tuple[Record, np.ndarray]:
    """Store a copy of ``src`` as ``dest_ns``/``dest_id`` in ``tier``, with its vector."""
    vec = st.store.get_vector(txn, src.rid)
    new = Record.unpack(src.pack())
    new.rid, new.vk = st.alloc_ids()
    new.namespace, new.id = dest_ns, dest_id
    new.updated_at = now
    new.origin = [src.namespace, src.id, src.tier, now]
    enter_tier(new, tier, now)
    st.store.insert(txn, new)
    if vec is None:  # the source still waits for its embedding; so does the copy
        st.store.mark_pending(txn, new.rid, True)
        return new, NO_VECTOR
    st.store.put_vector(txn, new.rid, vec, new=True)
    return new, vec
