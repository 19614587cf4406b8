"""The bridge sessions that hear one stdio server's notifications (log messages, list changes, updates).

A stdio server's notifications carry no session: on a pipe there is only one peer. The bridge passes
each on to every session that listens to that server (all of a shared backend's sessions, the one
session of a per_session process), on the session's own stream (its GET stream, as MCP sends
unsolicited notifications). A session listens from its first request on; one unheard from for
`idle_timeout` is forgotten, and at most `limit` are kept.

Delivery never holds the server back: its session puts notifications in a bounded queue (a full
queue drops, and says so in the log within a budget), and one pump per server sends them, each send
bounded, so a session whose client stopped reading costs at most `SEND_TIMEOUT` per notification.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import anyio
import mcp_types as types
from mcp.server.session import ServerSession

from bridge.transports.stderr import LogBudget

logger = logging.getLogger(__name__)

QUEUE_SIZE = 256  # notifications waiting to be sent; more are dropped
SEND_TIMEOUT = 1.0  # seconds one send to one session may take


class Listeners:
    """Sessions by id, most recently heard from last, and the queue of what they are to hear."""

    def __init__(self, backend_id: str, limit: int, idle_timeout: float) -> None:
        self.backend_id = backend_id
        self.limit = limit
        self.idle_timeout = idle_timeout
        self.dropped = 0
        self._sessions: OrderedDict[str, tuple[ServerSession, float]] = OrderedDict()
        self._send, self._receive = anyio.create_memory_object_stream[types.ServerNotification](QUEUE_SIZE)
        self._drop_budget = LogBudget(burst=1, per_second=0.1)

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, session_id: str, session: ServerSession) -> None:
        """Note that `session_id` is alive and reached through `session` (any request's will do)."""
        self._sessions[session_id] = (session, anyio.current_time())
        self._sessions.move_to_end(session_id)
        while len(self._sessions) > self.limit:
            self._sessions.popitem(last=False)

    def remove(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def deliver(self, notification: types.ServerNotification) -> None:
        """Queue a notification for every listening session; never waits."""
        if not self._sessions:
            return
        try:
            self._send.send_nowait(notification)
        except anyio.WouldBlock:
            self.dropped += 1
            if self._drop_budget.allow():
                logger.warning(
                    "backend %s: notifications are coming faster than sessions take them; %d dropped",
                    self.backend_id,
                    self.dropped,
                )

    async def run(self) -> None:
        """Send queued notifications until cancelled."""
        async with self._receive:
            async for notification in self._receive:
                now = anyio.current_time()
                for session_id, (session, seen) in list(self._sessions.items()):
                    if now - seen > self.idle_timeout:
                        self.remove(session_id)
                        continue
                    with anyio.move_on_after(SEND_TIMEOUT):
                        await session.send_notification(notification)
