"""The MCP server the bridge shows for one stdio backend: every request forwarded to the stdio server.

One lowlevel `Server` per backend, served by the SDK's stateful Streamable HTTP session manager. Its
handlers do no MCP work of their own: each passes its request on to the `Upstream` the request's
`Channel` gives (the ASGI endpoint puts the channel in the request's scope: the backend's one shared
process, or the session's own) and returns the stdio server's answer. Progress the caller asked for
is relayed on the call's own stream, and so are the server's requests of its client and its log
messages during the call (bridge/speaking/callers.py); a caller's cancellation cancels the handler, which
makes the SDK tell the stdio server (`notifications/cancelled`).

`initialize` is answered with what the stdio server said of itself when it started (capabilities,
name, instructions), and `server/discover` is refused, so clients speak the initialize handshake:
a session is what `per_session` isolation keys on, and what the stdio servers speak anyway (a
backend configured `protocol: 2026-07-28` is served without this server: bridge/serving/modern_endpoint.py).
Each request also marks its session as listening to the server's notifications (`Listeners`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import BaseModel
from starlette.requests import Request

from bridge.speaking.upstream import Forwarded, RawResult, Upstream

CHANNEL_KEY = "toolsearch.bridge.channel"  # the ASGI scope key of a request's channel
# the requests during which a server does its work, and may ask its client or log (bridge/speaking/callers.py)
WORKING = frozenset({"tools/call", "resources/read", "prompts/get", "completion/complete"})

# what the bridge forwards, with the model the SDK checks each request's params against
FORWARDED: tuple[tuple[str, type[BaseModel]], ...] = (
    ("ping", types.RequestParams),
    ("tools/list", types.PaginatedRequestParams),
    ("tools/call", types.CallToolRequestParams),
    ("resources/list", types.PaginatedRequestParams),
    ("resources/templates/list", types.PaginatedRequestParams),
    ("resources/read", types.ReadResourceRequestParams),
    ("resources/subscribe", types.SubscribeRequestParams),
    ("resources/unsubscribe", types.UnsubscribeRequestParams),
    ("prompts/list", types.PaginatedRequestParams),
    ("prompts/get", types.GetPromptRequestParams),
    ("completion/complete", types.CompleteRequestParams),
    ("logging/setLevel", types.SetLevelRequestParams),
)


class Channel(Protocol):
    """Where one request's stdio server is: a shared backend's `Supervisor`, or a session's `Lease`
    (which may answer by method: a listing before the session's own process runs goes to its lister)."""

    async def upstream(self, method: str, offered: types.ClientCapabilities | None = None) -> Upstream: ...

    def listen(self, session_id: str, session: ServerSession) -> None: ...


def channel_of(ctx: ServerRequestContext[Any]) -> Channel:
    request = ctx.request
    channel = request.scope.get(CHANNEL_KEY) if isinstance(request, Request) else None
    if channel is None:
        raise MCPError(types.INTERNAL_ERROR, "the request reached the bridge's handler without a backend")
    return channel  # type: ignore[no-any-return]  # the endpoint put it there


def _progress_relay(ctx: ServerRequestContext[Any]) -> ProgressFnT | None:
    """The caller's progress, when it asked for it: the stdio server's reports, on the call's stream."""
    if (ctx.meta or {}).get("progress_token") is None:
        return None

    async def relay(progress: float, total: float | None, message: str | None) -> None:
        await ctx.session.report_progress(progress, total, message)

    return relay


class _Caller:
    """The caller of one forwarded request, asked and told on its request's own stream
    (bridge/speaking/callers.py)."""

    def __init__(self, ctx: ServerRequestContext[Any], timeout: float) -> None:
        self._ctx = ctx
        self._timeout = timeout

    def answers(self, capability: str) -> bool:
        declared = self._ctx.session.client_capabilities
        return declared is not None and getattr(declared, capability, None) is not None

    async def ask(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        answer = await self._ctx.session.send_request(
            Forwarded(method=method, params=dict(params) if params is not None else None),  # type: ignore[arg-type]
            RawResult,
            request_read_timeout_seconds=self._timeout,
            metadata=ServerMessageMetadata(related_request_id=self._ctx.request_id),
        )
        return dict(answer.model_extra or {})

    async def tell(self, notification: types.LoggingMessageNotification) -> None:
        await self._ctx.session.send_notification(notification, related_request_id=self._ctx.request_id)


def _forward(method: str) -> Callable[[ServerRequestContext[Any], BaseModel], Awaitable[HandlerResult]]:
    async def handle(ctx: ServerRequestContext[Any], params: BaseModel) -> HandlerResult:
        upstream = await channel_of(ctx).upstream(method, ctx.session.client_capabilities)
        # only a request that does the server's work is a call in flight that may ask or log: a
        # listing or a ping (a health probe's, say) in flight beside it would make its asks ambiguous
        caller = _Caller(ctx, upstream.timeout) if method in WORKING else None
        return await upstream.forward(method, ctx.params, _progress_relay(ctx), caller)

    return handle


async def _refuse_discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> HandlerResult:
    raise MCPError(
        types.METHOD_NOT_FOUND,
        "the bridge speaks the initialize handshake (protocol 2025-11-25 and earlier)",
    )


def initialize_result(params: Any, child: types.InitializeResult) -> dict[str, Any]:
    """The answer to a caller's initialize: the stdio server's own, at the version the caller can speak."""
    requested = params.get("protocolVersion") if isinstance(params, dict) else None
    version = requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    result = types.InitializeResult(
        protocol_version=version,
        capabilities=child.capabilities,
        server_info=child.server_info,
        instructions=child.instructions,
    )
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


class _Sessions:
    """Server middleware: answers initialize from the stdio server, and notes who listens."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        channel = channel_of(ctx)
        if ctx.method == "initialize":
            # The session is not issued yet: it listens from its next message (notifications/initialized).
            upstream = await channel.upstream("initialize")
            return initialize_result(ctx.params, upstream.init)
        request = ctx.request
        if isinstance(request, Request) and (session_id := request.headers.get(MCP_SESSION_ID_HEADER)):
            channel.listen(session_id, ctx.session)
        return await call_next(ctx)


def build_server(backend_id: str) -> Server[Any]:
    """The forwarding MCP server of one stdio backend."""
    server: Server[Any] = Server(f"toolsearch-bridge-{backend_id}")
    for method, params_type in FORWARDED:
        server.add_request_handler(method, params_type, _forward(method))
    server.add_request_handler("server/discover", types.RequestParams, _refuse_discover)
    server.middleware.append(_Sessions())
    return server
