"""A key's call rate counted once across the processes that serve one port (a leader and its
search followers): each key's token bucket lives in a small anonymous file that the leader creates
and its followers inherit, and is changed under a lock on that file. Without it each process would
give a key its whole rate."""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import stat
import struct
import tempfile
import threading
import time
import weakref

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

    SIZE = _SLOT.size * SLOTS

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, self.SIZE)
        self._lock = threading.Lock()  # (a file lock keeps other processes out, not our threads)
        weakref.finalize(self, os.close, fd)  # (the map holds its own; the table lives as its server)

    @classmethod
    def create(cls) -> SharedRates:
        try:
            fd = os.memfd_create("tiermem-key-rates")
        except (AttributeError, OSError):  # (no memfd: an unlinked temporary file does the same)
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
        try:
            os.ftruncate(fd, cls.SIZE)  # (zeros: every slot free)
            return cls(fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def inherited(cls) -> SharedRates | None:
        """The table whose descriptor the leader handed this process (``FD_ENV``), if it handed one
        (it decides, and clears the variable when it does not)."""
        value = os.environ.get(FD_ENV, "")
        if not value:
            return None
        try:
            fd = int(value)
            st = os.fstat(fd)
        except (ValueError, OSError) as e:
            raise RuntimeError(f"{FD_ENV}={value!r}: not the key rate table's descriptor ({e})") from None
        if not stat.S_ISREG(st.st_mode) or st.st_size != cls.SIZE:
            raise RuntimeError(f"{FD_ENV}={value!r}: not the key rate table ({st.st_size} bytes)")
        return cls(fd)

    def take(self, key_id: str, rate: float, burst: int, now: float | None = None) -> float | None:
        """One call of ``key_id`` at ``rate`` a second with bursts of ``burst``: None when it may go
        ahead (a token taken), else the seconds until one would be there. Raises ``TableFull``.
        ``now`` (the monotonic clock) is read once the table is locked, unless given."""
        h = _hash(key_id)
        with self._lock:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
            try:
                at = self._find(h)
                held, tokens, then = _SLOT.unpack_from(self._map, at)
                now = time.monotonic() if now is None else now
                if held == 0:
                    tokens, then = float(burst), now
                # (never back in time: a time read before a wait for the lock credits nothing twice)
                stamp = max(now, then)
                tokens = min(float(burst), tokens + (stamp - then) * rate)
                wait = None if tokens >= 1.0 else (1.0 - tokens) / rate
                _SLOT.pack_into(self._map, at, h, tokens - 1.0 if wait is None else tokens, stamp)
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
