"""Filter masks over the columns: which rows a request may see (its namespaces and filter, an
embedding space, alive and unexpired), computed by a kernel over whole column arrays; and the
check of a request's filter before it is used. Lock-free readers of a ``ColumnsView``."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import numpy as np

from tiermem import kernels
from tiermem.server.config import TIERS
from tiermem.server.index.columns import Columns, ColumnsView
from tiermem.server.index.filters import MAX_LIST_VALUES, compile_where
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.types import Filter


def allowed_rows(
    cols: Columns, view: ColumnsView, namespaces: list[str], flt: Filter, now: float, space: int = -1
) -> tuple[np.ndarray, int]:
    """Rows allowed by namespaces and filter (and in embedding space ``space`` when >= 0),
    alive and unexpired at ``now``: (bool mask over the view's rows, count)."""
    ns_ok = np.zeros(len(cols.namespaces), np.bool_)
    for name in namespaces:
        i = cols.namespaces.get(name)
        if i >= 0:
            ns_ok[i] = True
    if not ns_ok.any():  # none of them holds a memory yet: no pass over the rows
        return np.zeros(view.n, np.bool_), 0
    tier_ok = np.zeros(5, np.bool_)
    for t in flt.tiers or TIERS:
        tier_ok[t] = True
    kind_ok = np.zeros(0, np.bool_)
    if flt.kinds:
        kind_ok = np.zeros(max(1, len(cols.kinds)), np.bool_)
        ids = [cols.kinds.get(k) for k in flt.kinds]
        kind_ok[[i for i in ids if i >= 0]] = True
        if not kind_ok.any():
            return np.zeros(view.n, np.bool_), 0
    lo = -np.inf if flt.created_after is None else flt.created_after
    hi = np.inf if flt.created_before is None else flt.created_before
    mask, count = kernels.filter_mask(
        alive=view.alive,
        ns_id=view.ns,
        ns_ok=ns_ok,
        tier=view.tier,
        tier_ok=tier_ok,
        kind_id=view.kind,
        kind_ok=kind_ok,
        created_at=view.created,
        created_lo=lo,
        created_hi=hi,
        expire_at=view.expire if cols.earliest_expire <= now else None,
        now=now,
        space_id=view.space,
        space=space,
    )
    if _narrow(cols, view, flt, mask):
        return mask, int(mask.sum())
    return mask, count


class MaskCache:
    """The last few masks of ``allowed_rows``, reused while no row changed: searches of a namespace
    that is not being written to skip the pass over every row (at a million rows it costs about as
    much as the HNSW search). Masks handed out are shared: callers must not change them. Only
    requests whose mask depends on nothing but the columns are kept: no metadata, tag, source or
    topic condition (their own lookups change apart from rows), and no row expiring by ``now``."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._lock = threading.Lock()
        # key -> (the columns, weakly: a replaced one must not be kept alive; epoch; rows; mask; count;
        # the mask's bits once packed): a mask's bits go with it
        self._masks: OrderedDict[
            tuple, tuple[weakref.ref[Columns], int, int, np.ndarray, int, np.ndarray | None]
        ] = OrderedDict()

    def allowed_rows(
        self,
        cols: Columns,
        view: ColumnsView,
        namespaces: list[str],
        flt: Filter,
        now: float,
        space: int = -1,
        within: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """``allowed_rows``, shared with earlier callers of the same request while nothing changed.
        ``within``: the same request's mask without a space, if the caller has it (a new mask is then
        that one's rows in ``space``: one pass over two arrays)."""

        def computed() -> tuple[np.ndarray, int]:
            if within is not None and space >= 0:
                return kernels.mask_equal(within, view.space, space)
            return allowed_rows(cols, view, namespaces, flt, now, space)

        if not _cacheable(cols, flt, now):
            return computed()
        key = (
            tuple(sorted(set(namespaces))),
            tuple(flt.tiers),
            tuple(flt.kinds),
            flt.created_after,
            flt.created_before,
            space,
        )
        epoch = cols.epoch  # (read first: a change made while the mask is computed moves it after)
        with self._lock:
            hit = self._masks.get(key)
            # The same epoch: no row changed and none was published since, so the same rows; a view
            # taken before the last publication has fewer rows and computes its own.
            if hit is not None and hit[0]() is cols and hit[1] == epoch and hit[2] == view.n:
                self._masks.move_to_end(key)
                return hit[3], hit[4]
        mask, count = computed()
        if cols.epoch != epoch or not cols.is_live(view):  # a change while it was computed
            return mask, count
        with self._lock:
            if within is not None and space >= 0:
                # Narrowed from the caller's mask: current only if that is this epoch's shared mask.
                base = self._masks.get((*key[:-1], -1))
                if base is None or base[3] is not within or base[1] != epoch:
                    return mask, count
            self._masks[key] = (weakref.ref(cols), epoch, view.n, mask, count, None)
            self._masks.move_to_end(key)
            while len(self._masks) > self.size:
                self._masks.popitem(last=False)
        return mask, count

    def bits(self, mask: np.ndarray) -> np.ndarray | None:
        """A mask this cache holds, packed 8 rows a byte (little-endian bits), computed once; None for
        any other array. The keyword pass reads them: a row's bit stays in cache where its bool
        would not, beside a search's other work."""
        with self._lock:
            key = next((k for k, entry in self._masks.items() if entry[3] is mask), None)
            if key is None:
                return None
            packed = self._masks[key][5]
        if packed is None:
            packed = np.packbits(mask, bitorder="little")
            with self._lock:
                entry = self._masks.get(key)
                if entry is not None and entry[3] is mask:  # (still held: keep them with it)
                    self._masks[key] = (*entry[:5], packed)
        return packed


def _cacheable(cols: Columns, flt: Filter, now: float) -> bool:
    return (
        cols.earliest_expire > now
        and not (flt.source or flt.topic or flt.tags_any or flt.tags_all)
        and flt.compiled is None
        and not flt.where
    )


def _narrow(cols: Columns, view: ColumnsView, flt: Filter, mask: np.ndarray) -> bool:
    """Apply the filter's conditions the kernel does not (in place); whether any applied."""
    extra = False
    if flt.source:
        mask &= view.source == cols.sources.get(flt.source)
        extra = True
    if flt.topic:
        mask &= view.topic == cols.topics.get(flt.topic)
        extra = True
    if flt.tags_any:
        mask &= cols.tag_mask(flt.tags_any, view.n, require_all=False)
        extra = True
    if flt.tags_all:
        mask &= cols.tag_mask(flt.tags_all, view.n, require_all=True)
        extra = True
    if flt.compiled is not None:
        mask &= flt.compiled(view, cols)
        extra = True
    return extra


def check_filter(flt: Filter, max_where_bytes: int, prefix: str = "filter.") -> Filter:
    """Validate a request's filter and compile its ``where`` (once); returns it."""
    for name in ("tiers", "kinds", "tags_any", "tags_all"):
        if len(getattr(flt, name)) > MAX_LIST_VALUES:
            raise InvalidArgument(
                f"{prefix}{name}", f"lists more than {MAX_LIST_VALUES} values", reason="FIELD_TOO_LARGE"
            )
    for i, t in enumerate(flt.tiers):
        check.tier(f"{prefix}tiers[{i}]", t)
    for i, k in enumerate(flt.kinds):
        check.kind(f"{prefix}kinds[{i}]", k)
    for name in ("tags_any", "tags_all"):  # (as a create checks them: one it refuses matches nothing)
        for i, t in enumerate(getattr(flt, name)):
            if not t:
                raise InvalidArgument(f"{prefix}{name}[{i}]", "must not be empty")
            check.label(f"{prefix}{name}[{i}]", t, check.MAX_TAG)
    check.text(f"{prefix}source", flt.source)
    check.text(f"{prefix}topic", flt.topic)
    if flt.where and flt.compiled is None:
        check.text(f"{prefix}where", flt.where, max_where_bytes)
        flt.compiled = compile_where(flt.where)
    return flt
