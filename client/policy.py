"""A namespace's lifecycle policy from keyword arguments: ``MemoryClient.update_namespace_config``
sets each field given on a ``LifecyclePolicy`` and names it in the update mask (``policy.<name>``).
Enums are taken by name ("half_life", "ten_point", "last_access", ...) or by value."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from tiermem.v1 import memory_pb2 as pb

_FIELDS = pb.LifecyclePolicy.DESCRIPTOR.fields
# Read from the message itself, so a field the server adds is taken as soon as the stubs have it.
# Each enum field: its enum and the prefix of its value names (its zero value's, less UNSPECIFIED).
ENUMS: dict[str, tuple[EnumTypeWrapper, str]] = {
    f.name: (getattr(pb, f.enum_type.name), f.enum_type.values_by_number[0].name.removesuffix("UNSPECIFIED"))
    for f in _FIELDS
    if f.enum_type is not None
}
SCALARS = tuple(f.name for f in _FIELDS if f.enum_type is None and f.message_type is None)
# The fields MemoryClient.update_namespace_config takes as keyword arguments of the same name
# (``tiers`` apart: a mapping of per-tier messages).
POLICY_ARGUMENTS = (*SCALARS, *ENUMS, "kind_capacities")


def enum_value(argument: str, value: int | str) -> int:
    """The value of policy enum ``argument`` named ``value`` ("half_life", "HALF_LIFE" or
    "IMPORTANCE_DECAY_HALF_LIFE"), or ``value`` itself when it is an int (the server checks it)."""
    enum, prefix = ENUMS[argument]
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    names = [v.name[len(prefix) :].lower() for v in enum.DESCRIPTOR.values if v.number]
    if isinstance(value, str):
        name = value.upper().removeprefix(prefix).lower()
        if name in names:
            return int(enum.Value(prefix + name.upper()))
    raise ValueError(f"{argument} must be one of {', '.join(names)} (or an enum value), not {value!r}")


def set_policy_fields(policy: pb.LifecyclePolicy, fields: Mapping[str, Any]) -> list[str]:
    """Set on ``policy`` each of ``fields`` that is not None (enums by name or value, scalars,
    ``kind_capacities`` as {kind: max_items}); returns the update mask paths naming them."""
    paths = []
    for name, value in fields.items():
        if value is None:
            continue
        if name in ENUMS:
            setattr(policy, name, enum_value(name, value))
        elif name == "kind_capacities":
            if not isinstance(value, Mapping):
                raise ValueError(f"kind_capacities must map kinds to max_items, not {type(value).__name__}")
            for kind, n in value.items():
                policy.kind_capacities.add(kind=kind, max_items=n)
        elif name in SCALARS:
            setattr(policy, name, value)
        else:
            raise ValueError(f"{name!r} is not a lifecycle policy field")
        paths.append(f"policy.{name}")
    return paths
