"""Importance for memories stored without one: fast, documented heuristics, so "lite" agents
without an LLM rating still get meaningful ranking. A namespace's policy picks one
(``importance_heuristic``); ``estimate`` (cues) is the server's default.

cues (``estimate``):
    0.3 baseline
    +0.1 for more than 200 characters, +0.1 more for more than 500 (detail)
    +0.1 per cue word found, at most +0.3: decision and commitment cues (decided, agreed, will,
         must, plan), preference and identity cues (prefer, like, hate, always, never, remember,
         my name), urgency cues (important, critical, urgent, deadline, error, failed)
    kind: decision, preference, fact +0.2; tool_result, consensus, dissent +0.1;
          reflection at least 0.8, summary at least 0.6
    clamped to [0, 1]

ten_point (``estimate_ten_point``), rated on 1-10 and divided by 10:
    3 baseline
    +1 for more than 200 characters, +1 more for more than 500
    +0.5 per keyword contained in the lower-cased text (as substrings, so "disagree" also
         contains "agree"): important, critical, urgent, decision, agree, disagree, believe, feel
    clamped to [1, 10]

phrases (``estimate_phrases``):
    0.5 baseline
    +0.3 if the lower-cased text contains "my name is", "i prefer" or "remember that"
    +0.2 if it contains "i will", "let's do" or "decided"
    +0.1 for kind tool_result
    +max(0, 0.2 - 0.1 * age_hours / 24) for freshness (0.2 for a memory stored as it happens),
         evaluated once, when stored
    clamped to [0, 1]
"""

from __future__ import annotations

from tiermem.server.config import IMPORTANCE_HEURISTICS
from tiermem.server.model.text import words

CUES = frozenset(
    {
        "decided",
        "decide",
        "decision",
        "agreed",
        "agree",
        "disagree",
        "will",
        "must",
        "plan",
        "commit",
        "prefer",
        "prefers",
        "preference",
        "like",
        "likes",
        "hate",
        "always",
        "never",
        "remember",
        "name",
        "important",
        "critical",
        "urgent",
        "deadline",
        "error",
        "failed",
        "failure",
    }
)
KIND_BONUS = {
    "decision": 0.2,
    "preference": 0.2,
    "fact": 0.2,
    "tool_result": 0.1,
    "consensus": 0.1,
    "dissent": 0.1,
}
KIND_FLOOR = {"reflection": 0.8, "summary": 0.6}


def estimate(content: str, kind: str) -> float:
    score = 0.3
    if len(content) > 200:
        score += 0.1
    if len(content) > 500:
        score += 0.1
    cues = len(CUES.intersection(words(content)))
    score += min(0.3, 0.1 * cues)
    score += KIND_BONUS.get(kind, 0.0)
    score = max(score, KIND_FLOOR.get(kind, 0.0))
    return round(min(1.0, max(0.0, score)), 4)


TEN_POINT_KEYWORDS = ("important", "critical", "urgent", "decision", "agree", "disagree", "believe", "feel")
IDENTITY_PHRASES = ("my name is", "i prefer", "remember that")
DECISION_PHRASES = ("i will", "let's do", "decided")


def estimate_ten_point(content: str) -> float:
    score = 3.0
    if len(content) > 200:
        score += 1.0
    if len(content) > 500:
        score += 1.0
    lower = content.lower()
    score += 0.5 * sum(1 for k in TEN_POINT_KEYWORDS if k in lower)
    return round(min(10.0, max(1.0, score)) / 10.0, 4)


def estimate_phrases(content: str, kind: str, age_hours: float = 0.0) -> float:
    score = 0.5
    lower = content.lower()
    if any(p in lower for p in IDENTITY_PHRASES):
        score += 0.3
    if any(p in lower for p in DECISION_PHRASES):
        score += 0.2
    if kind == "tool_result":
        score += 0.1
    score += max(0.0, 0.2 - max(0.0, age_hours) / 24.0 * 0.1)
    return round(min(1.0, max(0.0, score)), 4)


def estimate_by(heuristic: int, content: str, kind: str, age_hours: float = 0.0) -> float:
    """The importance ``heuristic`` (a value of ``config.IMPORTANCE_HEURISTICS``) gives; a
    reflection's is at least 0.8 whichever rates it."""
    if heuristic == IMPORTANCE_HEURISTICS["ten_point"]:
        score = estimate_ten_point(content)
    elif heuristic == IMPORTANCE_HEURISTICS["phrases"]:
        score = estimate_phrases(content, kind, age_hours)
    else:
        return estimate(content, kind)
    return max(score, 0.8) if kind == "reflection" else score
