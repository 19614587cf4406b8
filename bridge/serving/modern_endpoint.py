"""The endpoint of a 2026-07-28 stdio backend, `/<backend id>/mcp`: one POST, one request, one answer.

A backend configured with `protocol: 2026-07-28` is served as that protocol's Streamable HTTP has
it: no session, no `initialize` (a method not found, as the protocol has it), each POST one JSON-RPC
request, checked as that protocol's HTTP servers check them (the `_meta` envelope, and headers that
agree with it: the stdio server sees no headers), then passed on to the server as it came
(bridge/speaking/modern_upstream.py). The answer is JSON, with the HTTP status the protocol maps its error
codes to, unless a notification of the request (its progress, a log message, a listen's changes)
comes first, or nothing within `PING_INTERVAL`: then the answer is an event stream, pinged while it
waits, that ends with the result. A client that closes it cancels the request. A notification POST is
acknowledged and dropped (the protocol has none for a server here: a client cancels by leaving).

Bounds: bodies of `MAX_BODY` bytes, `EVENT_BACKLOG` notifications not yet read by a slow client (one
that falls further behind has its request ended with an error, rather than the bridge hold more),
`max_listens` open listens, the backend's call timeout for anything else.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp_types import HEADER_MISMATCH, INTERNAL_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR
from mcp_types.version import LATEST_MODERN_VERSION
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from bridge.keeping.supervisor import Supervisor
from bridge.serving.endpoints import error_answer, write_answer
from bridge.speaking.modern_upstream import LISTEN, ModernUpstream

MAX_BODY = 4 * 1024 * 1024  # bytes of one request, as the SDK's servers take them
PING_INTERVAL = 15.0  # seconds before a quiet answer becomes a pinged event stream, and between pings
EVENT_BACKLOG = 1000  # notifications of one request held for a client that does not read them yet
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]

Message = dict[str, Any]


def _event(message: Message) -> bytes:
    return f"event: message\r\ndata: {json.dumps(message, separators=(',', ':'))}\r\n\r\n".encode()


async def _body(receive: Receive) -> bytes | None:
    """The request's body, or None once it passes `MAX_BODY`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class ModernEndpoint:
    """Every request of a 2026-07-28 stdio backend, served by its one process."""

    def __init__(
        self,
        supervisor: Supervisor[ModernUpstream],
        security: TransportSecuritySettings,
        max_listens: int,
    ) -> None:
        self.supervisor = supervisor
        self.max_listens = max_listens
        self._guard = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if (
            rejection := await self._guard.validate_request(request, is_post=scope["method"] == "POST")
        ) is not None:
            await rejection(scope, receive, send)
            return
        if scope["method"] != "POST":
            # no session to open a stream on, or to end: every request is its own POST
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        body = await _body(receive)
        if body is None:
            message = f"the request is larger than {MAX_BODY} bytes"
            await write_answer(send, error_answer(None, INVALID_REQUEST, message), 413)
            return
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            await write_answer(send, error_answer(None, PARSE_ERROR, "Parse error: the body is not JSON"))
            return
        if isinstance(decoded, dict) and "id" not in decoded and isinstance(decoded.get("method"), str):
            await Response(status_code=202)(scope, receive, send)  # a notification: nothing acts on it
            return
        if not (
            isinstance(decoded, dict)
            and isinstance(decoded.get("method"), str)
            and isinstance(decoded.get("id"), str | int)
            and isinstance(decoded.get("params", {}), dict)
        ):
            message = "the body must be one JSON-RPC request: an object with id, method and object params"
            await write_answer(send, error_answer(None, INVALID_REQUEST, message))
            return
        await self._serve(decoded, request, send, receive)

    async def _serve(self, request: Message, http: Request, send: Send, receive: Receive) -> None:
        backend = self.supervisor.backend_id
        method = request["method"]
        if method == "initialize":
            message = (
                f"backend {backend} speaks protocol {LATEST_MODERN_VERSION}, which has no initialize "
                "handshake: send each request with that protocol's _meta envelope"
            )
            await write_answer(send, error_answer(request["id"], METHOD_NOT_FOUND, message))
            return
        duplicated = find_duplicated_routing_header(http.headers.items())
        verdict = (
            InboundLadderRejection(HEADER_MISMATCH, f"{duplicated} header appears more than once")
            if duplicated is not None
            else classify_inbound_request(request, headers=dict(http.headers))
        )
        if isinstance(verdict, InboundLadderRejection):
            await write_answer(send, error_answer(request["id"], verdict.code, verdict.message, verdict.data))
            return
        has_json, has_sse = check_accept_headers(http)
        if not has_json or (method == LISTEN and not has_sse):
            needed = "application/json and text/event-stream" if method == LISTEN else "application/json"
            message = f"the Accept header must take {needed} for {method}"
            await write_answer(send, error_answer(request["id"], INVALID_REQUEST, message), 406)
            return
        if not self.supervisor.accepting():
            await write_answer(
                send, error_answer(request["id"], INTERNAL_ERROR, self.supervisor.describe()), 503
            )
            return
        try:
            upstream = await self.supervisor.upstream()
            if method == LISTEN and upstream.listens() >= self.max_listens:
                raise MCPError(
                    INTERNAL_ERROR, f"backend {backend}: {self.max_listens} listens are open already"
                )
        except MCPError as exc:
            await write_answer(send, error_answer(request["id"], exc.error.code, exc.error.message), 503)
            return
        await _Exchange(upstream, request, has_sse).run(send, receive)


class _Exchange:
    """One request's answer: JSON, or an event stream once a notification of it comes."""

    def __init__(self, upstream: ModernUpstream, request: Message, streams: bool) -> None:
        self._upstream = upstream
        self._request = request
        self._streams = streams  # the client takes an event stream
        self._events, self._next = anyio.create_memory_object_stream[Message](EVENT_BACKLOG)
        self._answer: Message | None = None
        self._answered = anyio.Event()
        self._behind = False  # the client fell `EVENT_BACKLOG` notifications behind

    def _deliver(self, notification: Message) -> None:
        try:
            self._events.send_nowait(notification)
        except anyio.WouldBlock:
            self._behind = True
            self._events.close()  # ends the wait below: the request ends
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the request is ending

    async def _exchange(self) -> None:
        with self._events:
            try:
                self._answer = await self._upstream.exchange(
                    self._request, self._deliver if self._streams else None
                )
            except MCPError as exc:  # the server had gone
                self._answer = error_answer(self._request["id"], exc.error.code, exc.error.message)
        self._answered.set()

    async def run(self, send: Send, receive: Receive) -> None:
        async with self._next, anyio.create_task_group() as tasks:
            tasks.start_soon(self._exchange)
            tasks.start_soon(_cancel_on_disconnect, receive, tasks.cancel_scope)
            await self._respond(send)
            tasks.cancel_scope.cancel()

    async def _respond(self, send: Send) -> None:
        if not self._streams:  # a client that takes JSON only gets the answer alone, when it comes
            await self._answered.wait()
            assert self._answer is not None  # set before answered
            await write_answer(send, self._answer)
            return
        first: Message | None = None
        with anyio.move_on_after(PING_INTERVAL):
            with contextlib.suppress(anyio.EndOfStream):
                first = await self._next.receive()
        if self._answer is not None and first is None:
            await write_answer(send, self._answer)
            return
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        pending = first
        while True:
            body = _event(pending) if pending is not None else b": ping\r\n\r\n"
            await send({"type": "http.response.body", "body": body, "more_body": True})
            pending = None
            with anyio.move_on_after(PING_INTERVAL):
                try:
                    pending = await self._next.receive()
                except anyio.EndOfStream:
                    break
        answer = self._answer if not self._behind else None
        if answer is None:
            message = (
                f"backend {self._upstream.backend_id}: the client fell {EVENT_BACKLOG} notifications "
                "behind, and the request was ended"
            )
            answer = error_answer(self._request["id"], INTERNAL_ERROR, message)
        await send({"type": "http.response.body", "body": _event(answer), "more_body": False})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
