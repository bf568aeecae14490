"""Backup files: an export saved to disk, and restored from it.

``backup(client, path)`` writes the ``ExportMemories`` stream of a server (memories with their
vectors, the namespaces' reflection and summary progress, the graph) to ``path``;
``restore(client, path)`` checks the whole file, then streams it back through ``ImportMemories``.
``verify(path)`` only checks a file and says what it holds. docs/backup.md describes the format:

    magic (16 bytes) | format version (uint32, big-endian)
    record*          : length (uint32, big-endian, 1 .. 2**32 - 2) | an ExportMemoriesResponse
    trailer          : 0xFFFFFFFF | message count (uint64, big-endian) | SHA-256 (32 bytes)

The SHA-256 covers every byte before it. A backup is written to a temporary file beside ``path``,
flushed to disk, then renamed over ``path``: a crash or a failed export leaves the previous file
as it was. A file that is not a backup, of another format version, truncated or altered is refused
with a ``BackupFileError`` (a ``ValueError``) naming the file and what is wrong, before anything
is sent to the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tiermem._values import timestamp_seconds
from tiermem.v1 import memory_pb2 as pb

from .client import CallMetadata, MemoryClient
from .errors import TiermemError

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "BackupFileError",
    "BackupSummary",
    "backup",
    "restore",
    "verify",
]

# PNG-style: a first byte no text file starts with, then CR LF, SUB, LF that a text-mode copy mangles.
MAGIC = b"\x89TIERMEM-BKP\r\n\x1a\n"
FORMAT_VERSION = 1

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_END = 0xFFFFFFFF  # the length that opens the trailer instead of a record
_DIGEST_BYTES = 32
_TRAILER_BYTES = _U32.size + _U64.size + _DIGEST_BYTES
_HEAD_BYTES = len(MAGIC) + _U32.size
_CHUNK_KINDS = ("header", "settings", "memory", "scope", "node", "edge")


class BackupFileError(ValueError):
    """A file that cannot be restored: not a backup, of another format version, truncated, altered
    or malformed. ``path`` is the file, ``problem`` what is wrong with it."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.path, self.problem), self.__dict__


@dataclass(frozen=True)
class BackupSummary:
    """What a backup file holds. ``namespace`` is the exported namespace ('' for all of them),
    ``export_time`` when the server took the snapshot (epoch seconds), ``messages`` the export
    chunks (the header included), ``size_bytes`` the file's size and ``sha256`` its checksum (hex)."""

    path: Path
    format_version: int
    namespace: str
    server_version: str
    export_time: float
    messages: int
    settings: int
    memories: int
    scopes: int
    nodes: int
    edges: int
    size_bytes: int
    sha256: str


def backup(
    client: MemoryClient,
    path: str | os.PathLike[str],
    namespace: str = "",
    include_children: bool = False,
    *,
    timeout: float | None = None,
    call_metadata: CallMetadata | None = None,
) -> BackupSummary:
    """Export ``namespace`` (and those below it with ``include_children``; '' exports every
    namespace) into the backup file ``path``, replacing it atomically once the whole export is on
    disk. The file is created readable by its owner only. ``timeout`` bounds the whole export
    (None: no deadline). Raises the client's ``TiermemError`` if the export fails, ``OSError`` if
    the file cannot be written; either way ``path`` is left as it was."""
    path = Path(path)
    directory = path.parent
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)  # mode 0600
    except OSError as e:  # (named by the file asked for, not the temporary one)
        raise type(e)(e.errno, f"cannot write {path}: {e.strerror}") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as f:
            written = _write(
                f,
                client.export_memories(
                    namespace, include_children=include_children, timeout=timeout, call_metadata=call_metadata
                ),
                path,
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_directory(directory)
    return written


def restore(
    client: MemoryClient,
    path: str | os.PathLike[str],
    target_namespace: str = "",
    *,
    confirm: bool = False,
    timeout: float | None = None,
    call_metadata: CallMetadata | None = None,
) -> pb.ImportMemoriesResponse:
    """Check the backup file ``path`` whole (magic, format version, framing, checksum, every chunk),
    then stream it to the server's ``ImportMemories``, under ``target_namespace`` instead of the
    exported namespace if given (``confirm``: into protected namespaces too, see
    ``import_memories``). Nothing is sent from a file that fails the check: it raises
    ``BackupFileError``. ``timeout`` bounds the import (None: no deadline)."""
    path = Path(path)
    with _open(path) as f:
        _check(f, path)
        failed: list[BackupFileError] = []

        def chunks() -> Iterator[pb.ExportMemoriesResponse]:
            try:
                yield from _chunks(f, path)
            except BackupFileError as e:  # the file changed since it was checked
                failed.append(e)
                raise

        try:
            return client.import_memories(
                chunks(),
                target_namespace=target_namespace,
                confirm=confirm,
                timeout=timeout,
                call_metadata=call_metadata,
            )
        except TiermemError:
            if failed:  # the call was cancelled because of the file: say why, and what stays
                raise BackupFileError(
                    path,
                    f"changed while it was restored ({failed[0].problem}): the batches the server "
                    "committed before that stay restored",
                ) from None
            raise


def verify(path: str | os.PathLike[str]) -> BackupSummary:
    """Check the backup file ``path`` as ``restore`` does, without a server, and say what it holds;
    raises ``BackupFileError`` for a file that cannot be restored."""
    path = Path(path)
    with _open(path) as f:
        return _check(f, path)


def check_path(path: Path) -> None:
    """FileNotFoundError for nothing at ``path``, BackupFileError for what is not a regular file (a
    FIFO would block an open)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    if not path.is_file():
        raise BackupFileError(path, "not a regular file (a directory, a pipe or a device)")


def _open(path: Path) -> BinaryIO:
    check_path(path)
    return path.open("rb")


# -- writing --------------------------------------------------------------------------------------


def _write(f: BinaryIO, chunks: Iterator[pb.ExportMemoriesResponse], path: Path) -> BackupSummary:
    digest = hashlib.sha256()

    def put(data: bytes) -> None:
        digest.update(data)
        f.write(data)

    put(MAGIC + _U32.pack(FORMAT_VERSION))
    tally: Counter[str] = Counter()
    header = pb.ExportHeader()
    size = _HEAD_BYTES
    for i, chunk in enumerate(chunks):
        which = chunk.WhichOneof("chunk")
        if which is None or (which == "header") != (i == 0):
            raise ValueError(f"export chunk {i} is {which!r}: an export has its header first, and only there")
        if which == "header":
            header = chunk.header
        data = chunk.SerializeToString()
        if len(data) >= _END:
            raise ValueError(f"export chunk {i} is too large for a backup record ({len(data)} bytes)")
        put(_U32.pack(len(data)))
        put(data)
        size += _U32.size + len(data)
        tally[which] += 1
    if not tally:
        raise ValueError("the export sent nothing, not even its header")
    messages = sum(tally.values())
    put(_U32.pack(_END) + _U64.pack(messages))
    checksum = digest.digest()
    f.write(checksum)
    return _summary(path, header, tally, size + _TRAILER_BYTES, checksum)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable (POSIX: a directory's entries are flushed with the directory)."""
    with contextlib.suppress(OSError):  # not every platform opens directories
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _summary(
    path: Path, header: pb.ExportHeader, tally: Counter[str], size: int, checksum: bytes
) -> BackupSummary:
    return BackupSummary(
        path=path,
        format_version=FORMAT_VERSION,
        namespace=header.namespace,
        server_version=header.server_version,
        export_time=timestamp_seconds(header.export_time),
        messages=sum(tally.values()),
        settings=tally["settings"],
        memories=tally["memory"],
        scopes=tally["scope"],
        nodes=tally["node"],
        edges=tally["edge"],
        size_bytes=size,
        sha256=checksum.hex(),
    )


# -- reading --------------------------------------------------------------------------------------


class _Reader:
    """One pass over a backup file: its head, its records' bytes, then its trailer, hashing as it
    goes. Each problem raises BackupFileError; the checksum is compared once the trailer is read."""

    def __init__(self, f: BinaryIO, path: Path) -> None:
        self.f, self.path = f, path
        self.size = os.fstat(f.fileno()).st_size
        self.pos = 0
        self.digest = hashlib.sha256()
        self.checksum = b""

    def fail(self, problem: str) -> BackupFileError:
        return BackupFileError(self.path, problem)

    def take(self, n: int, what: str) -> bytes:
        data = self.f.read(n)
        if len(data) < n:
            raise self.fail(f"truncated: the file ends inside {what} ({self.size} bytes)")
        self.digest.update(data)
        self.pos += n
        return data

    def head(self) -> None:
        self.f.seek(0)
        magic = self.f.read(len(MAGIC))
        if magic != MAGIC:
            if magic and MAGIC.startswith(magic):
                raise self.fail(f"truncated: the file ends inside its magic header ({self.size} bytes)")
            raise self.fail("not a tiermem backup file (its first bytes are not the backup magic)")
        self.digest.update(magic)
        self.pos = len(magic)
        (version,) = _U32.unpack(self.take(_U32.size, "its format version"))
        if version != FORMAT_VERSION:
            raise self.fail(
                f"backup format version {version} is not supported (this tiermem reads version "
                f"{FORMAT_VERSION}): restore it with the tiermem that wrote it, or a newer one"
            )

    def records(self) -> Iterator[bytes]:
        """Each record's bytes; then the trailer is read and checked (count, checksum, end of file)."""
        self.head()
        count = 0
        while True:
            start = self.pos
            (n,) = _U32.unpack(self.take(_U32.size, f"the length of record {count} at byte {start}"))
            if n == _END:
                break
            if n == 0:
                raise self.fail(f"damaged: record {count} at byte {start} is empty")
            left = self.size - self.pos - _TRAILER_BYTES
            if n > left:
                raise self.fail(
                    f"truncated or damaged: record {count} at byte {start} says {n} bytes, but only "
                    f"{max(left, 0)} come before where the trailer would start"
                )
            yield self.take(n, f"record {count}")
            count += 1
        (declared,) = _U64.unpack(self.take(_U64.size, "the trailer's message count"))
        expected = self.digest.digest()
        self.checksum = self.f.read(_DIGEST_BYTES)
        if len(self.checksum) < _DIGEST_BYTES:
            raise self.fail(f"truncated: the file ends inside the trailer's checksum ({self.size} bytes)")
        extra = self.size - self.pos - _DIGEST_BYTES
        if extra > 0:
            raise self.fail(f"damaged: {extra} unexpected bytes follow the trailer")
        if self.checksum != expected:
            raise self.fail(
                "checksum mismatch: the SHA-256 in the trailer does not match the contents "
                "(the file was altered or damaged)"
            )
        if declared != count:
            raise self.fail(f"damaged: the trailer counts {declared} messages, the file holds {count}")


def _parse(data: bytes, i: int, path: Path) -> pb.ExportMemoriesResponse:
    try:
        chunk = pb.ExportMemoriesResponse.FromString(data)
    except Exception as e:  # DecodeError, RuntimeError (C++ protobuf), ...
        raise BackupFileError(path, f"record {i} is not an export chunk ({e})") from None
    which = chunk.WhichOneof("chunk")
    if which is None:
        raise BackupFileError(path, f"record {i} holds no chunk (written by a newer tiermem?)")
    if (which == "header") != (i == 0):
        raise BackupFileError(path, f"record {i} is a {which}: the export header must come first, once")
    return chunk


def _check(f: BinaryIO, path: Path) -> BackupSummary:
    """Read the whole file: framing and checksum first (a problem there is reported as such even
    when a damaged record would not parse), then every chunk."""
    reader = _Reader(f, path)
    tally: Counter[str] = Counter()
    header = pb.ExportHeader()
    bad: BackupFileError | None = None
    for i, data in enumerate(reader.records()):
        if bad is not None:
            continue
        try:
            chunk = _parse(data, i, path)
        except BackupFileError as e:
            bad = e  # reported once the checksum has been compared
            continue
        which = chunk.WhichOneof("chunk") or ""
        if which == "header":
            header = chunk.header
        tally[which] += 1
    if bad is not None:
        raise bad
    if not tally:
        raise BackupFileError(path, "damaged: it holds no export header")
    return _summary(path, header, tally, reader.size, reader.checksum)


def _chunks(f: BinaryIO, path: Path) -> Iterator[pb.ExportMemoriesResponse]:
    """The chunks of a checked file, read again (a change since is still caught at the end)."""
    for i, data in enumerate(_Reader(f, path).records()):
        yield _parse(data, i, path)
