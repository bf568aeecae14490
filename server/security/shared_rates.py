"""A key's call rate counted once across the processes that serve one port (a leader and its
search followers): each key's token bucket lives in a small anonymous file that the leader creates
and its followers inherit, and is changed under a lock on that file. Without it each process would
give a key its whole rate."""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
import threading

# A bucket: the key's hash (0: a free slot), its tokens, and when they were counted (the system's
# monotonic clock, which every process on the machine reads alike).
_SLOT = struct.Struct("<Qdd")
SLOTS = 4096
FD_ENV = "TIERMEM_KEY_RATES_FD"  # (a follower's inherited descriptor of the leader's table)


class TableFull(Exception):
    """Every slot holds another key: the caller counts this key in its own process."""


def _hash(key_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(key_id.encode(), digest_size=8).digest(), "little") or 1


class SharedRates:
    """Token buckets of up to ``SLOTS`` keys in the file open as ``fd``, shared by every process
    that has it. ``create`` makes a new table (the leader); ``inherited`` opens the one a follower
    was handed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, _SLOT.size * SLOTS)
        self._lock = threading.Lock()  # (a file lock keeps other processes out, not our threads)

    @classmethod
    def create(cls) -> SharedRates:
        try:
            fd = os.memfd_create("tiermem-key-rates")
        except (AttributeError, OSError):  # (no memfd: an unlinked temporary file does the same)
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        os.ftruncate(fd, _SLOT.size * SLOTS)  # (zeros: every slot free)
        return cls(fd)

    @classmethod
    def inherited(cls) -> SharedRates | None:
        fd = os.environ.get(FD_ENV)
        return cls(int(fd)) if fd else None

    def take(self, key_id: str, rate: float, burst: int, now: float) -> float | None:
        """One call of ``key_id`` at ``rate`` a second with bursts of ``burst``: None when it may go
        ahead (a token taken), else the seconds until one would be there. Raises ``TableFull``."""
        h = _hash(key_id)
        with self._lock:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
            try:
                at = self._find(h)
                held, tokens, then = _SLOT.unpack_from(self._map, at)
                tokens = (
                    float(burst) if held == 0 else min(float(burst), tokens + max(0.0, now - then) * rate)
                )
                wait = None if tokens >= 1.0 else (1.0 - tokens) / rate
                _SLOT.pack_into(self._map, at, h, tokens - 1.0 if wait is None else tokens, now)
                return wait
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def _find(self, h: int) -> int:
        """The offset of ``h``'s slot, or of the first free one on its probe path (linear probing;
        slots are never freed while the table lives, so a key's slot stays where it was found)."""
        start = h % SLOTS
        for i in range(SLOTS):
            at = ((start + i) % SLOTS) * _SLOT.size
            (held,) = struct.unpack_from("<Q", self._map, at)
            if held in (0, h):
                return at
        raise TableFull(f"all {SLOTS} shared rate slots hold other keys")
