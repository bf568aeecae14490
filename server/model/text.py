"""Text handling shared by the built-in embedder, the keyword index and token estimates."""

from __future__ import annotations

import math
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


def estimate_tokens(text: str) -> int:
    """The token cost of ``text`` when no tokenizer is given: a quarter of its UTF-8 bytes, rounded up."""
    return math.ceil(len(text.encode()) / 4)
