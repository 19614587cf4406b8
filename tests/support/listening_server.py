"""A Streamable HTTP MCP server of both protocol eras made with the SDK's `MCPServer`, whose
2026-07-28 clients hear of its changes on `subscriptions/listen`.

    app = listening_app()               # both eras; its MCP endpoint at /mcp
    app = listening_app(modern=True)    # refusing the initialize handshake

It offers the resources `notes://a` and `notes://b` and the prompt `summarize`. The tool `edit`
changes a note (`{"uri": ...}`) and publishes its update; the tool `file` adds the note `notes://c`
and publishes that the resource list changed; `reword` publishes that the prompt list changed, and
`grow` that the tool list did. Each answers `published`. Each app keeps notes of its own.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp

from tests.support.conformance_server import ModernOnly


def listening_app(modern: bool = False) -> ASGIApp:
    """A new listening server, with notes of its own, as an ASGI app."""
    server = MCPServer("listening")
    notes = {"notes://a": "first", "notes://b": "second"}

    @server.resource("notes://a")
    def note_a() -> str:
        return notes["notes://a"]

    @server.resource("notes://b")
    def note_b() -> str:
        return notes["notes://b"]

    @server.prompt()
    def summarize(text: str) -> str:
        """Summarize a text."""
        return f"Summarize: {text}"

    @server.tool()
    async def edit(uri: str, ctx: Context[Any, Any]) -> str:
        """Change a note and say so to the listeners."""
        notes[uri] = notes.get(uri, "") + " (edited)"
        await ctx.notify_resource_updated(uri)
        return "published"

    @server.tool()
    async def file(ctx: Context[Any, Any]) -> str:
        """Add a note and say the resource list changed."""
        notes["notes://c"] = "third"
        await ctx.notify_resources_changed()
        return "published"

    @server.tool()
    async def reword(ctx: Context[Any, Any]) -> str:
        """Say the prompt list changed."""
        await ctx.notify_prompts_changed()
        return "published"

    @server.tool()
    async def grow(ctx: Context[Any, Any]) -> str:
        """Say the tool list changed."""
        await ctx.notify_tools_changed()
        return "published"

    app = server.streamable_http_app()
    return ModernOnly(app) if modern else app
