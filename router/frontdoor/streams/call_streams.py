"""A streamed call's SSE response, written by the SDK and, beside it, by the router itself.

The router runs the SDK's server stateless, and a stateless server cannot send a request of its
client: it would wait for an answer that, over HTTP, comes back in another POST, maybe to another
replica. The router needs no answer on this stream, though: it passes a backend's request of its
client on (sampling, elicitation, roots; router/relays.py) and the client's answer, posted to any
replica, goes to the backend directly (router/upstream/session_wide/backend_notices.py). So the
session layer hands the SDK a `CallStream`'s `send` in place of the server's, and the relay writes
such a request through `CallStream.send`: one SSE event, between two of the SDK's, never inside one
(each ASGI message is one whole event, and one lock orders them).

With a `StreamLog` (a handshake-era session's call), the stream is resumable: it opens with a
priming event, every event gets an id and is kept in the indexer as it is written
(router/frontdoor/streams/stream_log.py), and the call no longer ends with its client's connection. The SDK
reads `asgi_receive`, which never says the client went away; `watch` learns it from the server
instead, and from then on the events are only kept, for the client to read on any replica when it
resumes (a disconnection is not a cancellation: the client sends `notifications/cancelled` for
that). Without one, the call ends when its client goes away, as the SDK has it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import anyio
from sse_starlette import ServerSentEvent
from starlette.types import Message, Receive, Send

from router.errors import RouterError
from router.frontdoor.streams.stream_log import RETRY_MS, StreamLog

logger = logging.getLogger(__name__)

START_TIMEOUT = 5.0  # seconds a message waits for the SDK to start the stream, at most


class CallStream:
    """One call's SSE response: the SDK's messages through `asgi_send`, the router's through `send`."""

    def __init__(self, send: Send, receive: Receive, log: StreamLog | None = None) -> None:
        self._send = send
        self._receive = receive
        self._log = log
        self._lock = anyio.Lock()
        self._started = anyio.Event()
        self._ended = anyio.Event()
        self._open = False  # an SSE stream has started and not ended
        self._gone = False  # the client's connection is
        self._body_read = False

    async def asgi_receive(self) -> Message:
        """The ASGI `receive` the SDK reads the request with; with a log, once the body is read it
        waits for the stream's end instead of the client's disconnection."""
        if self._log is None or not self._body_read:
            message = await self._receive()
            self._body_read = message["type"] == "http.request" and not message.get("more_body", False)
            return message
        await self._ended.wait()
        return {"type": "http.disconnect"}

    async def watch(self) -> None:
        """With a log: note when the client goes away (the SDK does not see it), until the stream ends."""
        if self._log is None:
            return
        await self._started.wait()
        if self._log is None or not self._open:  # not kept after all, or answered with JSON
            return
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._gone = True
        if self._log.run_on():
            logger.debug("the client of a resumable call's stream went away: its events are kept")
        else:
            self._ended.set()  # the SDK hears of the disconnection, and the call ends

    async def asgi_send(self, message: Message) -> None:
        """The ASGI `send` the SDK writes the response with."""
        async with self._lock:
            log = self._log
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                content_type = headers.get(b"content-type", b"").decode("latin-1")
                self._open = message["status"] == 200 and content_type.startswith("text/event-stream")
                if self._open and log is not None:
                    await self._start_log(log)
                await self._write(message)
                if self._open and self._log is not None:
                    priming = f"id: {self._log.event_id(0)}\r\nretry: {RETRY_MS}\r\ndata: \r\n\r\n"
                    await self._write(
                        {"type": "http.response.body", "body": priming.encode(), "more_body": True}
                    )
                self._started.set()
                return
            if message["type"] == "http.response.body":
                more = message.get("more_body", False)
                body = bytes(message.get("body", b""))
                if self._open and log is not None and body and not body.startswith(b":"):
                    body = self._numbered(log, body)
                if not more:
                    self._open = False
                    if log is not None:
                        log.close()
                    self._ended.set()
                message = {**message, "body": body}
            await self._write(message)

    async def send(self, message: Mapping[str, Any]) -> bool:
        """Write one JSON-RPC message as an event of the stream; False if there is no stream to
        write it on (the answer is not a stream, or it ended, or the client went away and the
        stream is not kept for it to resume)."""
        with anyio.move_on_after(START_TIMEOUT):
            await self._started.wait()
        event = ServerSentEvent(data=json.dumps(message, separators=(",", ":")), event="message").encode()
        async with self._lock:
            if not self._open:
                return False
            log = self._log
            if log is not None:
                event = self._numbered(log, event)
            await self._write({"type": "http.response.body", "body": event, "more_body": True})
            return not self._gone or (log is not None and not log.broken)

    async def _start_log(self, log: StreamLog) -> None:
        try:
            await log.open()
        except RouterError as exc:  # the stream is not resumable, but the call goes on
            logger.warning("a call's stream is not kept for resumption: %s", exc)
            self._log = None

    def _numbered(self, log: StreamLog, event: bytes) -> bytes:
        numbered = f"id: {log.event_id(log.next_number())}\r\n".encode() + event
        log.add(numbered)
        return numbered

    async def _write(self, message: Message) -> None:
        if self._gone:
            return
        try:
            await self._send(message)
        except OSError as exc:  # the client went away mid-stream
            logger.debug("a message could not reach the client: %r", exc)
            self._gone = True
            if self._log is None:
                self._open = False
