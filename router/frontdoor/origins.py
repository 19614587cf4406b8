"""The Host and Origin a request may carry: the router's guard against DNS rebinding.

A web page on evil.example can have a browser resolve that name to 127.0.0.1 and call a router that
listens there: the request then carries `Host: evil.example:8000` and, from a browser,
`Origin: http://evil.example:8000`. The MCP transport requires servers to validate Origin; the
router checks both, on every request:

- **Host** must be a name the router answers to: `router.allowed_hosts` when set; otherwise, for a
  loopback listen address, `localhost`, `127.0.0.1` and `[::1]` (and the listen host itself), for
  another address that address, on any port: a rebinding page cannot make its Host one of these
  names, whatever the port, and a port of its own may sit in front (a proxy, several replicas). A
  wildcard bind (`0.0.0.0`, `::`), as in a container, does not know the names it is reached by,
  so Host is not checked there unless `allowed_hosts` is set; set it wherever browsers reach it.
- **Origin**, when a browser sends one, must be in `router.allowed_origins` or be one of the
  router's own origins (http or https on an allowed host; with the host check off, the request's
  own Host). A request without Origin (every client that is not a browser) passes.

Patterns: hosts `HOST`, `HOST:PORT`, `HOST:*`; origins `scheme://HOST[:PORT]`, `scheme://HOST:*`,
`null`; `*` allows anything. A refused request gets 403 with a JSON-RPC error naming the header and
the key that allows it, after its body is drained (router/frontdoor/bodies.py); refusals are logged once per
burst (router/frontdoor/bursts.py).

A page of an allowed origin also gets what a browser needs to call across origins (CORS): a
preflight `OPTIONS` is answered 204 with the methods and MCP headers it may send, and answers carry
`Access-Control-Allow-Origin` with the page's origin and expose `Mcp-Session-Id` and
`WWW-Authenticate`. Refused origins get none of it.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from dataclasses import dataclass

from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.error_answers import jsonrpc_error_response
from router.frontdoor.bodies import Body, answer_early
from router.frontdoor.bursts import BurstLog

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_CORS_ALLOW_HEADERS = (
    b"authorization, content-type, accept, mcp-session-id, mcp-protocol-version, last-event-id"
)
_CORS_EXPOSE_HEADERS = b"mcp-session-id, mcp-protocol-version, www-authenticate, x-request-id"
_WILDCARDS = ("0.0.0.0", "::", "[::]", "")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _split(authority: str) -> tuple[str, str | None]:
    """(host, port or None) of `host[:port]`, IPv6 hosts in brackets; lowercased."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        host, rest = authority[: end + 1], authority[end + 1 :]
        return host, rest[1:] if rest.startswith(":") else None
    host, sep, port = authority.rpartition(":")
    return (host, port) if sep else (authority, None)


def _same(pattern: tuple[str, str | None], host: str, port: str | None, scheme: str) -> bool:
    """Whether `host:port` (as sent over `scheme`) matches a host pattern; no port is the default."""
    pattern_host, pattern_port = pattern
    if pattern_host != host:
        return False
    if pattern_port == "*":
        return True
    default = str(_DEFAULT_PORTS.get(scheme, 80))
    return (pattern_port or default) == (port or default)


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    """Which Host and Origin values requests may carry."""

    hosts: tuple[str, ...] | None  # Host patterns; None: Host is not checked
    origins: tuple[str, ...]  # router.allowed_origins, as configured

    @classmethod
    def for_listen(cls, listen: str, allowed_hosts: list[str], allowed_origins: list[str]) -> HostPolicy:
        """The policy of `router.listen` and the two lists (docs/router.md, "Host and Origin")."""
        if allowed_hosts:
            return cls(None if "*" in allowed_hosts else tuple(allowed_hosts), tuple(allowed_origins))
        host = _split(listen)[0]
        if host in _WILDCARDS:
            return cls(None, tuple(allowed_origins))
        names = (*LOOPBACK_NAMES, host) if is_loopback(host) else (host,)
        return cls(tuple(f"{name}:*" for name in dict.fromkeys(names)), tuple(allowed_origins))

    def _host_patterns(self) -> list[tuple[str, str | None]]:
        return [_split(h) for h in self.hosts or ()]

    def host_problem(self, scope: Scope, headers: Headers) -> str | None:
        """Why the Host header is refused; None when it is allowed (or not checked, or absent)."""
        value = headers.get("host")
        if self.hosts is None or value is None:  # HTTP/1.0 without Host: not a browser
            return None
        host, port = _split(value)
        patterns = self._host_patterns()
        if any(_same(p, host, port, scope.get("scheme", "http")) for p in patterns):
            return None
        names = ", ".join(f"{h}:{p}" if p else h for h, p in patterns)
        return (
            f"Host header {_clip(value)} is not allowed: this router answers to {names} (a guard "
            "against DNS rebinding). To serve it under that name, add it to router.allowed_hosts."
        )

    def origin_problem(self, scope: Scope, headers: Headers) -> str | None:
        """Why the Origin header is refused; None when it is allowed or absent."""
        value = headers.get("origin")
        if value is None or "*" in self.origins:
            return None
        origin = value.strip().lower()
        if origin in self.origins:
            return None
        scheme, sep, authority = origin.partition("://")
        if sep and scheme in _DEFAULT_PORTS and "/" not in authority:
            host, port = _split(authority)
            listed = [_split(o.partition("://")[2]) for o in self.origins if o.startswith(scheme + "://")]
            own = self._host_patterns() if self.hosts is not None else [_split(headers.get("host", ""))]
            if any(_same(p, host, port, scheme) for p in [*listed, *own]):
                return None
        return (
            f"Origin {_clip(value)} is not allowed: browsers may call this router only from its own "
            "origin (a guard against DNS rebinding and cross-site calls). To let pages of that origin "
            "call it, add it to router.allowed_origins."
        )


def _clip(value: str, limit: int = 100) -> str:
    return json.dumps(value if len(value) <= limit else value[:limit] + "...")


class OriginGuard:
    """ASGI: refuses (403) a request whose Host or Origin the policy does not allow."""

    def __init__(self, app: ASGIApp, policy: HostPolicy, drain_limit: int) -> None:
        self.app = app
        self.policy = policy
        self.drain_limit = drain_limit
        self.refusals = BurstLog(
            logger, "refused requests for another Host or Origin", "router.allowed_hosts, allowed_origins"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = self.policy.host_problem(scope, headers) or self.policy.origin_problem(scope, headers)
        origin = headers.get("origin")
        if problem is None and origin is None:
            await self.app(scope, receive, send)
            return
        if problem is None:
            await self._cross_origin(origin or "", scope, receive, send)
            return
        self.refusals.note(problem.split(" is not allowed")[0])
        response = jsonrpc_error_response(403, INVALID_REQUEST, problem)
        await answer_early(response, Body(receive, headers, 0, self.drain_limit), scope, send)

    async def _cross_origin(self, origin: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve an allowed origin's request with the CORS headers a browser needs."""
        cors = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-expose-headers", _CORS_EXPOSE_HEADERS),
            (b"vary", b"Origin"),
        ]
        preflight = scope["method"] == "OPTIONS" and "access-control-request-method" in Headers(scope=scope)
        if preflight:
            allow = [
                (b"access-control-allow-methods", b"GET, POST, DELETE"),
                (b"access-control-allow-headers", _CORS_ALLOW_HEADERS),
                (b"access-control-max-age", b"600"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": cors + allow})
            await send({"type": "http.response.body", "body": b""})
            return

        async def with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, with_cors)
