"""The bounds of settings that share a rule, and the TLS files' check, read by ``ServerConfig``'s
checks (config.py)."""

from __future__ import annotations

import ssl
from collections.abc import Callable

AT_LEAST_ONE = """max_message_bytes map_size max_map_size max_content_bytes max_metadata_bytes max_metadata_keys max_tags
    max_batch_size max_search_limit max_page_size default_page_size max_dimension promote_access_count
    promote_success_count"""
AT_LEAST_ZERO = """summary_token_threshold max_keyword_postings embedding_cache_size exact_search_max_rows
    snapshot_min_changes reflection_threshold shutdown_grace_seconds request_id_ttl_seconds
    embedder_timeout_seconds"""

# Upper bounds where a larger value would start a server that then fails: a message size gRPC
# keeps in a C int, an LMDB map size past the address space, waits past what thread timers take.
AT_MOST: dict[str, float] = {
    "max_message_bytes": 2**31 - 1,
    "map_size": 2**48,
    "max_map_size": 2**48,
    **dict.fromkeys(
        (
            "shutdown_grace_seconds",
            "snapshot_interval_seconds",
            "maintenance_interval_seconds",
            "access_flush_seconds",
            "request_id_ttl_seconds",
            "embedder_timeout_seconds",
            "embedder_breaker_cooldown_seconds",
        ),
        1e9,
    ),
}

# Per-tier settings beyond finite and >= 0: what UpdateNamespaceConfig takes for the same fields.
TIER_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "tier_ttl_seconds": (lambda v: v > 0, "> 0"),
    "half_life_hours": (lambda v: v > 0, "> 0"),
    "tier_importance_threshold": (lambda v: v <= 1, "in [0, 1]"),
    "tier_max_items": (lambda v: v == int(v) <= 2**53, "that are whole numbers up to 2^53"),
}


def tls_fault(files: str | tuple[str, str]) -> str:
    """Why a certificate with its key, or a CA file, does not load ('' when it does)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        if isinstance(files, tuple):
            context.load_cert_chain(files[0], files[1], password=lambda: b"")  # (no prompt)
        else:
            context.load_verify_locations(files)
    except (ssl.SSLError, OSError, ValueError) as e:
        return str(e) or type(e).__name__
    return ""
