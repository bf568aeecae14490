"""Page tokens of the list calls: opaque to clients, checked when they come back.

A token holds where a listing stopped, which is a storage position shared by every namespace: in
the clear, two tokens a tenant got would tell how much the others wrote in between. So a token is
sealed: its value masked by a keystream and authenticated by a MAC, both keyed by a secret derived
from the data's instance id (the same after a restart), and bound
to the listing it continues (its namespace or prefix): a token forged, changed or taken from
another listing is refused. The key is the leader data's: the instance a replica copies, kept once
it is promoted, so a listing goes on across a replica and a failover. (The instance id is shown only
to calls that may read everything, and in the data directory.)"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Any

import msgpack

from tiermem.server.model.errors import InvalidArgument

_NONCE, _TAG = 16, 16


def page_secret(instance: str) -> bytes:
    """The key of an instance's page tokens."""
    return hashlib.blake2b(instance.encode(), person=b"tiermem-pages").digest()[:32]


def _keystream(secret: bytes, nonce: bytes, n: int) -> bytes:
    out = b""
    block = 0
    while len(out) < n:
        out += hashlib.blake2b(
            nonce + block.to_bytes(4, "big"), key=secret, person=b"tiermem-stream"
        ).digest()
        block += 1
    return out[:n]


def _tag(secret: bytes, listing: str, nonce: bytes, sealed: bytes) -> bytes:
    name = listing.encode()
    data = len(name).to_bytes(4, "big") + name + nonce + sealed  # (length first: no two listings alike)
    return hashlib.blake2b(data, key=secret, digest_size=_TAG, person=b"tiermem-tag").digest()


def encode_token(value: int | str | list[Any], secret: bytes, listing: str) -> str:
    """A token for ``value`` of the listing ``listing`` (e.g. "memories:ns")."""
    plain = msgpack.packb(value)
    nonce = os.urandom(_NONCE)
    sealed = bytes(a ^ b for a, b in zip(plain, _keystream(secret, nonce, len(plain)), strict=True))
    return base64.urlsafe_b64encode(nonce + _tag(secret, listing, nonce, sealed) + sealed).decode()


def decode_token(field_name: str, token: str, kind: type, secret: bytes, listing: str) -> Any:
    """The value of a token this server issued for ``listing`` (of type ``kind``); INVALID_ARGUMENT
    otherwise."""
    try:
        raw = base64.urlsafe_b64decode(token.encode())
        nonce, tag, sealed = raw[:_NONCE], raw[_NONCE : _NONCE + _TAG], raw[_NONCE + _TAG :]
        if len(nonce) != _NONCE or not hmac.compare_digest(tag, _tag(secret, listing, nonce, sealed)):
            raise ValueError(token)
        plain = bytes(a ^ b for a, b in zip(sealed, _keystream(secret, nonce, len(sealed)), strict=True))
        value = msgpack.unpackb(plain)
        if type(value) is not kind:  # (not a bool for an int)
            raise ValueError(token)
        return value
    except Exception:
        raise InvalidArgument(field_name, "is not a token this server issued for this listing") from None
