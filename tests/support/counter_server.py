"""A stateful MCP server made with the SDK's `MCPServer` (FastMCP), as people write them.

    python tests/support/counter_server.py            # over stdio
    python tests/support/counter_server.py sse PORT   # over the legacy HTTP+SSE transport
    COUNTER_KEY=k python tests/support/counter_server.py sse PORT   # ... asking for X-Api-Key: k

The tool `increment` adds one to a counter and answers the new count and the process id
(`{"count": 2, "pid": 4242}`). Over stdio the process keeps one counter: a caller that shares a
process with another sees the other's increments, and one whose process was replaced sees its count
start again at 1. Over SSE each session (each open event stream) keeps its own, as a server that
holds per-session state does: a caller whose session was replaced sees its count start again at 1.
The tool `ask` asks the client's model a question (`sampling/createMessage`) and answers
`answered: <its text>`; `offered` answers the capabilities its client declared at initialize, as
JSON. With `COUNTER_KEY` set, every request without that `X-Api-Key` is answered 401.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

server = MCPServer("counter")
counts: dict[str, int] = {}  # one counter for the process (key ""), or one per SSE session
per_session = False  # whether each session keeps its own


@server.tool()
def increment(ctx: Context[Any, Any]) -> str:
    """Add one to this process's counter and answer the new count."""
    request = ctx.request_context.request
    # the legacy transport names its session in every POST's query
    key = request.query_params.get("session_id", "") if per_session and request is not None else ""
    counts[key] = counts.get(key, 0) + 1
    return json.dumps({"count": counts[key], "pid": os.getpid()})


@server.tool()
async def ask(ctx: Context[Any, Any]) -> str:
    """Ask the client's model a question and answer what it said."""
    question = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hello?"))
    said = await ctx.session.create_message(
        [question], max_tokens=5, related_request_id=ctx.request_context.request_id
    )
    text = said.content.text if isinstance(said.content, types.TextContent) else repr(said.content)
    return f"answered: {text}"


@server.tool()
def offered(ctx: Context[Any, Any]) -> str:
    """Answer the capabilities this session's client declared at initialize."""
    client = ctx.session.client_params
    declared = (
        client.capabilities.model_dump(mode="json", by_alias=True, exclude_none=True)
        if client is not None
        else {}
    )
    return json.dumps(declared)


def keyed(app: ASGIApp, key: str) -> ASGIApp:
    """`app`, answering 401 to every request without `X-Api-Key: key`."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and Headers(scope=scope).get("x-api-key") != key:
            await PlainTextResponse("a key, please", 401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    if sys.argv[1:2] == ["sse"]:
        per_session = True
        app = server.sse_app()
        if key := os.environ.get("COUNTER_KEY"):
            app = keyed(app, key)
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")
