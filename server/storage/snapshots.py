"""Columns snapshots: the in-memory columns on disk, so a start-up need not decode every record.

A snapshot is ``columns.<token>.bin`` named by ``columns.json`` (written last, atomically), like the
index snapshots in vector_index.py. It records the LMDB commit sequence number it is consistent with
and the LMDB environment's instance id. At start-up the engine restores it and reloads only the
records the ``changes`` log lists after that commit (storage.py), so a snapshot older than LMDB
(kill -9 after it was written) is still correct. A missing, damaged or foreign snapshot is ignored:
the engine then decodes every record, as it always can (LMDB holds the truth; snapshots only save
time).

Damage is detected, never trusted: the manifest carries the checksum of the data file (XXH3; BLAKE2b
in snapshots of earlier versions) and one of its own fields, both checked before anything in them is
used; a mismatch discards the snapshot with a warning. The format cannot run code when read (unlike
a pickle): the data file is

    MAGIC, u64 header length, header (msgpack), the arrays' bytes one after another

where the header is msgpack of ``{"tree": the state with every NumPy array replaced by an ext
reference, "arrays": [[dtype, shape], ...]}``. Containers come back as msgpack gives them: maps as
dicts (integer keys allowed), arrays as tuples; arrays are numeric or fixed-width strings only.
"""

from __future__ import annotations

import io
import logging
import os
import struct
import threading
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

from tiermem.server.model.manifests import FILE_HASH, OLD_FILE_HASH, file_digest, file_hash_of, sealed, unseal

logger = logging.getLogger(__name__)

# 2: the columns hold each record's tokens; 3: this format (checksummed, no pickle). A snapshot of
# another version is ignored (rebuilt from LMDB).
VERSION = 3
MAGIC = b"TMCOLS\x00\x03"
_LENGTH = struct.Struct("<Q")
_ARRAY = 1  # msgpack ext code: the index of an array in the header's list
_KINDS = set("biufcSU")  # dtype kinds that hold no Python objects


class _Hashing:
    """A writable file that checksums what goes through it."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.hash_name = FILE_HASH
        self.hash = file_digest(FILE_HASH)
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.size += view.nbytes
        return self.f.write(view)


def _encode(state: dict[str, Any]) -> tuple[bytes, list[np.ndarray]]:
    arrays: list[np.ndarray] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in _KINDS or obj.dtype.hasobject:
                raise TypeError(f"array of {obj.dtype} in a columns snapshot")
            arrays.append(np.ascontiguousarray(obj))
            return msgpack.ExtType(_ARRAY, _LENGTH.pack(len(arrays) - 1))
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"{type(obj).__name__} in a columns snapshot")

    tree = msgpack.packb(state, default=default, use_bin_type=True)
    header = msgpack.packb(
        {"tree": tree, "arrays": [[a.dtype.str, list(a.shape)] for a in arrays]}, use_bin_type=True
    )
    return header, arrays


def save_columns(directory: Path, state: dict[str, Any], seq: int, instance: str) -> Path:
    """Write ``state`` (Columns.state() and more) durably as the current columns snapshot; returns
    its path. On failure (a full disk) nothing is left behind and the previous snapshot stays."""
    header, arrays = _encode(state)
    token = uuid.uuid4().hex[:16]
    path = directory / f"columns.{token}.bin"
    tmp = directory / "columns.json.tmp"
    try:
        with open(path, "wb") as f:
            out = _Hashing(f)
            out.write(MAGIC)
            out.write(_LENGTH.pack(len(header)))
            out.write(header)
            for a in arrays:
                if a.nbytes:
                    out.write(a.reshape(-1).view(np.uint8))
            f.flush()
            os.fsync(f.fileno())
        manifest = {
            "version": VERSION,
            "seq": seq,
            "instance": instance,
            "token": token,
            "size": out.size,
            "hash": out.hash_name,
            "checksum": out.hash.hexdigest(),
        }
        with open(tmp, "w") as m:
            m.write(sealed(manifest))
            m.flush()
            os.fsync(m.fileno())
        os.replace(tmp, directory / "columns.json")
    except BaseException:
        path.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in [*directory.glob("columns.*.bin"), *directory.glob("columns.*.pkl")]:
        if old != path:
            old.unlink(missing_ok=True)  # (.pkl: an older version's snapshot)
    return path


def current_seq(directory: Path) -> int | None:
    """The commit sequence number of the current columns snapshot (None: none readable)."""
    try:
        return int(unseal((directory / "columns.json").read_text(), VERSION)["seq"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_columns(directory: Path, instance: str) -> tuple[dict[str, Any], int] | None:
    """(state, commit sequence number) of the current columns snapshot, or None (none, another
    version or database, or damaged: then with a warning)."""
    manifest_path = directory / "columns.json"
    try:
        for _ in range(3):
            manifest = unseal(manifest_path.read_text(), VERSION)
            if manifest.get("version") != VERSION:
                logger.info("columns snapshot of another version: the columns are loaded from LMDB")
                return None
            if manifest.get("instance") != instance:
                return None
            # (read before the file is opened; an earlier version's checksum is under "blake2b")
            hash_name = file_hash_of(manifest)
            expected = str(manifest["checksum" if "hash" in manifest else OLD_FILE_HASH])
            try:
                f = open(directory / f"columns.{manifest['token']}.bin", "rb")  # noqa: SIM115
            except FileNotFoundError:  # replaced meanwhile (a follower loading): the new manifest
                continue
            with f:
                state = _read(f, int(manifest["size"]), expected, hash_name)
            break
        else:
            return None
        if not isinstance(state, dict) or "arrays" not in state or "spaces" not in state:
            raise ValueError("not a columns snapshot")
        return state, int(manifest["seq"])
    except FileNotFoundError:
        return None
    except Exception as e:  # any damage: rebuilt from LMDB
        logger.warning(
            "ignoring damaged columns snapshot in %s (the columns are loaded from LMDB): %s", directory, e
        )
        return None


def _read(f: io.BufferedReader, size: int, expected: str, hash_name: str) -> Any:
    """The state in a data file of ``size`` bytes whose checksum by ``hash_name`` is ``expected``.
    Every byte is checked before the state is returned (on a thread of its own while the tree is
    decoded: the hashes let go of the GIL); a size or shape the file cannot hold is refused before
    anything that large is allocated."""
    if os.fstat(f.fileno()).st_size != size:
        raise ValueError(f"file is {os.fstat(f.fileno()).st_size} bytes, its manifest says {size}")

    def read(n: int) -> bytes:
        data = f.read(n)
        if len(data) != n:
            raise ValueError("file ends early")
        return data

    head = read(len(MAGIC) + _LENGTH.size)
    if head[: len(MAGIC)] != MAGIC:
        raise ValueError("not a columns snapshot file")
    length = _LENGTH.unpack_from(head, len(MAGIC))[0]
    if length > size:
        raise ValueError("header longer than the file")
    raw_header = read(length)
    header = msgpack.unpackb(raw_header, raw=False)
    specs = [(np.dtype(d), tuple(int(x) for x in shape)) for d, shape in header["arrays"]]
    if any(dt.kind not in _KINDS or dt.hasobject for dt, _ in specs):
        raise ValueError("array of a type a snapshot never holds")
    need = sum(dt.itemsize * int(np.prod(shape, dtype=np.int64)) for dt, shape in specs)
    if need != size - len(head) - length or any(min(s, default=0) < 0 for _, s in specs):
        raise ValueError("arrays do not match the file's size")
    arrays = []
    for dt, shape in specs:
        a = np.empty(shape, dt)
        if f.readinto(a.reshape(-1).view(np.uint8).data) != a.nbytes:
            raise ValueError("file ends early")
        arrays.append(a)

    check = file_digest(hash_name)

    def hash_all() -> None:
        check.update(head)
        check.update(raw_header)
        for a in arrays:
            check.update(a.reshape(-1).view(np.uint8).data)

    hashing = threading.Thread(target=hash_all, name="tiermem-snapshot-check")
    hashing.start()
    try:

        def ext(code: int, data: bytes) -> Any:
            if code != _ARRAY:
                raise ValueError(f"unknown msgpack ext {code}")
            return arrays[_LENGTH.unpack(data)[0]]

        state = msgpack.unpackb(header["tree"], ext_hook=ext, raw=False, strict_map_key=False, use_list=False)
    finally:
        hashing.join()
    if check.hexdigest() != expected:
        raise ValueError("checksum mismatch")
    return state
