"""Admission of calls: a server-wide cap on calls in flight with a share kept for monitoring (health
and stats stay answerable under overload), and per API key a cap on calls in flight and a rate
(a token bucket). Each ``enter`` that succeeds is paired with one ``leave``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from tiermem.server.security.shared_rates import SharedRates, TableFull


class Admission:
    """At most ``total`` calls admitted and not yet finished, of which monitoring calls may take the
    last ``reserved``. A call is admitted when it arrives, before it waits for a handler thread, so
    the calls queued count too; each admission is a lease, given back when the call ends, or
    reclaimed after ``lease_seconds`` (a call cancelled while it was queued never runs its handler,
    so it never gives its lease back)."""

    def __init__(self, total: int, reserved: int, lease_seconds: float = 120.0) -> None:
        self.total, self.general = total, max(1, total - reserved)
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._leases: dict[int, float] = {}  # lease -> when it was given
        self._next = 0

    def enter(self, monitoring: bool) -> int | None:
        """A lease, or None when the call must be refused."""
        limit = self.total if monitoring else self.general
        with self._lock:
            if len(self._leases) >= limit:
                self._reclaim(time.monotonic() - self.lease_seconds)
                if len(self._leases) >= limit:
                    return None
            self._next += 1
            self._leases[self._next] = time.monotonic()
            return self._next

    def leave(self, lease: int) -> None:
        with self._lock:
            self._leases.pop(lease, None)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._leases)

    def _reclaim(self, before: float) -> None:
        stale = [lease for lease, at in self._leases.items() if at < before]
        for lease in stale:
            del self._leases[lease]


@dataclass
class _Bucket:
    tokens: float
    at: float
    in_flight: int = 0


class KeyLimits:
    """Per key: at most ``concurrency`` calls in flight in this process (0: no cap) and ``rate``
    calls a second on average with bursts of ``burst`` (rate 0: no cap), counted in ``shared`` when
    several processes serve the port (a key's rate is the same whichever process its calls reach),
    else here."""

    def __init__(self, concurrency: int, rate: float, burst: int, shared: SharedRates | None = None) -> None:
        self.concurrency, self.rate, self.burst = concurrency, rate, max(1, burst)
        self.shared = shared
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}

    def enter(self, key_id: str) -> float | None:
        """None when the call may go ahead (then ``leave`` once it ends); else the seconds to wait
        before a retry could succeed."""
        now = time.monotonic()
        with self._lock:
            b = self._buckets.get(key_id)
            if b is None:
                b = self._buckets[key_id] = _Bucket(float(self.burst), now)
            if self.concurrency and b.in_flight >= self.concurrency:
                return 0.05  # (a call in flight ends soon: a short wait)
            if self.rate > 0:
                wait = self._take(key_id, b, now)
                if wait is not None:
                    return wait
            b.in_flight += 1
            return None

    def _take(self, key_id: str, b: _Bucket, now: float) -> float | None:
        if self.shared is not None:
            try:
                return self.shared.take(key_id, self.rate, self.burst)  # (its clock read there)
            except TableFull:
                pass  # (more keys than the table's slots: this one is counted here alone)
        b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens < 1.0:
            return (1.0 - b.tokens) / self.rate
        b.tokens -= 1.0
        return None

    def leave(self, key_id: str) -> None:
        with self._lock:
            b = self._buckets.get(key_id)
            if b is not None:
                b.in_flight -= 1
