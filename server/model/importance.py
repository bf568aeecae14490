"""Importance for memories stored without one: a fast, documented heuristic,
so "lite" agents without an LLM rating still get meaningful ranking.

    0.3 baseline
    +0.1 for more than 200 characters, +0.1 more for more than 500 (detail)
    +0.1 per cue word found, at most +0.3: decision and commitment cues (decided, agreed, will,
         must, plan), preference and identity cues (prefer, like, hate, always, never, remember,
         my name), urgency cues (important, critical, urgent, deadline, error, failed)
    kind: decision, preference, fact +0.2; tool_result, consensus, dissent +0.1;
          reflection at least 0.8, summary at least 0.6
    clamped to [0, 1]
"""

from __future__ import annotations

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
