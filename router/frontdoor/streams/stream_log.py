"""One handshake-era call's stream, kept in the indexer as it is written, so its client can resume it.

A call's SSE stream is the client's only way to its answer, and a connection drops (a proxy's idle
timeout, a network change, a laptop lid). So the router numbers the stream's events (`id:
<stream>/<n>`, a priming event `<stream>/0` first) and keeps each in the indexer with the session
(`KeepStreamEvents`) while it writes them; a client that lost the connection sends `GET` with the
last id it read to any replica, which reads the rest there (router/frontdoor/streams/resumed_streams.py).

`StreamLog` is that keeping for one stream: `open` makes the record before the first event goes
out, so a client never holds an id no replica can find; `add` queues an event (it returns at once:
the client's events are never held up by the indexer); `run` keeps what is queued, in order, a batch
per call, and renews the record every `RENEW` seconds while the call runs, so that the record
outlives the replica running the call by `LEASE` seconds at most; `close` keeps the rest and the
stream's end, then the record lasts `KEPT_AFTER_END`. An event the indexer cannot keep (over its
size, or the indexer unreachable) breaks the stream: the rest is not kept, and a resumption says so
instead of waiting for events that will never come. A call whose client went away runs on only
while the replica runs fewer than `MAX_DETACHED` such calls (`Detached`); beyond, it ends as it
would without a log, its stream ending unanswered. Bounds: `MAX_EVENTS` events, `MAX_EVENT_BYTES`
each, as the indexer keeps them, and `MAX_QUEUED_BYTES` waiting for it (an indexer that far behind
breaks the stream too).
"""

from __future__ import annotations

import logging
import secrets
from collections import deque

import anyio

from router.caller import Caller
from router.errors import RouterError
from router.link.indexer_client import IndexerClient
from toolsearch.kept_streams import MAX_EVENT_BYTES, MAX_EVENTS, EventsToKeep, StreamEnd

logger = logging.getLogger(__name__)

LEASE = 30.0  # seconds a running call's record outlives its last renewal
RENEW = 10.0  # seconds between two renewals while nothing else is kept
KEPT_AFTER_END = 120.0  # seconds a client has to resume a stream that ended
RETRY_MS = 500  # the `retry` the priming event suggests: how soon a client tries again
BATCH_BYTES = 2 * MAX_EVENT_BYTES  # bytes of events one keep carries, at most (the link's own bound is 4 MiB)
MAX_DETACHED = 256  # calls one replica runs on after their clients went away
MAX_QUEUED_BYTES = 4 * BATCH_BYTES  # bytes waiting for the indexer, at most: beyond, it fell behind


class Detached:
    """The calls one replica runs on after their clients went away: at most `limit` at once, so a
    client that starts calls and leaves cannot make the replica hold more than that."""

    def __init__(self, limit: int = MAX_DETACHED) -> None:
        self.limit = limit
        self.count = 0
        self.refused = 0  # calls ended since the replica started, for want of room

    def enter(self) -> bool:
        """Whether one more call may run on; if so, it counts until `leave`."""
        if self.count >= self.limit:
            self.refused += 1
            if self.refused % 100 == 1:  # the first, then one line per hundred: no flood
                logger.warning(
                    "a call whose client went away ends: %d such calls run on here already (%d ended so)",
                    self.limit,
                    self.refused,
                )
            return False
        self.count += 1
        return True

    def leave(self) -> None:
        self.count -= 1


class StreamLog:
    """Keeps one call's stream events in the indexer: `open`, then `add` each, `run` beside, `close`."""

    def __init__(self, indexer: IndexerClient, caller: Caller, request_id: str, detached: Detached) -> None:
        self.stream_id = secrets.token_urlsafe(16)
        self._detached = detached
        self._running_on = False  # the call runs on without its client, counted in `detached`
        self._indexer = indexer
        self._caller = caller
        self._request_id = request_id  # the call's JSON-RPC id, as JSON
        self._queued: deque[bytes] = deque()
        self._queued_bytes = 0
        self._numbered = 0  # events given a number so far
        self._kept = 0  # of those, the ones the indexer has
        self._opened = False
        self._closed = False
        self._broken = False
        self._wake = anyio.Event()

    def event_id(self, number: int) -> str:
        return f"{self.stream_id}/{number}"

    @property
    def broken(self) -> bool:
        return self._broken

    async def open(self) -> None:
        """Make the stream's record; raises `RouterError` when the indexer does not take it."""
        await self._keep(1, [], StreamEnd.OPEN, LEASE)
        self._opened = True

    def add(self, event: bytes) -> int:
        """Queue one whole SSE event (its id line already in) and answer its number."""
        self._numbered += 1
        if self._numbered > MAX_EVENTS or len(event) > MAX_EVENT_BYTES:
            self._break(
                f"event {self._numbered} is over the {MAX_EVENTS} events or {MAX_EVENT_BYTES} bytes kept"
            )
        if not self._broken:
            self._queued.append(event)
            self._wake.set()
        return self._numbered

    def next_number(self) -> int:
        return self._numbered + 1

    def run_on(self) -> bool:
        """The client went away: whether the call may run on, its events kept (else it ends, as
        when its stream is not kept: the replica runs as many such calls as it may already)."""
        if self._closed:
            return True  # the stream had ended: nothing runs on
        self._running_on = not self._broken and self._detached.enter()
        return self._running_on

    def close(self) -> None:
        """The stream ended: `run` keeps what is queued and the end, then returns."""
        self._closed = True
        self._wake.set()
        if self._running_on:
            self._running_on = False
            self._detached.leave()

    async def run(self) -> None:
        """Keep queued events until `close`d and all is kept (or the stream broke); nothing if the
        stream was never `open`ed."""
        while True:
            with anyio.move_on_after(RENEW):
                await self._wake.wait()
            self._wake = anyio.Event()
            closing = self._closed
            if not self._opened:  # answered with JSON, or not kept at all: nothing to keep
                if closing:
                    return
                continue
            try:
                await self._flush(closing)
            except RouterError as exc:
                self._break(f"the indexer did not keep its events ({exc})")
            if self._broken:
                await self._keep_quietly(StreamEnd.BROKEN)
                return
            if closing:
                return

    async def _flush(self, closing: bool) -> None:
        while True:
            batch: list[str] = []
            size = 0
            while self._queued and (not batch or size + len(self._queued[0]) <= BATCH_BYTES):
                size += len(self._queued[0])
                batch.append(self._queued.popleft().decode())
            self._queued_bytes -= size
            last = not self._queued
            end = StreamEnd.DONE if closing and last and not self._broken else StreamEnd.OPEN
            await self._keep(self._kept + 1, batch, end, KEPT_AFTER_END if end is StreamEnd.DONE else LEASE)
            self._kept += len(batch)
            if last:
                return

    async def _keep(self, first: int, events: list[str], end: StreamEnd, ttl: float) -> None:
        caller = self._caller
        keep = EventsToKeep(caller.session_id, self.stream_id, first, events, end, ttl, self._request_id)
        await self._indexer.keep_stream_events(caller.identity.principal, keep)

    async def _keep_quietly(self, end: StreamEnd) -> None:
        try:
            await self._keep(self._kept + 1, [], end, KEPT_AFTER_END)
        except RouterError as exc:
            logger.debug("a call's stream end was not kept: %s", exc)

    def _break(self, why: str) -> None:
        if not self._broken:
            logger.warning("a call's stream can no longer be resumed: %s", why)
            self._broken = True
            self._queued.clear()
            self._queued_bytes = 0
