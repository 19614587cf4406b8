"""`logging/setLevel`: the level a client sets, kept with its session and passed on to its backends.

A handshake-era client sets the lowest level of log messages it wants once, for its session. The
router keeps it with the session in the indexer (`SetLogLevel`), so every replica's session check
(`GetSession`) hands it back; the same answer names the session's backend sessions, and the
request is passed on inside each of them at once, so the backends send what the client asked for.
A backend session opened later gets the level right after its `initialize`
(router/upstream/wire/backend_messages.py), when the backend declared `logging`. A 2026-07-28 backend
keeps no session: each request it gets says the client's level in its `_meta`
(router/upstream/wire/modern.py). Whatever a backend sends, the relay passes on no message below the
level (router/relays.py).

Passing the level on is best effort: each backend gets it within `PASS_ON_TIMEOUT` (or its own
timeout, if lower), and one that refuses it or does not answer is logged at debug; the client's
request is answered `{}` once the level is kept.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext

from router.error_answers import mcp_error
from router.errors import RouterError
from router.exchange import exchange_of
from router.upstream.session_wide.backend_requests import BackendRequests

PASS_ON_TIMEOUT = 5.0  # seconds one backend may take to take a client's level, at most


class LogLevels:
    """The handler of `logging/setLevel`, over the backend requests' indexer and backends."""

    def __init__(self, requests: BackendRequests) -> None:
        self._requests = requests

    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> dict[str, Any]:
        caller = exchange_of(ctx).caller
        requests = self._requests
        try:
            kept = await requests.indexer.set_log_level(
                caller.session_id, caller.identity.principal, params.level
            )
        except RouterError as exc:
            raise mcp_error(exc) from None
        async with anyio.create_task_group() as group:
            for target in kept:
                within = min(target.timeout_seconds, PASS_ON_TIMEOUT)
                group.start_soon(requests.backends.set_level, target, params.level, caller, within)
        return {}
