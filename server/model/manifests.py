"""Snapshot manifests that check themselves: the JSON of their fields with a BLAKE2b checksum of
that JSON, shared by the columns snapshot (storage/) and the index snapshots (index/); and the hash
their data files are checked with (``file_digest``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import xxhash

# The hash new snapshots' data files are checked with, named in their manifests: XXH3 (128 bits)
# catches accidental damage (not tampering: the data directory's permissions guard that) at about
# 25x BLAKE2b's speed here, which a 1,000,000-vector index (1.8 GB) pays at every start-up and
# snapshot. Manifests written before it name no hash: BLAKE2b.
FILE_HASH = "xxh3_128"
OLD_FILE_HASH = "blake2b"
_FILE_HASHES: dict[str, Callable[[], Any]] = {
    "xxh3_128": xxhash.xxh3_128,
    "blake2b": lambda: hashlib.blake2b(digest_size=16),
}


def digest() -> Any:
    """The checksum of a manifest's own fields (``hashlib`` BLAKE2b, 128 bits)."""
    return hashlib.blake2b(digest_size=16)


def file_digest(name: str) -> Any:
    """A new hash of data file bytes by the name a manifest gives (``FILE_HASH``, ``OLD_FILE_HASH``);
    ValueError for a name this version does not know."""
    make = _FILE_HASHES.get(name)
    if make is None:
        raise ValueError(f"unknown file checksum {name!r}")
    return make()


def file_hash_of(manifest: dict[str, Any]) -> str:
    """The hash a manifest's data-file checksums are by (``OLD_FILE_HASH`` when it names none, as
    earlier versions wrote them); ValueError for one this version does not know."""
    name = str(manifest.get("hash", OLD_FILE_HASH))
    if name not in _FILE_HASHES:
        raise ValueError(f"unknown file checksum {name!r}")
    return name


def _check_of(fields: dict[str, Any]) -> str:
    check = digest()
    check.update(json.dumps(fields, sort_keys=True).encode())
    return str(check.hexdigest())


def sealed(fields: dict[str, Any]) -> str:
    """``fields`` as a manifest's JSON, with a checksum of its own content (``check``)."""
    return json.dumps({**fields, "check": _check_of(fields)}, sort_keys=True)


def unseal(text: str, version: int) -> dict[str, Any]:
    """A manifest written by ``sealed``; ValueError when it does not match its checksum. One of
    an older version than ``version`` (no checksum) comes back unchecked: its version alone is
    read, to ignore it."""
    fields = json.loads(text)
    if not isinstance(fields, dict):
        raise ValueError("manifest is not an object")
    if "check" not in fields and fields.get("version") != version:
        return {"version": fields.get("version")}
    check = fields.pop("check", None)
    if check != _check_of(fields):
        raise ValueError("manifest checksum mismatch")
    return fields
