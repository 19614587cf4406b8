"""What the router asks of a store of call streams, in its order: run against each store.

The memory store is checked in tests/indexer/test_stream_event_store.py, the Redis one, where every
replica reads what another kept, in tests/system/test_replicas_on_one_redis.py.
"""

from __future__ import annotations

import pytest

from indexer.errors import InvalidRequest
from indexer.state.stream_events import StreamStore
from toolsearch.kept_streams import EventsToKeep, KeptEvents, StreamEnd

STREAM = "a-stream-of-the-routers"


def keep(
    first: int, *events: str, end: StreamEnd = StreamEnd.OPEN, ttl: float = 30.0, session: str = "one"
) -> EventsToKeep:
    return EventsToKeep(session, STREAM, first, events, end, ttl, "7")


async def kept_in_order(streams: StreamStore) -> None:
    await streams.keep(keep(1))  # the record, before the first event goes out
    assert await streams.read("one", STREAM, 0, 10) == KeptEvents((), StreamEnd.OPEN, "7")
    await streams.keep(keep(1, "e1", "e2"))
    await streams.keep(keep(3, "e3", end=StreamEnd.DONE))
    assert await streams.read("one", STREAM, 1, 10) == KeptEvents(("e2", "e3"), StreamEnd.DONE, "7")
    # the end is said only with the last event: a read that stops short of it is still open
    assert await streams.read("one", STREAM, 0, 2) == KeptEvents(("e1", "e2"), StreamEnd.OPEN, "7")
    assert await streams.read("two", STREAM, 0, 10) is None
    with pytest.raises(InvalidRequest, match="cannot follow the 3 kept"):
        await streams.keep(keep(5, "e5"))
    await streams.keep(keep(2, "e2", "e3"))  # a keep sent twice changes nothing
    assert await streams.read("one", STREAM, 0, 10) == KeptEvents(("e1", "e2", "e3"), StreamEnd.DONE, "7")
