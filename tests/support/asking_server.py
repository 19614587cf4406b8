"""A Streamable HTTP MCP server that asks its client to sample, whatever the client declared, and
that logs at the level its client set.

    app = asking_app()  # an ASGI app, its MCP endpoint at /mcp/; served by tests/support/asking.py

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
with a session per client, as most servers people run do. Each app keeps its own state (sessions
subscribed, tools grown, levels set), as a process of its own would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_args

import mcp_types as types
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
LAST = types.Tool(name="last", description="How the last ask ended", input_schema={"type": "object"})
ROOTS = types.Tool(name="roots", description="Count roots changes", input_schema={"type": "object"})
ASK = types.Tool(name="ask", description="Ask the client's model a question", input_schema={"type": "object"})
CHATTER = types.Tool(name="chatter", description="Log at every level", input_schema={"type": "object"})
GROW = types.Tool(name="grow", description="Add a tool", input_schema={"type": "object"})
SPROUT = types.Tool(name="sprout", description="Water the garden's seedlings", input_schema=GROW.input_schema)
TWICE = types.Tool(
    name="ask_twice", description="Ask the client's model two questions", input_schema={"type": "object"}
)
LEVELS: list[types.LoggingLevel] = list(get_args(types.LoggingLevel))


def _session_id(ctx: ServerRequestContext[Any]) -> str:
    return ctx.request.headers.get("mcp-session-id", "") if ctx.request is not None else ""


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


@dataclass
class Asking:
    """One asking server's state, by session id, and its handlers."""

    subscribed: dict[str, Any] = field(default_factory=dict)  # the session of each client subscribed
    roots_changed: dict[str, int] = field(default_factory=dict)  # the roots/list_changed it sent
    last_asked: dict[str, str] = field(default_factory=dict)  # how its last `ask` ended, read or not
    levels: dict[str, types.LoggingLevel] = field(default_factory=dict)  # logging/setLevel
    grown: list[types.Tool] = field(default_factory=list)  # the tools `grow` added

    async def set_level(
        self, ctx: ServerRequestContext[Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        self.levels[_session_id(ctx)] = params.level
        return types.EmptyResult()

    async def chatter(self, ctx: ServerRequestContext[Any]) -> types.CallToolResult:
        level = self.levels.get(_session_id(ctx))
        for each in LEVELS[LEVELS.index(level or "debug") :]:
            await ctx.session.send_log_message(
                each, f"a {each} message", "asking", related_request_id=ctx.request_id
            )
        return _text(f"level: {level or 'unset'}")

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[ASK, TWICE, CHATTER, TOUCH, ROOTS, LAST, GROW, *self.grown])

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name == "chatter":
            return await self.chatter(ctx)
        if params.name == "last":
            return _text(self.last_asked.get(_session_id(ctx), "none yet"))
        if params.name == "roots":
            return _text(f"roots changed {self.roots_changed.get(_session_id(ctx), 0)}")
        if params.name == "grow":
            self.grown[:] = [SPROUT]
            await ctx.session.send_tool_list_changed()  # no request id: on the standalone stream
            return _text("grown")
        if params.name == "touch":
            return await self.touch(params.arguments or {})
        if params.name == "ask_twice":
            first, second = await _sample(ctx, "first?"), await _sample(ctx, "second?")
            return _text(f"{first} | {second}")
        text = await _sample(ctx, "hello?")
        self.last_asked[_session_id(ctx)] = text
        return _text(text)

    async def touch(self, arguments: dict[str, Any]) -> types.CallToolResult:
        # a `mark` argument names this touch in its log line, so a reader can tell when it got that far
        mark = arguments.get("mark")
        line = f"the note changed ({mark})" if mark else "the note changed"
        for session in list(self.subscribed.values()):  # on each one's standalone stream: no request id
            await session.send_resource_updated(NOTE)
            await session.send_log_message("notice", line, "asking")
        return _text(f"told {len(self.subscribed)}")

    async def subscribe(self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams) -> Any:
        self.subscribed[_session_id(ctx)] = ctx.session
        return {}

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> Any:
        self.subscribed.pop(_session_id(ctx), None)
        return {}

    async def on_roots_changed(
        self, ctx: ServerRequestContext[Any], params: types.NotificationParams | None
    ) -> None:
        self.roots_changed[_session_id(ctx)] = self.roots_changed.get(_session_id(ctx), 0) + 1


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


async def refuse_discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> Any:
    raise MCPError(types.METHOD_NOT_FOUND, "this server speaks the initialize handshake only")


def asking_app() -> Starlette:
    """A new asking server, with state of its own, as an ASGI app (its MCP endpoint at /mcp/)."""
    asking = Asking()
    server: Server[Any] = Server(
        "asking",
        on_list_tools=asking.list_tools,
        on_call_tool=asking.call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_subscribe_resource=asking.subscribe,
        on_unsubscribe_resource=asking.unsubscribe,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    server.add_request_handler("server/discover", types.RequestParams, refuse_discover)
    server.add_notification_handler(
        "notifications/roots/list_changed", types.NotificationParams, asking.on_roots_changed
    )
    server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, asking.set_level)
    # with an event store, as a server whose clients resume their streams: what a session's
    # standalone stream would carry while nobody reads it is kept for its reader to resume
    manager = StreamableHTTPSessionManager(server, json_response=False, event_store=MemoryEventStore())
    return Starlette(routes=[Mount("/mcp", app=manager.handle_request)], lifespan=lambda app: manager.run())
