"""The files of a vector index snapshot: their names, the manifest, durable writes and reading back.

A snapshot is ``<base>.<token>.faiss`` + ``<base>.<token>.vks.npy``, named by ``<base>.json`` (written
last, atomically). The token ties the three together: a crash mid-save leaves the previous manifest
pointing at the previous, complete files. ``instance`` is the LMDB environment's id, so a snapshot is
never applied to another database (e.g. a restored LMDB backup). Which entries a snapshot holds, and
the locking while FAISS writes it, are ``VectorIndex.save``'s business.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

logger = logging.getLogger(__name__)

VERSION = 2


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


def commit_snapshot(base: Path, files: SnapshotFiles, vks: np.ndarray, manifest: Manifest) -> None:
    """Make a snapshot whose FAISS index is already written to ``files.index`` the current one:
    fsync it, write the vks, then the manifest (atomically), then drop the previous snapshot's files."""
    _fsync(files.index)
    with open(files.vks, "wb") as f:
        np.save(f, vks)
        f.flush()
        os.fsync(f.fileno())
    fields = {
        "model": manifest.model,
        "dim": manifest.dim,
        "n": manifest.n,
        "token": manifest.token,
        "instance": manifest.instance,
        "version": VERSION,
    }
    tmp_manifest = base.with_name(f"{base.name}.json.tmp")
    tmp_manifest.write_text(json.dumps(fields))
    _fsync(tmp_manifest)
    os.replace(tmp_manifest, base.with_name(f"{base.name}.json"))
    _fsync(base.parent)
    for old in base.parent.glob(f"{base.name}.*"):
        if old.suffix in (".faiss", ".npy") and f".{files.token}." not in old.name:
            old.unlink(missing_ok=True)


def read_snapshot(base: Path, model: str, dim: int, instance: str) -> tuple[Any, np.ndarray] | None:
    """(FAISS index, vks by internal id) of the snapshot of ``base``, or None when there is none
    for this model, dimension and database, or it is damaged. A snapshot replaced while it is read
    (a search follower loading while its leader writes the next one) is read again from the new
    manifest."""
    manifest_path = base.with_name(f"{base.name}.json")
    token = None
    for _ in range(3):
        try:
            manifest = json.loads(manifest_path.read_text())
            if (
                manifest.get("version") != VERSION
                or manifest.get("model") != model
                or manifest.get("dim") != dim
                or manifest.get("instance") != instance
            ):
                return None
            token = manifest["token"]
            files = _files(base, token)
            index: Any = faiss.read_index(str(files.index))
            vks = np.load(files.vks)
            if index.ntotal != manifest["n"] or vks.shape != (index.ntotal,) or index.d != dim:
                return None
            return index, vks
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            if token is not None and _manifest_token(manifest_path) not in (token, None):
                continue  # replaced meanwhile: read the new one
            logger.warning("ignoring index snapshot %s: %s", base, e)
            return None
    return None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest_token(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text())["token"])
    except (OSError, ValueError, KeyError):
        return None
