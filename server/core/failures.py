"""How the background loops log their failures: a refusal for want of room (a full disk or map) is
a state the server is in, said in one line when it begins (or its cause changes) and once a minute
while it lasts (small writes may go through in between: a success does not end it); anything else
is a fault, logged with its traceback each time."""

from __future__ import annotations

import logging
import time

from tiermem.server.model.errors import ResourceExhausted

logger = logging.getLogger(__name__)

REPEAT_SECONDS = 60.0  # a refusal that lasts is logged again this often


class Failures:
    """The failures of one kind of background work (``what``: "maintenance pass")."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._last: tuple[str, float] | None = None  # (the refusal's cause, when it was logged)

    def failed(self, e: Exception, about: str = "") -> None:
        """Log ``e`` (``about``: what it failed on, named in the line)."""
        on = f" ({about})" if about else ""
        if not isinstance(e, ResourceExhausted):  # (a fault, if a domain error too: each one told)
            logger.error("%s failed%s", self.what, on, exc_info=e)
            return
        now, why = time.monotonic(), f"{e.reason} {e.metadata.get('resource', '')}"
        if self._last is None or self._last[0] != why or now - self._last[1] >= REPEAT_SECONDS:
            logger.warning("%s failed%s, tried again later: %s [%s]", self.what, on, e, e.reason)
            self._last = (why, now)
