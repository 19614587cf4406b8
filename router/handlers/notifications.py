"""What a client's standalone stream carries: its backends' notifications outside calls, under the
names the client knows.

A handshake-era client opens its session's standalone stream with `GET /mcp` (on whichever replica;
router/frontdoor/streams/standalone.py); the backends' messages come from their own backend sessions'
streams (router/upstream/session_wide/backend_streams.py) and are passed on here:

- `notifications/resources/updated` (a subscribed resource changed), its URI the one the client
  knows: the backend's own, or the prefixed form when URIs collide (router/handlers/offerings.py);
- `notifications/resources/list_changed` and `notifications/prompts/list_changed`: the session's
  listings are the backends' together, so one backend's change is theirs;
- `notifications/message`: a log message, at or above the level the client set (all of them when
  it set none, as for the log messages of a call).

A backend the router speaks 2026-07-28 to keeps no session to read a stream of: the replica asks
it with a `subscriptions/listen` of its own instead, for its list changes and the resources the
client subscribed to there, for as long as the client's stream lasts
(router/handlers/modern_listens.py).

`notifications/tools/list_changed` is not passed on: the client's tools are the router's two (and
the pinned ones, fixed for the session), and find_tool searches what the indexer lists. It goes to
the indexer instead (`ToolsChanged`), which lists that backend again at once, so find_tool finds
its new tools within a probe's time; at most once per `TELL_GAP` per backend from one replica, since
a shared backend tells every session's stream. Anything else a backend sends outside calls is
dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from router.caller import Caller
from router.errors import RouterError
from router.exchange import Exchange
from router.handlers.modern_listens import ModernListens
from router.handlers.offerings import template_pattern
from router.handlers.resources import catalogue
from router.relays import passes_level
from router.upstream.session_wide.backend_listens import BackendListens
from router.upstream.session_wide.backend_requests import BackendRequests
from router.upstream.session_wide.backend_streams import BackendStreams
from toolsearch.naming import prefixed

logger = logging.getLogger(__name__)

PASSED_AS_THEY_ARE = frozenset({"notifications/resources/list_changed", "notifications/prompts/list_changed"})
UPDATED = "notifications/resources/updated"
TOOLS_CHANGED = "notifications/tools/list_changed"
TELL_GAP = 1.0  # seconds between two of this replica's asks to list one backend again

# writes one message on the client's stream, with the backend it came from and its mark ("" when
# it has none to resume from: router/upstream/session_wide/backend_streams.py)
Write = Callable[[Mapping[str, Any], str, str], Awaitable[None]]


class Notifications:
    """Passes a client session's backends' notifications on to its standalone stream."""

    def __init__(self, requests: BackendRequests, streams: BackendStreams, listens: BackendListens) -> None:
        self.requests = requests
        self.streams = streams
        self.listens = listens
        self._told: dict[str, float] = {}  # backend id: when this replica last said its tools changed

    async def listen(self, caller: Caller, write: Write, resume: Mapping[str, str] | None = None) -> None:
        """Until cancelled or the session ends (`SessionNotFound`), write each of the session's
        backends' notifications that is the client's to have; `resume` (by backend id, the mark of
        the last event the client had) reads each backend's stream from there."""

        async def deliver(backend_id: str, message: Mapping[str, Any], mark: str = "") -> None:
            method = message.get("method")
            if method in PASSED_AS_THEY_ARE:
                await write(message, backend_id, mark)
            elif method == "notifications/message":
                if passes_level(message, caller.declared.log_floor):
                    await write(message, backend_id, mark)
            elif method == UPDATED:
                renamed = await self._renamed(caller, backend_id, message)
                if renamed is not None:
                    await write(renamed, backend_id, mark)
            elif method == TOOLS_CHANGED:
                await self.tools_changed(caller, backend_id)

        async with anyio.create_task_group() as group:
            modern = ModernListens(self.requests, self.listens, caller, deliver, group)
            # until cancelled, or the session ends; each look at the session follows its subscriptions
            await self.streams.listen(caller, deliver, modern.follow, resume)

    async def tools_changed(self, caller: Caller, backend_id: str) -> None:
        """Have the indexer list a backend again; once per `TELL_GAP` however many streams say so."""
        now = time.monotonic()
        last = self._told.get(backend_id)
        if last is not None and now - last < TELL_GAP:
            return
        self._told[backend_id] = now
        try:
            await self.requests.indexer.tools_changed(
                caller.session_id, caller.identity.principal, backend_id
            )
        except RouterError as exc:  # its next probe lists it anyway
            logger.debug("backend %s: its tools changed, the indexer was not told: %s", backend_id, exc)

    async def _renamed(
        self, caller: Caller, backend_id: str, message: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """An update with the backend's own URI replaced by the one the client knows it by."""
        params = message.get("params")
        uri = params.get("uri") if isinstance(params, dict) else None
        if not isinstance(uri, str) or not isinstance(params, dict):
            return None
        try:
            reach = await self.requests.reach(Exchange(caller))
        except RouterError as exc:
            logger.debug("an update of backend %s was not passed on: %s", backend_id, exc)
            return None
        advertised = uri
        if reach.prefix == "always":
            advertised = prefixed(backend_id, uri, reach.separator)
        elif len(reach.offering("resources")) > 1:
            found = await catalogue(reach)
            for offering in [*found.resources, *found.templates]:
                if offering.backend_id != backend_id:
                    continue
                if offering.original == uri or (
                    offering.template and template_pattern(offering.original).fullmatch(uri)
                ):
                    # the prefix a collision gave the entry, if any, before the backend's own URI
                    advertised = offering.name[: len(offering.name) - len(offering.original)] + uri
                    break
        return {**message, "params": {**params, "uri": advertised}}
