"""Admission of calls: a server-wide cap on calls in flight with a share kept for monitoring (health
and stats stay answerable under overload), and per API key a cap on calls in flight and a rate
(a token bucket). Each ``enter`` that succeeds is paired with one ``leave``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


class Admission:
    """At most ``total`` calls in flight, of which monitoring calls may take the last ``reserved``."""

    def __init__(self, total: int, reserved: int) -> None:
        self.total, self.general = total, max(1, total - reserved)
        self._lock = threading.Lock()
        self._in_flight = 0

    def enter(self, monitoring: bool) -> bool:
        with self._lock:
            if self._in_flight >= (self.total if monitoring else self.general):
                return False
            self._in_flight += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1


@dataclass
class _Bucket:
    tokens: float
    at: float
    in_flight: int = 0


class KeyLimits:
    """Per key: at most ``concurrency`` calls in flight (0: no cap) and ``rate`` calls a second on
    average with bursts of ``burst`` (rate 0: no cap)."""

    def __init__(self, concurrency: int, rate: float, burst: int) -> None:
        self.concurrency, self.rate, self.burst = concurrency, rate, max(1, burst)
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
                b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
                b.at = now
                if b.tokens < 1.0:
                    return (1.0 - b.tokens) / self.rate
                b.tokens -= 1.0
            b.in_flight += 1
            return None

    def leave(self, key_id: str) -> None:
        with self._lock:
            b = self._buckets.get(key_id)
            if b is not None:
                b.in_flight -= 1
