"""A handshake-era client's standalone stream: `GET /mcp`, held open on whichever replica it reaches.

The router keeps no session in process memory, and it need not for this stream either: the stream
is the client's for as long as it holds the connection, and the replica it reached reads the
session's backends' own standalone streams meanwhile (router/handlers/notifications.py), so what a
backend sends outside calls reaches the client wherever its stream is. The stream is held as every
stream the router holds open (router/frontdoor/streams/held.py: pinged, ended when the router begins
to stop); it ends when the client disconnects or its session ends.

Each event's id says where the stream got to at each backend whose events have ids, so a client
whose connection dropped resumes it on any replica with `Last-Event-ID` and gets what those
backends sent meanwhile (router/frontdoor/streams/stream_cursor.py).

Bounds: at most `max_streams` open on one replica (503 beyond, with Retry-After), and
`MAX_PER_SESSION` of one session there (409 beyond: one client cannot take the others' room); each
message is written to the client with the backpressure of its connection (a client that does not
read holds its backends' streams, not the router's memory).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import anyio
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from sse_starlette import ServerSentEvent
from starlette.types import Receive, Scope, Send

from router.caller import Caller
from router.error_answers import jsonrpc_error_response
from router.errors import SessionNotFound
from router.frontdoor.streams.held import Stopping, Write, hold
from router.frontdoor.streams.stream_cursor import StreamCursor
from router.handlers.notifications import Notifications

logger = logging.getLogger(__name__)

MAX_STREAMS = 1000  # standalone streams one replica holds at once
MAX_PER_SESSION = 8  # and of those, one session's


class StandaloneStreams:
    """Serves `GET /mcp` for handshake sessions, at most `max_streams` at once."""

    def __init__(
        self, notifications: Notifications, stopping: Stopping | None = None, max_streams: int = MAX_STREAMS
    ) -> None:
        self.notifications = notifications
        self.stopping = stopping or Stopping()
        self.max_streams = max_streams
        self.open = 0
        self._by_session: dict[str, int] = {}  # the streams open here, by session id

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, caller: Caller, resume: str | None = None
    ) -> None:
        """Hold the caller's standalone stream open until it goes away or its session ends; with
        `resume` (a `Last-Event-ID` of such a stream), from where that event left each backend."""
        try:
            cursor = StreamCursor.parse(resume) if resume is not None else StreamCursor()
        except ValueError as exc:
            response = jsonrpc_error_response(
                400,
                INVALID_REQUEST,
                f"Last-Event-ID {str(resume)[:100]!r} is not an event id of a standalone stream ({exc}): "
                "open the stream again without it",
            )
            await response(scope, receive, send)
            return
        if self.open >= self.max_streams:
            response = jsonrpc_error_response(
                503,
                INTERNAL_ERROR,
                f"this router holds {self.max_streams} standalone streams already: open it again shortly",
                headers={"Retry-After": "5"},
            )
            await response(scope, receive, send)
            return
        if self._by_session.get(caller.session_id, 0) >= MAX_PER_SESSION:
            response = jsonrpc_error_response(
                409,
                INVALID_REQUEST,
                f"this session holds {MAX_PER_SESSION} standalone streams on this router already: "
                "close one before opening another",
            )
            await response(scope, receive, send)
            return
        self.open += 1
        self._by_session[caller.session_id] = self._by_session.get(caller.session_id, 0) + 1
        try:

            async def messages(write: Write) -> None:
                resumed = dict(cursor.marks)
                lock = anyio.Lock()

                async def message(message: Mapping[str, Any], backend_id: str, mark: str) -> None:
                    data = json.dumps(message, separators=(",", ":"))
                    async with lock:  # the id written is where the stream is once this event is out
                        cursor.moved(backend_id, mark)
                        event = ServerSentEvent(data=data, event="message", id=cursor.event_id() or None)
                        await write(event.encode())

                await self.notifications.listen(caller, message, resumed)

            # the stream ends quietly with the client's session, too
            await hold(receive, send, self.stopping, messages, ends=(SessionNotFound,))
        finally:
            self.open -= 1
            left = self._by_session.pop(caller.session_id) - 1
            if left:
                self._by_session[caller.session_id] = left
