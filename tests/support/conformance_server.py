"""The MCP conformance suite's test server: its tools, resources and prompts, in both protocol eras.

    python tests/support/conformance_server.py PORT
    python tests/support/conformance_server.py stdio
    python tests/support/conformance_server.py PORT modern   # refusing the initialize handshake

What each one does is what the suite's server scenarios (`@modelcontextprotocol/conformance`) ask
of it: content of every type, logs and progress during a call, requests of the client (sampling,
elicitation, roots) on a 2025-11-25 call's stream, 2026-07-28 input-required results with
integrity-protected request state (asked on the call's stream instead in the handshake era, which
has no such result), and SSE polling (`test_reconnection` closes its call's stream
before the result, which its event store replays to a client that resumes with Last-Event-ID).
Built on the `mcp` SDK's lowlevel server, which serves both eras on one endpoint (`/mcp`), with a
session per 2025-11-25 client; or, with `stdio`, one 2025-11-25 client on its stdin and stdout (for
the bridge).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.support.conformance_content import (
    ELICITATIONS,
    INPUT_ROUNDS,
    PROMPTS,
    RESOURCES,
    TOOL_RESULTS,
    TOOLS,
    prompt_messages,
    template_contents,
)
from tests.support.conformance_rounds import asked_in_turn, input_required, text
from tests.support.event_store import MemoryEventStore

_ASK_TIMEOUT = 30.0  # seconds a request of the client may take
RETRY_MS = 100  # the reconnection delay asked of a client whose stream was closed early
_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]
_session_levels: dict[str, str] = {}  # logging/setLevel by session id
# what each request of the client is answered with (a plain Result would drop its fields)
_ANSWERS: dict[str, type[types.Result]] = {
    "sampling/createMessage": types.CreateMessageResult,
    "elicitation/create": types.ElicitResult,
    "roots/list": types.ListRootsResult,
}


def _session_id(ctx: ServerRequestContext[Any]) -> str:
    return ctx.request.headers.get("mcp-session-id", "") if ctx.request is not None else ""


async def _log(ctx: ServerRequestContext[Any], level: str, data: str) -> None:
    floor = _session_levels.get(_session_id(ctx), "debug")
    if _LEVELS.index(level) >= _LEVELS.index(floor):
        await ctx.session.send_log_message(level, data, "conformance", related_request_id=ctx.request_id)  # type: ignore[arg-type]


async def _ask(ctx: ServerRequestContext[Any], method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A request of the client on the call's stream (2025-11-25); its result, or its error as text."""
    request = types.Request[dict[str, Any], str](method=method, params=params)
    answer = await ctx.session.send_request(
        request,  # type: ignore[arg-type]
        _ANSWERS.get(method, types.Result),
        request_read_timeout_seconds=_ASK_TIMEOUT,
        metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
    )
    return answer.model_dump(mode="json", by_alias=True, exclude_none=True)


async def _rounds(ctx: ServerRequestContext[Any], name: str, params: Any) -> dict[str, Any]:
    """A tool or prompt that needs answers first: input-required results in 2026-07-28, requests of
    the client on the call's stream in the handshake era."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return input_required(ctx, name, params)
    client = ctx.session.client_params
    declared = client.capabilities.model_dump(exclude_none=True) if client is not None else {}
    return await asked_in_turn(name, lambda method, asked: _ask(ctx, method, asked), declared)


async def _asking_tool(
    ctx: ServerRequestContext[Any], name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    method, params, label = ELICITATIONS[name](arguments)
    try:
        answer = await _ask(ctx, method, params)
    except MCPError as exc:
        return text(f"{label} not supported or error: {exc.error.message}", is_error=True)
    if method == "sampling/createMessage":
        content = answer.get("content") or {}
        return text(
            f"LLM response: {content.get('text', 'No response') if isinstance(content, dict) else ''}"
        )
    return text(f"{label}: action={answer.get('action')}, content={json.dumps(answer.get('content') or {})}")


async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {"tools": TOOLS}


async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
    name, arguments = params.name, params.arguments or {}
    if name in TOOL_RESULTS:
        return TOOL_RESULTS[name]
    if name == "test_error_handling":
        return text("This tool intentionally returns an error for testing", is_error=True)
    if name in ("test_tool_with_logging", "test_logging_tool"):
        for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
            await _log(ctx, "info", message)
        return text("Tool with logging executed successfully")
    if name == "test_tool_with_progress":
        token = (ctx.meta or {}).get("progress_token")
        for step in (0, 50, 100):
            if token is not None:
                await ctx.session.send_progress_notification(
                    token, step, 100, f"Completed step {step} of 100", related_request_id=ctx.request_id
                )
        return text(str(token if token is not None else 0))
    if name == "test_reconnection":
        # SSE polling (SEP-1699): the call's stream ends here, and the result is replayed to the
        # client that resumes it with Last-Event-ID (over stdio there is no stream to close)
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        return text("Reconnection test completed")
    if name == "test_missing_capability":
        declared = (ctx.meta or {}).get(types.CLIENT_CAPABILITIES_META_KEY) or {}
        if not isinstance(declared, dict) or "sampling" not in declared:
            raise MCPError(
                types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                "this tool needs the client's sampling capability",
                {"requiredCapabilities": {"sampling": {}}},
            )
        return text("the client declared sampling")
    if name in ELICITATIONS:
        return await _asking_tool(ctx, name, arguments)
    if name in INPUT_ROUNDS:
        return await _rounds(ctx, name, params)
    raise MCPError(types.INVALID_PARAMS, f"unknown tool {name}")


async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {"resources": [{k: v for k, v in r.items() if k != "contents"} for r in RESOURCES]}


async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {
        "resourceTemplates": [
            {
                "uriTemplate": "test://template/{id}/data",
                "name": "template",
                "description": "A resource template with parameter substitution",
                "mimeType": "application/json",
            }
        ]
    }


async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
    uri = str(params.uri)
    for resource in RESOURCES:
        if resource["uri"] == uri:
            return {"contents": [resource["contents"]]}
    if (contents := template_contents(uri)) is not None:
        return {"contents": [contents]}
    raise MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": uri})


async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> Any:
    return {}


async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {"prompts": PROMPTS}


async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
    if params.name in INPUT_ROUNDS:
        return await _rounds(ctx, params.name, params)
    messages = prompt_messages(params.name, params.arguments or {})
    if messages is None:
        raise MCPError(types.INVALID_PARAMS, f"unknown prompt {params.name}")
    return {"messages": messages}


async def complete(ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> Any:
    return {"completion": {"values": [], "total": 0, "hasMore": False}}


async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> Any:
    _session_levels[_session_id(ctx)] = params.level
    return {}


def _complete(handler: Callable[[ServerRequestContext[Any], Any], Awaitable[Any]]) -> Any:
    """The handler, its plain results marked complete, as the 2026-07-28 wire requires (an earlier
    era's answer leaves the field out)."""

    async def handle(ctx: ServerRequestContext[Any], params: Any) -> Any:
        result = await handler(ctx, params)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or "resultType" in result:
            return result
        return {"resultType": "complete", **result}

    return handle


def build() -> Server[Any]:
    hint = CacheHint(ttl_ms=0, scope="private")
    server: Server[Any] = Server(
        "mcp-conformance-test-server",
        version="1.0.0",
        cache_hints={
            m: hint
            for m in (
                "tools/list",
                "prompts/list",
                "resources/list",
                "resources/templates/list",
                "resources/read",
            )
        },  # type: ignore[misc]
        on_list_tools=_complete(list_tools),
        on_call_tool=_complete(call_tool),
        on_list_resources=_complete(list_resources),
        on_list_resource_templates=_complete(list_templates),
        on_read_resource=_complete(read_resource),
        on_subscribe_resource=_complete(subscribe),
        on_unsubscribe_resource=_complete(subscribe),
        on_list_prompts=_complete(list_prompts),
        on_get_prompt=_complete(get_prompt),
        on_completion=_complete(complete),
    )
    # registered by method: the constructor's hook for it warns that 2026-07-28 drops it
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, _complete(set_level))
    return server


async def _healthy(request: Request) -> Response:
    return PlainTextResponse("ok")


class ModernOnly:
    """An ASGI app refusing the initialize handshake in front of `app`: a server of the 2026-07-28
    era alone. (A class: Starlette routes an object as an ASGI app, a function as a handler.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        body = b"".join(m.get("body", b"") for m in messages)
        with contextlib.suppress(ValueError):
            message = json.loads(body)
            if isinstance(message, dict) and message.get("method") == "initialize":
                error = {"code": types.METHOD_NOT_FOUND, "message": "this server speaks 2026-07-28 only"}
                refusal = JSONResponse({"jsonrpc": "2.0", "id": message.get("id"), "error": error})
                await refusal(scope, receive, send)
                return
        replayed = iter(messages)

        async def replay() -> Message:
            return next(replayed, None) or await receive()

        await self.app(scope, replay, send)


def conformance_app(port: int, modern_only: bool = False) -> Starlette:
    """The server as an ASGI app for 127.0.0.1:`port` (it answers to that host, localhost and [::1]),
    its MCP endpoint at /mcp; with `modern_only`, refusing the initialize handshake."""
    hosts = [f"{host}:{port}" for host in ("127.0.0.1", "localhost", "[::1]")]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{host}" for host in hosts],
    )
    manager = StreamableHTTPSessionManager(
        build(),
        json_response=False,
        security_settings=security,
        event_store=MemoryEventStore(),
        retry_interval=RETRY_MS,
    )
    endpoint: ASGIApp = StreamableHTTPASGIApp(manager)
    routes = [Route("/mcp", ModernOnly(endpoint) if modern_only else endpoint), Route("/healthz", _healthy)]
    return Starlette(routes=routes, lifespan=lambda app: manager.run())


def main(port: int, modern_only: bool = False) -> None:
    uvicorn.run(conformance_app(port, modern_only), host="127.0.0.1", port=port, log_level="warning")


async def _stdio() -> None:
    server = build()
    async with stdio_server() as (reads, writes):
        await server.run(reads, writes, server.create_initialization_options())


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        anyio.run(_stdio)
    else:
        main(int(sys.argv[1]), modern_only=sys.argv[2:] == ["modern"])
