"""Page tokens of the list calls: opaque to clients, checked when they come back."""

from __future__ import annotations

import base64
from typing import Any

import msgpack

from tiermem.server.model.errors import InvalidArgument


def encode_token(value: int | str | list[Any]) -> str:
    return base64.urlsafe_b64encode(msgpack.packb(["v1", value])).decode()


def decode_token(field_name: str, token: str, kind: type) -> Any:
    """The value of a token this server issued (of type ``kind``); INVALID_ARGUMENT otherwise."""
    try:
        tag, value = msgpack.unpackb(base64.urlsafe_b64decode(token.encode()))
        if tag != "v1" or type(value) is not kind:  # (not a bool for an int)
            raise ValueError(token)
        return value
    except Exception:
        raise InvalidArgument(field_name, "is not a token this server issued") from None
