"""The memory record as the engine sees it, and its msgpack form in LMDB."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np

MetadataValue = str | int | float | bool


@dataclass(slots=True)
class Record:
    """One stored memory. Times are float epoch seconds; ``expire_at`` is None for no expiry.

    ``rid`` is the record's internal key (monotonic, never reused); ``vk`` identifies the record's
    current vector entry in its tier's HNSW index and changes whenever the vector moves (new
    embedding, new tier), so a stale entry in an index snapshot can never be mistaken for a live one.
    """

    rid: int
    id: str
    namespace: str
    content: str
    kind: str
    tier: int
    importance: float
    source: str = ""
    topic: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, MetadataValue] = field(default_factory=dict)
    embedding_model: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    accessed_at: float = 0.0
    access_count: int = 0
    surprise: float = 0.0
    success_count: int = 0
    token_cost: int = 0
    source_ids: list[str] = field(default_factory=list)
    expire_at: float | None = None
    vk: int = 0
    tier_since: float = 0.0  # when it entered its tier
    access_base: int = 0  # access_count when it entered its tier
    success_base: int = 0  # success_count when it entered its tier
    origin: list[Any] | None = None  # [namespace, id, tier, time] of the memory it was transferred from
    words: int = 0  # unused: postings carry their content's length (kept for the stored form)
    questions: list[str] = field(default_factory=list)  # questions a reflection addresses

    def answer_bytes(self) -> int:
        """At least the size of this memory in an answer, without its vector: its texts with their
        framing, and a margin for the fixed fields."""
        meta = (
            len(msgpack.packb(self.metadata, use_bin_type=True)) + 16 * len(self.metadata)
            if self.metadata
            else 0
        )
        texts = (
            self.content,
            self.namespace,
            self.id,
            self.kind,
            self.source,
            self.topic,
            self.embedding_model,
        )
        origin = 0 if not self.origin else len(str(self.origin[0]).encode()) + len(str(self.origin[1])) + 64
        framed = sum(
            len(t.encode()) + 5 for t in (*texts, *self.tags, *self.questions)
        )  # (tag, length: <= 5)
        return (
            framed
            + 132 * len(self.source_ids)  # (field 20: a two-byte tag)
            + meta
            + origin
            + 256  # (the numbers and times)
        )

    def expired(self, now: float) -> bool:
        return self.expire_at is not None and self.expire_at <= now

    def pack(self) -> bytes:
        """The stored form: a msgpack array of the fields in declaration order (new fields are
        only ever appended, with defaults, so an older, shorter array still reads)."""
        return msgpack.packb([getattr(self, f) for f in _RECORD_FIELDS], use_bin_type=True)

    @classmethod
    def unpack(cls, raw: bytes | memoryview) -> Record:
        """Read the stored form; also the map (field name -> value) that servers before the array
        form wrote. The array is ~3x faster to read and ~1/3 the bytes (no field names):
        search results decode their records on every call."""
        values = msgpack.unpackb(raw, raw=False)
        return cls(**values) if isinstance(values, dict) else cls(*values)


_RECORD_FIELDS = tuple(f.name for f in fields(Record))


@dataclass(slots=True)
class NewMemory:
    """A validated create request for one memory (vector already normalized, or None to embed)."""

    namespace: str
    content: str
    id: str = ""
    kind: str = ""
    tier: int = 0
    importance: float | None = None
    source: str = ""
    topic: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, MetadataValue] = field(default_factory=dict)
    embedding: Any = None  # np.ndarray float32, or None
    embedding_model: str = ""
    created_at: float | None = None
    token_cost: int = 0
    source_ids: list[str] = field(default_factory=list)
    expire_at: float | None = None
    questions: list[str] = field(default_factory=list)

    def fingerprint_parts(self) -> list[Any]:
        emb = None if self.embedding is None else bytes(np.asarray(self.embedding, np.float32).tobytes())
        return [
            self.namespace,
            self.content,
            self.id,
            self.kind,
            self.tier,
            self.importance,
            self.source,
            self.topic,
            self.tags,
            sorted(self.metadata.items()),
            emb,
            self.embedding_model,
            self.created_at,
            self.token_cost,
            self.source_ids,
            self.expire_at,
            self.questions,
        ]


def enter_tier(rec: Record, tier: int, now: float) -> None:
    """Move a record to ``tier``: promotion evidence (accesses, successes) counts from here on."""
    rec.tier = tier
    rec.tier_since = now
    rec.access_base = rec.access_count
    rec.success_base = rec.success_count
