"""What one backend tells a 2026-07-28 client's `subscriptions/listen`: its list changes and the
updates of the resources the client named, read from the backend for as long as the client listens.

A 2026-07-28 backend is asked the way the client asked the router: a `subscriptions/listen` of the
router's own, stamped as every 2026-07-28 request is (router/upstream/wire/modern.py), whose answer is
the stream; its acknowledgment stays here, since the router acknowledged the client already. A
handshake-era backend keeps subscriptions in a session: the listen opens one of its own there
(`initialize`), subscribes to each URI in it, reads its standalone stream, and when the listen
ends, unsubscribes and ends the session (DELETE). A session of its own leaves the client session's
kept backend session alone (a handshake-era client's standalone stream may be reading it, and a
backend serves one reader per session); a `per_session` backend behind the bridge then starts a
process for the listen, whose resources are that process's (docs/gateway.md).

Each event is bounded by the backend's `max_response_bytes`; nothing is retried here: when a
backend's stream ends, the listen ends, and the client listens again (docs/gateway.md).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from mcp.shared.subscriptions import LISTEN_STREAM_METHODS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from router.caller import Caller
from router.errors import RouterError
from router.exchange import BARE
from router.upstream.calls.backends import BackendCaller
from router.upstream.session_wide.backend_streams import read_standalone
from router.upstream.wire.backend_answers import events
from router.upstream.wire.modern import modern_request
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

LISTEN_ID = "toolsearch-listen"  # the id of the router's own listen at a backend: one per request
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"  # a backend's first frame: it listens
UNSUBSCRIBE_WITHIN = 2.0  # seconds a listen's end may take to unsubscribe at one backend
_ACCEPT = "application/json, text/event-stream"

# what is done with each notification a backend sends: its backend id and the message
Deliver = Callable[[str, Mapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Interest:
    """What a listen asks of one backend: which of its lists' changes, and the updates of which of
    its resources (under the backend's own URIs)."""

    tools_list_changed: bool = False
    prompts_list_changed: bool = False
    resources_list_changed: bool = False
    uris: frozenset[str] = frozenset()

    def filter(self) -> dict[str, Any]:
        """The wire's `SubscriptionFilter` of this interest."""
        wire: dict[str, Any] = {}
        if self.tools_list_changed:
            wire["toolsListChanged"] = True
        if self.prompts_list_changed:
            wire["promptsListChanged"] = True
        if self.resources_list_changed:
            wire["resourcesListChanged"] = True
        if self.uris:
            wire["resourceSubscriptions"] = sorted(self.uris)
        return wire


@dataclass(frozen=True, slots=True)
class _Listen:
    """One backend's part of one listen: where, with which headers, what for, and to whom."""

    target: BackendTarget
    headers: Mapping[str, str]
    interest: Interest
    deliver: Deliver
    on_open: Callable[[], None]


class BackendListens:
    """Reads what backends send a listen: one backend at a time, for as long as the caller awaits."""

    def __init__(self, backends: BackendCaller) -> None:
        self.backends = backends

    async def listen(
        self,
        caller: Caller,
        target: BackendTarget,
        interest: Interest,
        deliver: Deliver,
        on_open: Callable[[], None],
    ) -> bool:
        """Pass each notification `target` sends to `deliver` until its stream ends, calling
        `on_open` once the backend listens (what changes from then on is heard); whether a stream
        was open at all (False: the backend offers none, or failed to open one; logged at debug)."""
        try:
            headers = await self.backends.credentials.headers(target, caller.identity)
            one = _Listen(target, headers, interest, deliver, on_open)
            if target.protocol_version in MODERN_PROTOCOL_VERSIONS:
                return await self._modern(one)
            return await self._in_session(one)
        except RouterError as exc:
            logger.debug("backend %s: not listened to: %s", target.backend_id, exc)
            return False

    async def _modern(self, one: _Listen) -> bool:
        target, interest = one.target, one.interest
        params, stamp = modern_request(
            "subscriptions/listen", {"notifications": interest.filter()}, target.protocol_version, BARE
        )
        message = {"jsonrpc": "2.0", "id": LISTEN_ID, "method": "subscriptions/listen", "params": params}
        http = self.backends.stream_client(target, one.headers)
        opened = False
        try:
            asked = {**stamp, "Accept": _ACCEPT}
            async with http.stream("POST", target.url, json=message, headers=asked) as response:
                kind = response.headers.get("content-type", "")
                if response.status_code != 200 or not kind.startswith("text/event-stream"):
                    logger.debug(
                        "backend %s: no listen stream (HTTP %d, %s)",
                        target.backend_id,
                        response.status_code,
                        kind or "no content type",
                    )
                    return False
                opened = True
                async for each in events(response, target.max_response_bytes):
                    if not isinstance(each, dict):
                        continue
                    if each.get("id") == LISTEN_ID:  # the result or error that ends the stream
                        break
                    if each.get("method") == ACKNOWLEDGED:
                        one.on_open()
                    elif each.get("method") in LISTEN_STREAM_METHODS and "id" not in each:
                        await one.deliver(target.backend_id, each)
        except (httpx2.HTTPError, ValueError) as exc:
            logger.debug("backend %s: its listen stream ended: %r", target.backend_id, exc)
        return opened

    async def _in_session(self, one: _Listen) -> bool:
        target, headers, interest = one.target, one.headers, one.interest
        async with self.backends.own_session(target, headers) as own:
            subscribed: list[str] = []
            try:
                for uri in sorted(interest.uris):
                    await own.request("resources/subscribe", {"uri": uri})
                    subscribed.append(uri)
                http = self.backends.stream_client(target, headers)
                return await read_standalone(http, own.target, own.session, one.deliver, one.on_open)
            finally:
                # said before the session ends, for a server that keeps subscriptions past it
                with anyio.CancelScope(shield=True), anyio.move_on_after(UNSUBSCRIBE_WITHIN):
                    for uri in subscribed:
                        with contextlib.suppress(RouterError):
                            await own.request("resources/unsubscribe", {"uri": uri})
