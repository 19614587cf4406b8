"""A Streamable HTTP MCP server that asks its client to sample, whatever the client declared, and
that logs at the level its client set.

    python -m tests.support.asking_server PORT

The tool `ask` sends `sampling/createMessage` on the call's own stream and answers with what came
back: `answered: ...`, or `refused: <the error's message>`. The tool `chatter` sends one log message
at each of MCP's eight levels at or above the level its session set (`logging/setLevel`; all of
them when none was set), and answers `level: <that level, or unset>`. It offers one resource,
`asking://note`, which a session may subscribe to; the tool `touch` changes it, and sends each
session subscribed to it `notifications/resources/updated` and a log message, outside the call (on
that session's standalone stream; its `mark` argument, if any, named in the line), answering
`told N`. Reading its other resource, `asking://asked`, and getting its prompt `ask` ask the client to
sample too, during the read or the prompt, and carry the same answer. The tool `roots` answers how
many times its session's client said its roots changed (`notifications/roots/list_changed`), and
`last` how its session's last `ask` ended (even one whose answer nobody read); `ask_twice` asks two
questions, one after the other, and answers both answers. The tool `grow` adds the tool `sprout` to
its list and tells its session so (`notifications/tools/list_changed`, on the session's standalone
stream), answering `grown`. It speaks the initialize handshake only (server/discover is refused),
with a session per client, as most servers people run do.
"""

from __future__ import annotations

import sys
from typing import Any, get_args

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from starlette.applications import Starlette
from starlette.routing import Mount

from tests.support.event_store import MemoryEventStore

NOTE = "asking://note"
ASKED = "asking://asked"  # read, it asks the client first
TOUCH = types.Tool(name="touch", description="Change the note", input_schema={"type": "object"})
_subscribed: dict[str, Any] = {}  # session id: the session of each client subscribed to the note
_roots_changed: dict[str, int] = {}  # session id: the roots/list_changed notifications it sent
_last_asked: dict[str, str] = {}  # session id: how its last `ask` ended, even if nobody read it
LAST = types.Tool(name="last", description="How the last ask ended", input_schema={"type": "object"})
ROOTS = types.Tool(name="roots", description="Count roots changes", input_schema={"type": "object"})
ASK = types.Tool(name="ask", description="Ask the client's model a question", input_schema={"type": "object"})
CHATTER = types.Tool(name="chatter", description="Log at every level", input_schema={"type": "object"})
GROW = types.Tool(name="grow", description="Add a tool", input_schema={"type": "object"})
SPROUT = types.Tool(name="sprout", description="Water the garden's seedlings", input_schema=GROW.input_schema)
TWICE = types.Tool(
    name="ask_twice", description="Ask the client's model two questions", input_schema={"type": "object"}
)
_grown: list[types.Tool] = []  # the tools `grow` added
LEVELS: list[types.LoggingLevel] = list(get_args(types.LoggingLevel))
_levels: dict[str, types.LoggingLevel] = {}  # logging/setLevel by session id


def _session_id(ctx: ServerRequestContext[Any]) -> str:
    return ctx.request.headers.get("mcp-session-id", "") if ctx.request is not None else ""


async def set_level(ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams) -> types.EmptyResult:
    _levels[_session_id(ctx)] = params.level
    return types.EmptyResult()


async def chatter(ctx: ServerRequestContext[Any]) -> types.CallToolResult:
    level = _levels.get(_session_id(ctx))
    for each in LEVELS[LEVELS.index(level or "debug") :]:
        await ctx.session.send_log_message(
            each, f"a {each} message", "asking", related_request_id=ctx.request_id
        )
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"level: {level or 'unset'}")])


async def list_tools(
    ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[ASK, TWICE, CHATTER, TOUCH, ROOTS, LAST, GROW, *_grown])


async def call_tool(
    ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    if params.name == "chatter":
        return await chatter(ctx)
    if params.name == "last":
        text = _last_asked.get(_session_id(ctx), "none yet")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
    if params.name == "roots":
        heard = _roots_changed.get(_session_id(ctx), 0)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"roots changed {heard}")])
    if params.name == "grow":
        _grown[:] = [SPROUT]
        await ctx.session.send_tool_list_changed()  # no request id: on the standalone stream
        return types.CallToolResult(content=[types.TextContent(type="text", text="grown")])
    if params.name == "touch":
        # a `mark` argument names this touch in its log line, so a reader can tell when it got that far
        mark = (params.arguments or {}).get("mark")
        line = f"the note changed ({mark})" if mark else "the note changed"
        for session in list(_subscribed.values()):  # on each one's standalone stream: no request id
            await session.send_resource_updated(NOTE)
            await session.send_log_message("notice", line, "asking")
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"told {len(_subscribed)}")])
    if params.name == "ask_twice":
        first, second = await _sample(ctx, "first?"), await _sample(ctx, "second?")
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{first} | {second}")])
    text = await _sample(ctx, "hello?")
    _last_asked[_session_id(ctx)] = text
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def _sample(ctx: ServerRequestContext[Any], question: str) -> str:
    """Ask the client's model `question` on the call's stream: `answered: ...` or `refused: ...`."""
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))
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
    except MCPError as exc:
        return f"refused: {exc.error.message}"
    return f"answered: {result.model_dump(mode='json')}"


async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {"resources": [{"uri": NOTE, "name": "note"}, {"uri": ASKED, "name": "asked"}]}


async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
    if str(params.uri) == ASKED:
        return {"contents": [{"uri": ASKED, "text": await _sample(ctx, "what to read?")}]}
    return {"contents": [{"uri": NOTE, "text": "a note"}]}


async def list_prompts(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
    return {"prompts": [{"name": "ask", "description": "A prompt that asks the client's model first"}]}


async def get_prompt(ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
    text = await _sample(ctx, "what to prompt?")
    return {"messages": [{"role": "user", "content": {"type": "text", "text": text}}]}


async def subscribe(ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> Any:
    _subscribed[_session_id(ctx)] = ctx.session
    return {}


async def unsubscribe(ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams) -> Any:
    _subscribed.pop(_session_id(ctx), None)
    return {}


async def roots_changed(ctx: ServerRequestContext[Any], params: types.NotificationParams | None) -> None:
    _roots_changed[_session_id(ctx)] = _roots_changed.get(_session_id(ctx), 0) + 1


async def refuse_discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> Any:
    raise MCPError(types.METHOD_NOT_FOUND, "this server speaks the initialize handshake only")


def main(port: int) -> None:
    server: Server[Any] = Server(
        "asking",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    server.add_request_handler("server/discover", types.RequestParams, refuse_discover)
    server.add_notification_handler(
        "notifications/roots/list_changed", types.NotificationParams, roots_changed
    )
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, set_level)
    # with an event store, as a server whose clients resume their streams: what a session's
    # standalone stream would carry while nobody reads it is kept for its reader to resume
    manager = StreamableHTTPSessionManager(server, json_response=False, event_store=MemoryEventStore())
    app = Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lambda app: manager.run())
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(int(sys.argv[1]))
