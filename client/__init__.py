"""Python client for tiermem: ``MemoryClient`` and its error hierarchy."""

from tiermem.v1.memory_pb2 import Memory, SearchResult, Tier

from .client import MemoryClient
from .errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    TiermemError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FieldViolation",
    "InvalidArgumentError",
    "Memory",
    "MemoryClient",
    "NotFoundError",
    "ResourceExhaustedError",
    "SearchResult",
    "Tier",
    "TiermemError",
    "UnavailableError",
]
