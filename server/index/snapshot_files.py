"""The files of a vector index snapshot: their names, the manifest, durable writes and reading back.

A snapshot is ``<base>.<token>.faiss`` + ``<base>.<token>.vks.npy``, named by ``<base>.json`` (written
last, atomically). The token ties the three together: a crash mid-save leaves the previous manifest
pointing at the previous, complete files. ``instance`` is the LMDB environment's id, so a snapshot is
never applied to another database (e.g. a restored LMDB backup). Which entries a snapshot holds, and
the locking while FAISS writes it, are ``VectorIndex.save``'s business.

Damage is detected before FAISS reads a byte: the manifest carries the size and checksum of both
files (XXH3; BLAKE2b in snapshots of earlier versions) and a checksum of its own fields (the same
scheme as the columns snapshot, storage/snapshots.py); a mismatch discards the snapshot with a
warning, and start-up rebuilds the index from the vectors in LMDB. FAISS parses what it is given
without checking it: a damaged neighbour list would send searches astray (or out of bounds) and a
damaged length could ask for any amount of memory. The ``.npy`` file is read without pickle
(``np.load``'s default).
"""

from __future__ import annotations

import io
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import faiss
import numpy as np

from tiermem.server.cores import usable_cores
from tiermem.server.model.manifests import FILE_HASH, file_digest, file_hash_of, sealed, unseal

logger = logging.getLogger(__name__)

VERSION = 3  # 3: sizes and checksums of the files and of the manifest (an older snapshot is rebuilt)
_PART = 16 << 20  # bytes per checksummed part of a file


class HashingWriter:
    """A writable file that checksums what goes through it (FAISS's writer callback, np.save):
    the digest of the digests of its ``_PART``-byte parts, so reading it back can check the parts
    on every core at once (``file_checksum``), by the hash ``hash_name``."""

    def __init__(self, f: BinaryIO, hash_name: str = FILE_HASH) -> None:
        self.f = f
        self.hash_name = hash_name
        self.size = 0
        self._parts: list[bytes] = []
        self._part = file_digest(hash_name)
        self._filled = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = view.nbytes
        self.f.write(view)
        while view.nbytes:
            take = min(view.nbytes, _PART - self._filled)
            self._part.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == _PART:
                self._parts.append(self._part.digest())
                self._part, self._filled = file_digest(self.hash_name), 0
        self.size += n
        return n

    def checksum(self) -> tuple[int, str]:
        """(size, digest) of what was written."""
        last = [self._part.digest()] if self._filled or not self._parts else []
        return self.size, _combined(self._parts + last, self.hash_name)


def _combined(parts: list[bytes], hash_name: str) -> str:
    check = file_digest(hash_name)
    for part in parts:
        check.update(part)
    return str(check.hexdigest())


def file_checksum(path: Path, hash_name: str) -> tuple[int, str]:
    """(size, digest) of a file as ``HashingWriter`` computes it by ``hash_name``, its parts read and
    hashed on every core (pread and the hashes let go of the GIL): a large index costs little more
    than reading."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size

        def part(i: int) -> bytes:
            want = min(_PART, size - i * _PART)
            data = os.pread(fd, want, i * _PART)
            if len(data) != want:
                raise ValueError(f"{path.name}: short read")
            check = file_digest(hash_name)
            check.update(data)
            return bytes(check.digest())

        count = max(1, -(-size // _PART))
        if count == 1:
            return size, _combined([part(0)], hash_name)
        with ThreadPoolExecutor(min(count, usable_cores()), thread_name_prefix="tiermem-check") as pool:
            return size, _combined(list(pool.map(part, range(count))), hash_name)
    finally:
        os.close(fd)


def bytes_checksum(data: bytes, hash_name: str) -> tuple[int, str]:
    """(size, digest) of ``data`` as ``HashingWriter`` computes it by ``hash_name``."""
    view = memoryview(data)
    parts = []
    for start in range(0, max(1, view.nbytes), _PART):
        check = file_digest(hash_name)
        check.update(view[start : start + _PART])
        parts.append(bytes(check.digest()))
    return view.nbytes, _combined(parts, hash_name)


@dataclass(frozen=True)
class SnapshotFiles:
    """The data files of one snapshot, tied together by ``token``."""

    token: str
    index: Path  # the FAISS index
    vks: Path  # the vector key of every entry, by internal id


def _files(base: Path, token: str) -> SnapshotFiles:
    return SnapshotFiles(
        token, base.with_name(f"{base.name}.{token}.faiss"), base.with_name(f"{base.name}.{token}.vks.npy")
    )


def new_snapshot_files(base: Path) -> SnapshotFiles:
    """Names for the files of a new snapshot of ``base`` (none of the current one's)."""
    return _files(base, uuid.uuid4().hex[:16])


@dataclass(frozen=True)
class Manifest:
    """What ``<base>.json`` records of a snapshot."""

    model: str
    dim: int
    n: int  # entries in the FAISS index
    token: str
    instance: str
    index_checksum: tuple[int, str]  # (size, digest) of the FAISS file as written
    checksum_hash: str  # the hash of the digests (``HashingWriter.hash_name``)


def commit_snapshot(base: Path, files: SnapshotFiles, vks: np.ndarray, manifest: Manifest) -> None:
    """Make a snapshot whose FAISS index is already written to ``files.index`` the current one:
    fsync it, write the vks, then the manifest (atomically), then drop the previous snapshot's files.
    On failure (a full disk) the new files are removed and the previous snapshot stays current."""
    tmp_manifest = base.with_name(f"{base.name}.json.tmp")
    try:
        _fsync(files.index)
        with open(files.vks, "wb") as f:
            out = HashingWriter(f, manifest.checksum_hash)
            np.save(out, vks)
            f.flush()
            os.fsync(f.fileno())
        fields = {
            "model": manifest.model,
            "dim": manifest.dim,
            "n": manifest.n,
            "token": manifest.token,
            "instance": manifest.instance,
            "version": VERSION,
            "index": list(manifest.index_checksum),
            "vks": list(out.checksum()),
            "hash": manifest.checksum_hash,
        }
        tmp_manifest.write_text(sealed(fields))
        _fsync(tmp_manifest)
        os.replace(tmp_manifest, base.with_name(f"{base.name}.json"))
    except BaseException:
        discard(files)
        tmp_manifest.unlink(missing_ok=True)
        raise
    _fsync(base.parent)
    for old in base.parent.glob(f"{base.name}.*"):
        if old.suffix in (".faiss", ".npy") and f".{files.token}." not in old.name:
            old.unlink(missing_ok=True)


def discard(files: SnapshotFiles) -> None:
    """Remove the files of a snapshot that was not completed."""
    files.index.unlink(missing_ok=True)
    files.vks.unlink(missing_ok=True)


def read_snapshot(
    base: Path, model: str, dim: int, instance: str, mapped: bool = False
) -> tuple[Any, np.ndarray, str] | None:
    """(FAISS index, vks by internal id, token) of the snapshot of ``base``, or None when there is none
    for this model, dimension and database, or it is damaged (then with a warning). A snapshot
    replaced while it is read (a search follower loading while its leader writes the next one) is
    read again from the new manifest. ``mapped``: the index's arrays are mapped from the file, not
    read (the file is never rewritten, so it stays what the checksum saw)."""
    manifest_path = base.with_name(f"{base.name}.json")
    token = None
    for _ in range(3):
        try:
            manifest = unseal(manifest_path.read_text(), VERSION)
            if manifest.get("version") != VERSION:
                logger.info("index snapshot %s of another version: rebuilt from LMDB", base.name)
                return None
            if (
                manifest.get("model") != model
                or manifest.get("dim") != dim
                or manifest.get("instance") != instance
            ):
                return None
            token = manifest["token"]
            files = _files(base, token)
            raw_vks = files.vks.read_bytes()
            hash_name = file_hash_of(manifest)
            if list(bytes_checksum(raw_vks, hash_name)) != manifest["vks"]:
                raise ValueError(f"{files.vks.name}: checksum mismatch")
            # Checked whole before FAISS parses it (files are never rewritten: a new token each save)
            if list(file_checksum(files.index, hash_name)) != manifest["index"]:
                raise ValueError(f"{files.index.name}: checksum mismatch")
            index: Any = faiss.read_index(str(files.index), faiss.IO_FLAG_MMAP_IFC if mapped else 0)
            vks = np.load(io.BytesIO(raw_vks), allow_pickle=False)
            if index.ntotal != manifest["n"] or vks.shape != (index.ntotal,) or index.d != dim:
                raise ValueError("entries do not match the manifest")
            return index, vks, token
        except FileNotFoundError:
            if token is None:
                return None  # no snapshot
            if _manifest_token(manifest_path) not in (token, None):
                continue  # replaced meanwhile: read the new one
            logger.warning(
                "ignoring index snapshot %s whose files are missing (rebuilt from LMDB)", base.name
            )
            return None
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            if token is not None and _manifest_token(manifest_path) not in (token, None):
                continue  # replaced meanwhile: read the new one
            logger.warning("ignoring damaged index snapshot %s (rebuilt from LMDB): %s", base.name, e)
            return None
    return None


def snapshot_token(base: Path) -> str | None:
    """The token of the current snapshot of ``base`` (None: none, or an unreadable manifest)."""
    return _manifest_token(base.with_name(f"{base.name}.json"))


def entries_by_vk(snap_vks: np.ndarray, vks: np.ndarray) -> np.ndarray:
    """Each of ``vks``'s entry in a snapshot whose entries carry ``snap_vks`` (-1: not in it)."""
    internal = np.full(vks.shape[0], -1, np.int64)
    if snap_vks.shape[0] == 0:
        return internal
    order = np.argsort(snap_vks)
    pos = np.minimum(np.searchsorted(snap_vks, vks, sorter=order), snap_vks.shape[0] - 1)
    hit = snap_vks[order[pos]] == vks
    internal[hit] = order[pos[hit]]
    return internal


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest_token(path: Path) -> str | None:
    try:
        return str(unseal(path.read_text(), VERSION)["token"])
    except (OSError, ValueError, KeyError):
        return None
