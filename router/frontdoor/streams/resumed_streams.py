"""A call's stream resumed by its client: `GET /mcp` with `Last-Event-ID`, on whichever replica.

A handshake-era call's stream is kept in the indexer as it is written (router/frontdoor/
stream_log.py), its events numbered `<stream>/<n>`. A client whose connection dropped sends `GET`
with the last id it read; the replica it reaches reads what came after from the indexer, writes it,
and follows the stream, reading again as the replica running the call keeps more (every
`POLL_FIRST` seconds, slowing to `POLL_MOST` while nothing comes), until its last event, the call's
answer. So the client gets every event once, in order, and its answer, whichever replica runs the
call and whichever it reached.

What can go wrong ends the stream with a JSON-RPC error for the call, so the client's request never
waits for nothing: the stream ended without an answer (the call was cut short), events could not
be kept (`BROKEN`), or the record vanished before the end (the replica running the call is gone:
it renews the record while it runs). An id of no stream kept in the session is a 400 saying so.
Bounds: at most `max_streams` resumed streams held on one replica (503 beyond, with Retry-After).
Each is held as every stream the router holds open (router/frontdoor/streams/held.py): pinged, so
a client that went away is noticed, and ended when the router begins to stop (its client resumes
it again elsewhere).
"""

from __future__ import annotations

import json
import logging
import re

import anyio
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from sse_starlette import ServerSentEvent
from starlette.types import Receive, Scope, Send

from router.caller import Caller
from router.error_answers import jsonrpc_error_response
from router.errors import RouterError
from router.frontdoor.streams.held import Stopping, Write, hold
from router.frontdoor.streams.stream_log import Detached
from router.link.indexer_client import IndexerClient
from toolsearch.kept_streams import KeptEvents, StreamEnd
from toolsearch.sessions import KEPT_ID

logger = logging.getLogger(__name__)


MAX_STREAMS = 1000  # resumed streams one replica holds at once
POLL_FIRST = 0.05  # seconds between two reads of a stream that is still being written, at first
POLL_MOST = 0.5  # and at most, while nothing new comes
READ_LIMIT = 100  # events one read asks for
_EVENT_ID = re.compile(rf"(?P<stream>{KEPT_ID.pattern})/(?P<number>[0-9]{{1,9}})")
UNKNOWN = (
    "Last-Event-ID {event_id!r} names no call stream kept in this session: it ended more than two "
    "minutes ago, or it is not an event id of this server; call again"
)
NO_ANSWER = "the call's stream ended before its answer: call again"
BROKEN = "some of the call's events could not be kept for resumption: call again"
LOST = "the router running this call stopped before its answer: call again"


class ResumedStreams:
    """Serves `GET /mcp` with `Last-Event-ID` for handshake sessions, at most `max_streams` at once."""

    def __init__(self, indexer: IndexerClient, stopping: Stopping, max_streams: int = MAX_STREAMS) -> None:
        self.indexer = indexer
        self.stopping = stopping
        self.max_streams = max_streams
        self.open = 0
        self.detached = Detached()  # the calls this replica runs on after their clients left

    async def serve(self, scope: Scope, receive: Receive, send: Send, caller: Caller, event_id: str) -> None:
        """Write the call's events after `event_id` and follow them to its answer."""
        match = _EVENT_ID.fullmatch(event_id.strip())
        first = None if match is None else await self._read(caller, match["stream"], int(match["number"]))
        if match is None or first is None:
            response = jsonrpc_error_response(400, INVALID_REQUEST, UNKNOWN.format(event_id=event_id[:100]))
            await response(scope, receive, send)
            return
        if self.open >= self.max_streams:
            response = jsonrpc_error_response(
                503,
                INTERNAL_ERROR,
                f"this router holds {self.max_streams} resumed streams already: resume shortly",
                headers={"Retry-After": "1"},
            )
            await response(scope, receive, send)
            return
        self.open += 1
        try:

            async def follow(write: Write) -> None:
                await self._follow(caller, match["stream"], int(match["number"]), first, write)

            await hold(receive, send, self.stopping, follow)
        finally:
            self.open -= 1

    async def _read(self, caller: Caller, stream_id: str, after: int) -> KeptEvents | None:
        return await self.indexer.read_stream_events(
            caller.session_id, caller.identity.principal, stream_id, after, READ_LIMIT
        )

    async def _follow(
        self, caller: Caller, stream_id: str, after: int, kept: KeptEvents | None, write: Write
    ) -> None:
        request_id = kept.request_id if kept is not None else "null"
        last = ""  # the last event written
        pause = POLL_FIRST
        while True:
            if kept is None:
                await write(_error(request_id, LOST))
                return
            request_id = kept.request_id or request_id
            for event in kept.events:
                await write(event.encode())
                last = event
            after += len(kept.events)
            if kept.end is StreamEnd.DONE:
                if not _is_answer(last):
                    await write(_error(request_id, NO_ANSWER))
                return
            if kept.end is StreamEnd.BROKEN:
                await write(_error(request_id, BROKEN))
                return
            if len(kept.events) == READ_LIMIT:
                pause = 0.0  # more is kept already
            elif kept.events:
                pause = POLL_FIRST
            else:
                pause = min(POLL_MOST, max(pause * 2, POLL_FIRST))
            await anyio.sleep(pause)
            try:
                kept = await self._read(caller, stream_id, after)
            except RouterError as exc:  # the stream ends unanswered: its client resumes it again
                logger.info("a resumed stream could not be read on: %s", exc)
                return


def _is_answer(event: str) -> bool:
    """Whether an SSE event carries a JSON-RPC response (the call's answer)."""
    data = "".join(line[5:].lstrip(" ") for line in event.splitlines() if line.startswith("data:"))
    try:
        message = json.loads(data)
    except ValueError:
        return False
    return (
        isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)
    )


def _error(request_id: str, message: str) -> bytes:
    """An SSE event answering the call with an error: `request_id` is the id as the router kept it."""
    try:
        id_ = json.loads(request_id or "null")
    except ValueError:
        id_ = None
    answer = {"jsonrpc": "2.0", "id": id_, "error": {"code": INTERNAL_ERROR, "message": message}}
    return ServerSentEvent(data=json.dumps(answer, separators=(",", ":")), event="message").encode()
