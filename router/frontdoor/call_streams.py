"""A streamed call's SSE response, written by the SDK and, beside it, by the router itself.

The router runs the SDK's server stateless, and a stateless server cannot send a request of its
client: it would wait for an answer that, over HTTP, comes back in another POST, maybe to another
replica. The router needs no answer on this stream, though: it passes a backend's request of its
client on (sampling, elicitation, roots; router/upstream/relays.py) and the client's answer, posted
to any replica, goes to the backend directly (router/handlers/client_answers.py). So the session
layer hands the SDK a `CallStream`'s `send` in place of the server's, and the handlers write such a
request through `CallStream.send`: one SSE event, between two of the SDK's, never inside one (each
ASGI message is one whole event, and one lock orders them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import anyio
from sse_starlette import ServerSentEvent
from starlette.types import Message, Send

logger = logging.getLogger(__name__)

START_TIMEOUT = 5.0  # seconds a message waits for the SDK to start the stream, at most


class CallStream:
    """One call's SSE response: the SDK's messages through `asgi_send`, the router's through `send`."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = anyio.Lock()
        self._started = anyio.Event()
        self._open = False  # an SSE stream has started and not ended

    async def asgi_send(self, message: Message) -> None:
        """The ASGI `send` the SDK writes the response with."""
        async with self._lock:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                content_type = headers.get(b"content-type", b"").decode("latin-1")
                self._open = message["status"] == 200 and content_type.startswith("text/event-stream")
                self._started.set()
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                self._open = False
            await self._send(message)

    async def send(self, message: Mapping[str, Any]) -> bool:
        """Write one JSON-RPC message as an event of the stream; False if there is no stream to
        write it on (the answer is not a stream, or it ended, or the client went away)."""
        with anyio.move_on_after(START_TIMEOUT):
            await self._started.wait()
        event = ServerSentEvent(data=json.dumps(message, separators=(",", ":")), event="message")
        async with self._lock:
            if not self._open:
                return False
            try:
                await self._send({"type": "http.response.body", "body": event.encode(), "more_body": True})
            except OSError as exc:  # the client went away mid-stream
                logger.debug("a message could not reach the client: %r", exc)
                self._open = False
                return False
        return True
