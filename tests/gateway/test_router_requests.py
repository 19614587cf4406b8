"""The router without processes: argument checks, message sniffing, error translation, the HTTP layer.

The HTTP tests run the whole app in process: a fake indexer (a grpc.aio servicer of the real proto
on a free port) and a backend MCP server reached through an ASGI transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx2
import mcp_types as types
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel.server import Server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from commands.ports import free_port
from router.error_answers import http_answer, mcp_error, tool_result_for
from router.errors import (
    BackendTimeout,
    IndexerFailed,
    IndexerUnavailable,
    InvalidRequest,
    InvalidRequestState,
    MissingCredentials,
    RouterError,
    RouterStopping,
    SessionNotFound,
    ToolNotFound,
    TooManySessions,
    Unauthenticated,
)
from router.frontdoor.app import RouterState, create_app
from router.frontdoor.auth import bearer_token
from router.frontdoor.messages import is_handshake_era, parse_message
from router.frontdoor.session_layer import MISSING_SESSION
from router.handlers.arguments import parse_call_tool, parse_find_tool
from router.handlers.schemas import SchemaValidators
from router.link.indexer_client import IndexerClient
from router.link.indexer_errors import translate
from router.upstream.calls.credentials import outgoing_headers
from tests.support.stack import INITIALIZE
from toolsearch.config import parse_config
from toolsearch.sessions import Principal
from toolsearch.v1 import indexer_pb2 as pb
from toolsearch.v1 import indexer_pb2_grpc

# -- find_tool and call_tool arguments ------------------------------------------------------------


def test_find_tool_arguments_are_checked_and_defaulted() -> None:
    args = parse_find_tool({"tool_description": "weather in Paris", "tool_keywords": [" forecast ", ""]}, 50)
    assert (args.description, args.keywords, args.limit) == ("weather in Paris", ("forecast",), 0)
    assert parse_find_tool({"tool_description": "x", "limit": 5.0}, 50).limit == 5
    assert parse_find_tool({"tool_description": "x", "tool_keywords": "maps"}, 50).keywords == ("maps",)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({}, "tool_description"),
        ({"tool_description": "   "}, "tool_description"),
        ({"tool_description": 3}, "tool_description"),
        ({"tool_description": "x", "tool_keywords": [1]}, "tool_keywords"),
        ({"tool_description": "x", "limit": 0}, "limit"),
        ({"tool_description": "x", "limit": 51}, "limit"),
        ({"tool_description": "x", "limit": True}, "limit"),
        ({"tool_description": "x", "limit": "5"}, "limit"),
    ],
)
def test_wrong_find_tool_arguments_name_the_field(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        parse_find_tool(arguments, 50)


def test_call_tool_arguments_accept_a_nested_name_and_a_json_string() -> None:
    assert parse_call_tool({"tool_name": "a", "parameters": {"x": 1}}).parameters == {"x": 1}
    nested = parse_call_tool({"parameters": {"tool_name": "a", "x": 1}})
    assert (nested.name, nested.parameters) == ("a", {"x": 1})
    assert parse_call_tool({"tool_name": "a", "parameters": '{"x": 1}'}).parameters == {"x": 1}
    assert parse_call_tool({"tool_name": "a"}).parameters == {}


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        ({"parameters": {}}, "tool_name"),
        ({"tool_name": 7, "parameters": {}}, "tool_name"),
        ({"tool_name": "a", "parameters": [1]}, "parameters"),
        ({"tool_name": "a", "parameters": "not json"}, "parameters"),
    ],
)
def test_wrong_call_tool_arguments_name_the_field(arguments: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        parse_call_tool(arguments)


def test_schema_problems_name_the_field_and_validators_are_cached() -> None:
    validators = SchemaValidators()
    schema = json.dumps({"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["city"]})
    assert validators.problem(schema, {"city": "Paris", "days": 3}) is None
    assert "'city' is a required property" in (validators.problem(schema, {}) or "")
    assert (validators.problem(schema, {"city": "x", "days": "3"}) or "").startswith("parameters.days:")
    assert validators._validator(schema) is validators._validator(schema)
    # a schema that cannot be used does not block the call: the backend judges
    assert validators.problem('{"type": 12}', {"a": 1}) is None
    assert validators.problem("", {"a": 1}) is None


# -- the session layer's sniffing -----------------------------------------------------------------


def test_messages_are_sniffed_for_method_and_id() -> None:
    request = parse_message(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {}}')
    assert (request.method, request.id, request.is_request) == ("tools/call", 7, True)
    note = parse_message(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    assert (note.method, note.is_request) == ("notifications/initialized", False)
    assert parse_message(b'{"jsonrpc": "2.0", "id": 1, "result": {}}').method is None


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{nope", -32700),
        (b"", -32700),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600),
        (b'"hello"', -32600),
        (b'{"id": 1, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
    ],
)
def test_malformed_bodies_are_client_errors(body: bytes, code: int) -> None:
    from router.frontdoor.messages import ClientError

    with pytest.raises(ClientError) as caught:
        parse_message(body)
    assert (caught.value.status, caught.value.code) == (400, code)


def test_the_era_is_told_by_the_protocol_version_header() -> None:
    assert is_handshake_era(Headers({}))
    assert is_handshake_era(Headers({"mcp-protocol-version": "2025-06-18"}))
    assert not is_handshake_era(Headers({"mcp-protocol-version": "2026-07-28"}))
    assert not is_handshake_era(Headers({"mcp-protocol-version": "2099-01-01"}))


def test_bearer_tokens_are_read_from_authorization() -> None:
    assert bearer_token(Headers({"authorization": "Bearer abc"})) == "abc"
    assert bearer_token(Headers({"authorization": "bearer  abc "})) == "abc"
    assert bearer_token(Headers({"authorization": "Basic abc"})) is None
    assert bearer_token(Headers({})) is None


# -- error translation -----------------------------------------------------------------------------


def _rpc_error(code: grpc.StatusCode, kind: str = "", details: str = "") -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata(("toolsearch-error", kind)) if kind else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (_rpc_error(grpc.StatusCode.UNAVAILABLE), IndexerUnavailable),
        (_rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), IndexerUnavailable),
        (_rpc_error(grpc.StatusCode.NOT_FOUND, "session-not-found"), SessionNotFound),
        (_rpc_error(grpc.StatusCode.NOT_FOUND, "tool-not-found"), ToolNotFound),
        (_rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "invalid-request", "query too long"), InvalidRequest),
        (_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED), TooManySessions),
        (_rpc_error(grpc.StatusCode.INTERNAL), IndexerFailed),
    ],
)
def test_grpc_errors_become_router_errors(error: grpc.aio.AioRpcError, expected: type[Exception]) -> None:
    assert isinstance(translate(error, "get_weather"), expected)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (Unauthenticated("bad token", 'Bearer error="invalid_token"'), 401),
        (SessionNotFound("gone"), 404),
        (TooManySessions("limit 10"), 429),
        (IndexerUnavailable("indexer unavailable, retry shortly"), 503),
        (IndexerFailed("indexer error (INTERNAL)"), 502),
    ],
)
def test_router_errors_become_http_answers_with_a_jsonrpc_body(error: RouterError, status: int) -> None:
    response = http_answer(error, request_id=3)
    assert response.status_code == status
    body = json.loads(bytes(response.body))
    assert body["id"] == 3 and body["error"]["message"]
    if status == 401:
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'


def test_model_errors_become_tool_results_and_router_faults_protocol_errors() -> None:
    result = tool_result_for(ToolNotFound("get_weather"))
    assert result["isError"] is True
    assert result["content"][0]["text"] == (
        "tool not found: get_weather. Use find_tool to search for the tool you need."
    )
    assert (
        "did not answer within 30s" in tool_result_for(BackendTimeout("weather", 30.0))["content"][0]["text"]
    )
    with pytest.raises(MCPError, match="indexer unavailable"):
        tool_result_for(IndexerUnavailable("indexer unavailable, retry shortly"))


def test_a_request_the_client_got_wrong_is_invalid_params_and_the_routers_stop_an_internal_error() -> None:
    # a tool call's bad argument is the model's to mend: a tool result; a retry's request state is
    # the client's: invalid params, as it is for a read or a prompt the client got wrong
    assert tool_result_for(InvalidRequest("bad argument"))["isError"] is True
    with pytest.raises(MCPError) as refused:
        tool_result_for(InvalidRequestState("requestState names no call that waits for input"))
    assert refused.value.error.code == types.INVALID_PARAMS
    assert mcp_error(InvalidRequest("no such prompt argument")).error.code == types.INVALID_PARAMS
    assert mcp_error(RouterStopping("the router stopped")).error.code == types.INTERNAL_ERROR


def test_outgoing_headers_follow_the_backends_auth() -> None:
    def auth(kind: str, env: str = "") -> pb.BackendAuth:
        return pb.BackendAuth(type=kind, header="Authorization", value_env=env)

    assert outgoing_headers("b", auth("none"), {}, "tok") == {}
    assert outgoing_headers("b", auth("passthrough"), {}, "tok") == {"Authorization": "Bearer tok"}
    assert outgoing_headers("b", auth("header", "B_KEY"), {"B_KEY": "k"}, None) == {"Authorization": "k"}
    with pytest.raises(MissingCredentials, match="backend b requires the caller's bearer token"):
        outgoing_headers("b", auth("passthrough"), {}, None)
    with pytest.raises(MissingCredentials, match="B_KEY"):
        outgoing_headers("b", auth("header", "B_KEY"), {}, None)


# -- the app in process: a fake indexer and an in-process backend -----------------------------------

BACKEND_URL = "http://backend.test/mcp"
ADD_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
ADD_TOOL = {"name": "math_add", "description": "Add two integers", "inputSchema": ADD_SCHEMA}
VERSION = pb.IndexVersionRef(number=3, fingerprint="f00d")


def _resolved(name: str) -> pb.ResolveToolResponse | None:
    """The fake's one tool, as every resolution of its name answers it."""
    if name != "math_add":
        return None
    return pb.ResolveToolResponse(
        name="math_add",
        original_name="add",
        backend_id="math",
        backend_url=BACKEND_URL,
        input_schema_json=json.dumps(ADD_SCHEMA),
        auth=pb.BackendAuth(type="none"),
        version=VERSION,
        protocol_version="2025-11-25",
        timeout_seconds=5,
    )


@dataclass
class FakeIndexer(indexer_pb2_grpc.IndexerServicer):
    """Sessions in a dict, one tool, and a record of the calls."""

    sessions: dict[str, tuple[str, str]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    async def _check(self, session_id: str, principal: pb.Principal, context: Any) -> None:
        if self.sessions.get(session_id) != (principal.issuer, principal.subject):
            context.set_trailing_metadata((("toolsearch-error", "session-not-found"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, "session not found")

    async def OpenSession(self, request: pb.OpenSessionRequest, context: Any) -> pb.OpenSessionResponse:
        self.calls.append("OpenSession implied" if request.implied else "OpenSession")
        principal = (request.principal.issuer, request.principal.subject)
        session_id = f"implied-{principal}" if request.implied else uuid.uuid4().hex
        self.sessions[session_id] = principal
        tool = _resolved(request.resolve)
        return pb.OpenSessionResponse(session_id=session_id, version=VERSION, backends=["math"], tool=tool)

    async def GetSession(self, request: pb.GetSessionRequest, context: Any) -> pb.GetSessionResponse:
        self.calls.append("GetSession")
        await self._check(request.session_id, request.principal, context)
        tool = _resolved(request.resolve)
        return pb.GetSessionResponse(session_id=request.session_id, version=VERSION, tool=tool)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:
        self.calls.append("CloseSession")
        await self._check(request.session_id, request.principal, context)
        del self.sessions[request.session_id]
        return pb.CloseSessionResponse()

    async def FindTools(self, request: pb.FindToolsRequest, context: Any) -> pb.FindToolsResponse:
        self.calls.append("FindTools")
        await self._check(request.session_id, request.principal, context)
        metrics = pb.TokenMetrics(baseline_tokens=1000, returned_tokens=40, savings_percent=96.0)
        if "add" not in request.query:
            return pb.FindToolsResponse(
                version=VERSION, token_metrics=metrics, empty_reason="nothing matched"
            )
        found = pb.FoundTool(
            name="math_add", backend_id="math", definition_json=json.dumps(ADD_TOOL), score=1
        )
        return pb.FindToolsResponse(tools=[found], version=VERSION, token_metrics=metrics)

    async def ResolveTool(self, request: pb.ResolveToolRequest, context: Any) -> pb.ResolveToolResponse:
        self.calls.append("ResolveTool")
        await self._check(request.session_id, request.principal, context)
        tool = _resolved(request.name)
        if tool is None:
            context.set_trailing_metadata((("toolsearch-error", "tool-not-found"),))
            await context.abort(grpc.StatusCode.NOT_FOUND, f"tool not found: {request.name}")
        return tool

    async def Status(self, request: pb.StatusRequest, context: Any) -> pb.StatusResponse:
        return pb.StatusResponse(model="fake")


@dataclass
class Backend:
    calls: list[dict[str, Any]] = field(default_factory=list)

    def server(self) -> Server[Any]:
        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=[types.Tool(name="add", input_schema=ADD_SCHEMA)])

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            self.calls.append(dict(params.arguments or {}))
            total = (params.arguments or {})["a"] + (params.arguments or {})["b"]
            text = types.TextContent(type="text", text=str(total))
            return types.CallToolResult(content=[text], structured_content={"sum": total}, _meta={"k": "v"})

        return Server("math", on_list_tools=list_tools, on_call_tool=call_tool)


@dataclass
class Running:
    http: httpx2.AsyncClient
    indexer: FakeIndexer
    backend: Backend
    state: RouterState

    def client(self, mode: str = "legacy") -> Client:
        return Client(streamable_http_client("http://router.test/mcp", http_client=self.http), mode=mode)


FIND_ADD = {"name": "find_tool", "arguments": {"tool_description": "add"}}
JSON_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _config(indexer_address: str) -> Any:
    raw = {
        "router": {
            "indexer": [indexer_address],
            "indexer_timeout": 2.0,
            "max_body_bytes": 4096,
            "allowed_hosts": ["router.test"],  # the host the in-process clients call
        }
    }
    return parse_config(raw, Path("test.yaml"))


@contextlib.asynccontextmanager
async def _lifespans(*apps: Any) -> AsyncIterator[list[Any]]:
    """Run the apps' lifespans in a task of their own: their task groups must exit where they began.

    Yields each app's lifespan state (None for an app without any).
    """
    started, stop = asyncio.Event(), asyncio.Event()
    states: list[Any] = []

    async def hold() -> None:
        async with contextlib.AsyncExitStack() as stack:
            for app in apps:
                states.append(await stack.enter_async_context(app.router.lifespan_context(app)))
            started.set()
            await stop.wait()

    task = asyncio.create_task(hold())
    await asyncio.wait([task, asyncio.create_task(started.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield states
    finally:
        stop.set()
        await task


def _served(app: Any, state: RouterState) -> httpx2.ASGITransport:
    """A transport to `app` that hands each request the lifespan state, as an ASGI server does."""

    async def with_state(scope: Scope, receive: Receive, send: Send) -> None:
        await app({**scope, "state": dict(state)}, receive, send)

    return httpx2.ASGITransport(with_state)


@pytest.fixture(scope="module")
async def running() -> AsyncIterator[Running]:
    fake = FakeIndexer()
    grpc_server = grpc.aio.server()
    indexer_pb2_grpc.add_IndexerServicer_to_server(fake, grpc_server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, grpc_server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()

    backend = Backend()
    backend_app = backend.server().streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    app = create_app(_config(f"127.0.0.1:{port}"), {}, backend_transport=httpx2.ASGITransport(backend_app))
    async with _lifespans(backend_app, app) as (_, state):
        http = httpx2.AsyncClient(transport=_served(app, state), base_url="http://router.test")
        yield Running(http, fake, backend, state)
    await grpc_server.stop(None)


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def _initialize(running: Running) -> str:
    response = await running.http.post("/mcp", json=INITIALIZE, headers=JSON_HEADERS)
    assert response.status_code == 200, response.text
    return response.headers["mcp-session-id"]


async def test_initialize_issues_a_session_and_later_requests_need_it(running: Running) -> None:
    session_id = await _initialize(running)
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    missing = await running.http.post("/mcp", json=ping, headers=JSON_HEADERS)
    assert missing.status_code == 400
    assert missing.json()["error"]["message"].startswith("missing Mcp-Session-Id header")
    ok = await running.http.post("/mcp", json=ping, headers={**JSON_HEADERS, "mcp-session-id": session_id})
    assert ok.status_code == 200 and ok.json()["result"] == {}
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = await running.http.post(
        "/mcp", json=note, headers={**JSON_HEADERS, "mcp-session-id": session_id}
    )
    assert accepted.status_code == 202


async def test_an_unknown_or_closed_session_answers_404(running: Running) -> None:
    session_id = await _initialize(running)
    headers = {**JSON_HEADERS, "mcp-session-id": session_id}
    assert (await running.http.delete("/mcp", headers=headers)).status_code == 200
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    gone = await running.http.post("/mcp", json=ping, headers=headers)
    assert gone.status_code == 404
    assert gone.json() == {
        "jsonrpc": "2.0",
        "id": 2,
        "error": {"code": -32600, "message": gone.json()["error"]["message"]},
    }
    assert "re-initialize" in gone.json()["error"]["message"]
    assert (await running.http.delete("/mcp", headers=headers)).status_code == 404


async def test_a_refused_initialize_opens_no_session(running: Running) -> None:
    before = running.indexer.calls.count("OpenSession")
    bad = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    response = await running.http.post("/mcp", json=bad, headers=JSON_HEADERS)
    assert "error" in response.json() and "mcp-session-id" not in response.headers
    assert running.indexer.calls.count("OpenSession") == before


@pytest.mark.parametrize(
    ("content", "content_type", "status", "code"),
    [
        (b"{nope", "application/json", 400, -32700),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', "application/json", 400, -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', "text/plain", 415, -32600),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "' + b"x" * 5000 + b'"}',
            "application/json",
            413,
            -32600,
        ),
    ],
)
async def test_client_mistakes_get_4xx_with_a_jsonrpc_error(
    running: Running, content: bytes, content_type: str, status: int, code: int
) -> None:
    headers = {**JSON_HEADERS, "content-type": content_type}
    response = await running.http.post("/mcp", content=content, headers=headers)
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


async def test_a_get_without_a_session_is_told_to_send_its_id_and_a_2026_get_has_no_stream(
    running: Running,
) -> None:
    sessionless = await running.http.get("/mcp", headers={"accept": "text/event-stream"})
    modern = await running.http.get(
        "/mcp", headers={"accept": "text/event-stream", "mcp-protocol-version": "2026-07-28"}
    )
    assert sessionless.status_code == 400
    assert sessionless.json()["error"]["message"] == MISSING_SESSION
    assert modern.status_code == 405
    assert modern.headers["allow"] == "POST, DELETE"


async def test_handshake_clients_see_two_tools_and_use_them(running: Running) -> None:
    async with running.client("legacy") as client:
        listed = await client.list_tools()
        assert [tool.name for tool in listed.tools] == ["find_tool", "call_tool"]
        found = await client.call_tool("find_tool", {"tool_description": "add two numbers"})
        assert not found.is_error
        assert found.structured_content is not None
        assert found.structured_content["tools"] == [ADD_TOOL]
        assert json.loads(_text(found)) == found.structured_content
        assert found.meta == {"toolsearch/index": {"version": 3, "fingerprint": "f00d"}}
        called = await client.call_tool(
            "call_tool", {"tool_name": "math_add", "parameters": {"a": 2, "b": 3}}
        )
        assert (called.is_error, called.structured_content, called.meta) == (False, {"sum": 5}, {"k": "v"})
        assert running.backend.calls[-1] == {"a": 2, "b": 3}


async def test_tool_level_mistakes_are_error_results_the_model_can_read(running: Running) -> None:
    calls_before = len(running.backend.calls)
    async with running.client("legacy") as client:
        empty = await client.call_tool("find_tool", {"tool_description": "paint a fence"})
        assert empty.structured_content is not None
        assert (
            empty.structured_content["tools"] == []
            and empty.structured_content["message"] == "nothing matched"
        )
        unknown = await client.call_tool("call_tool", {"tool_name": "nope", "parameters": {}})
        assert unknown.is_error and "tool not found: nope. Use find_tool" in _text(unknown)
        wrong = await client.call_tool(
            "call_tool", {"tool_name": "math_add", "parameters": {"a": "2", "b": 3}}
        )
        assert wrong.is_error and "parameters.a" in _text(wrong)
        limit = await client.call_tool("find_tool", {"tool_description": "add", "limit": 500})
        assert limit.is_error and "limit must be an integer from 1 to 50" in _text(limit)
    assert len(running.backend.calls) == calls_before


async def test_stateless_clients_use_the_session_their_principal_implies(running: Running) -> None:
    async with running.client("auto") as client:
        assert client.protocol_version == "2026-07-28"
        listed = await client.list_tools()
        assert [tool.name for tool in listed.tools] == ["find_tool", "call_tool"]
        running.indexer.calls.clear()
        found = await client.call_tool("find_tool", {"tool_description": "add"})
        assert found.structured_content is not None and found.structured_content["tools"] == [ADD_TOOL]
        assert running.indexer.calls == ["OpenSession implied", "FindTools"]


async def test_find_tool_costs_one_search_which_checks_the_session_itself(running: Running) -> None:
    async with running.client("legacy") as client:
        await client.list_tools()  # the SDK client lists once to check structured output
        running.indexer.calls.clear()
        await client.call_tool("find_tool", {"tool_description": "add"})
        assert running.indexer.calls == ["FindTools"]


def _call(request_id: int, name: str, arguments: Any, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments, **({"_meta": meta} if meta else {})}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _find(request_id: int, arguments: Any) -> dict[str, Any]:
    return _call(request_id, "find_tool", arguments)


def _sse_result(text: str) -> Any:
    """The JSON-RPC response among an SSE stream's events."""
    for line in text.splitlines():
        if line.startswith("data: ") and '"result"' in line:
            return json.loads(line.removeprefix("data: "))
    raise AssertionError(f"no result in {text!r}")


@pytest.mark.parametrize(
    ("tool", "arguments", "indexer_calls"),
    [
        ("find_tool", {"tool_description": "add"}, ["FindTools"]),  # the search checks the session
        ("find_tool", {"tool_description": ""}, ["GetSession"]),  # a mistake the model reads
        ("call_tool", {"tool_name": "math_add", "parameters": {"a": 1, "b": 2}}, ["GetSession"]),
        ("call_tool", {"tool_name": "math_add", "parameters": {"a": "1"}}, ["GetSession"]),
        ("call_tool", {"tool_name": "nope", "parameters": {}}, ["GetSession", "ResolveTool"]),
    ],
)
async def test_a_meta_tool_answered_before_the_sdk_is_answered_as_the_sdk_answers(
    running: Running, tool: str, arguments: dict[str, Any], indexer_calls: list[str]
) -> None:
    headers = {**JSON_HEADERS, "mcp-session-id": await _initialize(running)}
    running.indexer.calls.clear()
    direct = await running.http.post("/mcp", json=_call(7, tool, arguments), headers=headers)
    assert direct.status_code == 200 and direct.headers["content-type"] == "application/json"
    assert running.indexer.calls == indexer_calls
    # asking for progress sends the same call through the SDK's server, answered on a stream
    progress = _call(7, tool, arguments, {"progressToken": "p"})
    through_sdk = await running.http.post("/mcp", json=progress, headers=headers)
    assert through_sdk.headers["content-type"].startswith("text/event-stream")
    assert direct.json() == _sse_result(through_sdk.text)
    assert "resultType" not in direct.json()["result"]  # not in the handshake era's results


async def test_a_find_in_an_unknown_session_answers_404_as_any_request_does(running: Running) -> None:
    headers = {**JSON_HEADERS, "mcp-session-id": "no-such-session"}
    gone = await running.http.post("/mcp", json=_find(2, {"tool_description": "add"}), headers=headers)
    mistaken = await running.http.post("/mcp", json=_find(2, {"tool_description": ""}), headers=headers)
    assert mistaken.status_code == 404 and mistaken.json() == gone.json()
    ping = await running.http.post(
        "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers
    )
    assert gone.status_code == ping.status_code == 404
    assert gone.json() == ping.json()


async def test_a_find_the_sdk_must_judge_goes_through_the_sdk(running: Running) -> None:
    headers = {**JSON_HEADERS, "mcp-session-id": await _initialize(running)}
    running.indexer.calls.clear()
    malformed = await running.http.post("/mcp", json=_find(3, "not an object"), headers=headers)
    assert malformed.json()["error"]["code"] == types.INVALID_PARAMS
    sse_only = {**headers, "accept": "text/event-stream"}
    refused = await running.http.post("/mcp", json=_find(4, {"tool_description": "add"}), headers=sse_only)
    assert refused.status_code == 406
    tasked = _find(5, {"tool_description": "add"})
    tasked["params"]["task"] = {"ttl": 1000}  # what the SDK's server makes of it is its to say
    await running.http.post("/mcp", json=tasked, headers=headers)
    assert running.indexer.calls[:3] == ["GetSession"] * 3  # each went the usual way


async def test_call_tool_costs_one_session_check_that_resolves_the_tool_too(running: Running) -> None:
    async with running.client("legacy") as client:
        await client.list_tools()
        running.indexer.calls.clear()
        called = await client.call_tool(
            "call_tool", {"tool_name": "math_add", "parameters": {"a": 1, "b": 2}}
        )
        assert not called.is_error and running.indexer.calls == ["GetSession"]
        running.indexer.calls.clear()
        unknown = await client.call_tool("call_tool", {"tool_name": "nope", "parameters": {}})
        assert unknown.is_error and running.indexer.calls == ["GetSession", "ResolveTool"]
    async with running.client("auto") as client:
        running.indexer.calls.clear()
        called = await client.call_tool(
            "call_tool", {"tool_name": "math_add", "parameters": {"a": 1, "b": 2}}
        )
        assert not called.is_error and running.indexer.calls == ["OpenSession implied"]


async def test_readiness_follows_the_indexer_health_check(running: Running) -> None:
    assert (await running.http.get("/healthz")).status_code == 200
    ready = await running.http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


async def test_an_unreachable_indexer_is_a_503_not_a_traceback() -> None:
    app = create_app(_config(f"127.0.0.1:{free_port()}"), {})
    async with _lifespans(app) as (state,):
        http = httpx2.AsyncClient(transport=_served(app, state), base_url="http://router.test")
        response = await http.post("/mcp", json=INITIALIZE, headers=JSON_HEADERS)
        assert response.status_code == 503
        assert response.json()["error"]["message"] == "indexer unavailable, retry shortly"
        # a find checks its session in the indexer too, and is answered the same way
        find = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": FIND_ADD}
        headers = {**JSON_HEADERS, "mcp-session-id": "any"}
        found = await http.post("/mcp", json=find, headers=headers)
        assert (found.status_code, found.headers["retry-after"]) == (503, "1")
        assert found.json()["error"]["message"] == "indexer unavailable, retry shortly"
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["reason"]


async def test_an_unreachable_indexer_address_fails_over_to_the_next(running: Running) -> None:
    live = running.state["indexer"].addresses[0]
    client = IndexerClient([f"127.0.0.1:{free_port()}", live], timeout=2.0)
    try:
        opened = await client.open_session(Principal(), None)
        assert opened.session_id
        assert client.channels.current == 1
    finally:
        await client.close()
