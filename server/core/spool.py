"""A spool of packed parts: what was read under a read transaction, kept to be sent after it
closed, so that a reader that stops reading never holds a transaction open (nor LMDB's map growth,
which waits for readers, nor the pages freed since it began).

In memory up to ``memory_bytes``, then in an unnamed temporary file (nothing is left behind by a
crash). Iterating reads the parts from the first each time."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tiermem.server.model.errors import ResourceExhausted
from tiermem.server.storage.store import DISK_FULL

MEMORY_BYTES = 16 << 20  # the parts past this go to a temporary file


class Spool:
    """Packed parts. A disk too full for a part is RESOURCE_EXHAUSTED (``resource`` disk); the
    spool is then only closed (what its buffer holds is thrown away)."""

    def __init__(self, directory: Path | None, memory_bytes: int | None = None, what: str = "") -> None:
        limit = MEMORY_BYTES if memory_bytes is None else memory_bytes
        where = None if directory is None else str(directory)
        self._file = tempfile.SpooledTemporaryFile(max_size=limit, dir=where)  # noqa: SIM115 (see close)
        self._what = what
        self.count = 0
        self.bytes = 0

    @property
    def on_disk(self) -> bool:
        return not isinstance(self._file._file, io.BytesIO)

    def add(self, payload: bytes) -> None:
        try:
            self._file.seek(0, io.SEEK_END)
            self._file.write(len(payload).to_bytes(8, "little"))
            self._file.write(payload)
            self._file.flush()  # (a full disk fails here, not on a later read)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            err = ResourceExhausted(f"no disk space to spool {self._what} ({e})")
            err.metadata["resource"] = "disk"
            raise err from None
        self.count += 1
        self.bytes += 8 + len(payload)

    def __iter__(self) -> Iterator[bytes]:
        self._file.seek(0)
        for _ in range(self.count):
            yield self._file.read(int.from_bytes(self._file.read(8), "little"))

    def close(self) -> None:
        with contextlib.suppress(OSError):  # (what a full disk kept buffered is thrown away)
            self._file.close()


def disk_space(directory: Path) -> tuple[int, int]:
    """(bytes an unprivileged process may still write, bytes in all) of ``directory``'s file system."""
    s = os.statvfs(directory)
    return s.f_bavail * s.f_frsize, s.f_blocks * s.f_frsize
