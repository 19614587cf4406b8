"""Call streams kept for resumption: read in their own session only, numbered without gaps, ended
once their last event is read, forgotten when their time is up, bounded in memory; the same in
Redis, where every replica reads them (docs/gateway.md, "Streams a client resumes")."""

from __future__ import annotations

import pytest
import redis.asyncio as aredis

from indexer.errors import InvalidRequest
from indexer.state.redis import Keys
from indexer.state.stream_events import LocalStreams, RedisStreams, StreamStore, check_keep
from tests.support.clients import until
from tests.support.redis import RedisServer
from toolsearch.kept_streams import MAX_EVENTS, EventsToKeep, KeptEvents, StreamEnd

STREAM = "a-stream-of-the-routers"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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


async def test_a_stream_is_kept_in_order_and_read_in_its_own_session_only() -> None:
    await kept_in_order(LocalStreams())


async def test_redis_keeps_a_stream_the_same_way_for_every_replica(redis_server: RedisServer) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    try:
        await kept_in_order(RedisStreams(client, Keys("streams-test:")))
        other = RedisStreams(client, Keys("streams-test:"))  # another replica's
        assert (await other.read("one", STREAM, 2, 10)) == KeptEvents(("e3",), StreamEnd.DONE, "7")
    finally:
        await client.aclose()


async def test_a_redis_stream_expires_by_itself(redis_server: RedisServer) -> None:
    client = aredis.Redis.from_url(redis_server.url)
    try:
        streams = RedisStreams(client, Keys("streams-expiry:"))
        await streams.keep(keep(1, "e1", ttl=0.3))
        assert 0 < await client.pttl(f"streams-expiry:stream:one:{STREAM}") <= 300

        async def expired() -> bool:
            return await streams.read("one", STREAM, 0, 10) is None

        await until(expired, "the stream expired in Redis", timeout=10)
    finally:
        await client.aclose()


async def test_a_stream_is_forgotten_when_its_time_is_up_and_each_keep_renews_it() -> None:
    clock = Clock()
    streams = LocalStreams(clock=clock)
    await streams.keep(keep(1, "e1", ttl=10))
    clock.now = 9.0
    await streams.keep(keep(2, ttl=10))  # a renewal: no events
    clock.now = 15.0
    assert await streams.read("one", STREAM, 0, 10) == KeptEvents(("e1",), StreamEnd.OPEN, "7")
    clock.now = 19.5
    assert await streams.read("one", STREAM, 0, 10) is None
    assert len(streams) == 0


async def test_memory_keeps_at_most_its_streams_and_bytes_the_least_recently_kept_dropped_first() -> None:
    streams = LocalStreams(limit=2)
    for session in ("a", "b", "c"):
        await streams.keep(keep(1, "e1", session=session))
    assert len(streams) == 2
    assert await streams.read("a", STREAM, 0, 10) is None
    by_bytes = LocalStreams(max_bytes=10)
    await by_bytes.keep(keep(1, "123456", session="a"))
    await by_bytes.keep(keep(1, "123456", session="b"))
    assert await by_bytes.read("a", STREAM, 0, 10) is None
    assert await by_bytes.read("b", STREAM, 0, 10) is not None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (EventsToKeep("one", "short", 1, (), StreamEnd.OPEN, 30, ""), "16 to 64 url-safe"),
        (EventsToKeep("one", STREAM, 0, ("e",), StreamEnd.OPEN, 30, ""), "numbered 1 to"),
        (EventsToKeep("one", STREAM, MAX_EVENTS, ("e", "e"), StreamEnd.OPEN, 30, ""), "numbered 1 to"),
        (EventsToKeep("one", STREAM, 1, ("x" * (1 << 20 + 1),), StreamEnd.OPEN, 30, ""), "at most"),
        (EventsToKeep("one", STREAM, 1, (), StreamEnd.OPEN, 0, ""), "seconds"),
    ],
)
def test_a_keep_the_router_would_not_make_is_refused_saying_why(bad: EventsToKeep, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        check_keep(bad)
