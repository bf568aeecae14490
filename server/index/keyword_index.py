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
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tiermem.kernels import keywords as kernels
from tiermem.server.model.text import keyword_terms, keyword_terms_and_length


class _Segment(NamedTuple):
    """Postings sorted by key: key ``keys[i]``'s are ``starts[i]:starts[i + 1]``. Never changed once built."""

    keys: np.ndarray  # int32, ascending, unique
    starts: np.ndarray  # int64, len(keys) + 1
    rows: np.ndarray  # int32
    tfs: np.ndarray  # float32
    gens: np.ndarray  # int32: the row's content generation when posted

    @property
    def size(self) -> int:
        return int(self.rows.shape[0])


class _Delta(NamedTuple):
    """The newest postings, unsorted, in buffers of fixed capacity; readers see the first ``filled``."""

    keys: np.ndarray
    rows: np.ndarray
    tfs: np.ndarray
    gens: np.ndarray
    filled: int


def _segment(keys: np.ndarray, rows: np.ndarray, tfs: np.ndarray, gens: np.ndarray) -> _Segment:
    order = np.argsort(keys, kind="stable")
    keys, rows, tfs, gens = keys[order], rows[order], tfs[order], gens[order]
    bounds = np.flatnonzero(np.diff(keys)) + 1
    starts = np.concatenate([[0], bounds, [keys.shape[0]]]).astype(np.int64)
    return _Segment(
        keys[starts[:-1]] if keys.shape[0] else keys,
        starts if keys.shape[0] else np.zeros(1, np.int64),
        rows,
        tfs,
        gens,
    )


@dataclass
class QueryPostings:
    """A query's postings, ready for kernels.keywords.bm25: posting i is query term ``terms[i]``."""

    terms: np.ndarray
    n_terms: int
    rows: np.ndarray
    tfs: np.ndarray
    gens: np.ndarray
    current: np.ndarray  # each posting's row's generation, read with the postings (a consistent pair)


class KeywordIndex:
    """Postings keyed by (namespace id, term), so a search reads only its namespaces' postings. New
    postings go to a small unsorted delta; a full delta becomes a sorted segment, and segments of
    similar size merge (dropping replaced content), so a search reads a few segments and a short delta."""

    def __init__(self, delta_size: int = 8192) -> None:
        self.delta_size = delta_size  # postings in the delta: every search scans it
        self._key_ids: dict[tuple[int, str], int] = {}
        # What readers see, swapped as one: the sorted segments and the delta.
        self._view: tuple[tuple[_Segment, ...], _Delta] = ((), self._new_delta())
        self._gen = np.zeros(1024, np.int32)  # per row: its content generation (0: never posted)
        self.posted_rows = 0  # contents posted since the last compaction (live or not)
        self._bumps = 0  # row generations changed so far: a reader that saw it move reads again
        self._row_hash = np.zeros(1024, np.int64)  # per row: a digest of its posted content
        # Lengths for BM25's average: per row (its namespace, -1 once removed; its words) and summed
        # per namespace id over the rows not removed.
        self._row_ns = np.zeros(1024, np.int32)
        self._row_words = np.zeros(1024, np.int32)
        self._ns_words = np.zeros(16, np.float64)
        self._ns_rows = np.zeros(16, np.int64)

    def __len__(self) -> int:
        return len(self._key_ids)

    @property
    def postings_count(self) -> int:
        segments, delta = self._view
        return sum(seg.size for seg in segments) + delta.filled

    def _new_delta(self) -> _Delta:
        n = self.delta_size
        return _Delta(
            np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.float32), np.empty(n, np.int32), 0
        )

    # -- writer thread ---------------------------------------------------------------------------
    def add(self, row: int, namespace: int, text: str) -> None:
        """Post a row's content under its namespace id; posting a row again with new content makes its old
        postings stop counting (the same content again changes nothing)."""
        if row >= self._gen.shape[0]:
            size = max(row + 1, 2 * self._gen.shape[0])
            self._gen, self._row_ns, self._row_words, self._row_hash = (
                _grown(a, size) for a in (self._gen, self._row_ns, self._row_words, self._row_hash)
            )
        digest = _digest(text)
        if self._gen[row] > 0 and self._row_hash[row] == digest and self._row_ns[row] == namespace:
            return  # the same content posted again (a follower's or a start-up's replay): nothing changes
        self._row_hash[row] = digest
        gen = int(self._gen[row]) + 1
        self.posted_rows += 1
        terms, length = keyword_terms_and_length(text)
        self._count_length(row, namespace, length, replacing=gen > 1)
        if len(terms) > self.delta_size - self._view[1].filled:
            self._flush()
        segments, d = self._view
        n = min(len(terms), d.keys.shape[0] - d.filled)  # (a text of more distinct terms than DELTA: cut)
        ids = self._key_ids
        keys = [ids.setdefault((namespace, t), len(ids)) for t in list(terms)[:n]]
        end = d.filled + n
        d.keys[d.filled : end] = keys
        d.rows[d.filled : end] = row
        d.tfs[d.filled : end] = list(terms.values())[:n]
        d.gens[d.filled : end] = gen
        self._view = (segments, d._replace(filled=end))  # slots beyond what was filled: unseen by readers
        self._gen[row] = gen  # published last: the new postings count from here on
        self._bumps += 1

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
            self._row_ns[row] = -1

    def average_length(self, namespaces: list[int]) -> float:
        """The mean length in words of the memories of the namespaces (0.0: none)."""
        ids = [i for i in namespaces if 0 <= i < self._ns_words.shape[0]]
        rows = int(self._ns_rows[ids].sum()) if ids else 0
        return float(self._ns_words[ids].sum()) / rows if rows > 0 else 0.0

    def _flush(self) -> None:
        """Turn the delta into a segment; merge segments of similar size."""
        old, d = self._view
        segments = list(old)
        if d.filled:
            n = d.filled
            segments.append(
                _segment(d.keys[:n].copy(), d.rows[:n].copy(), d.tfs[:n].copy(), d.gens[:n].copy())
            )
        while len(segments) >= 2 and 4 * segments[-1].size >= segments[-2].size:
            newer, older = segments.pop(), segments.pop()
            segments.append(self._merge([older, newer]))
        self._view = (tuple(segments), self._new_delta())

    def _merge(self, parts: list[_Segment], alive: np.ndarray | None = None) -> _Segment:
        keys = np.concatenate([np.repeat(s.keys, np.diff(s.starts)) for s in parts]).astype(np.int32)
        rows = np.concatenate([s.rows for s in parts])
        gens = np.concatenate([s.gens for s in parts])
        tfs = np.concatenate([s.tfs for s in parts])
        keep = gens == self._gen[rows]  # replaced content goes
        if alive is not None:
            keep &= (rows < alive.shape[0]) & alive[np.minimum(rows, alive.shape[0] - 1)]
        return _segment(keys[keep], rows[keep], tfs[keep], gens[keep])

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
            self._view = ((self._merge(list(self._view[0]), alive),), self._view[1])
        return before - self.postings_count

    # -- readers ---------------------------------------------------------------------------------
    def postings(self, namespaces: list[int], terms: list[str], max_postings: int) -> QueryPostings:
        """The postings of ``terms`` in the namespaces (by id); a term in more than ``max_postings``
        rows of them is skipped (it says almost nothing about a memory)."""
        for _ in range(8):
            bumps = self._bumps
            found = self._gather(namespaces, terms)
            if self._bumps == bumps:  # no row's generation moved meanwhile: postings and generations agree
                break
        q_terms, rows, tfs, gens, current = found
        valid = gens == current
        per_term = np.bincount(q_terms[valid], minlength=len(terms))
        if (per_term > max_postings).any():
            keep = per_term[q_terms] <= max_postings
            q_terms, rows, tfs, gens, current = (
                q_terms[keep],
                rows[keep],
                tfs[keep],
                gens[keep],
                current[keep],
            )
        return QueryPostings(q_terms, len(terms), rows, tfs, gens, current)

    def _gather(self, namespaces: list[int], terms: list[str]) -> tuple[np.ndarray, ...]:
        """(query term, row, tf, generation, the row's current generation) of every posting."""
        (segments, delta), gen = self._view, self._gen  # (the generations as new as the view, or newer)
        wanted = [(self._key_ids.get((ns, t)), i) for i, t in enumerate(terms) for ns in namespaces]
        pairs = sorted((k, i) for k, i in wanted if k is not None)
        keys = np.array([k for k, _ in pairs], np.int32)
        labels = np.array([i for _, i in pairs], np.int32)
        parts: list[tuple[np.ndarray, ...]] = []
        for seg in segments if keys.shape[0] else ():
            parts.append(
                kernels.segment_postings(seg.keys, seg.starts, seg.rows, seg.tfs, seg.gens, keys, labels)
            )
        if delta.filled and keys.shape[0]:
            pos, lab = kernels.match_keys(delta.keys[: delta.filled], keys, labels)
            parts.append((lab, delta.rows[pos], delta.tfs[pos], delta.gens[pos]))
        if not parts:
            none = np.empty(0, np.int32)
            return none, none, np.empty(0, np.float32), none, none
        q_terms, rows, tfs, gens = (np.concatenate(column) for column in zip(*parts, strict=True))
        return q_terms, rows, tfs, gens, gen[rows]

    # -- snapshots -------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The postings as they stand (segments and a copy of the delta), with the key names, for the
        columns snapshot. Changes nothing: it runs between two commit groups."""
        segments, d = self._view
        n = d.filled
        delta = _Segment(
            d.keys[:n].copy(), np.empty(0, np.int64), d.rows[:n].copy(), d.tfs[:n].copy(), d.gens[:n].copy()
        )
        return {
            "keys": list(self._key_ids),
            "segments": [tuple(seg) for seg in segments],
            "delta": tuple(delta),  # keys per posting, unsorted (starts unused)
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
        index = cls()
        index._key_ids = {(int(ns), term): i for i, (ns, term) in enumerate(state["keys"])}
        segments = [_Segment(*seg) for seg in state["segments"]]
        keys, _, rows, tfs, gens = state["delta"]
        if keys.shape[0]:
            segments.append(_segment(keys, rows, tfs, gens))
        index._view = (tuple(seg for seg in segments if seg.size), index._view[1])
        index._gen = np.array(state["row_gen"], np.int32)
        index._row_hash = state["row_hash"]
        index.posted_rows = int(state["posted_rows"])
        index._row_ns, index._row_words, index._ns_words, index._ns_rows = state["lengths"]
        return index


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _grown(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, a.dtype)
    out[: a.shape[0]] = a
    return out


def bm25(
    index: KeywordIndex,
    namespaces: list[int],
    text: str,
    allowed: np.ndarray,
    n_docs: int,
    lengths: np.ndarray,
    max_postings: int,
    probe: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BM25 of the allowed rows holding a term of ``text``: (rows, scores, the ``probe`` rows' scores)."""
    probe = np.empty(0, np.int64) if probe is None else probe
    none = (np.empty(0, np.int64), np.empty(0, np.float32), np.zeros(probe.shape[0], np.float32))
    if n_docs == 0:
        return none
    q = index.postings(namespaces, list(keyword_terms(text)), max_postings)
    if q.rows.shape[0] == 0:
        return none
    avgdl = max(1.0, index.average_length(namespaces))
    return kernels.bm25(
        q.terms, q.n_terms, q.rows, q.tfs, q.gens, q.current, allowed, lengths, n_docs, avgdl, probe=probe
    )
