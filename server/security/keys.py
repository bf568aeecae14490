"""API keys: a keys file of hashes, each bound to namespace prefixes and a role.

The file holds one JSON object a line: ``{"id", "sha256", "namespaces", "role", "created"}``. A
token is ``tm_<id>_<secret>`` (32 random bytes, URL-safe base64); only its SHA-256 is stored (a
token is random and long, so a fast hash is enough: there is nothing to guess). A key for the prefix
``user:ana`` covers ``user:ana`` and ``user:ana/...``, never ``user:anabel``; the empty prefix covers
every namespace. Roles are ordered: read < write < admin.

``KeyRing`` reloads the file when it changes (checked at most once a second), so keys are added,
rotated and revoked without a restart; a file that cannot be read keeps the keys loaded before."""

from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tiermem.server.config import UnusableSetting
from tiermem.server.model.types import Under

logger = logging.getLogger(__name__)

ROLES = {"read": 1, "write": 2, "admin": 3}
TOKEN_PREFIX = "tm_"
RELOAD_CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class ApiKey:
    """A key's rights: the namespace prefixes it covers and its role."""

    id: str
    namespaces: tuple[str, ...]
    role: str

    @property
    def level(self) -> int:
        return ROLES[self.role]

    @property
    def everything(self) -> bool:
        """Whether the key covers every namespace (an empty prefix)."""
        return "" in self.namespaces

    def covers(self, namespace: str) -> bool:
        return self.everything or self.under(namespace)

    @functools.cached_property
    def under(self) -> Under:
        """The namespaces the key names and those below them: ``covers`` of a key that does not
        cover every namespace, and the selection of the server's figures such a key sees."""
        return Under(frozenset(self.namespaces))

    def covers_tree(self, prefix: str) -> bool:
        """Whether every namespace at or below ``prefix`` ("" for all) is covered."""
        return self.everything or (prefix != "" and self.covers(prefix))


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class KeysFileError(UnusableSetting):
    """The keys file cannot be read or holds a malformed line (its path and line named): at
    start-up a setting's fault, named in one line (exit status 2: a restart would not mend it)."""


def parse(path: Path) -> dict[str, ApiKey]:
    """The keys of a keys file, by token hash."""
    keys: dict[str, ApiKey] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise KeysFileError(f"cannot read the keys file {path}: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entry = json.loads(line)
            digest, role = str(entry["sha256"]), str(entry["role"])
            listed = entry["namespaces"]
            # (a string here would be read as its characters: "user:ana" as keys for "u", "s", ...)
            if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
                raise TypeError("namespaces must be a list of strings")
            namespaces = tuple(listed)
            key = ApiKey(str(entry["id"]), namespaces, role)
        except (ValueError, KeyError, TypeError) as e:
            raise KeysFileError(f"{path}:{n}: not a key entry ({type(e).__name__}: {e})") from None
        if role not in ROLES or not namespaces or len(digest) != 64:
            raise KeysFileError(f"{path}:{n}: needs a role of {sorted(ROLES)}, namespaces and a sha256")
        fault = _prefix_fault(namespaces)
        if fault:
            raise KeysFileError(f"{path}:{n}: {fault}")
        keys[digest] = key
    return keys


def _prefix_fault(prefixes: Iterable[str]) -> str | None:
    """What is wrong with the first malformed prefix, if one is."""
    for p in prefixes:
        if p != p.strip() or p.endswith("/") or any(ord(c) < 32 for c in p):
            return f"namespace prefix {p!r}: no surrounding spaces, control characters or final '/'"
    return None


def add_key(path: Path, namespaces: list[str], role: str) -> str:
    """Append a new key for ``namespaces`` with ``role`` to the keys file (created, mode 0600, if
    missing); returns its token, which is not stored anywhere."""
    if role not in ROLES:
        raise KeysFileError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    if not namespaces:
        raise KeysFileError("a key needs at least one namespace prefix ('' for every namespace)")
    fault = _prefix_fault(namespaces)
    if fault:
        raise KeysFileError(fault)
    key_id = secrets.token_hex(6)
    token = (
        TOKEN_PREFIX + key_id + "_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    )
    entry = {
        "id": key_id,
        "sha256": token_hash(token),
        "namespaces": namespaces,
        "role": role,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if path.exists():
        parse(path)  # never append to a file the server could not read
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token


class KeyRing:
    """The keys of a keys file, reloaded when the file changes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._keys = parse(self.path)  # (a bad file at start-up is an error, not an empty ring)
        self._stamp = self._file_stamp()
        self._checked = time.monotonic()
        logger.info("API keys: %d loaded from %s", len(self._keys), self.path)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def lookup(self, token: str) -> ApiKey | None:
        """The key of ``token``, or None when the file does not hold it (any more)."""
        self._maybe_reload()
        return self._keys.get(token_hash(token))

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        with self._lock:
            if now - self._checked < RELOAD_CHECK_SECONDS:
                return
            self._checked = now
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            try:
                keys = parse(self.path)
            except KeysFileError as e:
                logger.error("keeping the API keys loaded before: %s", e)
                return
            self._keys, self._stamp = keys, stamp
            logger.info("API keys: %d loaded from %s (the file changed)", len(keys), self.path)

    def reload(self) -> None:
        """Check the file now (tests; the server checks at most once a second)."""
        self._checked = 0.0
        self._maybe_reload()
