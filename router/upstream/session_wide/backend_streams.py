"""What a client session's backends send outside calls, read from each backend session's standalone
stream, for as long as the client holds its own standalone stream open on this replica.

A backend sends what belongs to no call (a subscribed resource's update, a `list_changed`, a log
message) on the standalone stream of the backend session (`GET` inside the session). The replica
holding the client's standalone stream opens that GET in every backend session the client session
keeps, which the indexer knows (`BackendSessions`), and at once in each one opened since (a
`resources/subscribe` sent through another replica opens one): each look is a long poll, which the
indexer answers when the set changes on any replica (the shared state's events carry the change
between indexer replicas) or after `LONG_POLL` seconds. A failed look is tried again after
`FIRST_PAUSE` seconds, twice as long each time it fails again, up to `LAST_PAUSE`. Nothing else is
shared between replicas: whichever replica holds the client's stream reads the backends.

A backend that offers no standalone stream (405), or already streams to another reader of that
session (409: the client opened a second stream elsewhere), or fails, is logged at debug and
looked at again only when its session changes. A 2026-07-28 or legacy SSE backend keeps no session
to listen in (a 2026-07-28 one is asked with a listen instead: router/handlers/notifications.py).
Each event is bounded by the backend's `max_response_bytes`; a stream lasts as long as the backend
and the client keep it.

Where a backend gives its stream's events ids (a server with an event store keeps what it sends
while nobody reads), each message is passed on with its mark: the event's id, and a tag of the
backend session it came from. A client that resumes its own stream hands the marks back
(router/frontdoor/streams/stream_cursor.py), and each backend session's stream is then read with
`Last-Event-ID`, so the backend sends what came after it first; only in the session the id came
from (an id is the backend's for one session), and from now on where the backend refuses it. A
backend that ends such a stream (SSE polling) is read on from where it got to, after the delay it
asked for (`retry:`; `DEFAULT_RETRY_MS` when none, never less than `MIN_RETRY_MS`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import httpx2
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from router.caller import Caller
from router.errors import RouterError, SessionNotFound
from router.link.indexer_client import IndexerClient
from router.upstream.calls.backends import BackendCaller
from router.upstream.wire.backend_answers import StreamPosition, events
from toolsearch.outgoing import SESSION_HEADER, VERSION_HEADER
from toolsearch.sessions import BackendSession, Subscription
from toolsearch.targets import BackendTarget

logger = logging.getLogger(__name__)

LONG_POLL = 25.0  # seconds the indexer holds a look for backend sessions opened since, at most
FIRST_PAUSE = 2.0  # seconds until the next look after a failed one, doubling
LAST_PAUSE = 30.0  # up to this
DEFAULT_RETRY_MS = 1000  # until a backend's stream that ended is read on, unless it asked otherwise
MIN_RETRY_MS = 100  # at least, whatever it asked

# what is done with each message a backend sends outside calls: its backend id and the message
Deliver = Callable[[str, Mapping[str, Any]], Awaitable[None]]
# the same, with its mark (`mark`: "" when the backend's events have no ids)
Heard = Callable[[str, Mapping[str, Any], str], Awaitable[None]]


def _tag(session: BackendSession) -> str:
    """A backend session's tag: enough to tell two apart, nothing to act in one with."""
    return hashlib.sha256(session.session_id.encode()).hexdigest()[:12]


def mark(session: BackendSession, event_id: str) -> str:
    """Where a backend session's stream got to: the session's tag, then the backend's own id of the
    event (one a client of the backend's own would see); "" when the event had no id."""
    return f"{_tag(session)} {event_id}" if event_id else ""


def resumed_from(session: BackendSession, marked: str) -> str:
    """The event id a mark gives for reading `session`'s stream: "" for another session's mark."""
    tag, _, event_id = marked.partition(" ")
    return event_id if tag == _tag(session) else ""


# given the session's subscriptions at backends that keep none (router/handlers/modern_listens.py)
Follow = Callable[[frozenset[Subscription]], Awaitable[None]]


async def _follow_nothing(subscriptions: frozenset[Subscription]) -> None:
    pass


def _listenable(target: BackendTarget) -> bool:
    session = target.session
    return (
        session is not None
        and bool(session.session_id)
        and session.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
    )


class BackendStreams:
    """Reads the standalone streams of a client session's backend sessions."""

    def __init__(self, indexer: IndexerClient, backends: BackendCaller) -> None:
        self.indexer = indexer
        self.backends = backends

    async def listen(
        self,
        caller: Caller,
        deliver: Heard,
        follow: Follow = _follow_nothing,
        resume: Mapping[str, str] | None = None,
    ) -> None:
        """Until cancelled, or until the client session ends (`SessionNotFound`), pass each message
        the session's backends send outside calls to `deliver`; `follow` is given the session's
        subscriptions at backends that keep none, at first and whenever they change. `resume`: by
        backend id, the mark of the last event the client had, from which each stream is read."""
        positions = dict(resume or {})  # backend id: the mark of its last event passed on
        heard: dict[str, BackendSession] = {}  # backend id: the backend session listened in
        seen = ""  # the stamp of the backend sessions looked at last
        pause = 0.0  # after a failed look, the time until the next one
        async with anyio.create_task_group() as group:
            while True:
                asked = anyio.current_time()
                try:
                    kept = await self.indexer.kept_sessions(
                        caller.session_id, caller.identity.principal, seen, LONG_POLL
                    )
                except SessionNotFound:
                    group.cancel_scope.cancel()
                    raise
                except RouterError as exc:
                    logger.debug("the backend sessions to listen in are unknown now: %s", exc)
                    pause = min(max(pause * 2, FIRST_PAUSE), LAST_PAUSE)
                    await anyio.sleep(pause)
                    continue
                pause = 0.0
                await follow(kept.subscriptions)
                for target in kept.targets:
                    if _listenable(target) and heard.get(target.backend_id) != target.session:
                        assert target.session is not None
                        heard[target.backend_id] = target.session
                        group.start_soon(self._one, caller, target, deliver, positions)
                if kept.stamp == seen and anyio.current_time() - asked < LONG_POLL / 2:
                    # the indexer did not wait (it waits on as many polls as it may): not again at once
                    await anyio.sleep(FIRST_PAUSE)
                seen = kept.stamp

    async def _one(
        self, caller: Caller, target: BackendTarget, deliver: Heard, positions: dict[str, str]
    ) -> None:
        """Read one backend session's standalone stream until it ends, from where `positions` says
        it got to; its failures are logged only."""
        session = target.session
        assert session is not None
        try:
            headers = await self.backends.credentials.headers(target, caller.identity)
        except RouterError as exc:
            logger.debug("backend %s: not listened to: %s", target.backend_id, exc)
            return
        position = StreamPosition(resumed_from(session, positions.get(target.backend_id, "")))

        async def heard(backend_id: str, message: Mapping[str, Any]) -> None:
            marked = mark(session, position.last_id)  # the id of the event that carried `message`
            positions[backend_id] = marked
            await deliver(backend_id, message, marked)

        http = self.backends.stream_client(target, headers)
        while True:
            opened = await read_standalone(http, target, session, heard, position=position)
            if not opened or not position.last_id:
                return  # refused, failed, or its events cannot be read on from where they got to
            # it ended a stream whose events it keeps (SSE polling): read on from there when it asks
            await anyio.sleep(max(position.retry_ms or DEFAULT_RETRY_MS, MIN_RETRY_MS) / 1000)


async def read_standalone(
    http: httpx2.AsyncClient,
    target: BackendTarget,
    session: BackendSession,
    deliver: Deliver,
    on_open: Callable[[], None] = lambda: None,
    position: StreamPosition | None = None,
) -> bool:
    """Pass each notification of a backend session's standalone stream to `deliver` until the stream
    ends, calling `on_open` once it is open; whether it was open at all (False: the backend offers
    none, or failed; logged at debug). With a `position` that has an id, the stream is read from
    after it (`Last-Event-ID`), or from now on where the backend refuses it; the position follows
    the stream's events."""
    asked = {
        "Accept": "text/event-stream",
        SESSION_HEADER: session.session_id,
        VERSION_HEADER: session.protocol_version,
    }
    resumed = position is not None and bool(position.last_id)
    if position is not None and position.last_id:
        asked["Last-Event-ID"] = position.last_id
    opened = refused = False
    try:
        async with http.stream("GET", target.url, headers=asked) as response:
            refused = response.status_code != 200
            if refused:
                logger.debug(
                    "backend %s: no standalone stream (HTTP %d%s)",
                    target.backend_id,
                    response.status_code,
                    ", asked to resume it" if resumed else "",
                )
            else:
                opened = True
                on_open()
                async for message in events(response, target.max_response_bytes, position):
                    if isinstance(message, dict) and "method" in message and "id" not in message:
                        await deliver(target.backend_id, message)
    except httpx2.HTTPError as exc:
        logger.debug("backend %s: its standalone stream ended: %r", target.backend_id, exc)
    except ValueError as exc:  # an event over the bound: the stream is not read past it, nor again
        logger.debug("backend %s: its standalone stream ended: %r", target.backend_id, exc)
        if position is not None:
            position.last_id = ""
    if refused and resumed and position is not None:  # an id it does not keep: from now on, then
        position.last_id = ""
        return await read_standalone(http, target, session, deliver, on_open, position)
    return opened
