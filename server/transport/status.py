"""The one table from domain errors to gRPC status, and the rich google.rpc.Status they travel as."""

from __future__ import annotations

from typing import NamedTuple

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from tiermem.server.model.errors import TiermemError

DOMAIN = "tiermem"
# A status repeating hostile input at length would not fit the trailers (16 KiB in all; the
# client would see a bare RESOURCE_EXHAUSTED instead): every text in it is cut to a share.
MAX_MESSAGE = 1024
MAX_FIELD = 200
MAX_DESCRIPTION = 400
MAX_VIOLATIONS = 8
MAX_METADATA = 8  # entries of ErrorInfo.metadata, each key and value cut to MAX_FIELD


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most] + "..."


# status name (TiermemError.status) -> (grpc code, google.rpc code)
STATUS_CODES: dict[str, tuple[grpc.StatusCode, int]] = {
    "INVALID_ARGUMENT": (grpc.StatusCode.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT),
    "NOT_FOUND": (grpc.StatusCode.NOT_FOUND, code_pb2.NOT_FOUND),
    "ALREADY_EXISTS": (grpc.StatusCode.ALREADY_EXISTS, code_pb2.ALREADY_EXISTS),
    "FAILED_PRECONDITION": (grpc.StatusCode.FAILED_PRECONDITION, code_pb2.FAILED_PRECONDITION),
    "RESOURCE_EXHAUSTED": (grpc.StatusCode.RESOURCE_EXHAUSTED, code_pb2.RESOURCE_EXHAUSTED),
    "UNAVAILABLE": (grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE),
    "DEADLINE_EXCEEDED": (grpc.StatusCode.DEADLINE_EXCEEDED, code_pb2.DEADLINE_EXCEEDED),
    "UNAUTHENTICATED": (grpc.StatusCode.UNAUTHENTICATED, code_pb2.UNAUTHENTICATED),
    "PERMISSION_DENIED": (grpc.StatusCode.PERMISSION_DENIED, code_pb2.PERMISSION_DENIED),
    "INTERNAL": (grpc.StatusCode.INTERNAL, code_pb2.INTERNAL),
}


class _Status(NamedTuple):
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


class Status(_Status, grpc.Status):
    """A status with trailers of our own beside its details."""


def final(status: grpc.Status) -> grpc.Status:
    """``status`` with gRPC's retry pushback set to never: a client's retry policy does not make the
    call again (a write stored here whose retry would only wait out the same timeout again)."""
    trailers = (*status.trailing_metadata, ("grpc-retry-pushback-ms", "-1"))
    return Status(status.code, status.details, trailers)


def to_status(err: TiermemError, retry_after: float | None = None) -> grpc.Status:
    """``err`` as a rich status; ``retry_after`` (seconds) adds a RetryInfo."""
    _, code = STATUS_CODES.get(err.status, STATUS_CODES["INTERNAL"])
    details = []
    metadata = {_cut(k, MAX_FIELD): _cut(v, MAX_FIELD) for k, v in list(err.metadata.items())[:MAX_METADATA]}
    info = error_details_pb2.ErrorInfo(reason=_cut(err.reason, MAX_FIELD), domain=DOMAIN, metadata=metadata)
    packed = any_pb2.Any()
    packed.Pack(info)
    details.append(packed)
    if err.violations:
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=_cut(v.field, MAX_FIELD), description=_cut(v.description, MAX_DESCRIPTION)
                )
                for v in err.violations[:MAX_VIOLATIONS]
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad)
        details.append(packed)
    if retry_after is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(int(retry_after * 1e9))
        packed = any_pb2.Any()
        packed.Pack(retry)
        details.append(packed)
    message = _cut(err.message, MAX_MESSAGE)
    return rpc_status.to_status(status_pb2.Status(code=code, message=message, details=details))
