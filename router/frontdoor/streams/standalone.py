"""A handshake-era client's standalone stream: `GET /mcp`, held open on whichever replica it reaches.

The router keeps no session in process memory, and it need not for this stream either: the stream
is the client's for as long as it holds the connection, and the replica it reached reads the
session's backends' own standalone streams meanwhile (router/handlers/notifications.py), so what a
backend sends outside calls reaches the client wherever its stream is. A comment line goes every
`PING_INTERVAL`, so a client that went away is noticed even when nothing else is sent; the stream
ends when the client disconnects or its session ends.

Bounds: at most `max_streams` open on one replica (503 beyond, with Retry-After), and
`MAX_PER_SESSION` of one session there (409 beyond: one client cannot take the others' room); each
message is written to the client with the backpressure of its connection (a client that does not
read holds its backends' streams, not the router's memory). When the router begins to stop (`Stopping`,
set by SIGTERM), every stream ends at once: a client opens it again on another replica, and the
stop need not wait out its grace for connections that never end by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from router.handlers.notifications import Notifications

logger = logging.getLogger(__name__)

PING_INTERVAL = 15.0  # seconds between two comment lines on an idle stream
MAX_STREAMS = 1000  # standalone streams one replica holds at once
MAX_PER_SESSION = 8  # and of those, one session's


class Stopping:
    """Set once the server begins to stop; `wait` returns then (at once if it is set already).

    `set` may be called from a signal handler: each waiter's loop is woken thread-safely.
    """

    def __init__(self) -> None:
        self._stopped = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def set(self) -> None:
        self._stopped = True
        for loop, event in list(self._waiters):
            loop.call_soon_threadsafe(event.set)

    async def wait(self) -> None:
        if self._stopped:
            return
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        self._waiters.append(waiter)
        try:
            await waiter[1].wait()
        finally:
            self._waiters.remove(waiter)


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

    async def serve(self, scope: Scope, receive: Receive, send: Send, caller: Caller) -> None:
        """Hold the caller's standalone stream open until it goes away or its session ends."""
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
        lock = anyio.Lock()
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})

            async def write(chunk: bytes) -> None:
                async with lock:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})

            async def message(message: Mapping[str, Any]) -> None:
                data = json.dumps(message, separators=(",", ":"))
                await write(ServerSentEvent(data=data, event="message").encode())

            async def ping() -> None:
                while True:
                    await anyio.sleep(PING_INTERVAL)
                    await write(b": ping\r\n\r\n")

            async def until_gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass

            async with anyio.create_task_group() as group:

                async def run(part: Any) -> None:
                    try:
                        await part()
                    except (OSError, SessionNotFound) as exc:  # the client, or its session, is gone
                        logger.debug("a standalone stream ended: %r", exc)
                    group.cancel_scope.cancel()

                group.start_soon(run, until_gone)
                group.start_soon(run, self.stopping.wait)
                group.start_soon(run, ping)
                group.start_soon(run, lambda: self.notifications.listen(caller, message))
            with contextlib.suppress(OSError):  # the client that went away needs no end
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.open -= 1
            left = self._by_session.pop(caller.session_id) - 1
            if left:
                self._by_session[caller.session_id] = left
