"""Private Numba kernels. Callers go through the checked wrappers in ``tiermem.kernels``.

Every kernel is serial and ``nogil=True``: gRPC handlers are threads, and serial nogil kernels let
two of them score at once (a ``prange`` kernel called from two threads aborts under the workqueue
threading layer). Inputs are contiguous arrays of the dtypes the wrappers enforce.
No ``fastmath``: inputs may hold NaN or Inf and the kernels must treat them deterministically.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

_kernel = njit(nogil=True, cache=True, error_model="numpy")

HOURS = 3600.0


@_kernel
def _decayed(importance, age_seconds, half_life_hours, floor):
    if half_life_hours <= 0.0 or math.isinf(half_life_hours):
        return importance
    age_h = age_seconds / HOURS
    if age_h < 0.0:
        age_h = 0.0
    d = importance * 0.5 ** (age_h / half_life_hours)
    lo = importance * floor
    return d if d > lo else lo


def _floor_at(floor, k):
    """The decay floor of namespace ``k``: ``floor`` itself when one value, else ``floor[k]``."""
    return floor[k] if np.ndim(floor) else floor


@overload(_floor_at, jit_options={"nogil": True})
def _floor_at_jit(floor, k):
    if isinstance(floor, types.Array):
        return lambda floor, k: floor[k]
    return lambda floor, k: floor


@_kernel
def _recency(last_access, now, tau_seconds):
    dt = now - last_access
    if dt < 0.0:
        dt = 0.0
    return math.exp(-dt / tau_seconds)


@_kernel
def decay_importance(importance, created_at, tier, now, half_life_hours, floor, out):
    for i in range(importance.shape[0]):
        out[i] = _decayed(importance[i], now - created_at[i], half_life_hours[tier[i]], floor)


@_kernel
def recency(last_access, now, tau_seconds, out):
    for i in range(last_access.shape[0]):
        out[i] = _recency(last_access[i], now, tau_seconds)


@_kernel
def combined(relevance, rec, imp, alpha, beta, gamma, out):
    for i in range(relevance.shape[0]):
        out[i] = alpha * relevance[i] + beta * rec[i] + gamma * imp[i]


@_kernel
def score_rows(
    rows,
    relevance,
    importance,
    created_at,
    last_access,
    tier,
    ns,
    now,
    tau_seconds,
    half_life_hours,
    floor,
    alpha,
    beta,
    gamma,
    score,
    rec,
    imp,
):
    """Fused gather + decay + recency + combined score over the rows ``rows`` of the columns.

    ``half_life_hours`` is a (namespaces, 5) table and ``floor`` one value or a (namespaces,) table;
    with one table row they apply to every row and ``ns`` is not read. Range checks happen here, in the one pass,
    not as extra passes in the wrapper.
    """
    n = importance.shape[0]
    per_ns = half_life_hours.shape[0] > 1
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0 or r >= n:
            raise ValueError("rows out of range")
        t = tier[r]
        if t < 0 or t > 4:
            raise ValueError("tier values must be in 0..4")
        k = 0
        if per_ns:
            k = ns[r]
            if k < 0 or k >= half_life_hours.shape[0]:
                raise ValueError("namespace ids out of range of half_life_hours")
        d = _decayed(importance[r], now - created_at[r], half_life_hours[k, t], _floor_at(floor, k))
        c = _recency(last_access[r], now, tau_seconds)
        imp[i] = d
        rec[i] = c
        score[i] = alpha * relevance[i] + beta * c + gamma * d


@_kernel
def prior_bounds(
    todo, gen, gen0, rec_ub, imp_ub, importance, beta, gamma, base, row_w, use_w, bar, out_rows, out_bound
):
    """Rows r with todo[r] whose score could exceed ``bar``: bound = w(r) * (base + prior bound).

    The prior bound is beta*rec_ub[r] + gamma*imp_ub[r] for rows whose generation still equals the
    one the bounds were computed at (gen0, rows below gen0's length); any other row gets the trivial
    bound beta + gamma*importance (recency <= 1, decayed importance <= importance). A small slack
    covers float32 rounding of the cached bounds. Returns the count written to out_rows/out_bound.
    """
    n = todo.shape[0]
    n0 = gen0.shape[0]
    # Simple loops that LLVM vectorizes, then one compaction pass: faster than one loop doing both.
    bound = np.empty(n, np.float32)
    fbase, fbeta, fgamma = np.float32(base), np.float32(beta), np.float32(gamma)
    trivial = fbase + fbeta
    for r in range(n0):
        cached = fbase + fbeta * rec_ub[r] + fgamma * imp_ub[r]
        fallback = trivial + fgamma * importance[r]
        bound[r] = cached if gen[r] == gen0[r] else fallback
    for r in range(n0, n):
        bound[r] = trivial + fgamma * importance[r]
    if use_w:
        for r in range(n):
            bound[r] *= row_w[r]
    # Branch-free compaction: every row is written at c, which advances only for rows kept (a
    # branch per row mispredicts when many pass; this costs the same however many are kept).
    # c <= r, so the writes stay in bounds.
    c = 0
    slack = np.float32(1e-5)
    for r in range(n):
        b = bound[r] + slack
        out_rows[c] = r
        out_bound[c] = b
        c += todo[r] & (b > bar)
    return c


@_kernel
def ordered_bounds(
    todo,
    n0,
    order,
    prior,
    importance,
    log,
    log_from,
    log_to,
    beta,
    gamma,
    base,
    bar,
    out_rows,
    out_bound,
):
    """``prior_bounds`` without a pass over every row, from rows kept sorted by cached prior bound.

    Bounds, clearing ``todo`` for each: the rows logged at positions log_from..log_to-1 of the
    ring ``log`` (changed since the bounds were cached) and rows from ``n0`` on (newer than the
    bounds), both with the trivial bound; then ``order`` (rows whose cached prior bound is
    ``prior``, best first) while base + prior beats ``bar``: rows below n0 still in ``todo``. A row
    of ``order`` is taken as unchanged since the bounds unless logged in the window (it was cleared
    then); no generation is read: one random read per row fewer (a generation check per walked row
    cost ~20 ns, 10x the rest of the walk). Returns the count written to out_rows/out_bound.
    """
    n = todo.shape[0]
    new_from = min(n0, n)
    cap = log.shape[0]
    fbase, fbeta, fgamma = np.float32(base), np.float32(beta), np.float32(gamma)
    trivial = fbase + fbeta
    slack = np.float32(1e-5)
    c = 0
    for j in range(log_from, log_to + max(0, n - new_from)):
        # the logged rows, then the newer ones
        r = log[j % cap] if j < log_to else new_from + (j - log_to)
        if 0 <= r < n and todo[r]:
            todo[r] = False
            b = trivial + fgamma * importance[r] + slack
            if b > bar:
                out_rows[c] = r
                out_bound[c] = b
                c += 1
    for i in range(order.shape[0]):
        b = fbase + prior[i] + slack
        if not b > bar:
            break
        r = order[i]
        if r < new_from and todo[r]:
            todo[r] = False
            out_rows[c] = r
            out_bound[c] = b
            c += 1
    return c


@_kernel
def row_weights(ns, tier, by_ns, by_tier, out):
    """out[r] = by_ns[ns[r]] * by_tier[tier[r]]; 0 where an id is out of its table's range."""
    m, t = by_ns.shape[0], by_tier.shape[0]
    for r in range(ns.shape[0]):
        i, j = ns[r], tier[r]
        out[r] = by_ns[i] * by_tier[j] if 0 <= i < m and 0 <= j < t else np.float32(0.0)


@_kernel
def mask_equal(mask, column, value, out):
    """out[i] = mask[i] and column[i] == value; returns how many are set. One pass, vectorized."""
    count = 0
    for i in range(mask.shape[0]):
        keep = mask[i] & (column[i] == value)
        out[i] = keep
        count += keep
    return count


@_kernel
def tier_counts(mask, tier, out):
    """out[t] = rows with mask set and tier t, t in 0..4 (other tier values are not counted). Five
    running sums in one loop, which LLVM vectorizes (a scatter ``out[tier[i]] += 1`` does not)."""
    c0 = c1 = c2 = c3 = c4 = 0
    for i in range(mask.shape[0]):
        m = np.int64(mask[i])
        t = tier[i]
        c0 += m & (t == 0)
        c1 += m & (t == 1)
        c2 += m & (t == 2)
        c3 += m & (t == 3)
        c4 += m & (t == 4)
    out[0] = c0
    out[1] = c1
    out[2] = c2
    out[3] = c3
    out[4] = c4


@_kernel
def selection_bitmap(slots, allowed, bitmap):
    """bit i of ``bitmap`` = entry i is live (slots[i] >= 0) and its row is allowed; returns the count."""
    m = allowed.shape[0]
    c = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0 and s < m and allowed[s]:
            bitmap[i >> 3] |= np.uint8(1 << (i & 7))
            c += 1
    return c


@_kernel
def allowed_entries(slots, allowed, ids, rows):
    """The live entries (slots[i] >= 0) whose row is allowed: positions into ``ids``, the rows read
    (each slot once) into ``rows``; returns the count."""
    m = allowed.shape[0]
    c = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0 and s < m and allowed[s]:
            ids[c] = i
            rows[c] = s
            c += 1
    return c


def _prefetch_row(xb, row):
    """Ask the CPU to fetch every 64-byte line of row ``row`` of the C-contiguous 2-D array ``xb``
    into cache: a hint with no effect on results (compiled: llvm.prefetch; plain Python: nothing).
    The caller keeps ``row`` in range."""


@intrinsic
def _prefetch_row_llvm(typingctx, xb, row):
    sig = types.void(xb, row)

    def codegen(context, builder, signature, args):
        arrty = signature.args[0]
        ary = context.make_array(arrty)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        start = cgutils.get_item_pointer(context, builder, arrty, ary, [args[1], zero], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", [i8p], fnty)
        base = builder.bitcast(start, i8p)
        itemsize = context.get_constant(types.intp, arrty.dtype.bitwidth // 8)
        nbytes = builder.mul(builder.extract_value(ary.shape, 1), itemsize)
        line = context.get_constant(types.intp, 64)
        # One more line than the row's length covers a row that does not start on a line boundary
        # (a prefetch past the end of the array is harmless: it never faults).
        end = builder.add(nbytes, context.get_constant(types.intp, 63))
        with cgutils.for_range_slice(builder, zero, end, line) as (offset, _):
            # read (0), keep in all cache levels (3), data cache (1)
            builder.call(fn, [builder.gep(base, [offset]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@overload(_prefetch_row, jit_options={"nogil": True})
def _prefetch_row_jit(xb, row):
    return lambda xb, row: _prefetch_row_llvm(xb, row)


_PREFETCH_AHEAD = 2  # rows fetched ahead of the one being multiplied


@njit(nogil=True, cache=True, fastmath=True)
def dot_rows(xb, ids, query, out):
    """out[i] = <xb[ids[i]], query>; returns False, having read nothing, when an id is outside xb.
    fastmath lets LLVM vectorize the reduction: stored vectors and queries are validated finite, so
    its no-NaN/Inf assumption holds.

    The rows are scattered over storage far larger than the caches, so each one is a cache miss;
    the rows a few places ahead are prefetched while one is multiplied (see docs/perf-log.md)."""
    d = query.shape[0]
    m = ids.shape[0]
    n = xb.shape[0]
    for i in range(m):  # (Numba checks no bounds: an id out of range is refused before any read)
        if not 0 <= ids[i] < n:
            return False
    for i in range(min(_PREFETCH_AHEAD, m)):
        _prefetch_row(xb, ids[i])
    for i in range(m):
        if i + _PREFETCH_AHEAD < m:
            _prefetch_row(xb, ids[i + _PREFETCH_AHEAD])
        out[i] = _dot(xb[ids[i]], query, d)
    return True


@njit(nogil=True, fastmath=True, inline="always")
def _dot(row, query, d):
    """<row, query> over d entries: one loop shared by the kernels below, so a vector's similarity
    is the same to the last bit whichever of them reads it."""
    acc = np.float32(0.0)
    for j in range(d):
        acc += row[j] * query[j]
    return acc


@njit(nogil=True, cache=True, fastmath=True)
def dot_rows_split(xbs, codes, shift, tag, query, out):
    """out[i] = <xbs[p][k], query> where p = (codes[i] >> shift) & 15 and k = codes[i]'s bits below
    ``shift``: ``dot_rows`` over several matrices (a tuple of them) in one call. Returns False, having
    read nothing, when a code names a matrix or row outside ``xbs`` or its bits above p differ
    from ``tag``."""
    d = query.shape[0]
    m = codes.shape[0]
    low = (np.int64(1) << shift) - 1
    for i in range(m):
        p = (codes[i] >> shift) & 15
        if codes[i] >> (shift + 4) != tag or p >= len(xbs) or not 0 <= codes[i] & low < xbs[p].shape[0]:
            return False
    for i in range(min(_PREFETCH_AHEAD, m)):
        _prefetch_row(xbs[(codes[i] >> shift) & 15], codes[i] & low)
    for i in range(m):
        if i + _PREFETCH_AHEAD < m:
            ahead = codes[i + _PREFETCH_AHEAD]
            _prefetch_row(xbs[(ahead >> shift) & 15], ahead & low)
        out[i] = _dot(xbs[(codes[i] >> shift) & 15][codes[i] & low], query, d)
    return True


@_kernel
def surprise_ema(state, index, predicted, actual, alpha, out):
    """Apply feedback items in order: s <- alpha*max(0, actual-predicted) + (1-alpha)*s.

    ``state`` holds one value per distinct memory and is updated in place; ``index`` maps each
    item to its memory, so repeated memories in one batch compound in item order.
    """
    for i in range(index.shape[0]):
        j = index[i]
        gain = actual[i] - predicted[i]
        if gain < 0.0:
            gain = 0.0
        s = alpha * gain + (1.0 - alpha) * state[j]
        state[j] = s
        out[i] = s


@_kernel
def _sift_down(hs, hi, n, pos):
    # Min-heap on (score, -index): the root is the worst kept item (lowest score, highest index).
    while True:
        left = 2 * pos + 1
        if left >= n:
            return
        child = left
        right = left + 1
        if right < n and (hs[right] < hs[left] or (hs[right] == hs[left] and hi[right] > hi[left])):
            child = right
        if hs[child] < hs[pos] or (hs[child] == hs[pos] and hi[child] > hi[pos]):
            hs[child], hs[pos] = hs[pos], hs[child]
            hi[child], hi[pos] = hi[pos], hi[child]
            pos = child
        else:
            return


@_kernel
def topk(scores, k):
    """Indices of the k highest scores, best first; ties go to the lower index; NaN never wins."""
    n = scores.shape[0]
    if k <= 0:  # (the heap below reads its top)
        return np.empty(0, np.int64)
    hs = np.empty(k, np.float64)
    hi = np.empty(k, np.int64)
    size = 0
    for i in range(n):
        s = scores[i]
        if math.isnan(s):
            continue
        if size < k:
            # sift up
            pos = size
            hs[pos] = s
            hi[pos] = i
            size += 1
            while pos > 0:
                parent = (pos - 1) // 2
                if hs[pos] < hs[parent] or (hs[pos] == hs[parent] and hi[pos] > hi[parent]):
                    hs[pos], hs[parent] = hs[parent], hs[pos]
                    hi[pos], hi[parent] = hi[parent], hi[pos]
                    pos = parent
                else:
                    break
        elif s > hs[0]:
            hs[0] = s
            hi[0] = i
            _sift_down(hs, hi, size, 0)
    # Pop the heap from worst to best.
    out = np.empty(size, np.int64)
    m = size
    while m > 0:
        out[m - 1] = hi[0]
        m -= 1
        hs[0] = hs[m]
        hi[0] = hi[m]
        _sift_down(hs, hi, m, 0)
    return out


@_kernel
def _kth_largest(vals, k):
    """The k-th largest of ``vals`` (1-based; 1 <= k <= len), found in place (vals is reordered):
    Hoare selection with a median-of-three pivot, expected linear time."""
    lo = 0
    hi = vals.shape[0] - 1
    want = k - 1  # position in descending order
    while lo < hi:
        mid = (lo + hi) // 2
        a, b, c = vals[lo], vals[mid], vals[hi]
        if a < b:
            a, b = b, a
        if b < c:
            b, c = c, b
            if a < b:
                a, b = b, a
        pivot = b  # the median of the three
        i, j = lo, hi
        while i <= j:
            while vals[i] > pivot:
                i += 1
            while vals[j] < pivot:
                j -= 1
            if i <= j:
                vals[i], vals[j] = vals[j], vals[i]
                i += 1
                j -= 1
        # Now vals[lo..j] >= pivot, vals[i..hi] <= pivot, and anything between equals it.
        if want <= j:
            hi = j
        elif want >= i:
            lo = i
        else:
            return pivot
    return vals[want]


@_kernel
def split_top(bounds, bar, size, top, rest):
    """Of the entries with bounds[i] > bar: the ``size`` largest into ``top`` (ties: lower index
    first), the others into ``rest``, each in index order. Returns (len(top), len(rest))."""
    n = bounds.shape[0]
    m = 0
    for i in range(n):
        if bounds[i] > bar:
            m += 1
    if m <= size:
        c = 0
        for i in range(n):
            if bounds[i] > bar:
                top[c] = i
                c += 1
        return c, 0
    vals = np.empty(m, bounds.dtype)
    c = 0
    for i in range(n):
        if bounds[i] > bar:
            vals[c] = bounds[i]
            c += 1
    t = _kth_largest(vals, size)
    above_t = 0
    for i in range(m):
        if vals[i] > t:
            above_t += 1
    ties = size - above_t  # entries equal to t that still go to top, lowest index first
    nt = 0
    nr = 0
    for i in range(n):
        v = bounds[i]
        if not v > bar:
            continue
        if v > t or (v == t and ties > 0):
            if v == t:
                ties -= 1
            top[nt] = i
            nt += 1
        else:
            rest[nr] = i
            nr += 1
    return nt, nr


@_kernel
def _check_tier_range(tier):
    bad = False
    for i in range(tier.shape[0]):  # checked here, in the kernel, not as extra passes in the wrapper
        t = tier[i]
        bad |= (t < 0) | (t > 4)
    if bad:
        raise ValueError("tier values must be in 0..4")


@_kernel
def _mask_namespaces(alive, ns_id, ns_ok, one_ns, out):
    """out = alive and in an allowed namespace (``one_ns >= 0``: that one alone, no lookups)."""
    n = alive.shape[0]
    if one_ns >= 0:
        for i in range(n):
            out[i] = alive[i] & (ns_id[i] == one_ns)
    else:
        m = ns_ok.shape[0]
        for i in range(n):
            ns = ns_id[i]
            out[i] = alive[i] and ns >= 0 and ns < m and ns_ok[ns]


@_kernel
def _mask_tiers(tier, tier_ok, tier_mode, out):
    """out &= allowed tier: ``tier_mode`` 1 every tier 1..4, 2 all five (nothing to do), 0 the table."""
    n = tier.shape[0]
    if tier_mode == 1:
        for i in range(n):
            out[i] &= tier[i] > 0
    elif tier_mode == 0:
        for i in range(n):
            out[i] &= tier_ok[tier[i]]


@_kernel
def _mask_kinds(kind_id, kind_ok, out):
    """out &= allowed kind (``kind_ok`` of length 0: every kind)."""
    k = kind_ok.shape[0]
    if k > 0:
        for i in range(kind_id.shape[0]):
            if out[i]:
                kd = kind_id[i]
                out[i] = kd >= 0 and kd < k and kind_ok[kd]


@_kernel
def _mask_window_and_expiry(
    created_at, created_lo, created_hi, check_created, expire_at, now, check_expire, out
):
    """out &= created in [lo, hi) (when ``check_created``) and unexpired by ``now`` (when ``check_expire``)."""
    n = out.shape[0]
    if check_created:
        for i in range(n):
            if out[i]:
                c = created_at[i]
                out[i] = c >= created_lo and c < created_hi
    if check_expire:
        for i in range(n):
            if out[i]:
                out[i] = not (expire_at[i] <= now)


@_kernel
def filter_mask(
    alive,
    ns_id,
    ns_ok,
    one_ns,
    tier,
    tier_ok,
    tier_mode,
    kind_id,
    kind_ok,
    created_at,
    created_lo,
    created_hi,
    check_created,
    expire_at,
    now,
    check_expire,
    space_id,
    space,
    out,
):
    """out[i] = row i is alive, in an allowed namespace/tier/kind, in the creation window (when
    ``check_created``), unexpired (when ``check_expire``) and in embedding space ``space`` (when
    ``space >= 0``). ``kind_ok`` of length 0 allows every kind. Returns the number of rows kept.

    One simple loop per condition, each of which LLVM vectorizes (a single loop testing every
    condition, with branches and table lookups, is far slower). The common cases need no lookups:
    ``one_ns >= 0`` when ``ns_ok`` allows exactly that id; ``tier_mode`` 1 when every tier 1..4 is
    allowed and 0 is not, 2 when all five are, 0 to read ``tier_ok``. Columns a disabled check
    needs are not read.
    """
    n = alive.shape[0]
    _check_tier_range(tier)
    _mask_namespaces(alive, ns_id, ns_ok, one_ns, out)
    _mask_tiers(tier, tier_ok, tier_mode, out)
    if space >= 0:
        for i in range(n):
            out[i] &= space_id[i] == space
    _mask_kinds(kind_id, kind_ok, out)
    _mask_window_and_expiry(
        created_at, created_lo, created_hi, check_created, expire_at, now, check_expire, out
    )
    count = 0
    for i in range(n):
        count += out[i]
    return count


# -- lifecycle: whole-array passes, run from one thread (the maintenance pass) -------------------
# These use prange. Numba's workqueue threading layer aborts the process when parallel kernels run
# from two threads at once, so their public wrappers hold ``kernels.PARALLEL_LOCK`` while running.
_pass_kernel = njit(nogil=True, cache=True, error_model="numpy", parallel=True)

NONE, PROMOTE_ACCESS, PROMOTE_SURPRISE, PROMOTE_SUCCESS, DEMOTE_IDLE, DEMOTE_DECAY = 0, 1, 2, 3, 4, 5


@_pass_kernel
def plan_moves(
    eligible,
    ns,
    tier,
    importance,
    created_at,
    accessed_at,
    tier_since,
    access_count,
    access_base,
    surprise,
    success_count,
    success_base,
    now,
    floor,
    half_life_hours,
    ttl_seconds,
    threshold,
    promote_access,
    promote_surprise,
    promote_success,
    decay_grace,
    action,
    decayed,
):
    """Decide each eligible row's promotion or demotion (one tier per pass) and its decayed importance.

    Promotion (not from FAST), first rule that holds: accesses since entering the tier >=
    promote_access; surprise >= promote_surprise with an access since entering the tier (counted,
    not dated: an access time ahead of the clock would count after every entry); successes
    since entering the tier >= promote_success. Demotion (not from GLACIAL): idle (no access, no tier
    entry) longer than the tier's TTL; or decayed importance below the tier's threshold, after one
    TTL in the tier where the namespace's decay_grace is set (else at once). Tables are indexed
    [namespace id, tier] or [namespace id] (floor, promotion thresholds, decay_grace).
    """
    for i in prange(eligible.shape[0]):
        k = ns[i]
        t = tier[i]
        if k < 0 or k >= ttl_seconds.shape[0] or t < 1 or t > 4:
            action[i] = NONE
            decayed[i] = importance[i]
            continue
        d = _decayed(importance[i], now - created_at[i], half_life_hours[k, t], _floor_at(floor, k))
        decayed[i] = d
        a = NONE
        if eligible[i]:
            if t > 1:
                if access_count[i] - access_base[i] >= promote_access[k]:
                    a = PROMOTE_ACCESS
                elif surprise[i] >= promote_surprise[k] and access_count[i] > access_base[i]:
                    a = PROMOTE_SURPRISE
                elif success_count[i] - success_base[i] >= promote_success[k]:
                    a = PROMOTE_SUCCESS
            if a == NONE and t < 4:
                last = accessed_at[i] if accessed_at[i] > tier_since[i] else tier_since[i]
                ttl = ttl_seconds[k, t]
                if now - last > ttl:
                    a = DEMOTE_IDLE
                elif (not decay_grace[k] or now - tier_since[i] > ttl) and decayed[i] < threshold[k, t]:
                    a = DEMOTE_DECAY  # (threshold as stored: float32)
        action[i] = a


@_pass_kernel
def retention_scores(ns, policy, decayed, accessed_at, created_at, tier_since, now, tau_seconds, out):
    """How much each row deserves to stay in its tier (higher stays), by its namespace's policy:
    1 importance_weighted 0.7*decayed + 0.3*recency, 2 recency (creation time), 3 fifo (tier entry),
    4 lru (last access), 5 importance (decayed), 6 ten_point_weighted 0.7*(10*decayed) + 0.3*recency
    (of creation): importance on a 1-10 scale outweighs any recency."""
    for i in prange(ns.shape[0]):
        k = ns[i]
        p = policy[k] if k >= 0 and k < policy.shape[0] else 1
        if p == 2:
            out[i] = created_at[i]
        elif p == 3:
            out[i] = tier_since[i]
        elif p == 4:
            out[i] = accessed_at[i]
        elif p == 5:
            out[i] = decayed[i]
        elif p == 6:
            out[i] = 7.0 * decayed[i] + 0.3 * _recency(created_at[i], now, tau_seconds)
        else:
            out[i] = 0.7 * decayed[i] + 0.3 * _recency(accessed_at[i], now, tau_seconds)


@_pass_kernel
def select_evictions(group, score, candidates, capacity, evict):
    """Mark, per group, the lowest-scoring candidate rows beyond the group's capacity.

    Counting pass, then only the groups over capacity are bucketed (counting sort, rows in index
    order) and each bucket is sorted by score with a stable sort, so ties evict the lower row index
    first. O(n) when no group is over capacity. Returns how many rows were marked.
    """
    n_groups = capacity.shape[0]
    count = np.zeros(n_groups, np.int64)
    for i in range(group.shape[0]):
        if candidates[i]:
            g = group[i]
            if g < 0 or g >= n_groups:
                raise ValueError("group ids out of range of capacity")
            if math.isnan(score[i]):
                raise ValueError("score must not be NaN")
            count[g] += 1
    start = np.zeros(n_groups + 1, np.int64)
    for g in range(n_groups):
        over = count[g] if count[g] > capacity[g] else 0
        start[g + 1] = start[g] + over
    if start[n_groups] == 0:
        return 0
    rows = np.empty(start[n_groups], np.int64)
    fill = start[:n_groups].copy()
    for i in range(group.shape[0]):
        if candidates[i]:
            g = group[i]
            if count[g] > capacity[g]:
                rows[fill[g]] = i
                fill[g] += 1
    marked = 0
    for g in prange(n_groups):
        lo = start[g]
        hi = start[g + 1]
        if hi == lo:
            continue
        bucket = rows[lo:hi]
        keys = np.empty(hi - lo, np.float64)
        for j in range(hi - lo):
            keys[j] = score[bucket[j]]
        order = np.argsort(keys, kind="mergesort")
        for j in range(count[g] - capacity[g]):
            evict[bucket[order[j]]] = True
            marked += 1
    return marked
