"""The stdio MCP server the benchmark calls through the bridge and directly: one tool, `echo`.

    python -m commands.bench.stdio_server           # answers on stdin and stdout
    python -m commands.bench.stdio_server NAME      # the same, its tool named NAME
    python -m commands.bench.stdio_server silent    # never answers anything (a broken server)

Made with the SDK's `MCPServer`, as most stdio servers people run are, so the hop measured is the
bridge's and the router's, not a server's of our own making. The SDK serves whichever protocol era
its first request speaks.
"""

from __future__ import annotations

import sys
import time

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


def echo(text: str) -> str:
    """Answer the text given."""
    return text


if __name__ == "__main__":
    if sys.argv[1:] == ["silent"]:
        time.sleep(86_400)  # reads nothing and answers nothing, as a server stuck at its start
    else:
        server.add_tool(echo, name=sys.argv[1] if sys.argv[1:] else "echo")
        server.run()
