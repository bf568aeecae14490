"""Domain errors of tiermem, independent of gRPC.

Each error carries a status name (a gRPC status code name, mapped to ``grpc.StatusCode`` in one
table in ``tiermem.server.transport.status``), a stable machine-readable ``reason`` that clients match on,
a human message, and for bad input the violated fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FieldViolation:
    """One invalid field: ``field`` is the request path (e.g. ``memories[2].importance``)."""

    field: str
    description: str


@dataclass
class TiermemError(Exception):
    """Base of every error the engine raises on purpose."""

    message: str
    reason: str = "INTERNAL"
    status: str = "INTERNAL"
    violations: list[FieldViolation] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class InvalidArgument(TiermemError):
    """A request field is malformed or out of range; nothing was changed."""

    def within(self, prefix: str) -> InvalidArgument:
        """The same error for a field nested under ``prefix`` (e.g. ``searches[2].``)."""
        v = self.violations[0]
        return InvalidArgument(prefix + v.field, v.description, self.reason)

    def __init__(self, field_name: str, description: str, reason: str = "INVALID_FIELD") -> None:
        super().__init__(
            message=f"{field_name}: {description}",
            reason=reason,
            status="INVALID_ARGUMENT",
            violations=[FieldViolation(field_name, description)],
            metadata={"field": field_name},
        )


class NotFound(TiermemError):
    def __init__(self, message: str, reason: str = "MEMORY_NOT_FOUND") -> None:
        super().__init__(message=message, reason=reason, status="NOT_FOUND")


class AlreadyExists(TiermemError):
    def __init__(self, message: str, reason: str = "MEMORY_ALREADY_EXISTS") -> None:
        super().__init__(message=message, reason=reason, status="ALREADY_EXISTS")


class FailedPrecondition(TiermemError):
    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message=message, reason=reason, status="FAILED_PRECONDITION")


class ResourceExhausted(TiermemError):
    def __init__(self, message: str, reason: str = "STORAGE_FULL") -> None:
        super().__init__(message=message, reason=reason, status="RESOURCE_EXHAUSTED")


class ResponseTooLarge(ResourceExhausted):
    """The answer would not fit one message (``max_message_bytes``): refused before the call
    changes anything."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="RESPONSE_TOO_LARGE")


class DeadlineExceeded(TiermemError):
    """The caller's deadline passed (or it went away) while the work waited to start: the work is
    skipped (for a batch, its remaining parts; parts already done keep their effects)."""

    def __init__(self, message: str, reason: str = "DEADLINE_EXCEEDED") -> None:
        super().__init__(message=message, reason=reason, status="DEADLINE_EXCEEDED")


class Unavailable(TiermemError):
    def __init__(self, message: str, reason: str = "SHUTTING_DOWN") -> None:
        super().__init__(message=message, reason=reason, status="UNAVAILABLE")


class Unauthenticated(TiermemError):
    """The call carries no API key, or one the server does not know."""

    def __init__(self, message: str, reason: str = "API_KEY_MISSING") -> None:
        super().__init__(message=message, reason=reason, status="UNAUTHENTICATED")


class PermissionDenied(TiermemError):
    """The call's API key does not cover a namespace it names, or its role is too low."""

    def __init__(self, message: str, reason: str, metadata: dict[str, str] | None = None) -> None:
        super().__init__(message=message, reason=reason, status="PERMISSION_DENIED", metadata=metadata or {})


class StorageError(TiermemError):
    """The data directory cannot be used (wrong schema version, corrupt, not writable)."""

    def __init__(self, message: str, reason: str = "STORAGE_ERROR") -> None:
        super().__init__(message=message, reason=reason, status="INTERNAL")


class FollowerBehind(Unavailable):
    """A follower missed commits the commit log no longer holds (or stopped following): it must
    load again; its searches fail with UNAVAILABLE until it is replaced."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="FOLLOWER_BEHIND")
