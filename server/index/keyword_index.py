"""In-memory keyword postings over the column rows: the keyword half of hybrid and default searches.

Derived state, like the HNSW indexes: rebuilt from the records at a start-up without a snapshot, saved
and restored with the columns snapshot, and updated by the writer thread as memories are created or their
content changes. Terms are lower-cased words without English stop words, stemmed (Snowball), so "moved",
"moving" and "moves" meet. Each posting is (row, term frequency, content generation): a row whose content
changes gets a new generation and new postings; its old postings stop counting at once and are dropped at
the next compaction. Deleted rows need nothing here: searches only count allowed (alive) rows.

Concurrency: only the writer thread calls ``add``/``remove``/``compact``/``state``; searches read at any
time. Segments are immutable and published as a new tuple; the delta's buffers are written only beyond the
count readers were given, and a full delta is replaced, never overwritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tiermem.kernels import keywords as kernels
from tiermem.server.model.text import TOKENIZER, keyword_terms, keyword_terms_and_length


def _segment(
    keys: np.ndarray, rows: np.ndarray, tfs: np.ndarray, gens: np.ndarray, lens: np.ndarray
) -> kernels.Postings:
    # By key, then row: searches read a key's rows in order. (Stable: merged parts are sorted runs.)
    order = np.argsort((keys.astype(np.int64) << 32) | rows.astype(np.int64), kind="stable")
    keys, rows, tfs, gens, lens = keys[order], rows[order], tfs[order], gens[order], lens[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    starts = np.concatenate([[0], bounds, [keys.shape[0]]]).astype(np.int64)
    return kernels.postings(
        keys[starts[:-1]] if keys.shape[0] else keys,
        starts if keys.shape[0] else np.zeros(1, np.int64),
        rows,
        tfs,
        gens,
        lens,
    )


def _resorted(seg: kernels.Postings) -> kernels.Postings:
    return _segment(np.repeat(seg.keys, np.diff(seg.starts)), seg.rows, seg.tfs, seg.gens, seg.lens)


class _Keys:
    """The (namespace id, term) -> key id numbering and each key's document frequency. Ids are dense
    (``list(ids)[i]`` has id i); a compaction that drops many unused keys numbers the rest again in a
    new ``_Keys``, published in the same view as the postings numbered by it."""

    __slots__ = ("df", "ids")

    def __init__(self, ids: dict[tuple[int, str], int], df: np.ndarray) -> None:
        self.ids = ids
        self.df = df  # (grown by the writer: replaced whole, read once by a search)


class KeywordIndex:
    """Postings keyed by (namespace id, term), so a search reads only its namespaces' postings. New
    postings go to a small unsorted delta; a full delta becomes a sorted segment, and segments of
    similar size merge (dropping replaced content), so a search reads a few segments and a short delta."""

    def __init__(self, delta_size: int = 2048) -> None:
        self.delta_size = delta_size  # postings in the delta: every search scans it
        # Per key, the rows whose current content holds it and that were not removed: the document
        # frequency behind idf (``_keys.df``). Kept exact through each row's keys (``_fwd``, appended;
        # a row's entries are ``_row_fwd[row]`` and the ``_row_nkeys[row]`` after), so the answers do
        # not depend on what merges or a restart dropped.
        self._keys = _Keys({}, np.zeros(1024, np.int64))
        self._fwd = np.zeros(4096, np.int32)
        self._fwd_used = 0
        self._row_fwd = np.zeros(1024, np.int64)
        self._row_nkeys = np.zeros(1024, np.int32)
        # What readers see, swapped as one: the sorted segments, the delta, each segment's stamp (the
        # count of replaced contents when it was built holding no stale posting, -1: it may hold
        # some; while that count has not moved, its postings need no generation check), and the key
        # numbering they are keyed by.
        self._view: tuple[tuple[kernels.Postings, ...], kernels.Appended, tuple[int, ...], _Keys] = (
            (),
            self._new_delta(),
            (),
            self._keys,
        )
        self._replaced = 0  # contents replaced so far (a row posted again with other content)
        self._gen = np.zeros(1024, np.int32)  # per row: its content generation (0: never posted)
        self.posted_rows = 0  # contents posted since the last compaction (live or not)
        # Moved before and after each content's postings and generation are published (odd while
        # a write is under way): a reader that saw it odd, or move, reads again.
        self._bumps = 0
        self._row_hash = np.zeros(1024, np.int64)  # per row: a digest of its posted content
        # Lengths for BM25's average: per row (its namespace, -1 once removed; its words) and summed
        # per namespace id over the rows not removed.
        self._row_ns = np.zeros(1024, np.int32)
        self._row_words = np.zeros(1024, np.int32)
        self._ns_words = np.zeros(16, np.float64)
        self._ns_rows = np.zeros(16, np.int64)

    def __len__(self) -> int:
        return len(self._keys.ids)

    @property
    def postings_count(self) -> int:
        segments, delta, _, _ = self._view
        return sum(seg.size for seg in segments) + delta.filled

    def _new_delta(self) -> kernels.Appended:
        n = self.delta_size
        return kernels.Appended(
            np.empty(n, np.int32),
            np.empty(n, np.int32),
            np.empty(n, np.float32),
            np.empty(n, np.int32),
            np.empty(n, np.uint16),
            0,
        )

    # -- writer thread ---------------------------------------------------------------------------
    def add(self, row: int, namespace: int, text: str) -> None:
        """Post a row's content under its namespace id; posting a row again with new content makes its old
        postings stop counting (the same content again changes nothing)."""
        if row >= self._gen.shape[0]:
            size = max(row + 1, 2 * self._gen.shape[0])
            self._gen, self._row_ns, self._row_words, self._row_hash, self._row_fwd, self._row_nkeys = (
                _grown(a, size)
                for a in (
                    self._gen,
                    self._row_ns,
                    self._row_words,
                    self._row_hash,
                    self._row_fwd,
                    self._row_nkeys,
                )
            )
        digest = _digest(text)
        if self._gen[row] > 0 and self._row_hash[row] == digest and self._row_ns[row] == namespace:
            return  # the same content posted again (a follower's or a start-up's replay): nothing changes
        self._row_hash[row] = digest
        gen = int(self._gen[row]) + 1
        self.posted_rows += 1
        terms, length = keyword_terms_and_length(text)
        self._count_length(row, namespace, length, replacing=gen > 1)
        ids = self._keys.ids
        keys = [ids.setdefault((namespace, t), len(ids)) for t in terms]
        self._count_keys(row, keys)  # (before readers can see the postings)
        n = len(keys)
        if n > self.delta_size - self._view[1].filled:
            self._flush()
        if gen > 1:  # (after any flush: segments stamped before this hold its old postings)
            self._replaced += 1
        self._bumps += 1  # (odd: a write under way)
        try:
            self._publish(row, keys, _tfs(terms), gen, _clipped(length))
        finally:
            self._bumps += 1  # (even again)

    def _publish(self, row: int, keys: list[int], tfs: np.ndarray, gen: int, length: int) -> None:
        """The postings of a row's new content into the view, then its generation."""
        segments, d, stamps, numbering = self._view
        n = len(keys)
        if n > self.delta_size:  # a long text: its postings make a segment of their own (merged later:
            # a merge now would drop them, as the row's generation is not published yet)
            own = _segment(
                np.array(keys, np.int32),
                np.full(n, row, np.int32),
                tfs,
                np.full(n, gen, np.int32),
                np.full(n, length, np.uint16),
            )
            self._view = (
                (*segments, own),
                d,
                (*stamps, -1),
                numbering,
            )  # (checked: its row's generation is not
            # published yet, so its postings do not count until it is)
        else:
            end = d.filled + n
            d.keys[d.filled : end] = keys
            d.rows[d.filled : end] = row
            d.tfs[d.filled : end] = tfs
            d.gens[d.filled : end] = gen
            d.lens[d.filled : end] = length
            self._view = (
                segments,
                d._replace(filled=end),
                stamps,
                numbering,
            )  # slots beyond what was filled: unseen
        self._gen[row] = gen  # published last: the new postings count from here on

    def _current(self, rows: np.ndarray, gens: np.ndarray) -> np.ndarray:
        """Which postings (their rows and generations) are of their row's current content."""
        n = self._gen.shape[0]
        return (rows < n) & (gens == self._gen[np.minimum(rows, n - 1)])

    def _count_keys(self, row: int, keys: list[int]) -> None:
        numbering = self._keys
        if len(numbering.ids) > numbering.df.shape[0]:
            numbering.df = _grown(numbering.df, 2 * len(numbering.ids))
        n, used = len(keys), self._fwd_used
        if used + n > self._fwd.shape[0]:
            self._fwd = _grown(self._fwd, max(used + n, 2 * self._fwd.shape[0]))
        self._fwd[used : used + n] = keys
        self._row_fwd[row], self._row_nkeys[row] = used, n
        self._fwd_used = used + n
        numbering.df[keys] += 1

    def _row_keys(self, row: int) -> np.ndarray:
        start = self._row_fwd[row]
        return self._fwd[start : start + self._row_nkeys[row]]

    def _count_length(self, row: int, namespace: int, length: int, replacing: bool) -> None:
        if replacing:
            self.remove(row)
        if namespace >= self._ns_words.shape[0]:
            size = max(namespace + 1, 2 * self._ns_words.shape[0])
            self._ns_words, self._ns_rows = _grown(self._ns_words, size), _grown(self._ns_rows, size)
        self._row_ns[row], self._row_words[row] = namespace, length
        self._ns_words[namespace] += length
        self._ns_rows[namespace] += 1

    def remove(self, row: int) -> None:
        """A row was deleted: it leaves its namespace's average length (its postings stop counting
        because searches allow live rows only, and go at the next compaction)."""
        if row < self._row_ns.shape[0] and self._gen[row] > 0 and self._row_ns[row] >= 0:
            ns = self._row_ns[row]
            self._ns_words[ns] -= self._row_words[row]
            self._ns_rows[ns] -= 1
            self._keys.df[self._row_keys(row)] -= 1
            self._row_ns[row] = -1

    def average_length(self, namespaces: list[int]) -> float:
        """The mean length in words of the memories of the namespaces (0.0: none)."""
        rows, words = self._totals(namespaces)
        return words / rows if rows > 0 else 0.0

    def _totals(self, namespaces: list[int]) -> tuple[int, float]:
        """(memories, their words) of the namespaces, posted and not removed."""
        ns_rows, ns_words = self._ns_rows, self._ns_words  # (replaced whole when grown: read once)
        size = min(ns_rows.shape[0], ns_words.shape[0])
        ids = [i for i in namespaces if 0 <= i < size]
        return int(sum(ns_rows[i] for i in ids)), float(sum(ns_words[i] for i in ids))

    def _flush(self) -> None:
        """Turn the delta into a segment; merge segments of similar size."""
        old, d, stamps, numbering = self._view
        segments = list(zip(old, stamps, strict=True))
        if d.filled:
            n = d.filled
            rows, gens = d.rows[:n], d.gens[:n]
            keep = self._current(rows, gens)  # (every add in the delta is published: replaced content goes)
            fresh = _segment(d.keys[:n][keep], rows[keep], d.tfs[:n][keep], gens[keep], d.lens[:n][keep])
            segments.append((fresh, self._replaced))
        merged = self._merged(segments)
        self._view = (
            tuple(seg for seg, _ in merged),
            self._new_delta(),
            tuple(st for _, st in merged),
            numbering,
        )
        kernels.forget_packed()  # (segments merged away are not kept alive for a search)

    def _merged(self, segments: list[tuple[kernels.Postings, int]]) -> list[tuple[kernels.Postings, int]]:
        """Segments (with their stamps) of similar size merged (the newest into the one before while
        it is at least a quarter of its size), so a search reads a logarithmic number of them."""
        while len(segments) >= 2 and 4 * segments[-1][0].size >= segments[-2][0].size:
            newer, older = segments.pop(), segments.pop()
            segments.append((self._merge([older[0], newer[0]]), self._replaced))
        return segments

    def _merge(self, parts: list[kernels.Postings], alive: np.ndarray | None = None) -> kernels.Postings:
        keys = np.concatenate([np.repeat(s.keys, np.diff(s.starts)) for s in parts]).astype(np.int32)
        rows = np.concatenate([s.rows for s in parts])
        gens = np.concatenate([s.gens for s in parts])
        tfs = np.concatenate([s.tfs for s in parts])
        lens = np.concatenate([s.lens for s in parts])
        keep = self._current(rows, gens)  # replaced content goes
        if alive is not None:
            keep &= (rows < alive.shape[0]) & alive[np.minimum(rows, alive.shape[0] - 1)]
        return _segment(keys[keep], rows[keep], tfs[keep], gens[keep], lens[keep])

    def compact(self, alive: np.ndarray) -> int:
        """One segment without the postings of dead rows or replaced content; returns how many went."""
        before = self.postings_count
        self.posted_rows = int(np.count_nonzero(alive))
        live = np.zeros(self._gen.shape[0], np.bool_)
        n = min(alive.shape[0], live.shape[0])
        live[:n] = alive[:n] & (self._gen[:n] > 0) & (self._row_ns[:n] >= 0)
        size = self._ns_words.shape[0]
        self._ns_words = np.bincount(
            self._row_ns[live], weights=self._row_words[live], minlength=size
        ).astype(np.float64)
        self._ns_rows = np.bincount(self._row_ns[live], minlength=size).astype(np.int64)
        self._flush()
        if self._view[0]:
            merged = self._merge(list(self._view[0]), alive)
            self._view = ((merged,), self._view[1], (self._replaced,), self._view[3])
            kernels.forget_packed()
        self._recount(live, *self._renumbered())
        return before - self.postings_count

    def _recount(
        self,
        live: np.ndarray,
        segments: tuple[kernels.Postings, ...] | None = None,
        numbering: _Keys | None = None,
    ) -> None:
        """Each row's keys and the document frequencies again from the postings of the ``live`` rows'
        current contents (after a compaction, which drops the keys of the others; or a restore);
        then ``segments`` and their ``numbering`` (when given) published with them. Nothing changes
        until all is computed: a failure leaves the index as it was."""
        old_segments, d, stamps, old_numbering = self._view
        segments = old_segments if segments is None else segments
        numbering = old_numbering if numbering is None else numbering
        parts = [(np.repeat(s.keys, np.diff(s.starts)), s.rows, s.gens) for s in segments]
        parts.append((d.keys[: d.filled], d.rows[: d.filled], d.gens[: d.filled]))
        keys, rows, gens = (np.concatenate(column) for column in zip(*parts, strict=True))
        n = live.shape[0]
        current = self._current(rows, gens) & live[np.minimum(rows, n - 1)]
        keys, rows = keys[current], rows[current]
        size = self._row_nkeys.shape[0]
        fwd, counts = kernels.keys_by_row(
            np.ascontiguousarray(keys, np.int32), np.ascontiguousarray(rows, np.int32), size
        )
        counts = counts[:size]
        df = np.bincount(keys, minlength=max(1024, len(numbering.ids))).astype(np.int64)
        row_fwd = (np.cumsum(counts) - counts).astype(np.int64)
        self._fwd, self._fwd_used = fwd, int(fwd.shape[0])
        self._row_nkeys, self._row_fwd = counts.astype(np.int32), row_fwd
        numbering.df = df  # (before a search can read it in the view below)
        self._keys = numbering
        if segments is not old_segments or numbering is not old_numbering:
            self._view = (segments, d, stamps, numbering)
            kernels.forget_packed()

    def _renumbered(self) -> tuple[tuple[kernels.Postings, ...], _Keys]:
        """After a compaction left the postings of live rows only, in at most one segment and an
        empty delta: once many keys have none left (the words of deleted memories and namespaces),
        the rest numbered again (the segments and a numbering without the others, to publish), so
        the key names held do not grow with every word ever posted; else the view's own."""
        segments, delta, _, numbering = self._view
        assert len(segments) <= 1 and delta.filled == 0, "a compaction's view"
        old = numbering.ids
        kept = segments[0].keys if segments else _NO_KEYS  # (ascending: new ids keep the old order)
        if len(old) - kept.shape[0] < max(RENUMBER_MIN, RENUMBER_SHARE * len(old)):
            return segments, numbering
        names = list(old)
        renumbered = _Keys({names[k]: i for i, k in enumerate(kept.tolist())}, numbering.df)
        # (searches under way keep the numbering of their view; the df is replaced before it is shown)
        return tuple(
            seg._replace(keys=np.arange(kept.shape[0], dtype=np.int32)) for seg in segments
        ), renumbered

    # -- readers ---------------------------------------------------------------------------------
    def bm25(
        self,
        namespaces: list[int],
        terms: list[str],
        allowed: np.ndarray,
        max_postings: int,
        probe: np.ndarray,
        depth: int = -1,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See ``bm25``: ``sums`` collected at once."""
        return self.sums(namespaces, terms, allowed, max_postings, depth).collect(probe, depth)

    def sums(
        self,
        namespaces: list[int],
        terms: list[str],
        allowed: np.ndarray,
        max_postings: int,
        depth: int = -1,
        allowed_bits: np.ndarray | None = None,
    ) -> kernels.Sums:
        """The keyword pass of ``bm25`` (its sums, to collect at most ``depth`` best of, when >= 0): the
        postings are read in place, as the view stands when the search starts."""
        rows, words = self._totals(namespaces)

        def plan(numbering: _Keys) -> tuple[np.ndarray, np.ndarray]:
            """(The terms' keys in the namespaces, sorted; each key's idf) by one key numbering."""
            found = sorted(
                (k, i)
                for i, t in enumerate(terms)
                for ns in namespaces
                if (k := numbering.ids.get((ns, t))) is not None
            )
            df = [0] * len(terms)  # a term's memories in the namespaces
            counts = numbering.df  # (a key the writer is adding may not have its count yet)
            for k, i in found:
                df[i] += int(counts[k]) if k < counts.shape[0] else 0
            weights = [0.0 if d > max_postings else kernels.term_idf(rows, d) for d in df]  # (a term
            # in that many memories says almost nothing)
            wanted = np.array([k for k, _ in found], np.int32)
            return wanted, np.array([weights[i] for _, i in found], np.float64)

        avgdl = max(1.0, words / rows if rows > 0 else 0.0)
        return self._pass(plan, allowed, avgdl, depth, allowed_bits)

    def _pass(
        self,
        plan: Callable[[_Keys], tuple[np.ndarray, np.ndarray]],
        allowed: np.ndarray,
        avgdl: float,
        depth: int,
        bits: np.ndarray | None = None,
        tries: int = 8,
    ) -> kernels.Sums:
        """The pass over the view as it stands, again while a row's generation moved meanwhile; the
        terms' keys and weights from ``plan`` by the view's own key numbering."""
        planned: tuple[_Keys | None, np.ndarray, np.ndarray] = (None, _NO_KEYS, _NO_WEIGHTS)
        for attempt in range(tries):
            last = attempt == tries - 1
            bumps = self._bumps
            segments, delta, stamps, numbering = self._view
            if planned[0] is not numbering:
                planned = (numbering, *plan(numbering))
            _, wanted, weights = planned
            # (generations as new as the view, or newer; the last try, kept even if one moved
            # meanwhile, reads a copy: its pass and read-out then see the same ones)
            gen = self._gen if not last else self._gen.copy()
            # Read after the view: a replacement published in it has moved this count already. The
            # last try checks every posting.
            replaced = self._replaced if not last else -2
            current = (*(st == replaced for st in stamps), False)
            out = kernels.accumulate(
                (*segments, delta),
                wanted,
                weights,
                gen,
                allowed,
                avgdl,
                current=current,
                depth=depth,
                allowed_bits=bits,
            )
            if self._unmoved(bumps) or last:  # no write overlapped: postings and generations agree
                break
            out.release()  # (gives its buffer back)
        if out.deferred and not last:
            # Its read-out reads generations after this check: a row replaced by then could mix
            # two contents, so the pass runs again (with the tries left).
            left = tries - 1 - attempt
            out.recheck(
                lambda: self._unmoved(bumps),
                lambda: self._pass(plan, allowed, avgdl, depth, bits, left),
            )
        return out

    def _unmoved(self, bumps: int) -> bool:
        """No write was under way when the counter read ``bumps``, nor has one been since."""
        return self._bumps == bumps and bumps % 2 == 0

    # -- snapshots -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The postings as they stand (segments and a copy of the delta), with the key names, for the
        columns snapshot. Changes nothing: it runs between two commit groups."""
        segments, d, _, _ = self._view
        n = d.filled
        delta = (
            d.keys[:n].copy(),
            np.empty(0, np.int64),
            d.rows[:n].copy(),
            d.tfs[:n].copy(),
            d.gens[:n].copy(),
            d.lens[:n].copy(),
        )
        return {
            "tokenizer": TOKENIZER,
            "keys": list(self._keys.ids),
            "segments": [seg.arrays for seg in segments],
            "delta": delta,  # keys per posting, unsorted (starts unused)
            "row_gen": self._gen.copy(),
            "row_hash": self._row_hash.copy(),
            "posted_rows": self.posted_rows,
            "lengths": (
                self._row_ns.copy(),
                self._row_words.copy(),
                self._ns_words.copy(),
                self._ns_rows.copy(),
            ),
        }

    @classmethod
    def restore(cls, state: dict[str, Any]) -> KeywordIndex:
        """The index a ``state`` saved; ValueError when its terms were read by another tokenizer
        (the caller then rebuilds the postings from the records)."""
        if state.get("tokenizer", "lower+snowball-english") != TOKENIZER:
            raise ValueError(f"keyword postings of tokenizer {state.get('tokenizer')!r}, not {TOKENIZER!r}")
        index = cls()
        index._keys.ids = {(int(ns), term): i for i, (ns, term) in enumerate(state["keys"])}
        index._gen = np.array(state["row_gen"], np.int32)
        index._row_hash = state["row_hash"]
        index.posted_rows = int(state["posted_rows"])
        index._row_ns, index._row_words, index._ns_words, index._ns_rows = state["lengths"]

        def with_lens(seg: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
            # (a snapshot from before postings carried their length: the row's, which is the current
            # content's, the only one whose postings count)
            if len(seg) == 6:
                return seg
            rows = seg[2]
            return (*seg, np.minimum(index._row_words[rows], LENGTH_MAX).astype(np.uint16))

        segments = [kernels.postings(*with_lens(seg)) for seg in state["segments"]]
        # (a snapshot from before keys held their rows in order: sorted once here)
        segments = [seg if seg.by_row else _resorted(seg) for seg in segments]
        keys, _, rows, tfs, gens, lens = with_lens(state["delta"])
        fresh = index._current(rows, gens)
        if fresh.any():  # (replaced content in the delta goes, as a flush drops it)
            segments.append(_segment(keys[fresh], rows[fresh], tfs[fresh], gens[fresh], lens[fresh]))
        kept = tuple(seg for seg in segments if seg.size)
        # (a snapshot may hold stale postings: such a segment's generations are checked)
        stamps = tuple(0 if index._current(seg.rows, seg.gens).all() else -1 for seg in kept)
        index._view = (kept, index._view[1], stamps, index._keys)
        size = index._gen.shape[0]
        index._row_fwd, index._row_nkeys = np.zeros(size, np.int64), np.zeros(size, np.int32)
        index._recount((index._gen > 0) & (index._row_ns[:size] >= 0))
        return index


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


_NO_KEYS = np.zeros(0, np.int32)
_NO_WEIGHTS = np.zeros(0, np.float64)
RENUMBER_MIN = 4096  # keys without a posting left before a compaction numbers the rest again ...
RENUMBER_SHARE = 0.25  # ... and at least this share of all keys (each costs a Python dict's entry)
LENGTH_MAX = 65_535  # a posting's length in words is kept in 16 bits (BM25 barely moves beyond)


def _clipped(length: int) -> int:
    return min(length, LENGTH_MAX)


def _tfs(terms: dict[str, int]) -> np.ndarray:
    return np.fromiter(terms.values(), np.float32, len(terms))


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, a.dtype)
    out[: a.shape[0]] = a
    return out


def bm25(
    index: KeywordIndex,
    namespaces: list[int],
    text: str,
    allowed: np.ndarray,
    max_postings: int,
    probe: np.ndarray | None = None,
    depth: int = -1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BM25 of the allowed rows holding a term of ``text``: (rows, scores, the ``probe`` rows' scores);
    with ``depth`` >= 0 the ``depth`` best rows only, best first.
    idf counts the namespaces' memories (a filter narrows what is found, not how a term weighs); a
    term in more than ``max_postings`` of them is skipped."""
    return keyword_sums(index, namespaces, text, allowed, max_postings, depth).collect(probe, depth)


def keyword_sums(
    index: KeywordIndex,
    namespaces: list[int],
    text: str,
    allowed: np.ndarray,
    max_postings: int,
    depth: int = -1,
    allowed_bits: np.ndarray | None = None,
) -> kernels.Sums:
    """The pass of ``bm25`` (same arguments), its sums to collect with the probe rows and (at most)
    ``depth``; ``allowed_bits``: ``allowed`` packed, if the caller keeps them (see ``accumulate``)."""
    terms = list(keyword_terms(text))
    if not terms:
        return kernels.no_sums()
    return index.sums(namespaces, terms, allowed, max_postings, depth, allowed_bits)
