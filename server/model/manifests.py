"""Snapshot manifests that check themselves: the JSON of their fields with a BLAKE2b checksum of
that JSON, shared by the columns snapshot (storage/) and the index snapshots (index/)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def digest() -> Any:
    """The checksum of snapshot files and manifests (``hashlib`` BLAKE2b, 128 bits)."""
    return hashlib.blake2b(digest_size=16)


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
