"""What a backend's HTTP answer holds: its JSON-RPC messages, as one JSON body or as SSE events read as
they arrive, and what an error answer means (a forgotten session, a JSON-RPC error, a capability
the client lacks), for the messenger (router/upstream/wire/backend_messages.py) to act on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from mcp_types import INTERNAL_ERROR, MISSING_REQUIRED_CLIENT_CAPABILITY

from router.errors import BackendAnswered, CapabilityMissing

FINISH_WITHIN = 0.05  # seconds an answered stream is read on for its end, at most


def is_stream(response: httpx2.Response) -> bool:
    content_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    return content_type == "text/event-stream"


@dataclass
class StreamPosition:
    """Where a backend's SSE stream got to: the id of its last event with one ("" if none had an id)
    and the reconnection delay it asked for (`retry:`, milliseconds; None if it asked none), from
    which a stream the backend closed early is resumed (`Last-Event-ID`)."""

    last_id: str = ""
    retry_ms: int | None = None


class _Events:
    """SSE lines in, the JSON-RPC message of each complete event out; ids and delays to `position`."""

    def __init__(self, position: StreamPosition | None = None) -> None:
        self._data: list[str] = []
        self.position = position if position is not None else StreamPosition()

    def line(self, line: str) -> Any | None:
        """Take one line; returns the event's message when the line ends an event that has one."""
        if line:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                self._data.append(value)
            elif field == "id" and "\0" not in value:
                self.position.last_id = value
            elif field == "retry" and value.isdigit():
                self.position.retry_ms = int(value)
            return None
        payload, self._data = "\n".join(self._data).strip(), []
        # an event without data (a priming event, which only carries an id) holds no message
        return json.loads(payload) if payload else None


def messages_of(response: httpx2.Response) -> list[Any]:
    """The JSON-RPC messages of a whole answer: one JSON body, or the `data` of each SSE event."""
    if not is_stream(response):
        return [response.json()]
    events = _Events()
    found = (events.line(line) for line in [*response.text.splitlines(), ""])
    return [message for message in found if message is not None]


async def streamed(response: httpx2.Response, position: StreamPosition | None = None) -> AsyncIterator[Any]:
    """The JSON-RPC messages of an answer as they arrive; with `position`, where its stream got to."""
    if not is_stream(response):
        await response.aread()
        yield response.json()
        return
    events = _Events(position)
    async for line in response.aiter_lines():
        if (message := events.line(line)) is not None:
            yield message
    if (message := events.line("")) is not None:
        yield message


async def finished(messages: AsyncIterator[Any]) -> None:
    """Read what is left of an answered stream, for `FINISH_WITHIN` at most.

    A backend ends a call's stream right after its answer; read to that end, the connection goes
    back to the pool, while one left unread is closed, and the next call would open another (a TCP
    handshake more per call). A stream that goes on is left after `FINISH_WITHIN`: only its
    connection is lost. What comes after the answer belongs to no one: it is dropped."""
    with anyio.move_on_after(FINISH_WITHIN):
        async for _ in messages:
            pass


async def events(
    response: httpx2.Response, limit: int, position: StreamPosition | None = None
) -> AsyncIterator[Any]:
    """The JSON-RPC messages of a long-lived SSE stream as they arrive, no line over `limit` bytes
    (one that grows past it raises `ValueError`: a stream may last for hours, a line may not); with
    `position`, where the stream got to (as each message is yielded, its own event's id)."""
    parsed = _Events(position)
    pending = b""
    async for chunk in response.aiter_bytes():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if len(pending) > limit:
            raise ValueError(f"an event line of more than {limit} bytes")
        for line in lines:
            if (message := parsed.line(line.rstrip(b"\r").decode("utf-8", "replace"))) is not None:
                yield message


def forgot(response: httpx2.Response) -> bool:
    """Whether an answer to a request inside a session says the backend does not know the session.

    The transport says 404; some servers (server-everything among them) answer 400 with an error
    about the session id instead, and are read the same way.
    """
    if response.status_code == 404:
        return True
    if response.status_code != 400:
        return False
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and "session" in str(error.get("message", "")).lower()


def error_body(response: httpx2.Response) -> Mapping[str, Any] | None:
    """The JSON-RPC error an HTTP error answer carries, if it carries one with a code."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return None
    if (
        not isinstance(error, dict)
        or not isinstance(code := error.get("code"), int)
        or isinstance(code, bool)
    ):
        return None
    return error


def answered(backend_id: str, error: Mapping[str, Any]) -> BackendAnswered:
    """The router error for a backend's JSON-RPC error; a missing capability is named as one."""
    code = error.get("code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else INTERNAL_ERROR
    message, data = str(error.get("message", "")), error.get("data")
    required = data.get("requiredCapabilities") if isinstance(data, dict) else None
    if code == MISSING_REQUIRED_CLIENT_CAPABILITY and isinstance(required, dict):
        return CapabilityMissing(backend_id, message, required)
    return BackendAnswered(backend_id, code, message, data)
