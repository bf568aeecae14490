"""Python client for tiermem: ``MemoryClient``, ``AsyncMemoryClient`` (the same for asyncio), their
error hierarchy, and ``metadata_dict`` / ``to_python`` for results as plain Python values."""

from tiermem.v1.memory_pb2 import Memory, SearchResult, Tier

from .aio import AsyncMemoryClient
from .client import MemoryClient
from .errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    TiermemError,
    UnauthenticatedError,
    UnavailableError,
)
from .plain import metadata_dict, to_python

__all__ = [
    "AlreadyExistsError",
    "AsyncMemoryClient",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FieldViolation",
    "InvalidArgumentError",
    "Memory",
    "MemoryClient",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "SearchResult",
    "Tier",
    "TiermemError",
    "UnauthenticatedError",
    "UnavailableError",
    "metadata_dict",
    "to_python",
]
