"""What the bridge's clients reach: the endpoint of each backend, `/<backend id>/mcp`, a handshake-era
one in front of the SDK's session manager and a 2026-07-28 one that passes each request on."""
