"""Extractive condensing (no LLM) for the summaries the server keeps: pieces of text with their
importance in, one summary within a token budget out. Pure functions; the lifecycle and the
summarizer read the records and store the result."""

from __future__ import annotations

from dataclasses import dataclass

from tiermem.server.model.text import as_sentence, estimate_tokens, first_sentence, fitting_sentences

CHUNK = 10  # pieces condensed into one at each level of a hierarchical summary


@dataclass(frozen=True)
class Piece:
    """A text to condense (a memory, or a sentence of a previous summary) and its importance."""

    text: str
    importance: float


def sentences(text: str) -> list[str]:
    """``text`` split into its sentences (see ``first_sentence``), white space collapsed."""
    rest, out = " ".join(text.split()), []
    while rest:
        s = first_sentence(rest)
        out.append(s)
        rest = rest[len(s) :].lstrip()
    return out


def rolling(pieces: list[Piece], max_tokens: int) -> tuple[str, list[int]]:
    """The first sentence of each piece (given oldest first), the best first by 0.7 * importance +
    0.3 * rank in time (the latest among equals), kept within ``max_tokens``, then in time order.
    Returns the summary and the indices of the pieces it quotes, in time order."""
    n = len(pieces)
    if not n:
        return "", []
    order = sorted(range(n), key=lambda i: (-(0.7 * pieces[i].importance + 0.3 * (i + 1) / n), -i))
    texts = [p.text for p in pieces]
    chosen = sorted(fitting_sentences(texts, order, max_tokens))
    if not chosen:  # not one sentence fits: the best one, cut to the budget
        return cut(first_sentence(texts[order[0]]), max_tokens), [order[0]]
    return " ".join(as_sentence(first_sentence(texts[i])) for i in chosen), chosen


def hierarchical(pieces: list[Piece], max_tokens: int) -> tuple[str, int, list[int]]:
    """The first sentence of each piece (given oldest first); while they do not fit ``max_tokens``,
    each run of CHUNK in time order is condensed to its most important sentence (the latest among
    equals), with the run's highest importance. Returns the summary, how many levels it took and
    the indices of the pieces it quotes, in time order."""
    level = [(Piece(as_sentence(first_sentence(p.text)), p.importance), i) for i, p in enumerate(pieces)]
    depth = 0
    while len(level) > 1 and _tokens([p for p, _ in level]) > max_tokens:
        level = [_best(level[lo : lo + CHUNK]) for lo in range(0, len(level), CHUNK)]
        depth += 1
    text = " ".join(p.text for p, _ in level)
    quoted = [i for _, i in level]
    return (cut(text, max_tokens) if estimate_tokens(text) > max_tokens else text), depth, quoted


def _best(run: list[tuple[Piece, int]]) -> tuple[Piece, int]:
    k = max(range(len(run)), key=lambda k: (run[k][0].importance, k))
    return Piece(run[k][0].text, max(p.importance for p, _ in run)), run[k][1]


def sources(n: int, quoted: list[int], cap: int) -> list[int]:
    """The pieces (of ``n``, oldest first) a summary names as its sources, in time order: every one
    it quotes, then the newest of the others, ``cap`` in all."""
    picked = sorted(quoted, reverse=True)[:cap]
    skip = set(picked)
    rest = [i for i in range(n - 1, -1, -1) if i not in skip][: cap - len(picked)]
    return sorted(picked + rest)


def _tokens(level: list[Piece]) -> int:
    """The tokens of the level joined, as the summary would be."""
    return estimate_tokens(" ".join(p.text for p in level))


def cut(text: str, max_tokens: int) -> str:
    """``text``'s first words within ``max_tokens`` (at least one word)."""
    out: list[str] = []
    size = 0  # UTF-8 bytes of " ".join(out)
    for w in text.split():
        grown = size + len(w.encode()) + (1 if out else 0)
        if out and -(-grown // 4) > max_tokens:  # (estimate_tokens: a quarter of the bytes, rounded up)
            break
        out.append(w)
        size = grown
    return " ".join(out)
