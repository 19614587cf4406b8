"""Call streams kept for resumption: read in their own session only, numbered without gaps, ended
once their last event is read, forgotten when their time is up, bounded in memory (docs/gateway.md,
"Streams a client resumes"). The same in Redis, where every replica reads them:
tests/system/test_replicas_on_one_redis.py."""

from __future__ import annotations

import pytest

from indexer.errors import InvalidRequest
from indexer.state.stream_events import LocalStreams, check_keep
from tests.support.stream_stores import STREAM, keep, kept_in_order
from toolsearch.kept_streams import MAX_EVENTS, EventsToKeep, KeptEvents, StreamEnd


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_stream_is_kept_in_order_and_read_in_its_own_session_only() -> None:
    await kept_in_order(LocalStreams())


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
