"""Python client for tiermem: ``MemoryClient``, its error hierarchy, and ``metadata_dict`` /
``to_python`` for results as plain Python values."""

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
from .plain import metadata_dict, to_python

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
    "metadata_dict",
    "to_python",
]
