"""Errors raised by the tiermem client: one hierarchy, matched on ``reason``, never on message text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class TiermemError(Exception):
    """A failed call: ``code`` (grpc.StatusCode), ``reason`` (e.g. ``MEMORY_NOT_FOUND``),
    ``message``, ``field_violations`` (for INVALID_ARGUMENT) and ``metadata`` from ErrorInfo."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        field_violations: tuple[FieldViolation, ...] = (),
        metadata: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" [{reason}]" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.field_violations = field_violations
        self.metadata = metadata or {}
        self.retry_after = retry_after  # seconds, when the server said when to try again (RetryInfo)

    @property
    def fields(self) -> list[str]:
        """Names of the invalid request fields."""
        return [v.field for v in self.field_violations]

    def __reduce__(self) -> tuple[Any, ...]:
        # (pickled whole, as raised in a worker process; the default passes the text as ``code``)
        details = (
            self.code,
            self.message,
            self.reason,
            self.field_violations,
            self.metadata,
            self.retry_after,
        )
        return type(self), details, self.__dict__


class InvalidArgumentError(TiermemError):
    pass


class NotFoundError(TiermemError):
    pass


class AlreadyExistsError(TiermemError):
    pass


class FailedPreconditionError(TiermemError):
    pass


class ResourceExhaustedError(TiermemError):
    pass


class UnavailableError(TiermemError):
    pass


class UnauthenticatedError(TiermemError):
    """The call had no API key, or one the server does not know (``reason`` API_KEY_MISSING or
    API_KEY_INVALID)."""


class PermissionDeniedError(TiermemError):
    """The API key does not cover a namespace the call names (NAMESPACE_NOT_COVERED), its role is
    too low (ROLE_TOO_LOW), or it may not name the embedding model of a vector it sends
    (EMBEDDING_MODEL_NOT_ALLOWED); ``metadata`` names which."""


class DeadlineExceededError(TiermemError):
    """The call's deadline passed: on the way, or while a search waited for its turn on the server
    (then it was not run)."""


_BY_CODE: dict[grpc.StatusCode, type[TiermemError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
}


def _status_sent(err: grpc.RpcError) -> status_pb2.Status | None:
    """The google.rpc.Status the server sent with the error, if any. (grpc_status's ``from_call``
    raises ValueError where it differs from the call's own status: a deadline that passed at both
    ends at once, the client's gRPC reporting its own.)"""
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    return None


def from_rpc_error(err: grpc.RpcError) -> TiermemError:
    """Build the matching TiermemError from a failed call, reading google.rpc.Status details."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    reason, metadata, violations, retry_after = "", {}, [], None
    status = _status_sent(err)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations = [FieldViolation(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.ToNanoseconds() / 1e9
    cls = _BY_CODE.get(code, TiermemError)
    return cls(code, message or "", reason, tuple(violations), metadata, retry_after)


TLS_HINT = (
    "it answers with TLS: connect with TLS (tls=True or the CA's certificate; the CLI's --tls or --tls-ca)"
)


def unreached(error: TiermemError, why: str) -> TiermemError:
    """``error`` (a deadline that passed while the call waited for its connection) saying why the
    server could not be reached: a bare DEADLINE_EXCEEDED after 30 s says nothing of a refused
    connection."""
    ask = "" if why.endswith(TLS_HINT) else "; is it running at that address?"
    return type(error)(
        error.code,
        f"{error.message}: the server could not be reached ({why}){ask}",
        error.reason,
        error.field_violations,
        error.metadata,
        error.retry_after,
    )
