"""Text handling shared by the built-in embedder, the keyword index and token estimates."""

from __future__ import annotations

import math
import re
import threading
import unicodedata
from collections import Counter

import Stemmer

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters, digits, underscore), in order."""
    return _WORD.findall(text.lower())


# Common English function words: they match almost every memory and carry no topic.
STOP_WORDS = frozenset(
    [
        "a",
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)
_stemmers = threading.local()  # a Stemmer object is not safe to share between threads


# How keyword_terms reads text: postings saved by another version are rebuilt, not mixed.
TOKENIZER = "casefold-nfc+snowball-english"


def keyword_terms(text: str) -> Counter[str]:
    """The terms of ``text`` with their counts: case-folded words (so "STRASSE" matches "Straße"),
    composed (NFC, so a text stored decomposed matches too), stop words out, stemmed."""
    return keyword_terms_and_length(text)[0]


def keyword_terms_and_length(text: str) -> tuple[Counter[str], int]:
    """``keyword_terms`` and the number of words (stop words included): a memory's length for BM25."""
    stemmer = getattr(_stemmers, "english", None)
    if stemmer is None:
        stemmer = _stemmers.english = Stemmer.Stemmer("english")
    # (NFC after folding: folding some letters leaves a combining mark, which \w would split on)
    every = _WORD.findall(unicodedata.normalize("NFC", text.casefold()))
    words = [w for w in every if w not in STOP_WORDS and len(w) < 100]
    return Counter(stemmer.stemWords(words)), len(every)


def estimate_tokens(text: str) -> int:
    """The token cost of ``text`` when no tokenizer is given: a quarter of its UTF-8 bytes, rounded up."""
    return math.ceil(len(text.encode()) / 4)


def first_sentence(text: str) -> str:
    """``text`` with its white space collapsed, up to the first '.', '!' or '?' that ends a word."""
    text = " ".join(text.split())
    for i, ch in enumerate(text):
        if ch in ".!?" and (i + 1 == len(text) or text[i + 1] == " "):
            return text[: i + 1]
    return text


def as_sentence(text: str) -> str:
    """``text`` ended as a sentence: a '.' added unless it ends with '.', '!' or '?' (joined to the
    next one, it would otherwise run on into it, and read back as one sentence)."""
    return text if not text or text[-1] in ".!?" else text + "."


def sentences(text: str) -> list[str]:
    """``text``'s sentences, as ``first_sentence`` ends them (one pass: a memory may be 64 KiB)."""
    text = " ".join(text.split())
    out, start, n = [], 0, len(text)
    for i, ch in enumerate(text):
        if ch in ".!?" and (i + 1 == n or text[i + 1] == " "):
            out.append(text[start : i + 1])
            start = i + 2
    if start < n:
        out.append(text[start:])
    return out


def fitting_sentences(texts: list[str], order: list[int], max_tokens: int) -> list[int]:
    """Of ``texts`` taken in ``order`` (best first), those whose first sentences fit together within
    ``max_tokens`` (a sentence and its space each); their indices, best first. An extractive summary."""
    chosen, used = [], 0
    for i in order:
        cost = estimate_tokens(first_sentence(texts[i])) + 1
        if used + cost <= max_tokens:
            chosen.append(i)
            used += cost
    return chosen
