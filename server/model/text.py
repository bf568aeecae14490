"""Text handling shared by the built-in embedder and the keyword index."""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"\w+", re.UNICODE)
MAX_TERM_BYTES = 200  # longer words are cut (LMDB keys are at most 511 bytes)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore), in order."""
    return _WORD.findall(text.lower())


def term_counts(text: str) -> Counter[str]:
    """Each distinct term of ``text`` with its count (the keyword index's unit)."""
    return Counter(w.encode()[:MAX_TERM_BYTES].decode(errors="ignore") for w in words(text))
