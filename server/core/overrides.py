"""Checking a namespace's lifecycle overrides (their stored form: {"tiers": {tier: {field: value}},
field: value, ...}) before they are stored: each out-of-range value is an InvalidArgument naming
its field."""

from __future__ import annotations

from typing import Any

import numpy as np

from tiermem.server.config import (
    IMPORTANCE_DECAYS,
    IMPORTANCE_HEURISTICS,
    RECENCY_BASES,
    RETENTION_POLICIES,
    SUMMARY_STRATEGIES,
    TIERS,
)
from tiermem.server.core.presets import PRESETS
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.validation import KIND_RE

MAX_KIND_CAPACITIES = 64  # each is counted at every pass and capped create


def check_overrides(overrides: dict[str, Any], prefix: str = "config.policy.") -> dict[str, Any]:
    """Validate stored-form overrides; returns them without empty parts."""
    out: dict[str, Any] = {}
    tiers: dict[int, dict[str, Any]] = {}
    # (entries in the request's order: the i-th is the request's tiers[i])
    for i, (t, fields_) in enumerate((overrides.get("tiers") or {}).items()):
        if int(t) not in TIERS:
            raise InvalidArgument(
                f"{prefix}tiers[{i}].tier", "must be TIER_FAST, TIER_MEDIUM, TIER_SLOW or TIER_GLACIAL"
            )
        for name, v in fields_.items():
            _check_tier_field(name, v, f"{prefix}tiers[{i}].{name}")
        if fields_:
            tiers[int(t)] = dict(fields_)
    if tiers:
        out["tiers"] = tiers
    out.update(_check_policy_fields(overrides, prefix))
    return out


def _check_tier_field(name: str, v: Any, f: str) -> None:
    """Reject a per-tier override ``name`` = ``v`` outside its range (``f``: the field's path)."""
    if name == "max_items":
        if v < 0:
            raise InvalidArgument(f, "must be >= 0")
    elif name == "importance_threshold":
        if not 0.0 <= v <= 1.0:
            raise InvalidArgument(f, "must be in [0, 1]")
    elif name in ("ttl_seconds", "half_life_hours"):
        if not (np.isfinite(v) and v > 0):
            raise InvalidArgument(f, "must be a finite number > 0")
    elif name == "cadence_seconds" and not (np.isfinite(v) and v >= 0):
        raise InvalidArgument(f, "must be a finite number >= 0")


def _check_policy_fields(overrides: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The namespace-wide overrides (retention, promotion thresholds, GLACIAL deletion), validated."""
    out: dict[str, Any] = {}
    if overrides.get("retention"):
        if overrides["retention"] not in RETENTION_POLICIES.values():
            raise InvalidArgument(f"{prefix}retention", "is not a retention policy")
        out["retention"] = int(overrides["retention"])
    for name in ("promote_access_count", "promote_success_count"):
        if overrides.get(name) is not None:
            if overrides[name] < 1:
                raise InvalidArgument(f"{prefix}{name}", "must be >= 1")
            out[name] = int(overrides[name])
    if overrides.get("promote_surprise") is not None:
        if not 0.0 <= overrides["promote_surprise"] <= 1.0:
            raise InvalidArgument(f"{prefix}promote_surprise", "must be in [0, 1]")
        out["promote_surprise"] = float(overrides["promote_surprise"])
    if overrides.get("delete_from_glacial") is not None:
        out["delete_from_glacial"] = bool(overrides["delete_from_glacial"])
    if overrides.get("reflection_threshold") is not None:
        v = overrides["reflection_threshold"]
        if not (np.isfinite(v) and v >= 0):
            raise InvalidArgument(f"{prefix}reflection_threshold", "must be a finite number >= 0 (0: off)")
        out["reflection_threshold"] = float(v)
    if overrides.get("summary_token_threshold") is not None:
        if overrides["summary_token_threshold"] < 0:
            raise InvalidArgument(f"{prefix}summary_token_threshold", "must be >= 0 (0: off)")
        out["summary_token_threshold"] = int(overrides["summary_token_threshold"])
    if overrides.get("default_importance") is not None:
        if not 0.0 <= overrides["default_importance"] <= 1.0:
            raise InvalidArgument(f"{prefix}default_importance", "must be in [0, 1]")
        out["default_importance"] = float(overrides["default_importance"])
    out.update(_check_importance_fields(overrides, prefix))
    out.update(_check_capacity_fields(overrides, prefix))
    return out


_FLAGS = ("promote_through_tiers", "decay_grace", "summarize_evictions", "evict_on_create", "auto_summarize")


def _check_importance_fields(overrides: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Decay, its floor, the heuristic, the recency basis, the summary strategy, the flags and the
    preset, validated."""
    out: dict[str, Any] = {}
    for name, allowed in (
        ("importance_decay", IMPORTANCE_DECAYS),
        ("importance_heuristic", IMPORTANCE_HEURISTICS),
        ("recency_basis", RECENCY_BASES),
        ("summary_strategy", SUMMARY_STRATEGIES),
    ):
        if overrides.get(name):
            if overrides[name] not in allowed.values():
                raise InvalidArgument(f"{prefix}{name}", f"must be one of {sorted(allowed.values())}")
            out[name] = int(overrides[name])
    if overrides.get("importance_floor") is not None:
        if not 0.0 <= overrides["importance_floor"] <= 1.0:
            raise InvalidArgument(f"{prefix}importance_floor", "must be in [0, 1] (0: none)")
        out["importance_floor"] = float(overrides["importance_floor"])
    for name in _FLAGS:
        if overrides.get(name) is not None:
            out[name] = bool(overrides[name])
    if overrides.get("preset"):
        if overrides["preset"] not in PRESETS:
            raise InvalidArgument(f"{prefix}preset", f"must be one of {', '.join(sorted(PRESETS))}")
        out["preset"] = str(overrides["preset"])
    return out


def _check_capacity_fields(overrides: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The namespace and kind caps, the share a cap evicts, the summaries' size and the working
    memory's limit, validated."""
    out: dict[str, Any] = {}
    if overrides.get("max_items") is not None:
        if overrides["max_items"] < 0:
            raise InvalidArgument(f"{prefix}max_items", "must be >= 0 (0: no cap)")
        out["max_items"] = int(overrides["max_items"])
    if overrides.get("evict_share") is not None:
        v = overrides["evict_share"]
        if not 0.0 <= v < 1.0:
            raise InvalidArgument(f"{prefix}evict_share", "must be in [0, 1) (0: only the surplus)")
        out["evict_share"] = float(v)
    for name, least, meaning in (("summary_max_tokens", 1, ""), ("working_token_limit", 0, " (0: never)")):
        if overrides.get(name) is not None:
            if overrides[name] < least:
                raise InvalidArgument(f"{prefix}{name}", f"must be >= {least}{meaning}")
            out[name] = int(overrides[name])
    caps = overrides.get("kind_capacities")
    if caps:
        if len(caps) > MAX_KIND_CAPACITIES:
            raise InvalidArgument(f"{prefix}kind_capacities", f"holds at most {MAX_KIND_CAPACITIES} kinds")
        for i, (kind, n) in enumerate(caps.items()):  # (in the request's order)
            if not KIND_RE.match(kind):
                raise InvalidArgument(
                    f"{prefix}kind_capacities[{i}].kind", "must be 1-64 characters of [a-z0-9_]"
                )
            if n < 0:
                raise InvalidArgument(f"{prefix}kind_capacities[{i}].max_items", "must be >= 0 (0: no cap)")
        out["kind_capacities"] = {str(k): int(n) for k, n in caps.items()}
    return out
