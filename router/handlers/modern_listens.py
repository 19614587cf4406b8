"""The listens one client's standalone stream holds at the session's 2026-07-28 backends: their list
changes, and the updates of the resources the client subscribed to there.

A backend the router speaks 2026-07-28 to, where the client session keeps no handshake session,
has no session stream to read: while a handshake-era client holds its standalone stream, the
replica holding it asks each such backend with a `subscriptions/listen` of its own
(router/upstream/session_wide/backend_listens.py) for its tool, prompt and resource list changes. One that
refuses the handshake keeps no subscriptions either: the client's `resources/subscribe` there,
sent through any replica, is kept with the session in the indexer (router/handlers/resources.py),
and the long poll the stream's replica holds on the session's backend sessions brings it back
(`follow`, router/upstream/session_wide/backend_streams.py), so that backend's listen asks for those
URIs' updates too. A change of a backend's URIs ends its listen and opens one with the new set;
updates that come in between are missed, as between two listens of a 2026-07-28 client. A backend
that ends its listen is asked again `RELISTEN` seconds later (later each time, up to
`LAST_RELISTEN`, while it ends them at once).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from router.caller import Caller
from router.errors import RouterError
from router.exchange import Exchange
from router.upstream.session_wide.backend_listens import BackendListens, Deliver, Interest
from router.upstream.session_wide.backend_requests import BackendRequests
from toolsearch.sessions import Subscription
from toolsearch.targets import BackendTarget, ReachableTarget

logger = logging.getLogger(__name__)

RELISTEN = 1.0  # seconds before a 2026-07-28 backend that ended its listen is asked again,
LAST_RELISTEN = 30.0  # doubling up to this while its listens end as soon as they start


def without_listen_id(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """A listen's notification as a handshake-era client's stream carries it: without the id of the
    router's own listen in its `_meta` (the client made no listen)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if not isinstance(params, dict) or not isinstance(meta, dict) or SUBSCRIPTION_ID_META_KEY not in meta:
        return message
    rest = {key: value for key, value in meta.items() if key != SUBSCRIPTION_ID_META_KEY}
    kept = {key: value for key, value in params.items() if key != "_meta"}
    return {**message, "params": {**kept, "_meta": rest} if rest else kept}


def listened_to(target: BackendTarget) -> bool:
    """Whether the router speaks 2026-07-28 to a backend, with no handshake session kept there: no
    session stream to read, so the backend is listened to instead."""
    return target.protocol_version in MODERN_PROTOCOL_VERSIONS and target.session is None


@dataclass(eq=False)
class _Listened:
    """One backend listened to: what it is asked for, and the scope its listen runs in."""

    backend: ReachableTarget
    interest: Interest
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)


class ModernListens:
    """The listens of one standalone stream at its session's 2026-07-28 backends."""

    def __init__(
        self,
        requests: BackendRequests,
        listens: BackendListens,
        caller: Caller,
        deliver: Deliver,
        group: TaskGroup,
    ) -> None:
        self._requests = requests
        self._listens = listens
        self._caller = caller
        self._deliver = deliver
        self._group = group  # the stream's: its listens end with it
        self._listened: dict[str, _Listened] = {}  # backend id: its listen now
        self._subscribed: frozenset[Subscription] = frozenset()
        self._looked = False  # whether the session's backends have been looked at

    async def follow(self, subscriptions: frozenset[Subscription]) -> None:
        """Listen to each of the session's 2026-07-28 backends for what the client wants of it now,
        opening a backend's listen again when its subscribed URIs changed."""
        known = {s.backend_id for s in subscriptions} <= self._listened.keys()
        if self._looked and known and subscriptions == self._subscribed:
            return
        self._subscribed = subscriptions
        if not self._looked or not known:
            await self._look()
        for backend_id, listened in self._listened.items():
            if listened.interest.uris != (uris := self._uris_at(backend_id)):
                listened.scope.cancel()
                self._start(listened.backend, uris)

    async def _look(self) -> None:
        """Find the session's 2026-07-28 backends, and start listening to those not listened to yet."""
        try:
            reach = await self._requests.reach(Exchange(self._caller))
        except RouterError as exc:
            logger.debug("the session's 2026-07-28 backends are not listened to: %s", exc)
            return
        self._looked = True
        for backend in reach.backends:
            if listened_to(backend.target) and backend.backend_id not in self._listened:
                self._start(backend, self._uris_at(backend.backend_id))

    def _uris_at(self, backend_id: str) -> frozenset[str]:
        """The URIs the client subscribed to at a backend (under the backend's own URIs)."""
        return frozenset(s.uri for s in self._subscribed if s.backend_id == backend_id)

    async def _delivered(self, backend_id: str, message: Mapping[str, Any]) -> None:
        await self._deliver(backend_id, without_listen_id(message))

    def _start(self, backend: ReachableTarget, uris: frozenset[str]) -> None:
        interest = Interest(True, backend.prompts, backend.resources, uris)
        listened = _Listened(backend, interest)
        self._listened[backend.backend_id] = listened
        self._group.start_soon(self._hear, listened)

    async def _hear(self, listened: _Listened) -> None:
        target, interest = listened.backend.target, listened.interest
        pause = RELISTEN
        with listened.scope:
            while True:
                started = anyio.current_time()
                opened = await self._listens.listen(
                    self._caller, target, interest, self._delivered, lambda: None
                )
                if not opened:
                    return  # it offers none, or failed: not asked again until the client's URIs change
                # it ended the stream (a restart, say): listen again, later each time it ends at once
                quick = anyio.current_time() - started <= LAST_RELISTEN
                pause = min(pause * 2, LAST_RELISTEN) if quick else RELISTEN
                await anyio.sleep(pause)
