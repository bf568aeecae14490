"""Columns snapshots and the change log (server/snapshots.py, storage ``changes``).

A start-up that restores the columns snapshot and reloads the records changed after it must build
exactly the state a start-up that decodes every record builds: same records per rid in every column
that matters, same tags and metadata indexes, same namespace counts, same search results. The
"crash" here is a close without a snapshot, which leaves LMDB (durable anyway) newer than the
snapshot on disk: the state kill -9 leaves, as far as snapshots go (tests/test_crash.py kills for real).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import FakeClock

from tiermem.server.config import ServerConfig
from tiermem.server.core import upkeep
from tiermem.server.core.engine import Engine
from tiermem.server.core.state import EngineState
from tiermem.server.index import snapshot_files
from tiermem.server.model.manifests import file_digest, sealed, unseal
from tiermem.server.model.records import NewMemory
from tiermem.server.model.types import Filter
from tiermem.server.search.searcher import SIMILARITY, SearchHit, SearchQuery
from tiermem.server.storage import snapshots

MODEL = "snap"
DIM = 16
FIELDS = ("tier", "importance", "created", "accessed", "access_count", "expire", "vk", "space")


def _engine(data: Path, clock: FakeClock, snapshot_on_shutdown: bool = True, **settings: Any) -> Engine:
    cfg = ServerConfig(
        data_dir=data,
        maintenance_interval_seconds=0,
        snapshot_interval_seconds=0,
        snapshot_on_shutdown=snapshot_on_shutdown,
        search_records_access=False,
        exact_search_max_rows=0,  # every search goes through the HNSW graphs
        **settings,
    )
    return Engine(cfg, clock=clock)


def _vec(rng: np.random.Generator) -> np.ndarray:
    v = rng.normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def _mem(rng: np.random.Generator, i: int, ns: str) -> NewMemory:
    return NewMemory(
        namespace=ns,
        content=f"memory {i} about topic {i % 7}",
        id=f"m{i}",
        importance=float(rng.random()),
        tags=[f"t{i % 3}"] + (["odd"] if i % 2 else []),
        metadata={"bucket": i % 5, "name": f"n{i % 4}"},
        embedding=_vec(rng),
        embedding_model=MODEL,
        expire_at=None if i % 9 else 1_800_000_000.0,
    )


def _state(e: Engine) -> dict[str, object]:
    """Everything start-up derives, keyed by rid (row numbers may differ between the two paths)."""
    cols = e.columns
    view = cols.view()
    out: dict[str, object] = {}
    for rid, row in sorted(cols.rows.items()):
        rec = {f: getattr(view, f)[row].item() for f in FIELDS}
        rec["ns"] = cols.namespaces.names[int(view.ns[row])]
        rec["kind"] = cols.kinds.names[int(view.kind[row])]
        rec["alive"] = bool(view.alive[row])
        rec["tags"] = sorted(t for t, rows in cols.tags.items() if row in rows)
        rec["meta"] = {k: v[row] for k, v in cols.metadata.items() if row in v}
        rec["indexed"] = int(view.vpos[row]) >= 0
        out[f"rid{rid}"] = rec
    out["ns_counts"] = dict(sorted(cols.ns_counts.items()))
    return out


def _searches(e: Engine, queries: np.ndarray) -> list[list[tuple[str, str]]]:
    results = []
    for q in queries:
        for flt in (Filter(), Filter(tags_any=["odd"]), Filter(where='{"metadata.bucket": {"$lt": 2}}')):
            hits = e.search(
                SearchQuery(
                    namespaces=["a", "b"],
                    embedding=q,
                    embedding_model=MODEL,
                    filter=flt,
                    limit=8,
                    read_only=True,
                )
            )
            results.append([(h.record.namespace, h.record.id) for h in hits])
    return results


@pytest.mark.timeout(120)
def test_snapshot_plus_change_log_equals_decoding_every_record(tmp_path: Path) -> None:
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(5)
    queries = np.stack([_vec(rng) for _ in range(6)])

    e = _engine(data, clock)
    e.create([_mem(rng, i, "a" if i % 2 else "b") for i in range(300)], batch=True)
    e.create([NewMemory(namespace="c", content=f"text only {i}", id=f"c{i}") for i in range(20)])
    for i in range(0, 40, 4):
        e.delete("a" if i % 2 else "b", f"m{i}")
    e.close()  # clean: writes the columns snapshot
    snap = snapshots.load_columns(data / "indexes", e.store.instance)
    assert snap is not None
    seq_at_snapshot = snap[1]

    # Start from the snapshot, change things, and stop without a new snapshot.
    clock.advance(3600)
    e = _engine(data, clock, snapshot_on_shutdown=False)
    assert len(e.columns) == 300 - 10 + 20
    with e.store.read() as txn:
        assert e.store.changed_since(txn, seq_at_snapshot) == []  # the clean close pruned the log
    e.create([_mem(rng, i, "a" if i % 3 else "b") for i in range(300, 360)], batch=True)
    for i in range(41, 80, 2):  # odd ids live in "a"
        e.update(
            "a",
            f"m{i}",
            NewMemory(namespace="a", content="", importance=1.0, tags=["new"]),
            ["importance", "tags"],
        )
    for i in range(81, 121, 2):
        e.update(
            "a",
            f"m{i}",
            NewMemory(namespace="a", content="", embedding=_vec(rng), embedding_model=MODEL),
            ["embedding"],
        )
    for i in range(121, 141, 2):  # tier moves: new vector keys, another index
        e.update("a", f"m{i}", NewMemory(namespace="a", content="", tier=1), ["tier"])
    for i in range(142, 170, 2):
        e.delete("b", f"m{i}")
    e.transfer("b", "m170", target_namespace="c", move=True)
    with e.store.read() as txn:
        changed = e.store.changed_since(txn, seq_at_snapshot)
    assert len(changed) >= 60 + 20 + 20 + 10 + 14
    e.close()

    restored = _engine(data, clock, snapshot_on_shutdown=False)  # snapshot + change log
    assert snapshots.load_columns(data / "indexes", restored.store.instance) is not None
    state_restored = _state(restored)
    found_restored = _searches(restored, queries)
    restored.close()

    (data / "indexes" / "columns.json").unlink()  # no snapshot: decode every record
    scanned = _engine(data, clock, snapshot_on_shutdown=False)
    state_scanned = _state(scanned)
    found_scanned = _searches(scanned, queries)
    scanned.close()

    assert state_restored == state_scanned
    assert found_restored == found_scanned
    assert any(found_restored)


def test_a_damaged_or_foreign_snapshot_is_ignored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(6)
    e = _engine(data, clock)
    e.create([_mem(rng, i, "a") for i in range(50)], batch=True)
    e.close()
    manifest = data / "indexes" / "columns.json"
    [columns] = list((data / "indexes").glob("columns.*.bin"))
    columns.write_bytes(columns.read_bytes()[:100])  # truncated
    e = _engine(data, clock)
    assert len(e.columns) == 50
    hits = e.search(
        SearchQuery(namespaces=["a"], text="", embedding=_vec(rng), embedding_model=MODEL, limit=3)
    )
    assert len(hits) == 3
    e.close()  # writes a good snapshot again
    assert snapshots.load_columns(data / "indexes", e.store.instance) is not None
    assert snapshots.load_columns(data / "indexes", "another-instance") is None
    manifest.write_text("{not json")
    assert snapshots.load_columns(data / "indexes", e.store.instance) is None
    e = _engine(data, clock)
    assert len(e.columns) == 50
    e.close()


def test_keyword_postings_of_an_earlier_tokenizer_are_rebuilt_at_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A columns snapshot whose keyword terms were lower-cased (versions before case folding) is
    not mixed with case-folded ones: start-up reads every record again, and keywords match."""
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(8)
    e = _engine(data, clock)
    street = e.create(
        [NewMemory(namespace="a", content="Die Straße am Fluss", embedding=_vec(rng), embedding_model=MODEL)]
    )[0]
    e.create([_mem(rng, i, "a") for i in range(20)], batch=True)
    instance = e.store.instance
    e.close()
    state, seq = snapshots.load_columns(data / "indexes", instance) or pytest.fail("no snapshot")
    del state["keywords"]["tokenizer"]  # (as written before case folding)
    snapshots.save_columns(data / "indexes", state, seq, instance)
    with caplog.at_level(logging.WARNING):
        e = _engine(data, clock)
    assert any("tokenizer" in r.getMessage() for r in caplog.records)
    assert len(e.columns) == 21
    hits = e.search(
        SearchQuery(
            namespaces=["a"],
            text="STRASSE",
            embedding=_vec(rng),
            embedding_model=MODEL,
            hybrid=True,
            strategy=SIMILARITY,
            limit=3,
            read_only=True,
        )
    )
    assert [h.record.id for h in hits if h.keyword_rank] == [street.id]
    e.close()


def _blake2b_of_parts(raw: bytes) -> str:
    """An index file's checksum as versions before XXH3 wrote it: BLAKE2b (128 bits) of each 16 MiB
    part, then of their digests."""
    part = 16 << 20
    digests = [
        hashlib.blake2b(raw[i : i + part], digest_size=16).digest() for i in range(0, max(1, len(raw)), part)
    ]
    return hashlib.blake2b(b"".join(digests), digest_size=16).hexdigest()


def _as_written_before_xxh3(index_dir: Path) -> list[Path]:
    """Rewrite the snapshot manifests as versions before XXH3 wrote them: no hash named, BLAKE2b
    digests (the columns' under the key "blake2b"). Returns the index manifests."""
    m = index_dir / "columns.json"
    fields = unseal(m.read_text(), snapshots.VERSION)
    assert (fields.pop("hash"), len(fields.pop("checksum"))) == ("xxh3_128", 32)
    raw = (index_dir / f"columns.{fields['token']}.bin").read_bytes()
    m.write_text(sealed({**fields, "blake2b": hashlib.blake2b(raw, digest_size=16).hexdigest()}))
    index_manifests = sorted(index_dir.glob("*-t[0-9].json"))
    for m in index_manifests:
        fields = unseal(m.read_text(), snapshot_files.VERSION)
        assert fields.pop("hash") == "xxh3_128"
        for key, suffix in (("index", "faiss"), ("vks", "vks.npy")):
            raw = m.with_name(f"{m.stem}.{fields['token']}.{suffix}").read_bytes()
            fields[key] = [len(raw), _blake2b_of_parts(raw)]
        m.write_text(sealed(fields))
    return index_manifests


def test_snapshots_checksummed_before_xxh3_are_still_used_and_still_checked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data, index_dir = tmp_path / "data", tmp_path / "data" / "indexes"
    clock = FakeClock()
    rng = np.random.default_rng(8)
    e = _engine(data, clock)
    e.create([_mem(rng, i, "a") for i in range(60)], batch=True)
    deadline = time.monotonic() + 30  # every vector in HNSW, so the index snapshot holds them
    while any(ix.pending for sp in e.spaces.values() for ix in sp.indexes.values()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    instance = e.store.instance
    e.close()
    index_manifests = _as_written_before_xxh3(index_dir)
    assert index_manifests
    for m in index_manifests:  # read and checked by BLAKE2b, as that version wrote it
        read = snapshot_files.read_snapshot(m.with_suffix(""), MODEL, DIM, instance)
        assert read is not None and read[0].ntotal == unseal(m.read_text(), snapshot_files.VERSION)["n"] > 0
    assert snapshots.load_columns(index_dir, instance) is not None

    caplog.set_level(logging.INFO)
    # Used, not rebuilt: no warning, the columns from the snapshot (and its manifests kept as they
    # are: no snapshot at this close).
    e = _engine(data, clock, snapshot_on_shutdown=False)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records
    assert any("from a snapshot and 0 changed records" in r.getMessage() for r in caplog.records)
    assert len(e.columns) == 60
    e.close()

    # Still checked, by BLAKE2b: a flipped byte in any of the files is a checksum mismatch (in the
    # stored vectors of the .faiss file, which FAISS itself would read as they are).
    for pattern, from_end in (("*.faiss", 1000), ("*.vks.npy", 100), ("columns.*.bin", 100)):
        copy = tmp_path / f"damaged-{pattern[2:6]}"
        shutil.copytree(index_dir, copy)
        [target] = list(copy.glob(pattern))
        raw = bytearray(target.read_bytes())
        raw[len(raw) - from_end] ^= 0xFF
        target.write_bytes(bytes(raw))
        caplog.clear()
        if pattern.startswith("columns"):
            assert snapshots.load_columns(copy, instance) is None
        else:
            assert snapshots.load_columns(copy, instance) is not None  # (only the damaged one refused)
            assert snapshot_files.read_snapshot(copy / index_manifests[0].stem, MODEL, DIM, instance) is None
        assert any("checksum mismatch" in r.getMessage() for r in caplog.records), caplog.records
    # A hash this version does not know, or one named without its checksum: damage too.
    columns = index_dir / "columns.json"
    fields = unseal(columns.read_text(), snapshots.VERSION)
    for changed, message in (
        ({"hash": "md5", "checksum": fields["blake2b"]}, "unknown file checksum 'md5'"),
        ({"hash": "xxh3_128"}, "'checksum'"),
    ):
        columns.write_text(sealed({**fields, **changed}))
        caplog.clear()
        assert snapshots.load_columns(index_dir, instance) is None
        assert any("damaged" in r.getMessage() and message in r.getMessage() for r in caplog.records)


def test_the_file_hashes_by_name() -> None:
    assert file_digest("xxh3_128").digest() != file_digest("blake2b").digest()
    assert len(file_digest("xxh3_128").hexdigest()) == len(file_digest("blake2b").hexdigest()) == 32
    with pytest.raises(ValueError, match="unknown file checksum 'sha1'"):
        file_digest("sha1")


def test_periodic_snapshot_runs_while_serving(tmp_path: Path) -> None:
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(7)
    e = _engine(data, clock, snapshot_on_shutdown=False)
    e.create([_mem(rng, i, "a") for i in range(40)], batch=True)
    e.snapshot()  # what the periodic thread calls: columns copied in the writer thread
    snap = snapshots.load_columns(data / "indexes", e.store.instance)
    assert snap is not None and snap[0]["n"] == 40
    with e.store.read() as txn:
        assert e.store.changed_since(txn, 0) == []  # the log is pruned up to the snapshot
    e.create([_mem(rng, i, "a") for i in range(40, 45)], batch=True)
    with e.store.read() as txn:
        assert len(e.store.changed_since(txn, snap[1])) == 5
    e.close()
    e = _engine(data, clock, snapshot_on_shutdown=False)
    assert len(e.columns) == 45
    assert {
        h.record.id
        for h in e.search(SearchQuery(namespaces=["a"], embedding=_vec(rng), embedding_model=MODEL, limit=45))
    } == {f"m{i}" for i in range(45)}
    e.close()


def test_spaces_first_used_in_another_order_than_their_names(tmp_path: Path) -> None:
    """Space ids follow first use while serving and model-name order at start-up: a snapshot's space
    column is renumbered, so each memory stays in its own space (different dimensions here)."""
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(8)
    e = _engine(data, clock)
    zz = [rng.normal(size=8).astype(np.float32) for _ in range(6)]
    aa = [rng.normal(size=4).astype(np.float32) for _ in range(6)]
    e.create(
        [
            NewMemory(namespace="n", content=f"z{i}", id=f"z{i}", embedding=v, embedding_model="zz")
            for i, v in enumerate(zz)
        ]
    )
    e.create(
        [
            NewMemory(namespace="n", content=f"a{i}", id=f"a{i}", embedding=v, embedding_model="aa")
            for i, v in enumerate(aa)
        ]
    )
    assert [sp.model for sp in e.state.space_list[:2]] == ["zz", "aa"]
    e.close()
    e = _engine(data, clock, snapshot_on_shutdown=False)
    assert snapshots.load_columns(data / "indexes", e.store.instance) is not None
    for model, vecs, prefix in (("zz", zz, "z"), ("aa", aa, "a")):
        for i, v in enumerate(vecs):
            hits = e.search(
                SearchQuery(
                    namespaces=["n"], embedding=v, embedding_model=model, limit=1, alpha=1, beta=0, gamma=0
                )
            )
            assert [h.record.id for h in hits] == [f"{prefix}{i}"]
    restored = _state(e)
    e.close()
    (data / "indexes" / "columns.json").unlink()
    e = _engine(data, clock, snapshot_on_shutdown=False)
    assert _state(e) == restored
    e.close()


def _lmdb_rolled_back(tmp_path: Path, clock: FakeClock, kept: list[NewMemory], lost: list[NewMemory]) -> Path:
    """A data directory whose snapshots (written at close) hold ``kept`` and ``lost`` while its
    LMDB, an older copy, holds ``kept`` alone; returns the directory."""
    data = tmp_path / "data"
    e = _engine(data, clock)
    e.create(kept, batch=True)
    e.close()
    shutil.copytree(data / "lmdb", tmp_path / "lmdb-copy")
    e = _engine(data, clock)
    e.create(lost, batch=True)
    e.close()
    shutil.rmtree(data / "lmdb")
    shutil.copytree(tmp_path / "lmdb-copy", data / "lmdb")
    return data


def test_a_snapshot_newer_than_lmdb_is_ignored(tmp_path: Path) -> None:
    """LMDB restored from an older copy (same instance id) next to a newer snapshot: the snapshot
    would hold memories LMDB no longer has, so start-up decodes every record instead."""
    clock = FakeClock()
    rng = np.random.default_rng(9)
    kept = [_mem(rng, i, "a") for i in range(5)]
    data = _lmdb_rolled_back(
        tmp_path, clock, kept, [_mem(rng, i, "a") for i in range(5, 10)]
    )  # snapshot of 10
    e = _engine(data, clock)
    assert len(e.columns) == 5
    assert e.columns.ns_counts == {"a": 5}
    e.create([_mem(rng, i, "a") for i in range(10, 12)], batch=True)
    assert len(e.columns) == 7 and e.columns.ns_counts == {"a": 7}
    rids = list(e.columns.rows)
    assert len(rids) == len(set(rids)) == 7
    e.close()


def test_vector_keys_lmdb_hands_out_again_never_revive_a_snapshots_lost_vectors(tmp_path: Path) -> None:
    """LMDB rolled back (an older copy; or sync off and a power loss) under an index snapshot that
    holds the lost memories' entries: the new memories get the same vector keys again. Each must
    keep its own vector, at this start-up and at every later one (the lost entries' keys do not
    travel into later snapshots)."""
    clock = FakeClock()
    rng = np.random.default_rng(10)
    kept = [_mem(rng, i, "a") for i in range(20)]
    lost = [_mem(rng, i, "a") for i in range(20, 24)]
    data = _lmdb_rolled_back(tmp_path, clock, kept, lost)  # an index snapshot of 24 entries
    for start in range(2):
        e = _engine(data, clock)
        if start == 0:
            new = [_mem(rng, i, "a") for i in range(30, 34)]
            e.create(new, batch=True)  # (the vector keys the lost ones had)
        for m in new:
            hit = _nearest(e, m)
            assert hit.record.id == m.id and hit.relevance > 0.999, (start, m.id)
        for m in lost:
            assert _nearest(e, m).relevance < 0.999, (start, m.id)  # (gone with LMDB's rollback)
        e.close()


def _nearest(e: Engine, m: NewMemory) -> SearchHit:
    """The memory of namespace "a" most similar to ``m``'s vector."""
    q = SearchQuery(
        namespaces=["a"], embedding=m.embedding, embedding_model=MODEL, limit=1, strategy=SIMILARITY
    )
    return e.search(q)[0]


def test_get_many_reads_what_get_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    e = _engine(tmp_path / "d", FakeClock())
    try:
        recs = e.create([_mem(rng, i, "ns") for i in range(20)], batch=True)
        e.delete("ns", "m3")
        rids = [*[r.rid for r in recs][::-1], 10**9, recs[0].rid]  # reversed, a missing rid, a repeat
        with e.store.read() as txn:
            many = e.store.get_many(txn, rids)
            one = [e.store.get(txn, rid) for rid in rids]
        assert many == one
        assert many[-2] is None and many[rids.index(recs[3].rid)] is None
        assert [r.id for r in many if r is not None][:3] == ["m19", "m18", "m17"]
    finally:
        e.close()


def test_a_write_that_failed_to_apply_is_not_hidden_by_snapshots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A committed write whose in-memory apply fails (a bug, injected here) is in LMDB but not in
    the columns. Snapshots taken after it must not carry that gap into the next start-up."""
    from tiermem.server.model.errors import TiermemError

    rng = np.random.default_rng(17)
    clock = FakeClock()
    e = _engine(tmp_path / "d", clock)
    try:
        e.create([_mem(rng, i, "ns") for i in range(10)], batch=True)
        e.snapshot()  # a good snapshot before the failure
        real = upkeep.index_new
        calls = {"n": 0}

        def failing(st: EngineState, items: list) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("injected apply failure")
            real(st, items)

        monkeypatch.setattr(upkeep, "index_new", failing)
        lost = _mem(rng, 10, "ns")
        with pytest.raises(TiermemError, match="committed but not applied"):
            e.create([lost])
        e.create([_mem(rng, 11, "ns")])
        e.snapshot()  # periodic snapshot after the failure
    finally:
        e.close()  # and the shutdown snapshot
    e = _engine(tmp_path / "d", clock)
    try:
        rec, _ = e.get("ns", "m10")
        assert rec.content == lost.content
        hits = e.search(
            SearchQuery(namespaces=["ns"], embedding=lost.embedding, embedding_model=MODEL, strategy=4)
        )
        assert hits[0].record.id == "m10"
        assert e.stats().memory_count == 12
    finally:
        e.close()


def _start(data: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture, pending_max: int) -> Engine:
    import logging

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tiermem.server.core.startup"):
        return _engine(data, clock, snapshot_on_shutdown=False, startup_pending_max=pending_max)


def _from_lmdb(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "from LMDB" in r.getMessage()]


def _wait_indexed(e: Engine, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while any(i.pending for i in e.spaces[MODEL].indexes.values()) and time.monotonic() < end:
        time.sleep(0.01)


def _finds_each(e: Engine, mems: list[NewMemory]) -> None:
    for m in mems:  # each finds itself first, pending or not
        query = SearchQuery(
            namespaces=["a"], embedding=m.embedding, embedding_model=MODEL, limit=1, alpha=1, beta=0, gamma=0
        )
        assert [h.record.id for h in e.search(query)] == [m.id]


def test_vectors_an_index_snapshot_lacks_are_pending_at_start_up_however_many(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kill -9 after a bulk load the last snapshot missed: 210 times as many vectors as the
    snapshot holds (and more than a write may leave pending) come back as pending entries
    (searchable at once, indexed after SERVING), not indexed before serving; so do all of them
    without an index snapshot; up to startup_pending_max, past which the rest is indexed first."""
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(12)
    mems = [_mem(rng, i, "a") for i in range(4220)]
    e = _engine(data, clock)
    e.create(mems[:20], batch=True)
    _wait_indexed(e)  # a shutdown snapshot leaves pending vectors out
    e.close()  # snapshot: 20
    e = _engine(data, clock, snapshot_on_shutdown=False)
    for lo in range(20, 4220, 1000):
        e.create(mems[lo : lo + 1000], batch=True)
    e.close()  # no snapshot: LMDB holds 4,200 vectors the index snapshot lacks, as after a kill -9
    cases = [
        (4200, "20 vectors from snapshot, 4200 from LMDB (0 indexed before serving, 4200 pending"),
        (4000, "20 vectors from snapshot, 4200 from LMDB (200 indexed before serving, 4000 pending"),
        # No index snapshot to start from (lost, or compaction): every vector, the same way.
        (5000, "0 vectors from snapshot, 4220 from LMDB (0 indexed before serving, 4220 pending"),
        (0, "0 vectors from snapshot, 4220 from LMDB (4220 indexed before serving, 0 pending"),
    ]
    for case, (pending_max, expect) in enumerate(cases):
        if case == 2:
            for f in (data / "indexes").glob("*-t3*"):
                f.unlink()
        e = _start(data, clock, caplog, pending_max)
        try:
            assert _from_lmdb(caplog) == [f"index {MODEL}/3: {expect}, indexed in the background)"]
            _finds_each(e, mems[::301])
            _wait_indexed(e)
            assert e.spaces[MODEL].indexes[3].counts() == (4220, 0, 4220)
            _finds_each(e, mems[150::301])
        finally:
            e.close()


def test_a_compacted_index_comes_back_pending(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An index snapshot with over 25% of its entries dead is rebuilt from LMDB at start-up; its
    live vectors are pending (searchable) rather than indexed before serving."""
    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(13)
    mems = [_mem(rng, i, "a") for i in range(400)]
    e = _engine(data, clock)
    e.create(mems, batch=True)
    _wait_indexed(e)
    e.close()  # snapshot: 400
    e = _engine(data, clock, snapshot_on_shutdown=False)
    for m in mems[:150]:
        e.delete("a", m.id)
    e.close()  # 150 of the snapshot's 400 entries are dead now (37.5%)
    e = _start(data, clock, caplog, 1000)
    try:
        messages = [r.getMessage() for r in caplog.records]
        assert f"rebuilding index {MODEL}/3: 150 of 400 entries dead" in messages
        assert _from_lmdb(caplog) == [
            f"index {MODEL}/3: 0 vectors from snapshot, 250 from LMDB (0 indexed before serving, "
            "250 pending, indexed in the background)"
        ]
        _finds_each(e, mems[150::25])
        _wait_indexed(e)
        assert e.spaces[MODEL].indexes[3].counts() == (250, 0, 250)
    finally:
        e.close()


def test_the_indexes_of_a_space_share_the_start_up_pending_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A search scans the pending vectors of every index of its space: startup_pending_max bounds
    them all together, the first indexes (by tier) taking it first."""
    from dataclasses import replace

    data = tmp_path / "data"
    clock = FakeClock()
    rng = np.random.default_rng(14)
    mems = [replace(_mem(rng, i, "a"), tier=2 if i % 5 < 2 else 3) for i in range(500)]  # 200 / 300
    e = _engine(data, clock, snapshot_on_shutdown=False)
    e.create(mems, batch=True)
    e.close()  # no index snapshots
    e = _start(data, clock, caplog, 400)
    try:
        assert _from_lmdb(caplog) == [
            f"index {MODEL}/2: 0 vectors from snapshot, 200 from LMDB (0 indexed before serving, "
            "200 pending, indexed in the background)",
            f"index {MODEL}/3: 0 vectors from snapshot, 300 from LMDB (100 indexed before serving, "
            "200 pending, indexed in the background)",
        ]
        _finds_each(e, mems[::37])
        _wait_indexed(e)
        assert [e.spaces[MODEL].indexes[t].counts() for t in (2, 3)] == [(200, 0, 200), (300, 0, 300)]
    finally:
        e.close()


def test_records_are_stored_as_arrays_and_the_older_map_form_still_reads(tmp_path: Path) -> None:
    """Records are msgpack arrays of their fields (about a third of the bytes of a map with field
    names); records a server before the array form wrote as maps read back unchanged."""
    import dataclasses

    import msgpack

    from tiermem.server.model.records import Record
    from tiermem.server.storage.store import rid_key

    clock, rng = FakeClock(1_700_000_000.0), np.random.default_rng(3)
    data = tmp_path / "data"
    eng = _engine(data, clock)
    made = eng.create([_mem(rng, i, "ns") for i in range(20)])
    with eng.store.read() as txn:
        raws = {r.rid: bytes(txn.get(rid_key(r.rid), db=eng.store.records)) for r in made}
    assert all(isinstance(msgpack.unpackb(raw, raw=False), list) for raw in raws.values())
    # Rewrite half of them in the map form (field name -> value), as older servers stored them.
    old_form = made[::2]
    with eng.store.env.begin(write=True) as txn:
        for r in old_form:
            as_map = {f.name: getattr(r, f.name) for f in dataclasses.fields(Record)}
            txn.put(rid_key(r.rid), msgpack.packb(as_map, use_bin_type=True), db=eng.store.records)
            assert len(msgpack.packb(as_map, use_bin_type=True)) > 2 * len(raws[r.rid])
    eng.close()
    eng = _engine(data, clock)
    try:
        for r in made:
            got, _ = eng.get("ns", r.id)
            assert got == r
        hits = eng.search(
            SearchQuery(namespaces=["ns"], embedding=_vec(rng), embedding_model=MODEL, limit=20)
        )
        assert sorted(h.record.id for h in hits) == sorted(r.id for r in made)
        # An update of an old-form record stores it in the array form.
        eng.update(
            "ns", old_form[0].id, NewMemory(namespace="ns", content="", importance=0.99), ["importance"]
        )
        with eng.store.read() as txn:
            raw = bytes(txn.get(rid_key(old_form[0].rid), db=eng.store.records))
        assert isinstance(msgpack.unpackb(raw, raw=False), list)
        assert eng.get("ns", old_form[0].id)[0].importance == pytest.approx(0.99)
    finally:
        eng.close()


def test_metadata_filters_on_a_view_older_than_the_metadata_arrays(tmp_path: Path) -> None:
    """A search may hold a columns view taken before later creates: a metadata filter evaluated
    on it covers exactly its rows, whatever the key's (newer, longer) value arrays hold."""
    import json

    from tiermem.server.index.filters import compile_where

    clock, rng = FakeClock(1_700_000_000.0), np.random.default_rng(5)
    eng = _engine(tmp_path / "data", clock)
    try:
        values: list[Any] = [3, 7.5, "x", True, 12, "y", False, 0]
        first = []
        for i in range(40):
            m = _mem(rng, i, "ns")
            m.metadata = {"v": values[i % len(values)]}
            first.append(m)
        eng.create(first)
        old = eng.columns.view()
        later = []
        for i in range(40, 80):
            m = _mem(rng, i, "ns")
            m.metadata = {"v": values[i % len(values)]}
            later.append(m)
        eng.create(later)
        assert eng.columns.view().n > old.n
        by_row = {row: eng.columns.metadata["v"].get(row) for row in range(eng.columns.view().n)}
        cases = [
            ({"$lt": 8}, lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v < 8),
            ({"$ne": "x"}, lambda v: not (isinstance(v, str) and v == "x")),
            (
                {"$in": [True, 12]},
                lambda v: (isinstance(v, bool) and v is True) or (type(v) is int and v == 12),
            ),
            ({"$gte": "x"}, lambda v: isinstance(v, str) and v >= "x"),
        ]
        for cond, want in cases:
            mask = compile_where(json.dumps({"metadata.v": cond}))(old, eng.columns)
            assert mask.shape == (old.n,)
            expected = np.array(
                [
                    want(by_row[r]) if by_row[r] is not None else cond.get("$ne") is not None
                    for r in range(old.n)
                ]
            )
            assert (mask == expected).all(), cond
    finally:
        eng.close()


def test_columns_keep_each_rows_metadata_and_tags_through_changes_removals_and_a_restore() -> None:
    """Rows share their metadata keys and tags (up to KEYSETS_MAX distinct sets each, past it a row
    keeps its own): whatever they share, each row's values (of their kind), and tags, are what
    its last record said, through changes, removals and ``state`` / ``restore``; and the common
    keys stay shared after a restore however many distinct tag sets came before them."""
    from conftest import make_record

    from tiermem.server.index.columns import KEYSETS_MAX, Columns

    cols = Columns(capacity=8)
    want: dict[int, tuple[dict[str, Any], list[str]]] = {}

    def put(rid: int, meta: dict[str, Any], tags: list[str]) -> None:
        rec = make_record(rid)
        rec.metadata, rec.tags = meta, tags
        if rid in cols.rows:
            cols.set(cols.rows[rid], rec, -1, -1)
        else:
            cols.add(rec, -1)
        want[rid] = (dict(meta), list(tags))

    n = 3 * KEYSETS_MAX + 300
    for rid in range(1, n + 1):  # every third row with a key of its own: more sets than are shared
        meta = {f"own{rid}": rid} if rid % 3 == 0 else {"bucket": rid % 5, "flag": rid % 2}
        put(rid, meta, [f"t{rid % 4}"] + ([f"u{rid}"] if rid % 2 == 0 else []))
    assert len(cols._shared_keys) == len(cols._shared_tags) == KEYSETS_MAX
    long_keys = {"k" * 200: 1, "j" * 100: 2}  # (past KEYSET_CHARS: kept, not shared)
    put(n + 1, long_keys, [])
    assert cols._row_meta[cols.rows[n + 1]] == tuple(long_keys)
    for rid in range(1, 400):
        meta, tags = want[rid]
        if rid % 3 == 1:  # an equal value of another kind, and a key added
            put(rid, {**meta, "flag": bool(meta["flag"]), "bucket": float(meta["bucket"]), "new": "x"}, tags)
        elif rid % 3 == 2:  # a key dropped, the tags cleared
            put(rid, {"bucket": meta["bucket"]}, [])
        else:  # a key of its own dropped for a shared one
            put(rid, {"bucket": 7}, tags[:1])
    gone = [rid for rid in range(5, n, 11)]
    gone_rows = [cols.rows[rid] for rid in gone]
    for rid in gone:
        cols.remove(rid, "ns")
        del want[rid]

    def seen(c: Columns) -> dict[int, tuple[dict[str, tuple[type, Any]], list[str]]]:
        return {
            rid: (
                {k: (type(v[row]), v[row]) for k, v in c.metadata.items() if row in v},
                sorted(t for t, rows in c.tags.items() if row in rows),
            )
            for rid, row in c.rows.items()
        }

    expected = {rid: ({k: (type(v), v) for k, v in m.items()}, sorted(t)) for rid, (m, t) in want.items()}
    assert seen(cols) == expected
    assert all(f"own{rid}" not in cols.metadata for rid in gone if rid % 3 == 0)
    assert not any(row in values for values in cols.metadata.values() for row in gone_rows)
    assert not any(row in rows for rows in cols.tags.values() for row in gone_rows)
    flags = cols.metadata_arrays("flag")
    rids = cols.column("rid")
    bools = {int(rids[r]) for r, v in zip(flags.rows[0], flags.values[0], strict=True) if v}
    assert bools == {rid for rid, (m, _) in want.items() if m.get("flag") is True}
    restored = Columns.restore(cols.state())
    assert seen(restored) == expected
    # Shared after a restore too, however many tag sets came first: one tuple for the common keys.
    common = [keys for keys in restored._row_meta.values() if keys == ("bucket", "flag")]
    assert len(common) > 1000 and len({id(keys) for keys in common}) == 1


def test_a_filter_built_while_a_metadata_key_is_dropped_does_not_keep_the_dropped_value() -> None:
    """A reader's metadata arrays built between the writer's steps of dropping a key from a row
    (another thread, in the server) must not stay cached with the row in them: the key's version
    moves after the value left, so arrays built before that are built again."""
    from conftest import make_record

    from tiermem.server.index.columns import Columns

    cols = Columns(capacity=8)
    for rid in (1, 2):
        rec = make_record(rid)
        rec.metadata = {"k": 5}
        cols.add(rec, -1)
    assert cols.metadata_arrays("k").rows[1].tolist() == [0, 1]

    class ReadMidway(dict):  # type: ignore[type-arg]
        def pop(self, *args: Any) -> Any:
            cols.metadata_arrays("k")  # a search's filter, between the writer's steps
            return super().pop(*args)

    cols.metadata["k"] = ReadMidway(cols.metadata["k"])
    dropped = make_record(1)
    dropped.metadata = {"other": 1}
    cols.set(cols.rows[1], dropped, -1, -1)
    assert cols.metadata_arrays("k").rows[1].tolist() == [1]
