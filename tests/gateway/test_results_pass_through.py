"""A backend's result reaches the client as the backend sent it: every content type, `_meta`, fields
no schema names yet, from a backend of either protocol era, to a client of either era.

In process (the router's parts are the subject, not its process): the router's backend caller
against a backend made of canned JSON-RPC answers, over an ASGI transport; and the router's own MCP
server (its pass-through middleware and a handler that answers a backend's result), served by the
SDK's session manager to a raw HTTP client. The conformance suite checks the same through the whole
stack (tests/system/test_conformance.py, tools-call-image, -audio, -embedded-resource, -mixed-content).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from router.errors import BackendError
from router.exchange import BARE
from router.handlers.passthrough import PassedThrough, PassThroughMiddleware, holding
from router.upstream.calls.backends import BackendCaller
from router.upstream.wire.pools import BackendPools
from tests.support.conformance_content import AUDIO, IMAGE
from toolsearch.outgoing import OutgoingAuth
from toolsearch.targets import BackendTarget

# everything a tool result can hold, and what no schema holds yet
RESULT: dict[str, Any] = {
    "content": [
        {"type": "text", "text": "plain", "annotations": {"audience": ["user"], "priority": 0.5}},
        {"type": "image", "data": IMAGE, "mimeType": "image/png"},
        {"type": "audio", "data": AUDIO, "mimeType": "audio/wav"},
        {"type": "resource_link", "uri": "test://linked", "name": "linked", "mimeType": "text/plain"},
        {
            "type": "resource",
            "resource": {"uri": "test://embedded", "mimeType": "text/plain", "text": "inside"},
        },
        {"type": "resource", "resource": {"uri": "test://blob", "mimeType": "image/png", "blob": IMAGE}},
        {"type": "hologram", "frames": [1, 2, 3], "_meta": {"vendor/depth": 7}},
    ],
    "structuredContent": {"answer": 42, "nested": {"list": [1, "two", None]}},
    "isError": False,
    "_meta": {
        "vendor/trace": "abc",
        "io.modelcontextprotocol/serverInfo": {"name": "backend", "version": "1"},
    },
    "futureField": {"anything": ["at", "all"]},
}
WITHOUT_STAMP = {**RESULT, "_meta": {"vendor/trace": "abc"}}
MODERN = "2026-07-28"
HANDSHAKE = "2025-11-25"


def canned_backend(result: Any) -> Starlette:
    """A backend that answers initialize, and every other request with `result` (no resultType)."""

    async def mcp(request: Request) -> Response:
        message = json.loads(await request.body())
        if "id" not in message:
            return Response(status_code=202)
        if message["method"] == "initialize":
            answer = {
                "protocolVersion": HANDSHAKE,
                "capabilities": {},
                "serverInfo": {"name": "b", "version": "1"},
            }
            return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": answer})
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": result})

    return Starlette(routes=[Route("/mcp", mcp, methods=["POST", "DELETE"])])


def target(protocol_version: str) -> BackendTarget:
    return BackendTarget(
        "canned",
        "http://canned/mcp",
        OutgoingAuth(),
        protocol_version,
        10.0,
        1_000_000,
        None,
    )


@pytest.mark.parametrize("protocol_version", [HANDSHAKE, MODERN])
async def test_a_backend_result_comes_back_from_the_backend_caller_as_it_was_sent(
    protocol_version: str,
) -> None:
    transport = httpx2.ASGITransport(canned_backend(RESULT))
    caller = BackendCaller(BackendPools(4, shared=transport), None, {})  # type: ignore[arg-type]
    result = await caller.call_tool(target(protocol_version), "anything", {"x": 1}, BARE)
    assert json.dumps(result, sort_keys=True) == json.dumps(WITHOUT_STAMP, sort_keys=True)


@pytest.mark.parametrize("answer", [["a", "list"], "text", 7, None])
async def test_a_result_that_is_not_an_object_is_a_clear_backend_error(answer: Any) -> None:
    pools = BackendPools(4, shared=httpx2.ASGITransport(canned_backend(answer)))
    caller = BackendCaller(pools, None, {})  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="backend canned answered with something that is not a result"):
        await caller.call_tool(target(MODERN), "anything", {}, BARE)


def router_like_server() -> Starlette:
    """An MCP server shaped as the router's: a tools/call handler answering a backend's result."""

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        return PassedThrough(RESULT)

    server: Server[Any] = Server("router-like")
    server.middleware.append(PassThroughMiddleware())
    server.add_request_handler("tools/call", types.CallToolRequestParams, holding(call_tool))
    manager = StreamableHTTPSessionManager(server, stateless=True, json_response=True)
    return Starlette(
        routes=[Route("/mcp", StreamableHTTPASGIApp(manager))], lifespan=lambda app: manager.run()
    )


async def _call(http: httpx2.AsyncClient, protocol_version: str) -> dict[str, Any]:
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": protocol_version}
    params: dict[str, Any] = {"name": "anything", "arguments": {}}
    if protocol_version == MODERN:
        headers.update({"Mcp-Method": "tools/call", "Mcp-Name": "anything"})
        params["_meta"] = {
            "io.modelcontextprotocol/protocolVersion": MODERN,
            "io.modelcontextprotocol/clientCapabilities": {},
        }
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    response = await http.post("http://router/mcp", json=message, headers=headers)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()["result"]
    return answer


async def test_a_client_of_either_era_gets_the_backend_result_with_only_its_own_envelope() -> None:
    app = router_like_server()
    async with (
        app.router.lifespan_context(app),
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app)) as http,
    ):
        handshake = await _call(http, HANDSHAKE)
        modern = await _call(http, MODERN)
    # a 2025-11-25 client: exactly what the backend sent, less the backend's serverInfo stamp
    assert json.dumps(handshake, sort_keys=True) == json.dumps(WITHOUT_STAMP, sort_keys=True)
    # a 2026-07-28 client: the same, marked complete and stamped with the router's serverInfo
    stamp = modern["_meta"].pop("io.modelcontextprotocol/serverInfo")
    assert stamp["name"] == "router-like"
    assert modern.pop("resultType") == "complete"
    assert json.dumps(modern, sort_keys=True) == json.dumps(WITHOUT_STAMP, sort_keys=True)
