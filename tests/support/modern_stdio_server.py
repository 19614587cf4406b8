"""A stdio MCP server made with the SDK's `MCPServer`, for a bridge that speaks 2026-07-28 to it.

    python tests/support/modern_stdio_server.py

Its tools: `count_to` reports progress 1..n of n (with a short pause between) and answers
`counted to N`; `wait` waits until it is cancelled; `cancelled` answers how many `wait` calls were
cancelled so far; `change` tells its `subscriptions/listen` streams that its tools changed; `pid`
answers the process id; `exit` ends the process without answering. The SDK serves whichever era
the first request speaks: here, 2026-07-28.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("modern")
cancelled: list[str] = []  # a word for each `wait` call cancelled so far


@server.tool()
async def count_to(n: int, ctx: Context[Any, Any]) -> str:
    """Report progress 1..n of n, then answer."""
    for step in range(1, n + 1):
        await ctx.report_progress(step, n)
        await anyio.sleep(0.01)
    return f"counted to {n}"


@server.tool()
async def wait() -> str:
    """Wait until cancelled."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        cancelled.append("cancelled")
        raise
    return "never"


@server.tool(name="cancelled")
def cancelled_so_far() -> int:
    """How many `wait` calls were cancelled."""
    return len(cancelled)


@server.tool()
async def change(ctx: Context[Any, Any]) -> str:
    """Tell the listening clients that the tools changed."""
    await ctx.notify_tools_changed()
    return "told"


@server.tool()
def pid() -> int:
    """This process's id."""
    return os.getpid()


@server.tool(name="exit")
def exit_now() -> str:
    """End the process at once, answering nothing."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
