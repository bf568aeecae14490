"""The LMDB data file (``data.mdb``) before LMDB maps it: the lock that keeps a second writing server
out, and the check that the file holds every page its meta pages say it has.

The lock: an exclusive ``flock`` on ``data.mdb`` itself, held by the writing server for its
lifetime (it goes with the process, so kill -9 leaves nothing to clean up). A lock file beside the
data can be deleted, after which a second server would lock a new one and write the same LMDB
with its own record-id counter; the data file cannot be deleted without losing the data anyway.
LMDB takes no ``flock`` of its own (its locks are POSIX record locks on ``lock.mdb``, which do not
interact with ``flock``), and search followers map the file read-only without locking it.

The check: LMDB maps the file and reads pages through the map, so a page past the end of a
truncated file kills the process with SIGBUS. Before opening, the newer valid meta page is read
with ``pread``: when the file is at least ``(last_pgno + 1) * page size`` bytes long it is whole.
A shorter file is not always damaged (LMDB does not write a page it allocated and freed again in
the same transaction, which may be the last one), so then every page the B-trees reach is looked
for with ``pread``: one past the end means the file was truncated.

The page layout read here is LMDB 0.9's on a 64-bit little-endian machine (``mdb.c``: ``MDB_page``,
``MDB_meta``, ``MDB_db``, ``MDB_node``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

from tiermem.server.model.errors import StorageError

DATA_FILE = "data.mdb"

_MAGIC = 0xBEEFC0DE
_PAGE_HEADER = 16  # mp_pgno (8), mp_pad (2), mp_flags (2), mp_lower/mp_upper or mp_pages (4)
_META = struct.Struct("<II8x8x")  # mm_magic, mm_version, mm_address, mm_mapsize
_META_SIZE = 152  # page header + meta up to and including mm_txnid
_PSIZE_AT = 40  # the free DB's md_pad holds the page size
_FREE_ROOT_AT = 80
_MAIN_ROOT_AT = 128
_LAST_PGNO_AT = 136
_TXNID_AT = 144
_DB_ROOT_IN_DB = 40  # md_root within an MDB_db (the value of a named or sub-database's node)
_P_BRANCH, _P_LEAF, _P_LEAF2 = 0x01, 0x02, 0x20
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_P_INVALID = 2**64 - 1
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize

# errno values that mean the caller may not write there (not: the disk is full)
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


def not_writable(path: Path, e: OSError) -> StorageError:
    return StorageError(
        f"{path} is not writable ({e.strerror or e}): the server needs to write its data directory",
        reason="DATA_DIR_NOT_WRITABLE",
    )


def open_and_lock(directory: Path) -> int:
    """Open (creating) ``directory/data.mdb``, check it, and lock it for this process; returns the
    descriptor, which holds the lock until closed. Raises StorageError (DATA_DIR_IN_USE: another
    server writes it; DATA_DIR_NOT_WRITABLE; STORAGE_DAMAGED: truncated)."""
    path = directory / DATA_FILE
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in NOT_WRITABLE:
            raise not_writable(directory, e) from None
        raise StorageError(f"cannot create {directory}: {e}") from None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno in NOT_WRITABLE:
            raise not_writable(path, e) from None
        raise StorageError(f"cannot open {path}: {e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StorageError(
                f"{path} is in use by another tiermem server", reason="DATA_DIR_IN_USE"
            ) from None
        check(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check(fd: int, path: Path) -> None:
    """Raise StorageError (STORAGE_DAMAGED) when the data file lacks pages LMDB would read."""
    head = os.pread(fd, _META_SIZE, 0)
    size = os.fstat(fd).st_size  # after the meta page: a writer extends the file before its meta
    if size == 0:
        return  # a new environment (LMDB writes its meta pages)
    if len(head) < _META_SIZE or _META.unpack_from(head, _PAGE_HEADER)[0] != _MAGIC:
        raise _damaged(path, "its first page is not an LMDB meta page")
    psize = _U32.unpack_from(head, _PSIZE_AT)[0]
    if psize < 512 or psize & (psize - 1):
        raise _damaged(path, f"its meta page gives a page size of {psize}")
    if size < 2 * psize:
        raise _damaged(path, f"{size} bytes, shorter than its two meta pages ({2 * psize} bytes)")
    metas = [
        m for m in (head, os.pread(fd, _META_SIZE, psize)) if _META.unpack_from(m, _PAGE_HEADER)[0] == _MAGIC
    ]
    meta = max(metas, key=lambda m: _U64.unpack_from(m, _TXNID_AT)[0])  # the one LMDB opens
    last = _U64.unpack_from(meta, _LAST_PGNO_AT)[0]
    pages = size // psize
    if last < pages:
        return
    roots = [_U64.unpack_from(meta, _FREE_ROOT_AT)[0], _U64.unpack_from(meta, _MAIN_ROOT_AT)[0]]
    try:
        missing = _first_missing_page(fd, psize, pages, roots)
    except (struct.error, ValueError) as e:
        raise _damaged(
            path, f"{size} bytes of {(last + 1) * psize}, and its pages cannot be read: {e}"
        ) from None
    if missing is not None:
        raise _damaged(
            path,
            f"truncated: {size} bytes, but its meta page counts {(last + 1) * psize} and page "
            f"{missing} is in use",
        )


def _first_missing_page(fd: int, psize: int, pages: int, roots: list[int]) -> int | None:
    """The first page past the file's ``pages`` that a B-tree (the free list, the main database, the
    named databases and dupsort sub-databases in it) refers to; None when every one is there."""
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        pgno = stack.pop()
        if pgno == _P_INVALID or pgno in seen:
            continue
        if pgno >= pages:
            return pgno
        seen.add(pgno)
        page = os.pread(fd, psize, pgno * psize)
        flags = _U16.unpack_from(page, 10)[0]
        if flags & _P_LEAF2 or not flags & (_P_BRANCH | _P_LEAF):
            continue  # keys only (a dupfixed sub-database), or not a tree page
        lower = _U16.unpack_from(page, 12)[0]
        for i in range((lower - _PAGE_HEADER) >> 1):
            at = _U16.unpack_from(page, _PAGE_HEADER + 2 * i)[0]
            lo, hi, nflags, ksize = _NODE.unpack_from(page, at)
            if flags & _P_BRANCH:
                stack.append(lo | hi << 16 | nflags << 32)
                continue
            data = at + _NODE.size + ksize
            if nflags & _F_BIGDATA:
                first = _U64.unpack_from(page, data)[0]
                if first >= pages:
                    return first
                count = _U32.unpack_from(os.pread(fd, _PAGE_HEADER, first * psize), 12)[0]
                if first + count > pages:
                    return pages
            elif nflags & _F_SUBDATA:
                stack.append(_U64.unpack_from(page, data + _DB_ROOT_IN_DB)[0])
    return None


def _damaged(path: Path, what: str) -> StorageError:
    return StorageError(
        f"{path} is damaged ({what}): restore the data directory from a backup", reason="STORAGE_DAMAGED"
    )
