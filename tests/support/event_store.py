"""An in-memory event store for the SDK's Streamable HTTP server, so that its streams can be resumed
(`Last-Event-ID`) after the server closed them early (SSE polling, SEP-1699).

Each event gets an id that names its stream and its place there; a resumption replays the events of
that stream after the id. At most `limit` events are kept, the oldest forgotten first.
"""

from __future__ import annotations

from collections import deque
from itertools import count

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage


class MemoryEventStore(EventStore):
    """Every stream's events in one bounded queue, in the order they were stored."""

    def __init__(self, limit: int = 10_000) -> None:
        self._events: deque[tuple[StreamId, EventId, JSONRPCMessage | None]] = deque(maxlen=limit)
        self._ids = count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"{stream_id}/{next(self._ids)}"
        self._events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        stream_id = last_event_id.rpartition("/")[0]
        found = False
        for stream, event_id, message in list(self._events):
            if found and stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
            found = found or event_id == last_event_id
        return stream_id if found else None
