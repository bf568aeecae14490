"""LangGraph addresses as tiermem addresses, both ways: a namespace tuple as a namespace path, an
item key as a memory id. Pure functions, no I/O.

A namespace label becomes one path segment. tiermem allows ``[A-Za-z0-9._:-]`` in a segment, and
LangGraph never allows ``.`` in a label, so ``.`` is the escape: every other character is written as
``.XX`` per byte of its UTF-8 form (``"ana maria"`` -> ``ana.20maria``, ``"a/b"`` -> ``a.2Fb``);
labels like ``user:ana`` stay as they are.

A key becomes the memory's client id. Ids allow ``[A-Za-z0-9._:-]``, 1 to 128 of them, and keys may
hold anything (``.`` included), so ``:`` is the escape there: ``[A-Za-z0-9._-]`` stay, everything else
(``:`` too) is ``:XX`` per UTF-8 byte (``"user:7"`` -> ``user:3A7``, ``"a b"`` -> ``a:20b``). A key
whose id would be empty or longer than 128 characters gets ``::`` and its SHA-256 in hex: ``::``
never comes out of the escaping, and the key itself is kept in the memory's metadata."""

from __future__ import annotations

import hashlib
import re
import string

MAX_ID = 128
_HEX = frozenset("0123456789ABCDEF")
_LABEL_SAFE = frozenset(string.ascii_letters + string.digits + "_:-")
_KEY_SAFE = frozenset(string.ascii_letters + string.digits + "._-")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._:\-]+(?:/[A-Za-z0-9._:\-]+)*\Z")
HASHED = "::"


def _escape(text: str, safe: frozenset[str], mark: str) -> str:
    out: list[str] = []
    for ch in text:
        if ch in safe:
            out.append(ch)
        else:
            out.extend(f"{mark}{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    return "".join(out)


def _unescape(text: str, safe: frozenset[str], mark: str) -> str | None:
    """``text`` unescaped, or None unless ``_escape`` writes exactly ``text`` for the result."""
    if mark not in text and safe.issuperset(text):
        return text  # nothing escaped (the common case, and ``_escape`` writes it as it is)
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == mark:
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                return None
            raw.append(int(pair, 16))
            i += 3
        elif ch in safe:
            raw += ch.encode()
            i += 1
        else:
            return None
    try:
        out = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None
    return out if _escape(out, safe, mark) == text else None


def check_prefix(prefix: str) -> str:
    """The store's root namespace path: '' or segments of ``[A-Za-z0-9._:-]`` joined by '/'."""
    prefix = prefix.strip("/")
    if prefix and not _PREFIX_RE.match(prefix):
        raise ValueError(
            f"namespace_prefix {prefix!r} must be '' or tiermem namespace segments of [A-Za-z0-9._:-] "
            "separated by '/' (e.g. 'app:x/langgraph')"
        )
    return prefix


def encode_label(label: str) -> str:
    return _escape(label, _LABEL_SAFE, ".")


def decode_label(segment: str) -> str | None:
    """The label ``encode_label`` writes as ``segment``; None when it writes no label so (a
    namespace another client made, e.g. with a '.' of its own)."""
    label = _unescape(segment, _LABEL_SAFE, ".")
    return label if label and "." not in label and "\x00" not in label else None


def namespace_path(prefix: str, namespace: tuple[str, ...]) -> str:
    """The tiermem namespace of a LangGraph namespace under the store's ``prefix`` ('' for the store
    root itself when ``prefix`` is '')."""
    return "/".join(([prefix] if prefix else []) + [encode_label(label) for label in namespace])


def namespace_tuple(prefix: str, path: str) -> tuple[str, ...] | None:
    """The LangGraph namespace stored at ``path``; None for a path outside ``prefix``, the store's
    root itself, or one no LangGraph namespace maps to."""
    if prefix:
        if not path.startswith(prefix + "/"):
            return None
        path = path[len(prefix) + 1 :]
    labels = [decode_label(segment) for segment in path.split("/")]
    if not labels or any(label is None for label in labels):
        return None
    return tuple(label for label in labels if label is not None)


def memory_id(key: str) -> str:
    escaped = _escape(key, _KEY_SAFE, ":")
    if 0 < len(escaped) <= MAX_ID:
        return escaped
    return HASHED + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_of(memory_id_: str) -> str | None:
    """The key whose id is ``memory_id_``; None for a hashed id (the key is in the metadata) or an
    id ``memory_id`` does not write."""
    if memory_id_.startswith(HASHED):
        return None
    return _unescape(memory_id_, _KEY_SAFE, ":")
