"""systemd's readiness protocol (``sd_notify``): under ``Type=notify`` systemd counts a start as done
only once the server says READY=1, which it does once SERVING, so ``TimeoutStartSec`` bounds the
whole start-up (loading the data, compiling the kernels) and units ordered after tiermem start when
it answers. Nothing is sent without ``NOTIFY_SOCKET`` (not under systemd, or another ``Type``)."""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``STOPPING=1``, ``STATUS=...``) to systemd; True when sent. A
    failure is logged, never raised: the server serves whether or not systemd hears it."""
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return False
    if addr.startswith("@"):  # (an abstract socket's name)
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(state.encode())
    except OSError as e:
        logger.warning("cannot tell systemd %r through NOTIFY_SOCKET %r: %s", state, addr, e)
        return False
    return True
