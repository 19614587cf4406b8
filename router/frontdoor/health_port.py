"""The health port: `/healthz`, `/readyz` and `/metrics` on a listener of their own (`router.health_listen`).

The kubelet probes a container at its pod's IP address, so the Host it sends is that address, which a
router with `router.allowed_hosts` set refuses (the guard against DNS rebinding,
router/frontdoor/origins.py); every probe would fail and the router restart in a loop. A request
that arrives on the health port goes to an app of its own that serves those three routes and
nothing else, outside the Host and Origin guard: a page that rebinds a name to that port reaches no
MCP endpoint, only what a scraper reads. Its connections are outside `router.max_connections` too
(router/frontdoor/connections.py), so a router busy at its limit still answers its probes.

`HealthPort` is the outermost layer of the router app: it tells the health port's requests by the
local port they arrived on (`scope["server"]`) and sends everything else, the lifespan included,
on to the router app, whose lifespan state (the indexer client `/readyz` asks) both share.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

HEALTH_ROUTES = ("/healthz", "/readyz", "/metrics")


class HealthPort:
    """ASGI: requests that arrived on `port` go to `health`, the rest to `app`."""

    def __init__(self, app: ASGIApp, port: int, health: ASGIApp) -> None:
        self.app = app
        self.port = port
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and arrived_on(scope) == self.port:
            await self.health(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def arrived_on(scope: Scope) -> int | None:
    """The local port a request arrived on; None when the server does not say (a test transport)."""
    server = scope.get("server")
    return int(server[1]) if server and server[1] is not None else None
