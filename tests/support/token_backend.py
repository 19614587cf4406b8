"""MCP backends for the credential tests: each checks, or only records, the bearer token it is sent.

    python -m tests.support.token_backend --port PORT --public-key key.pub.pem \\
        --backend crm=exchanged --backend notes=open

Each `--backend NAME=KIND` is served at `/NAME/mcp` (Streamable HTTP, one tool `whoami_NAME`):

- `exchanged`: requires `Authorization: Bearer <JWT>` signed ES256 by the token endpoint's key
  (tests/support/token_endpoint.py), issued by it, with `aud` NAME and an `exp` to come; anything
  else gets 401 with a `WWW-Authenticate` challenge. `whoami_NAME` answers the token's claims as JSON.
  `POST /control/refuse?backend=NAME&subject=S` makes it refuse that subject's tokens (401).
- `open`: accepts every request and answers `{}`.

`POST /control/down?backend=NAME` makes a backend answer 503 to everything, `/control/up` undoes it.

Every backend records the headers of every request it got: `GET /control/seen?backend=NAME` answers
`{"requests": N, "values": [every header value, in order]}`, so a test can tell whether a caller's
token reached a backend in any header at all.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import jwt
import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.token_endpoint import ISSUER

Scope = MutableMapping[str, Any]
Asgi = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class Backend:
    """One backend: its kind, what it refuses, and what it was sent."""

    def __init__(self, name: str, kind: str, public_key: str) -> None:
        self.name, self.kind, self.public_key = name, kind, public_key
        self.refused: set[str] = set()
        self.down = False
        self.values: list[str] = []
        self.requests = 0

    def claims(self, headers: Headers) -> dict[str, Any] | None:
        """The verified claims of the request's token; None when it must be refused."""
        if self.kind == "open":
            return {}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return None
        try:
            claims = jwt.decode(
                token, self.public_key, algorithms=["ES256"], audience=self.name, issuer=ISSUER
            )
        except jwt.PyJWTError:
            return None
        return None if claims.get("sub") in self.refused else claims

    def guard(self, inner: Asgi) -> Guarded:
        return Guarded(self, inner)

    def server(self) -> Server[Any]:
        tool = types.Tool(
            name=f"whoami_{self.name}",
            description=f"Who the {self.name} backend was called as: its token's claims",
            input_schema={"type": "object"},
        )

        async def list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=[tool])

        async def call_tool(
            ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            request = ctx.request
            claims = self.claims(request.headers) if isinstance(request, Request) else None
            return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(claims))])

        return Server(self.name, on_list_tools=list_tools, on_call_tool=call_tool)


class Guarded:
    """A backend's MCP endpoint behind its check: an ASGI app (a class, so Starlette routes it as one)."""

    def __init__(self, backend: Backend, inner: Asgi) -> None:
        self.backend, self.inner = backend, inner

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        backend = self.backend
        headers = Headers(scope=scope)
        backend.requests += 1
        backend.values.extend(value for _, value in headers.items())
        if backend.down:
            await JSONResponse({"error": "down"}, 503)(scope, receive, send)
            return
        if backend.claims(headers) is None:
            challenge = f'Bearer realm="{backend.name}", error="invalid_token"'
            response = JSONResponse({"error": "invalid_token"}, 401, {"WWW-Authenticate": challenge})
            await response(scope, receive, send)
            return
        await self.inner(scope, receive, send)


def build_app(backends: list[Backend]) -> Starlette:
    by_name = {b.name: b for b in backends}
    managers = [StreamableHTTPSessionManager(b.server(), json_response=True) for b in backends]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        async with AsyncExitStack() as stack:
            for manager in managers:
                await stack.enter_async_context(manager.run())
            yield

    async def seen(request: Request) -> Response:
        backend = by_name[request.query_params["backend"]]
        return JSONResponse({"requests": backend.requests, "values": backend.values})

    async def refuse(request: Request) -> Response:
        backend = by_name[request.query_params["backend"]]
        backend.refused.add(request.query_params["subject"])
        return JSONResponse({"refused": sorted(backend.refused)})

    async def switch(request: Request) -> Response:
        backend = by_name[request.query_params["backend"]]
        backend.down = request.path_params["action"] == "down"
        return JSONResponse({"down": backend.down})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    routes: list[Any] = [
        Route("/control/seen", seen),
        Route("/control/refuse", refuse, methods=["POST"]),
        Route("/control/{action:str}", switch, methods=["POST"]),
        Route("/healthz", healthz),
    ]
    # a Route, not a Mount: /NAME/mcp itself, without a redirect to /NAME/mcp/
    routes += [
        Route(f"/{b.name}/mcp", endpoint=b.guard(m.handle_request))
        for b, m in zip(backends, managers, strict=True)
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--public-key", required=True, help="PEM of the token endpoint's public key")
    parser.add_argument("--backend", action="append", default=[], help="NAME=exchanged or NAME=open")
    args = parser.parse_args()
    with open(args.public_key) as pem:
        public_key = pem.read()
    backends = [Backend(*spec.split("=", 1), public_key) for spec in args.backend]
    uvicorn.run(build_app(backends), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
