"""What a client declares of itself, read where the session layer meets it: a `Declared`.

A handshake-era client declares its capabilities in its initialize request and sets its log level
with `logging/setLevel`; the indexer keeps both with the session, and the session check every
request makes (`GetSession`) hands them back, so every replica knows them without asking again. A
2026-07-28 client has no session to keep them in: each request says them in its `_meta`
(`io.modelcontextprotocol/clientCapabilities`, `io.modelcontextprotocol/logLevel`), and asks for no
log messages unless it names a level.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from mcp_types import CLIENT_CAPABILITIES_META_KEY, LOG_LEVEL_META_KEY

from router.caller import Declared
from toolsearch.sessions import LOG_LEVELS

logger = logging.getLogger(__name__)


def session_declared(log_level: str, capabilities_json: str) -> Declared:
    """What a handshake session's client declared, as the indexer keeps it."""
    capabilities: Mapping[str, Any] | None = None
    if capabilities_json:
        try:
            decoded = json.loads(capabilities_json)
        except ValueError:
            decoded = None  # the indexer keeps only JSON objects: nothing to act on otherwise
        capabilities = decoded if isinstance(decoded, dict) else None
    level = log_level if log_level in LOG_LEVELS else ""
    return Declared(capabilities, level)


def request_declared(meta: Mapping[str, Any]) -> Declared:
    """What a 2026-07-28 request's `_meta` declares; a client that names no level takes no logs."""
    capabilities = meta.get(CLIENT_CAPABILITIES_META_KEY)
    level = meta.get(LOG_LEVEL_META_KEY)
    return Declared(
        capabilities if isinstance(capabilities, dict) else None,
        level if isinstance(level, str) and level in LOG_LEVELS else "",
        quiet_unasked=True,
    )
