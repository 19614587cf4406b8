"""Call streams kept for resumption: a handshake-era call's SSE events, kept with its session.

The router that runs a streamed call gives each event an id and keeps the events here as it writes
them, so a client whose connection dropped sends `GET` with `Last-Event-ID` to any replica, which
reads what came after that event here and follows the stream to its end (docs/gateway.md,
"Streams a client resumes"). The events are the router's (whole SSE events, ids included); the
indexer keeps them by session, numbered from 1, so a stream read in another session finds nothing,
and each keep must continue the numbering (a keep sent twice rewrites the same events). A stream
ends `DONE` (its last event, the call's answer, is kept) or `BROKEN` (the router could not keep
every event: a resumption cannot be served whole). The record lives `ttl` past its last keep: the
router renews it while the call runs, so a record that vanishes before its end means the replica
running the call is gone.

Bounds: `MAX_EVENTS` events of at most `MAX_EVENT_BYTES` each per stream (toolsearch/kept_streams.py:
the router keeps to them too); in memory (one indexer)
at most `STREAMS_KEPT` streams and `BYTES_KEPT` bytes, the oldest dropped first. In Redis each
stream is one hash expiring by itself, under `stream:<session>:<stream id>` (fields `n`, `end`,
`request` and the events by number), written by one script so that a keep's check of the numbering
and its writes are one step.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import redis.asyncio as aredis

from indexer.errors import InvalidRequest
from indexer.state.redis import Keys, guarded, text
from toolsearch.kept_streams import MAX_EVENT_BYTES, MAX_EVENTS, EventsToKeep, KeptEvents, StreamEnd
from toolsearch.sessions import KEPT_ID

MAX_TTL = 86_400.0  # seconds a keep may ask for, at most
STREAMS_KEPT = 10_000  # streams one indexer holds in memory
BYTES_KEPT = 256 * 1024 * 1024  # and their events' bytes in all


def check_keep(keep: EventsToKeep) -> None:
    """Raise `InvalidRequest` for a keep the router would not make."""
    if not KEPT_ID.fullmatch(keep.stream_id):
        raise InvalidRequest("a stream id is 16 to 64 url-safe characters")
    if keep.first_seq < 1 or keep.first_seq + len(keep.events) - 1 > MAX_EVENTS:
        raise InvalidRequest(f"a kept stream's events are numbered 1 to {MAX_EVENTS}")
    if any(len(event.encode()) > MAX_EVENT_BYTES for event in keep.events):
        raise InvalidRequest(f"a kept stream's event is at most {MAX_EVENT_BYTES} bytes")
    if not 0 < keep.ttl <= MAX_TTL:
        raise InvalidRequest(f"a stream is kept for more than 0 and at most {MAX_TTL:g} seconds")


def _gap(keep: EventsToKeep, kept: int) -> InvalidRequest:
    return InvalidRequest(
        f"stream events from {keep.first_seq} on cannot follow the {kept} kept: keep them in order"
    )


class StreamStore(Protocol):
    """Where call streams are kept: `keep` adds events, `read` those after a number."""

    async def keep(self, keep: EventsToKeep) -> None: ...

    async def read(self, session_id: str, stream_id: str, after: int, limit: int) -> KeptEvents | None: ...


@dataclass
class _Stream:
    events: list[str] = field(default_factory=list)
    end: StreamEnd = StreamEnd.OPEN
    request_id: str = ""
    expires: float = 0.0  # monotonic
    size: int = 0  # bytes of the events


class LocalStreams:
    """The `StreamStore` of a single indexer: its own memory, bounded."""

    def __init__(
        self,
        limit: int = STREAMS_KEPT,
        max_bytes: int = BYTES_KEPT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit, self._max_bytes, self._clock = limit, max_bytes, clock
        self._kept: OrderedDict[tuple[str, str], _Stream] = OrderedDict()  # least recently kept first
        self._size = 0

    async def keep(self, keep: EventsToKeep) -> None:
        key = (keep.session_id, keep.stream_id)
        stream = self._live(key) or _Stream()
        if keep.first_seq > len(stream.events) + 1:
            raise _gap(keep, len(stream.events))
        start = keep.first_seq - 1
        replaced = stream.events[start : start + len(keep.events)]
        stream.events[start : start + len(keep.events)] = keep.events
        grown = sum(len(e.encode()) for e in keep.events) - sum(len(e.encode()) for e in replaced)
        stream.size += grown
        self._size += grown
        if keep.end is not StreamEnd.OPEN:
            stream.end = keep.end
        stream.request_id = keep.request_id or stream.request_id
        stream.expires = self._clock() + keep.ttl
        self._kept[key] = stream
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit or (self._size > self._max_bytes and len(self._kept) > 1):
            self._size -= self._kept.popitem(last=False)[1].size

    async def read(self, session_id: str, stream_id: str, after: int, limit: int) -> KeptEvents | None:
        stream = self._live((session_id, stream_id))
        if stream is None:
            return None
        events = tuple(stream.events[after : after + limit])
        complete = after + len(events) >= len(stream.events)
        return KeptEvents(events, stream.end if complete else StreamEnd.OPEN, stream.request_id)

    def _live(self, key: tuple[str, str]) -> _Stream | None:
        stream = self._kept.get(key)
        if stream is not None and stream.expires <= self._clock():
            del self._kept[key]
            self._size -= stream.size
            return None
        return stream

    def __len__(self) -> int:
        return len(self._kept)


# KEYS: the stream's hash; ARGV: first number, ttl ms, end ('' for open), request id, events...
# Answers the number of events kept, or -1 - that number when the keep would leave a gap.
_KEEP = """
local kept = tonumber(redis.call('HGET', KEYS[1], 'n') or '0')
local first = tonumber(ARGV[1])
if first > kept + 1 then return -1 - kept end
for i = 5, #ARGV do redis.call('HSET', KEYS[1], tostring(first + i - 5), ARGV[i]) end
local last = first + #ARGV - 5
if last > kept then kept = last end
redis.call('HSET', KEYS[1], 'n', kept)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'end', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'request', ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return kept
"""


class RedisStreams:
    """The `StreamStore` replicas share: one Redis hash per stream, expiring by itself."""

    def __init__(self, client: aredis.Redis, keys: Keys) -> None:
        self._client, self._keys = client, keys
        self._keep = client.register_script(_KEEP)

    async def keep(self, keep: EventsToKeep) -> None:
        end = "" if keep.end is StreamEnd.OPEN else keep.end.value
        ttl = max(1, int(keep.ttl * 1000))
        key = self._keys.stream(keep.session_id, keep.stream_id)
        async with guarded("keeping a call's stream"):
            kept = int(
                await self._keep(keys=[key], args=[keep.first_seq, ttl, end, keep.request_id, *keep.events])
            )
        if kept < 0:
            raise _gap(keep, -1 - kept)

    async def read(self, session_id: str, stream_id: str, after: int, limit: int) -> KeptEvents | None:
        numbers = [str(n) for n in range(after + 1, after + limit + 1)]
        async with guarded("reading a call's stream"):
            values = await self._client.hmget(
                self._keys.stream(session_id, stream_id), ["n", "end", "request", *numbers]
            )
        if values[0] is None:
            return None
        kept = int(text(values[0]))
        events = tuple(text(v) for v in values[3 : 3 + max(0, kept - after)] if v is not None)
        end = (
            StreamEnd(text(values[1]))
            if values[1] is not None and after + len(events) >= kept
            else StreamEnd.OPEN
        )
        return KeptEvents(events, end, text(values[2]))
