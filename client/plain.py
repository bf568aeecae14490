"""Results as plain Python values.

The client returns the generated ``tiermem.v1`` messages, so every field of the contract is there
and code reading them (``m.content``, ``m.metadata["build"].int_value``, ``HasField``) keeps working.
Where plain values are wanted:

- ``metadata_dict(m)``: a memory's metadata (or a graph node's or edge's properties) as a dict of
  str, int, float and bool: ``{"build": 1432, "flaky": False}``.
- ``to_python(result)``: any result (a message, a list of them, a map field) as dicts, lists and
  scalars: metadata and properties as plain values, times as epoch seconds (float), enums by name
  (``"TIER_FAST"``), a field left unset that has presence (``importance``, ``expire_time``, ...) as
  None, every other field by its value (an empty list or "" included).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from tiermem._values import metadata_values, timestamp_seconds
from tiermem.v1 import memory_pb2 as pb


def metadata_dict(source: Any) -> dict[str, Any]:
    """Typed values as plain Python: of a ``Memory``'s ``metadata``, a ``GraphNode``'s or
    ``GraphEdge``'s ``properties``, or such a map field itself (a value with nothing set is left
    out)."""
    if isinstance(source, pb.Memory):
        source = source.metadata
    elif isinstance(source, (pb.GraphNode, pb.GraphEdge)):
        source = source.properties
    return {k: v for k, v in metadata_values(source).items() if v is not None}


def to_python(value: Any) -> Any:
    """A result as plain Python values (see the module's docstring); other values as they are."""
    if isinstance(value, pb.Value):
        which = value.WhichOneof("kind")
        return None if which is None else getattr(value, which)
    if isinstance(value, Timestamp):
        return timestamp_seconds(value)
    if isinstance(value, Message):
        return {f.name: _field(value, f) for f in value.DESCRIPTOR.fields}
    if isinstance(value, Mapping) or _is_map(value):
        return {k: to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or _is_repeated(value):
        return [to_python(v) for v in value]
    return value


def _field(message: Message, f: Any) -> Any:  # f: a FieldDescriptor
    value = getattr(message, f.name)
    if f.is_repeated and f.enum_type is not None:
        return [_enum_name(f, v) for v in value]
    if f.is_repeated:
        return to_python(value)
    if f.has_presence and not message.HasField(f.name):
        return None
    if f.enum_type is not None:
        return _enum_name(f, value)
    return to_python(value)


def _enum_name(f: Any, value: int) -> str | int:
    known = f.enum_type.values_by_number.get(value)
    return known.name if known is not None else value


def _is_map(value: Any) -> bool:
    return hasattr(value, "items") and hasattr(value, "get_or_create")


def _is_repeated(value: Any) -> bool:
    """A repeated field's container (not a str, bytes or message)."""
    # (upb's containers have no __iter__ attribute, yet iterate: extend tells them apart)
    return hasattr(value, "extend") and not isinstance(value, (str, bytes))
