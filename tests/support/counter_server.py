"""A stateful stdio MCP server made with the SDK's `MCPServer` (FastMCP), as people write them.

    python tests/support/counter_server.py

One tool, `increment`, adds one to a counter the process keeps and answers the new count and the
process id (`{"count": 2, "pid": 4242}`): a caller that shares a process with another sees the
other's increments, and one whose process was replaced sees its count start again at 1.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("counter")
count = 0


@server.tool()
def increment() -> str:
    """Add one to this process's counter and answer the new count."""
    global count  # noqa: PLW0603  # the process's state is the point of the server
    count += 1
    return json.dumps({"count": count, "pid": os.getpid()})


if __name__ == "__main__":
    server.run("stdio")
