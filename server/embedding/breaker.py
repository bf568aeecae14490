"""A circuit breaker in front of a remote embedder: a dead endpoint costs one wait per cool-down,
not one per memory.

Closed (normal): calls go through; ``failures`` failed calls in a row open it. Open: calls fail at
once for ``cooldown_seconds``. Then one call goes through as a trial (half-open) while the others
still fail at once: its success closes the breaker, its failure opens it for another cool-down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        failures: int = 3,
        cooldown_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ValueError("the circuit breaker needs failures >= 1")
        if not cooldown_seconds >= 0:
            raise ValueError("the circuit breaker needs cooldown_seconds >= 0")
        self.name = name
        self.failures = failures
        self.cooldown_seconds = cooldown_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._in_a_row = 0  # failed calls since the last success
        self._opened_at: float | None = None  # None: closed
        self._trial = False  # a half-open trial call is under way

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open`` (a trial call under way)."""
        with self._lock:
            if self._opened_at is None:
                return "closed"
            return "half-open" if self._trial else "open"

    @property
    def failed_in_a_row(self) -> int:
        return self._in_a_row

    def wait_left(self) -> float | None:
        """None: this call may go through (and must then ``record`` how it went); else the seconds
        until the breaker lets a trial call through (0: a trial is under way)."""
        with self._lock:
            if self._opened_at is None:
                return None
            if self._trial:
                return 0.0
            left = self._opened_at + self.cooldown_seconds - self.clock()
            if left > 0:
                return left
            self._trial = True
            return None

    def record(self, ok: bool) -> None:
        """How a call that went through ended: ``ok`` when the endpoint answered sensibly."""
        with self._lock:
            was_open = self._opened_at is not None
            self._trial = False
            if ok:
                self._in_a_row, self._opened_at = 0, None
                if was_open:
                    logger.info("embedder %s answers again: circuit closed", self.name)
                return
            self._in_a_row += 1
            if was_open or self._in_a_row >= self.failures:
                self._opened_at = self.clock()
                if not was_open:
                    logger.warning(
                        "embedder %s failed %d times in a row: failing fast for %.1f s at a time",
                        self.name,
                        self._in_a_row,
                        self.cooldown_seconds,
                    )
