"""A Streamable HTTP MCP server whose one tool asks its client to sample, whatever the client declared.

    python tests/support/asking_server.py PORT

The tool `ask` sends `sampling/createMessage` on the call's own stream and answers with what came
back: `answered: ...`, or `refused: <the error's message>`. It speaks the initialize handshake
only (server/discover is refused), with a session per client, as most servers people run do.
"""

from __future__ import annotations

import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from starlette.applications import Starlette
from starlette.routing import Mount

ASK = types.Tool(name="ask", description="Ask the client's model a question", input_schema={"type": "object"})


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[ASK])


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hello?"))
    request = types.CreateMessageRequest(
        params=types.CreateMessageRequestParams(messages=[message], max_tokens=5)
    )
    try:
        result = await ctx.session.send_request(
            request,
            types.CreateMessageResult,
            request_read_timeout_seconds=60,
            metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
        )
        text = f"answered: {result.model_dump(mode='json')}"
    except MCPError as exc:
        text = f"refused: {exc.error.message}"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def refuse_discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> Any:
    raise MCPError(types.METHOD_NOT_FOUND, "this server speaks the initialize handshake only")


def main(port: int) -> None:
    server: Server[Any] = Server("asking", on_list_tools=list_tools, on_call_tool=call_tool)
    server.add_request_handler("server/discover", types.RequestParams, refuse_discover)
    manager = StreamableHTTPSessionManager(server, json_response=False)
    app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lambda app: manager.run())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))
