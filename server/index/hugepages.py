"""Huge pages under FAISS's arrays.

HNSW reads its vectors and links at random over gigabytes; in 4 KB pages nearly every such read
also misses the TLB and walks the page tables. Linux backs memory with 2 MB pages where a program
asks for them (``transparent_hugepage`` set to ``madvise``, a common default) or everywhere
(``always``). NumPy asks for its large arrays; FAISS does not, so its arrays are advised here: the
mapping that holds one (``MADV_HUGEPAGE``: pages faulted in later come huge, the kernel's background
scan folds the others in slowly) and then, on a background thread, its pages already present folded
into huge ones at once (``MADV_COLLAPSE``, Linux 6.1 and later). Advice only: where the kernel
cannot or will not take it, nothing changes but speed. Nothing is asked where the machine's setting
is ``never`` (the collapse would not heed it).
"""

from __future__ import annotations

import ctypes
import logging
import queue
import sys
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

MIN_BYTES = 16 << 20  # smaller arrays: the TLB reaches over much of them in 4 KB pages already
HUGE = 1 << 21
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25

_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None
_collapses: queue.SimpleQueue[tuple[int, int]] | None = None
_off = False  # the machine says never, or the collapsing thread could not start


def advise(address: int, nbytes: int, since: int = 0) -> bool:
    """Advise huge pages for the array of ``nbytes`` at ``address`` (the whole 2 MB pages within
    it), and collapse its pages from byte ``since`` on (those advised before are already) later, on
    a background thread. Returns whether the kernel took the advice (False: too small, not Linux,
    or refused)."""
    madvise = _madvise()
    if madvise is None or nbytes < MIN_BYTES:
        return False
    lo, hi = -(-address // HUGE) * HUGE, (address + nbytes) // HUGE * HUGE
    if hi <= lo or madvise(lo, hi - lo, _MADV_HUGEPAGE) != 0:
        return False
    assert _collapses is not None
    _collapses.put((max(lo, (address + since) // HUGE * HUGE), hi))
    return True


def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise, with the collapsing thread started (None off Linux, or where the machine's
    setting is ``never``)."""
    global _libc, _collapses, _off
    if not sys.platform.startswith("linux"):
        return None
    with _lock:
        if _libc is None and not _off:
            try:
                _off = "[never]" in _SETTING.read_text()
                libc = ctypes.CDLL(None, use_errno=True)
                libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                libc.madvise.restype = ctypes.c_int
                if not _off:
                    collapses: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
                    threading.Thread(
                        target=_collapse_forever,
                        args=(libc, collapses),
                        name="tiermem-hugepages",
                        daemon=True,
                    ).start()
                    _libc, _collapses = libc, collapses
            except (OSError, AttributeError, RuntimeError) as e:  # (no such file, no libc, no thread)
                logger.info("huge pages not asked for: %s", e)
                _off = True
        if _libc is None:
            return None
    madvise: Callable[[int, int, int], int] = _libc.madvise
    return madvise


def _collapse_forever(libc: ctypes.CDLL, collapses: queue.SimpleQueue[tuple[int, int]]) -> None:
    """Collapse advised ranges as they come (a gigabyte takes about a second: no caller waits). A
    range freed meanwhile makes the call fail, or collapses whatever was mapped there since: advice
    either way, nothing read or written."""
    while True:
        lo, hi = collapses.get()
        if libc.madvise(lo, hi - lo, _MADV_COLLAPSE) != 0:
            logger.debug(
                "huge pages: collapse of %d MB refused (errno %d)", (hi - lo) >> 20, ctypes.get_errno()
            )
