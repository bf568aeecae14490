"""Logging of the server process: a text or JSON format (one object a line), each record carrying
the id of the request it was logged for (the caller's ``x-request-id``, or one made up), and the
access log, one DEBUG line a call (logger ``tiermem.access``)."""

from __future__ import annotations

import contextvars
import json
import logging
import time
import uuid
from typing import Any

import grpc

ACCESS = logging.getLogger("tiermem.access")
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("tiermem_request_id", default="")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def request_id_of(context: grpc.ServicerContext) -> str:
    for md in context.invocation_metadata() or ():
        if md.key == "x-request-id" and isinstance(md.value, str):
            return md.value[:64]
    return uuid.uuid4().hex[:16]


def set_request_id(value: str) -> contextvars.Token[str]:
    return _request_id.set(value)


def reset_request_id(token: contextvars.Token[str]) -> None:
    _request_id.reset(token)


class _RequestId(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, request_id, and the exception (and
    ``process``, when a search follower logs)."""

    def __init__(self, process: str = "") -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process:
            out["process"] = self.process
        rid = getattr(record, "request_id", "")
        if rid:
            out["request_id"] = rid
        for key in ("method", "code", "ms", "key_id", "peer"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str, process: str = "") -> None:
    """The root logger's level and format (``text`` or ``json``), with request ids on every record;
    ``process`` names the process in each line (a search follower's: "follower 1234")."""
    handler = logging.StreamHandler()
    handler.addFilter(_RequestId())
    text = TEXT_FORMAT.replace("%(name)s", f"{process} %(name)s") if process else TEXT_FORMAT
    handler.setFormatter(JsonFormatter(process) if fmt == "json" else logging.Formatter(text))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def code_of(context: grpc.ServicerContext, left_at_start: float | None = None, stopping: bool = False) -> str:
    """The status code a finished call answered with; for one that ended before its handler
    answered (no longer active), why it ended (``ended_early``)."""
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "OK" if context.is_active() else ended_early(context, left_at_start, stopping)


# (a client's cancel at its deadline reaches the server a little before the server's own timer)
CANCEL_MARGIN_SECONDS = 1.0


def ended_early(context: grpc.ServicerContext, left_at_start: float | None, stopping: bool) -> str:
    """Why a call ended before its handler answered: UNAVAILABLE when the server is stopping (it
    cancels the calls left), CANCELLED when its caller went away well before its deadline, else
    DEADLINE_EXCEEDED. ``left_at_start``: the call's time left when its handler began."""
    if stopping:
        return "UNAVAILABLE"
    left = context.time_remaining()
    if left is None or left > max(CANCEL_MARGIN_SECONDS, 0.05 * (left_at_start or 0.0)):
        return "CANCELLED"
    return "DEADLINE_EXCEEDED"


ENDED = {
    "UNAVAILABLE": "the server is stopping",
    "CANCELLED": "the caller cancelled the call",
    "DEADLINE_EXCEEDED": "the call's deadline passed",
}


def access(method: str, name: str, seconds: float, context: grpc.ServicerContext, key_id: str) -> None:
    """The access line of a finished call (DEBUG): method, status code, milliseconds, key id."""
    if not ACCESS.isEnabledFor(logging.DEBUG):
        return
    ms = round(seconds * 1000, 3)
    ACCESS.debug(
        "%s %s %.3f ms key=%s",
        method,
        name,
        ms,
        key_id or "-",
        extra={"method": method, "code": name, "ms": ms, "key_id": key_id, "peer": context.peer()},
    )
