"""Named lifecycle presets: each one a set of policy overrides (in the stored form of
``policy.check_overrides``) that makes a namespace behave like one of the memory designs tiermem
serves. A namespace names one in its policy (``LifecyclePolicy.preset``); its own overrides apply
over the preset's, and the effective policy shows the result. docs/lifecycle.md describes each.

Values of enums are those of the proto: retention 4 lru, 5 importance, 6 ten_point_weighted;
importance_decay 1 half_life, 2 none; importance_heuristic 2 ten_point, 3 phrases;
summary_strategy 1 rolling, 2 hierarchical.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # Four timescale tiers with promotion and demotion: decay by tier half-life with no floor, a
    # memory stored without importance rated 0.5, promotion through every faster tier in one pass,
    # demotion below a tier's threshold at once, and capacity evictions summarized (GLACIAL's
    # deleted once summarized).
    "tiered_consolidation": {
        "tiers": {
            1: {"ttl_seconds": 60.0, "max_items": 1000, "importance_threshold": 0.8},
            2: {"ttl_seconds": 3600.0, "max_items": 500, "importance_threshold": 0.5},
            3: {"ttl_seconds": 86400.0, "max_items": 200, "importance_threshold": 0.3},
            4: {"ttl_seconds": 604800.0, "max_items": 100, "importance_threshold": 0.0},
        },
        "importance_decay": 1,
        "importance_floor": 0.0,
        "default_importance": 0.5,
        "promote_through_tiers": True,
        "decay_grace": False,
        "delete_from_glacial": True,
        "summarize_evictions": True,
    },
    # Task, project and global stores: importance as stored, 1,000 memories per namespace, and a
    # create that crosses the cap deletes the least important tenth (the earliest stored first).
    "task_project_global": {
        "importance_decay": 2,
        "max_items": 1000,
        "evict_share": 0.1,
        "evict_on_create": True,
        "retention": 5,
    },
    # Observations and reflections: importance as stored, rated on ten points when not given,
    # 1,000 observations and 100 reflections kept by 0.7 importance (on its 1-10 scale) + 0.3 recency,
    # a reflection due at 10 of accumulated importance (100 on the ten-point scale).
    "generative_agents": {
        "importance_decay": 2,
        "importance_heuristic": 2,
        "kind_capacities": {"observation": 1000, "reflection": 100},
        "retention": 6,
        "reflection_threshold": 10.0,
    },
    # Raw events with a rolling summary the server keeps: rebuilt once more than 8,000 new tokens
    # arrived, from the previous one and what followed.
    "pyramid": {
        "summary_token_threshold": 8000,
        "auto_summarize": True,
        "summary_strategy": 1,
    },
    # Working, episodic and semantic layers: importance as stored, rated by phrases when not given,
    # the least recently accessed evicted first, working memory (FAST) flushed to episodic (MEDIUM)
    # past 32,000 tokens, and a hierarchical summary of 2,000 tokens kept past 50,000 new ones.
    "hybrid_retrieval": {
        "importance_decay": 2,
        "importance_heuristic": 3,
        "retention": 4,
        "working_token_limit": 32000,
        "summary_token_threshold": 50000,
        "auto_summarize": True,
        "summary_strategy": 2,
        "summary_max_tokens": 2000,
    },
}
