"""Columns snapshots: the in-memory columns on disk, so a start-up need not decode every record.

A snapshot is ``columns.<token>.pkl`` named by ``columns.json`` (written last, atomically), like the
index snapshots in vector_index.py. It records the LMDB commit sequence number it is consistent with
and the LMDB environment's instance id. At start-up the engine restores it and reloads only the
records the ``changes`` log lists after that commit (storage.py), so a snapshot older than LMDB
(kill -9 after it was written) is still correct. A missing, damaged or foreign snapshot is ignored:
the engine then decodes every record, as it always can.

The file is a pickle of plain containers and NumPy arrays. It lives in the server's own data
directory, which is trusted like the LMDB files next to it.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import uuid
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

VERSION = 2  # 2: the columns hold each record's tokens (an older snapshot is rebuilt from LMDB)


def save_columns(directory: Path, state: dict[str, Any], seq: int, instance: str) -> Path:
    """Write ``state`` (Columns.state()) durably as the current columns snapshot; returns its path."""
    token = uuid.uuid4().hex[:16]
    path = directory / f"columns.{token}.pkl"
    with open(path, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        f.flush()
        os.fsync(f.fileno())
    manifest = {"version": VERSION, "seq": seq, "instance": instance, "token": token}
    tmp = directory / "columns.json.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(manifest))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / "columns.json")
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    for old in directory.glob("columns.*.pkl"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def current_seq(directory: Path) -> int | None:
    """The commit sequence number of the current columns snapshot (None: none readable)."""
    try:
        return int(json.loads((directory / "columns.json").read_text())["seq"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_columns(directory: Path, instance: str) -> tuple[dict[str, Any], int] | None:
    """(state, commit sequence number) of the current columns snapshot, or None."""
    try:
        for _ in range(3):
            manifest = json.loads((directory / "columns.json").read_text())
            if manifest.get("version") != VERSION or manifest.get("instance") != instance:
                return None
            try:
                f = open(directory / f"columns.{manifest['token']}.pkl", "rb")  # noqa: SIM115
            except FileNotFoundError:  # replaced meanwhile (a follower loading): the new manifest
                continue
            with f:
                state = pickle.load(f)
            break
        else:
            return None
        if not isinstance(state, dict) or "arrays" not in state or "spaces" not in state:
            return None
        return state, int(manifest["seq"])
    except FileNotFoundError:
        return None
    except Exception as e:  # any damage (a truncated or altered pickle raises many kinds of errors)
        logger.warning("ignoring columns snapshot in %s: %s", directory, e)
        return None
