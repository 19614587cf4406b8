"""The `Mcp-Session-Id` layer: an ASGI app in front of the SDK's stateless Streamable HTTP handler.

The SDK's stateful session manager keeps each session's transport in process memory, which would
pin a session to one router replica. The router runs the SDK stateless and keeps sessions in the
indexer instead; this layer issues the session id on the `initialize` response, checks it on every
other handshake-era request, ends it on `DELETE`, and hands the session to the tool handlers through
`scope["state"]`. Clients of the stateless 2026-07-28 protocol send no session header: their session
is implied by their principal.

Router errors become HTTP responses here, in `error_response`; the body is always a JSON-RPC error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.auth import Authenticator, Identity
from router.errors import (
    IndexerFailed,
    IndexerUnavailable,
    InvalidRequest,
    RouterError,
    SessionNotFound,
    TooManySessions,
    Unauthenticated,
)
from router.indexer_client import IndexerClient
from toolsearch.logs import bind_session

logger = logging.getLogger(__name__)

STATE_KEY = "toolsearch.caller"  # where the layer leaves the `Caller` in scope["state"]
SESSION_HEADER = "mcp-session-id"
VERSION_HEADER = "mcp-protocol-version"
MISSING_SESSION = "missing Mcp-Session-Id header: send the id returned by initialize"


@dataclass(frozen=True, slots=True)
class Caller:
    """What the tool handlers know about the request in hand."""

    identity: Identity
    session_id: str  # empty when the request needs no session (2026-07-28 `tools/list`, discovery)


class ClientError(Exception):
    """Raised when a request is malformed; carries the HTTP status and the JSON-RPC error code."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class JsonRpcMessage:
    """The parts of a posted JSON-RPC message the layer routes on."""

    method: str | None  # None for a posted response
    id: Any  # None for a notification or a response without one
    is_request: bool


def parse_message(body: bytes) -> JsonRpcMessage:
    """Sniff one JSON-RPC message; raises `ClientError` (400) for bad JSON, batches and non-messages."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        raise ClientError(400, PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    if isinstance(decoded, list):
        raise ClientError(
            400, INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per request"
        )
    if not isinstance(decoded, dict) or decoded.get("jsonrpc") != "2.0":
        raise ClientError(
            400, INVALID_REQUEST, "Invalid request: the body must be a JSON-RPC 2.0 message object"
        )
    request_id = decoded.get("id")
    if "method" in decoded:
        if not isinstance(decoded["method"], str):
            raise ClientError(400, INVALID_REQUEST, "Invalid request: 'method' must be a string")
        return JsonRpcMessage(decoded["method"], request_id, "id" in decoded)
    if "result" in decoded or "error" in decoded:
        return JsonRpcMessage(None, request_id, False)
    raise ClientError(400, INVALID_REQUEST, "Invalid request: a JSON-RPC message needs 'method' or 'result'")


def is_handshake_era(headers: Headers) -> bool:
    """Whether a request speaks the handshake protocol: no version header, or a handshake version."""
    version = headers.get(VERSION_HEADER)
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


def jsonrpc_error(
    status: int, code: int, message: str, request_id: Any = None, headers: dict[str, str] | None = None
) -> Response:
    """An HTTP response whose body is one JSON-RPC error."""
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")


def error_response(exc: RouterError, request_id: Any = None) -> Response:
    """The HTTP response for a router error that ends a request before the tool handlers run."""
    if isinstance(exc, Unauthenticated):
        headers = {"WWW-Authenticate": exc.www_authenticate}
        return jsonrpc_error(401, INVALID_REQUEST, str(exc), request_id, headers)
    if isinstance(exc, SessionNotFound):
        return jsonrpc_error(404, INVALID_REQUEST, "session not found: re-initialize", request_id)
    if isinstance(exc, TooManySessions):
        return jsonrpc_error(429, INVALID_REQUEST, f"too many sessions: {exc}", request_id)
    if isinstance(exc, InvalidRequest):
        return jsonrpc_error(400, INVALID_REQUEST, str(exc), request_id)
    if isinstance(exc, IndexerUnavailable):
        return jsonrpc_error(503, INTERNAL_ERROR, str(exc), request_id, {"Retry-After": "1"})
    if isinstance(exc, IndexerFailed):
        return jsonrpc_error(502, INTERNAL_ERROR, str(exc), request_id)
    logger.error("unexpected router error before the handlers: %r", exc)
    return jsonrpc_error(500, INTERNAL_ERROR, "internal error", request_id)


class _ClientGone(Exception):
    """Raised when the client disconnects before its request body arrived."""


async def read_body(receive: Receive, headers: Headers, limit: int) -> bytes:
    """The whole request body, refusing (413) one longer than `limit` bytes."""
    too_large = ClientError(413, INVALID_REQUEST, f"Request body too large: the limit is {limit} bytes")
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the already-read body once, then defers to the real one."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class SessionLayer:
    """Issues, checks and ends `Mcp-Session-Id` around the SDK's stateless handler `app`."""

    def __init__(
        self, app: ASGIApp, indexer: IndexerClient, authenticator: Authenticator, max_body_bytes: int
    ) -> None:
        self.app = app
        self.indexer = indexer
        self.authenticator = authenticator
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id: Any = None
        try:
            headers = Headers(scope=scope)
            identity = await self.authenticator.authenticate(headers)
            method = scope["method"]
            if method == "POST":
                content_type = headers.get("content-type", "").partition(";")[0].strip().lower()
                if content_type != "application/json":
                    raise ClientError(
                        415, INVALID_REQUEST, "Unsupported Media Type: send Content-Type: application/json"
                    )
                body = await read_body(receive, headers, self.max_body_bytes)
                message = parse_message(body)
                request_id = message.id
                receive = _replay(body, receive)
                await self._post(scope, receive, send, headers=headers, identity=identity, message=message)
            elif method == "DELETE":
                await self._delete(scope, receive, send, headers, identity)
            else:
                # Stateless: no standalone server-to-client stream to open with GET.
                await Response(status_code=405, headers={"Allow": "POST, DELETE"})(scope, receive, send)
        except ClientError as exc:
            await jsonrpc_error(exc.status, exc.code, exc.message, request_id)(scope, receive, send)
        except RouterError as exc:
            await error_response(exc, request_id)(scope, receive, send)
        except _ClientGone:
            return

    async def _post(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        headers: Headers,
        identity: Identity,
        message: JsonRpcMessage,
    ) -> None:
        session_id = ""
        if is_handshake_era(headers):
            if message.method == "initialize" and message.is_request:
                await self._initialize(scope, receive, send, identity)
                return
            session_id = headers.get(SESSION_HEADER, "")
            if not session_id:
                raise ClientError(400, INVALID_REQUEST, MISSING_SESSION)
            await self.indexer.get_session(session_id, identity.principal)
        elif message.method == "tools/call" and headers.get(VERSION_HEADER) in MODERN_PROTOCOL_VERSIONS:
            opened = await self.indexer.open_session(identity.principal, identity.bearer_token, implied=True)
            session_id = opened.session_id
        bind_session(session_id)  # the logs of the rest of this request name the session (a prefix)
        scope.setdefault("state", {})[STATE_KEY] = Caller(identity, session_id)
        await self.app(scope, receive, send)

    async def _initialize(self, scope: Scope, receive: Receive, send: Send, identity: Identity) -> None:
        # The SDK answers first, held back, so a refused initialize opens no session at all.
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        scope.setdefault("state", {})[STATE_KEY] = Caller(identity, "")
        await self.app(scope, receive, hold)
        start = held[0] if held and held[0]["type"] == "http.response.start" else None
        if start is not None and start["status"] == 200 and not _is_jsonrpc_error(held[1:]):
            opened = await self.indexer.open_session(identity.principal, identity.bearer_token)
            bind_session(opened.session_id)
            session_header = (SESSION_HEADER.encode(), opened.session_id.encode())
            held[0] = {**start, "headers": [*start.get("headers", []), session_header]}
        for message in held:
            await send(message)

    async def _delete(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, identity: Identity
    ) -> None:
        if not is_handshake_era(headers):
            # 2026-07-28 has no sessions to end.
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        session_id = headers.get(SESSION_HEADER, "")
        if not session_id:
            raise ClientError(400, INVALID_REQUEST, MISSING_SESSION)
        bind_session(session_id)
        await self.indexer.close_session(session_id, identity.principal)
        await Response(status_code=200)(scope, receive, send)


def _is_jsonrpc_error(body_messages: list[Message]) -> bool:
    body = b"".join(m.get("body", b"") for m in body_messages if m["type"] == "http.response.body")
    try:
        decoded = json.loads(body)
    except ValueError:
        return True  # not the JSON answer of a successful initialize
    return not isinstance(decoded, dict) or "error" in decoded
