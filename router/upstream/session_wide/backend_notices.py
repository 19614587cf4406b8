"""A client's notifications that concern every backend session its session keeps, passed on to each.

A handshake-era client's `notifications/cancelled` names a call that may run on another replica, and
its `notifications/roots/list_changed` says its roots changed for every server it talks to: both go
to each backend session the client session keeps (`BackendSessions`), at once, each within
`NOTICE_TIMEOUT` (or the backend's `timeout`, if lower), best effort: a backend that does not take
one is logged at debug. A client session's backends without a kept session (2026-07-28, legacy SSE)
have no session to tell.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import anyio

from router.caller import Caller
from router.errors import RouterError
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.calls.credentials import OutgoingCredentials
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

NOTICE_TIMEOUT = 2.0  # seconds one backend may take to take a notification, at most


class BackendNotices:
    """Tells every backend session of a client session what its client notified."""

    def __init__(
        self, indexer: IndexerClient, backends: BackendCaller, credentials: OutgoingCredentials
    ) -> None:
        self.indexer = indexer
        self.backends = backends
        self.credentials = credentials

    async def tell_all(self, caller: Caller, method: str, params: Mapping[str, Any]) -> None:
        """Send `method` with `params` inside each backend session the caller's session keeps."""
        try:
            found = await self.indexer.backend_sessions(caller.session_id, caller.identity.principal)
        except RouterError as exc:
            logger.debug("%s was not passed on: %s", method, exc)
            return

        async def one(target: BackendTarget) -> None:
            try:
                headers = await self.credentials.headers(target, caller.identity)
            except RouterError:
                return
            within = min(target.timeout_seconds, NOTICE_TIMEOUT)
            await self.backends.notify(target, headers, method, params, within)

        async with anyio.create_task_group() as group:
            for target in found:
                group.start_soon(one, target)
