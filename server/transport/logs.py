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
    """One JSON object a line: time, level, logger, message, request_id, and the exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", "")
        if rid:
            out["request_id"] = rid
        for key in ("method", "code", "ms", "key_id", "peer"):
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure(level: str, fmt: str) -> None:
    """The root logger's level and format (``text`` or ``json``), with request ids on every record."""
    handler = logging.StreamHandler()
    handler.addFilter(_RequestId())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def code_of(context: grpc.ServicerContext) -> str:
    """The status code a finished call answered with."""
    code = context.code() if hasattr(context, "code") else None
    return code.name if isinstance(code, grpc.StatusCode) else "OK"


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
