"""The ASGI endpoint of one backend, `/<backend id>/mcp`: the right upstream server for each request.

In front of the backend's SDK session manager, each endpoint finds the `Channel` a request is
served by and puts it in the request's scope for the forwarding handlers (bridge/speaking/forwarding.py):

- `SharedEndpoint`: the backend's one process (`Supervisor`). While it is down and not about to
  come back, a request opening a session is answered 503 with the reason, so a health probe fails
  at once and cleanly instead of waiting.
- `PerSessionEndpoint`: one server per session (`ProcessPool`). A request without a session id
  starts one (503 when `max_processes` run already, or when it does not start), and the session id
  the answer carries binds it before the answer is sent; later requests find it by that id (404
  once it has ended: the client starts a new session), and a DELETE ends it. For a legacy SSE
  backend the session's event stream opens right then, with the opening request's auth header (a
  stream the server refuses answers with the server's status: 401, 403...).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import ERROR_CODE_HTTP_STATUS
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from bridge.keeping.pool import Lease, ProcessPool
from bridge.keeping.supervisor import Supervisor
from bridge.speaking.forwarding import CHANNEL_KEY
from bridge.speaking.upstream import Unavailable, Upstream

_SESSION_HEADER = MCP_SESSION_ID_HEADER.encode()


def error_answer(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error answer (`request_id` None: the request's id is not known)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


async def write_answer(send: Send, answer: Mapping[str, Any], status: int | None = None) -> None:
    """One JSON answer; `status` by default the one MCP maps its error code to (200 for a result)."""
    if status is None:
        error = answer.get("error")
        code = error.get("code") if isinstance(error, Mapping) else None
        status = ERROR_CODE_HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200
    body = json.dumps(answer, separators=(",", ":")).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 503:
        headers.append((b"retry-after", b"5"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, status: int, message: str, code: int = INTERNAL_ERROR) -> None:
    """A JSON-RPC error without an id, as the SDK answers requests it refuses before parsing them."""
    await write_answer(send, error_answer(None, code, message), status)


class SharedEndpoint:
    """Every session of a shared backend, served by its one process."""

    def __init__(self, supervisor: Supervisor[Upstream], manager: StreamableHTTPSessionManager) -> None:
        self.supervisor = supervisor
        self.manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = Headers(scope=scope).get(MCP_SESSION_ID_HEADER)
        if session_id is None and not self.supervisor.accepting():
            await _refuse(send, 503, self.supervisor.describe())
            return
        scope[CHANNEL_KEY] = self.supervisor
        await self.manager.handle_request(scope, receive, send)
        if session_id is not None and scope["method"] == "DELETE":
            self.supervisor.forget(session_id)


class _Binding:
    """The `send` of an opening request: binds the lease to the session id its answer carries, before
    the answer leaves, so the session's next request (which may come the moment the client reads
    the headers, on another connection) finds its process."""

    def __init__(self, send: Send, pool: ProcessPool, lease: Lease) -> None:
        self._send = send
        self._pool = pool
        self._lease = lease
        self.bound = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] < 400:
            for name, value in message.get("headers", []):
                if name.lower() == _SESSION_HEADER:
                    self._pool.bind(value.decode("latin-1"), self._lease)
                    self.bound = True
        await self._send(message)


class PerSessionEndpoint:
    """Each session of a per_session backend, served by its own process."""

    def __init__(
        self,
        pool: ProcessPool,
        manager: StreamableHTTPSessionManager,
        security: TransportSecuritySettings,
        forwarded: tuple[str, ...] = (),
    ) -> None:
        self.pool = pool
        self.manager = manager
        self.forwarded = forwarded  # the opening request's headers its server gets too (its auth)
        # the session manager checks Host and Origin too, but only after a process would have started
        self._guard = TransportSecurityMiddleware(security)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        session_id = headers.get(MCP_SESSION_ID_HEADER)
        if session_id is None:
            await self._open(scope, receive, send, headers)
            return
        lease = self.pool.get(session_id)
        if lease is None:
            await _refuse(
                send,
                404,
                f"Session not found: unknown, or its {self.pool.opener.what} has stopped (and its "
                "state with it): initialize a new session",
                INVALID_REQUEST,
            )
            return
        scope[CHANNEL_KEY] = lease
        with lease.in_use():
            await self.manager.handle_request(scope, receive, send)
        if scope["method"] == "DELETE":
            self.pool.release(lease, "its session ended")

    async def _open(self, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        version = headers.get("mcp-protocol-version")
        if scope["method"] != "POST" or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
            await _refuse(
                send,
                400,
                f"backend {self.pool.backend_id} runs one {self.pool.opener.what} per session: open a "
                "session with initialize (protocol 2025-11-25 or earlier) and send its Mcp-Session-Id",
                INVALID_REQUEST,
            )
            return
        if (rejection := await self._guard.validate_request(Request(scope), is_post=True)) is not None:
            await rejection(scope, receive, send)
            return
        lister = self.pool.lister
        if lister is not None and not lister.accepting():  # its command fails: so would the session's
            await _refuse(send, 503, lister.describe())
            return
        given = {name: value for name in self.forwarded if (value := headers.get(name)) is not None}
        try:
            lease = await self.pool.open(given)
        except MCPError as exc:  # the pool is full, or the bridge is stopping
            await _refuse(send, 503, exc.error.message)
            return
        if lister is None:  # no lister answers for it: its own server starts now
            try:
                await self.pool.start(lease)
            except MCPError as exc:  # the pool filled up meanwhile, or the server refused or failed
                self.pool.release(lease, "its session did not open")
                status = exc.status if isinstance(exc, Unavailable) else 503
                await _refuse(send, status, exc.error.message)
                return
        scope[CHANNEL_KEY] = lease
        binding = _Binding(send, self.pool, lease)
        try:
            with lease.in_use():
                await self.manager.handle_request(scope, receive, binding)
        finally:
            if not binding.bound:
                self.pool.release(lease, "its session did not open")
