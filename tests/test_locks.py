"""server/locks.py: neither readers nor a looping writer can starve the other side."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tiermem.server.model.locks import RWLock


def test_a_writer_in_a_loop_does_not_starve_readers() -> None:
    """The indexer re-acquires the write lock chunk after chunk while it drains a backlog: a
    search (reader) must get in between two chunks, not after the whole backlog."""
    lock = RWLock()
    stop = threading.Event()
    writes = [0]

    def writer() -> None:
        while not stop.is_set():
            with lock.write():
                time.sleep(0.002)
                writes[0] += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        time.sleep(0.05)
        waits = []
        for _ in range(20):
            t0 = time.monotonic()
            with lock.read():
                waits.append(time.monotonic() - t0)
        assert max(waits) < 0.5, waits  # a few chunks at most (was: until the writer stopped)
        assert writes[0] > 0
    finally:
        stop.set()
        t.join()


def test_a_stream_of_readers_does_not_starve_a_writer() -> None:
    lock = RWLock()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with lock.read():
                time.sleep(0.002)

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for r in readers:
        r.start()
    try:
        time.sleep(0.05)
        for _ in range(10):
            t0 = time.monotonic()
            with lock.write():
                pass
            assert time.monotonic() - t0 < 0.5
    finally:
        stop.set()
        for r in readers:
            r.join()


def test_readers_share_and_a_writer_excludes() -> None:
    lock = RWLock()
    inside = []
    gate = threading.Barrier(3, timeout=5)

    def reader() -> None:
        with lock.read():
            inside.append("r")
            gate.wait()  # all three readers inside at once, or the barrier times out

    rs = [threading.Thread(target=reader) for _ in range(3)]
    for r in rs:
        r.start()
    for r in rs:
        r.join()
    assert inside == ["r", "r", "r"]
    order = []
    with lock.write():
        t = threading.Thread(target=lambda: (lock.read().__enter__(), order.append("read")))
        t.start()
        time.sleep(0.1)
        order.append("write done")
    t.join(timeout=5)
    assert order == ["write done", "read"]


def _waiting_writer(lock: RWLock, writer: Callable[[], None]) -> threading.Thread:
    """``writer`` started on a thread (a daemon: a deadlock fails the test) and waiting for the lock
    the caller holds for reading."""
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    deadline = time.monotonic() + 5
    while lock._waiting_writers == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert lock._waiting_writers == 1  # the writer now waits for the caller's read
    return w


def test_a_reader_reads_again_while_a_writer_waits() -> None:
    """A search holds an index for reading across several lookups, each of which takes the read
    lock again: with a writer waiting in between, a non-reentrant phase-fair lock would deadlock
    (the writer waits for the reader, the reader's second read waits behind the writer)."""
    lock = RWLock()
    order: list[str] = []

    def writer() -> None:
        with lock.write():
            order.append("write")

    def search() -> None:
        with lock.read():
            w = _waiting_writer(lock, writer)
            with lock.read(), lock.read():
                order.append("nested read")
        w.join(5)

    s = threading.Thread(target=search, daemon=True)  # daemon: a deadlock fails the test, not the run
    s.start()
    s.join(5)
    assert not s.is_alive(), "the nested read waited behind the writer: deadlock"
    assert order == ["nested read", "write"]


def test_reads_in_other_threads_still_wait_for_a_waiting_writer() -> None:
    """Reentrancy is per thread: a new reader in another thread queues behind a waiting writer."""
    lock = RWLock()
    order: list[str] = []

    def writer() -> None:
        with lock.write():
            order.append("write")

    def reader() -> None:
        with lock.read():
            order.append("other read")

    with lock.read():
        w = threading.Thread(target=writer)
        w.start()
        time.sleep(0.05)  # the writer waits for this reader
        r = threading.Thread(target=reader)
        r.start()
        time.sleep(0.05)
        assert order == []  # the other thread's read waits behind the writer
    w.join(5)
    r.join(5)
    assert order == ["write", "other read"]


def test_an_error_inside_a_nested_read_leaves_the_lock_usable() -> None:
    """The nesting depth is restored when a nested read ends with an exception: the outer read
    still releases the lock, and a writer gets it after."""
    lock = RWLock()
    try:
        with lock.read():
            try:
                with lock.read():
                    raise RuntimeError("boom")
            except RuntimeError:
                pass
            assert lock._held.depth == 1  # back to the outer read's depth
            assert lock._readers == 1
            raise KeyError("outer")
    except KeyError:
        pass
    got = threading.Event()

    def writer() -> None:
        with lock.write():
            got.set()

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    assert got.wait(5), "the lock stayed held for reading"
    t.join(5)
    assert lock._held.depth == 0
    with lock.read():  # and this thread reads afresh (depth back to 0)
        assert lock._readers == 1


def test_a_helper_reads_under_a_lent_hold_while_a_writer_waits() -> None:
    """A search's helper thread searches an index the search holds for reading, and the search waits
    for it: under ``lent`` the helper's reads are taken at once even with a writer waiting (queueing
    behind the writer would deadlock), while a plain read in another thread still queues."""
    lock = RWLock()
    order: list[str] = []

    def writer() -> None:
        with lock.write():
            order.append("write")

    def helper() -> None:
        with lock.lent(), lock.read():
            order.append("lent read")

    def plain() -> None:
        with lock.read():
            order.append("plain read")

    with lock.read():
        w = _waiting_writer(lock, writer)
        h = threading.Thread(target=helper, daemon=True)  # daemon: a deadlock fails the test
        h.start()
        h.join(5)
        assert not h.is_alive(), "the helper's read waited behind the writer: deadlock"
        p = threading.Thread(target=plain, daemon=True)
        p.start()
        p.join(0.1)
        assert p.is_alive()  # a read not lent still waits behind the writer
    w.join(5)
    p.join(5)
    assert order == ["lent read", "write", "plain read"]
    with lock.write():  # the lent read left no reader behind
        order.append("write again")
