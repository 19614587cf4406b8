"""Speaking MCP to a started server: its client session, the server the bridge shows in front of it,
a 2026-07-28 server's requests passed as they came, and which caller a server's request goes to."""
