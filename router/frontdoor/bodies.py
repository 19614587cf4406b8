"""Request bodies: read once under a limit, and drained before an early answer so every client reads it.

A server that answers before it has read a request's body and then closes the connection makes the
kernel reset it while the client is still sending; a client that writes the whole body before it
reads (Python's urllib, for one) then sees the reset, not the answer. So an answer given before the
body was read (401, 403, 413, 415, ...) first reads the rest of the body and drops it, up to
`drain_limit` bytes (four times `router.max_body_bytes`). A body declared longer than that is not read at
all, and one that turns out longer is read no further: the answer then carries `Connection: close`.
A client that sends `Expect: 100-continue` is never asked for a body it would only have dropped.
How long a body may take to arrive is bounded by `router.body_timeout` (router/frontdoor/connections.py).
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

DRAIN_FACTOR = 4  # bytes drained before an early answer: this many times the body limit


class ClientGone(Exception):
    """Raised when the client disconnects (or is cut off) before its request body arrived."""


class BodyTooLarge(Exception):
    """Raised when a body is longer than the limit; the body was drained as far as allowed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"Request body too large: the limit is {limit} bytes (router.max_body_bytes)")
        self.limit = limit


class Body:
    """One request's body, read at most once: whole under `limit`, or dropped up to `drain_limit`."""

    def __init__(self, receive: Receive, headers: Headers, limit: int, drain_limit: int) -> None:
        self._receive = receive
        self.limit = limit
        self.drain_limit = drain_limit
        length = headers.get("content-length", "")
        self._declared = int(length) if length.isdigit() else None
        self._seen = 0  # bytes received so far, kept or dropped
        # HTTP/1.1: without Content-Length or Transfer-Encoding a request has no body
        self._complete = not self._declared and "transfer-encoding" not in headers
        self._gone = False

    @property
    def complete(self) -> bool:
        """Whether every byte of the body has been received, so the connection may be kept."""
        return self._complete

    @property
    def gone(self) -> bool:
        """Whether the client disconnected while its body was read."""
        return self._gone

    async def _next(self) -> bytes:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._gone = True
            raise ClientGone
        chunk: bytes = message.get("body", b"")
        self._seen += len(chunk)
        if not message.get("more_body", False):
            self._complete = True
        return chunk

    async def read(self) -> bytes:
        """The whole body; raises `BodyTooLarge` (after draining what may be drained) or `ClientGone`."""
        if self._declared is not None and self._declared > self.limit:
            await self.drain()
            raise BodyTooLarge(self.limit)
        chunks: list[bytes] = []
        while not self._complete:
            chunks.append(await self._next())
            if self._seen > self.limit:
                await self.drain()
                raise BodyTooLarge(self.limit)
        return b"".join(chunks)

    async def drain(self) -> bool:
        """Read and drop the rest of the body, up to `drain_limit`; returns whether all of it came."""
        if self._declared is not None and self._declared > self.drain_limit:
            return self._complete  # never asked for: the answer closes the connection instead
        try:
            while not self._complete and not self._gone and self._seen <= self.drain_limit:
                await self._next()
        except ClientGone:
            return False
        return self._complete

    def replay(self, body: bytes) -> Receive:
        """A `receive` that yields the read `body` once, then defers to the real one."""
        pending = True

        async def replay() -> Message:
            nonlocal pending
            if pending:
                pending = False
                return {"type": "http.request", "body": body, "more_body": False}
            return await self._receive()

        return replay


async def answer_early(response: Response, body: Body, scope: Scope, send: Send) -> None:
    """Send `response` to a request whose body may be unread: drained first, or the connection closed."""
    if not await body.drain():
        if body.gone:
            return  # nobody to answer
        response.headers["connection"] = "close"

    async def no_more() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_more, send)
