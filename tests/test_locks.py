"""server/locks.py: neither readers nor a looping writer can starve the other side."""

from __future__ import annotations

import threading
import time

from tiermem.server.locks import RWLock


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
