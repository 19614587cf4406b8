"""`toolsearch catalog-server`: every server of a catalog file as its own MCP endpoint.

One uvicorn process with one lowlevel MCP `Server` and one stateless session manager serves
`/servers/<slug>/mcp` for each server of the catalog; the handlers find the server from the request
path. `tools/list` pages through that server's tools; `tools/call` validates the arguments against
the tool's inputSchema and echoes them back. It stands in for real backends in demos and tests:

- servers named with `--require-jwt` demand `Authorization: Bearer <JWT>` (HS256): 401 with
  `WWW-Authenticate: Bearer` for a missing, malformed, badly signed or expired token, 403 for a
  subject outside `--allowed-subjects`;
- `--control` adds a testing and demo aid, without authentication (keep it on loopback):
  `GET /control/servers` (state), `POST /control/servers/<slug>/down` (every MCP request answers
  503) and `/up`, `POST /control/servers/<slug>/slow?seconds=X` (delay every MCP response; 0 ends
  it), `POST /control/servers/<slug>/stall?seconds=X` (delay only tools/call results: calls hang
  while listings, and so health probes, answer at once; 0 ends it),
  `POST /control/servers/<slug>/pad?bytes=N` (every tools/call result carries N bytes more, in a
  second text block: an oversized answer; 0 ends it), `POST /control/servers/<slug>/tools` with
  a JSON list of tool definitions that replaces the server's tool list (stateless, so no
  list_changed notification: clients see it on their next tools/list), and
  `POST /control/servers/<slug>/subjects` with a JSON list of the subjects that server lets in from
  now on (`null`: every subject), for a server that requires a JWT;
  `POST /control/servers/<slug>/garble?as=json|html` (every MCP request answers 200 with truncated
  JSON, or with an HTML page: a broken backend or a proxy's error page; `as=off` ends it);
  `GET /control/servers/<slug>/calls` counts the `tools/call` requests that server has handled
  (`calls`) and the MCP requests it has received, on arrival, before any delay (`requests`);
- `--sessions` serves them as most servers people run are served: in the initialize handshake
  only (`server/discover` is refused), each client session with an `Mcp-Session-Id` of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import jwt
import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from commands.catalog_control import GARBLED, Control, ServedServer, clip, prepare_tools
from toolsearch.catalog import (
    CatalogError,
    CatalogTool,
    argument_problem,
    group_by_server,
    load_catalog,
    server_slug,
)
from toolsearch.tracing import configure_tracing
from toolsearch.transport import MIN_SECRET_BYTES

DEFAULT_SECRET_ENV = "TOOLSEARCH_CATALOG_JWT_SECRET"
ALL_SERVERS = "*"

# pyjwt's own messages can quote parts of the token; clients get these fixed ones instead.
_TOKEN_PROBLEMS: tuple[tuple[type[jwt.InvalidTokenError], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet"),
    (jwt.InvalidAudienceError, "the token is not meant for this server (aud)"),
    (jwt.InvalidAlgorithmError, "the token must be signed with HS256"),
    (jwt.InvalidSignatureError, "the token's signature does not verify"),
    (jwt.DecodeError, "the token is not a well-formed JWT"),
)


@dataclass(frozen=True, slots=True)
class CatalogServerSettings:
    """What a catalog server enforces and offers besides its catalog."""

    page_size: int = 100  # tools per tools/list page
    require_jwt: frozenset[str] = frozenset()  # server names or slugs, or "*" for every server
    jwt_secret: str | None = None  # the HS256 secret tokens are checked with
    jwt_audience: str | None = None  # when set, tokens must name it in `aud`
    allowed_subjects: frozenset[str] | None = None  # when set, the only `sub` values let in
    control: bool = False  # serve the /control API
    sessions: bool = False  # the initialize handshake only, with a session per client

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page size must be at least 1, got {self.page_size}")
        if self.require_jwt and not self.jwt_secret:
            raise ValueError("servers that require a JWT need the secret to check tokens with")
        if self.jwt_secret is not None and len(self.jwt_secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"the JWT secret must be at least {MIN_SECRET_BYTES} bytes long (HS256)")
        if not self.require_jwt and (self.allowed_subjects is not None or self.jwt_audience is not None):
            raise ValueError("allowed subjects and a JWT audience only apply to servers that require a JWT")


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _rpc_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """An HTTP error whose body is a JSON-RPC error, so MCP clients surface the message."""
    error = {"code": -32600, "message": message, "data": {"status": status}}
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=status, headers=headers)


def _unauthorized(message: str, error: str | None = None) -> Response:
    challenge = 'Bearer realm="toolsearch-catalog"'
    if error is not None:
        challenge += f', error="{error}", error_description="{message}"'
    return _rpc_error(401, message, {"WWW-Authenticate": challenge})


class _CatalogService:
    """The served servers, their MCP handlers, and the MCP endpoint around them."""

    def __init__(self, catalog: list[CatalogTool], settings: CatalogServerSettings) -> None:
        self.settings = settings
        groups = group_by_server(catalog)
        wanted = {name if name == ALL_SERVERS else server_slug(name) for name in settings.require_jwt}
        if unknown := sorted(wanted - set(groups) - {ALL_SERVERS}):
            raise CatalogError(f"servers required to use a JWT are not in the catalog: {', '.join(unknown)}")
        self.backends = {
            slug: ServedServer(
                slug, tools[0].server, prepare_tools(tools), ALL_SERVERS in wanted or slug in wanted
            )
            for slug, tools in groups.items()
        }
        for backend in self.backends.values():
            backend.allowed_subjects = settings.allowed_subjects if backend.requires_jwt else None
        mcp: Server[Any] = Server(
            "toolsearch-catalog", on_list_tools=self.list_tools, on_call_tool=self.call_tool
        )
        if settings.sessions:
            mcp.add_request_handler("server/discover", types.RequestParams, _refuse_discover)
        self.manager = StreamableHTTPSessionManager(mcp, stateless=not settings.sessions, json_response=True)

    def _backend_of(self, ctx: ServerRequestContext[Any]) -> ServedServer:
        request = ctx.request
        slug = request.path_params.get("slug") if isinstance(request, Request) else None
        backend = self.backends.get(slug) if isinstance(slug, str) else None
        if backend is None:
            raise MCPError(types.INTERNAL_ERROR, "the request reached the MCP handler without a known server")
        return backend

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [definition for definition, _ in self._backend_of(ctx).tools.values()]
        cursor = params.cursor if params is not None else None
        start = 0
        if cursor is not None:
            # cursors are the offsets this server issued; anything else is refused, not guessed at
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) < 10 and int(cursor) < len(tools)):
                raise MCPError(
                    types.INVALID_PARAMS, f"invalid cursor {clip(cursor)}: list again from the start"
                )
            start = int(cursor)
        end = start + self.settings.page_size
        return types.ListToolsResult(
            tools=tools[start:end], next_cursor=str(end) if end < len(tools) else None
        )

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        backend = self._backend_of(ctx)
        backend.calls += 1
        await anyio.sleep(backend.call_delay)
        tool = backend.tools.get(params.name)
        if tool is None:
            return _tool_error(
                f"unknown tool {clip(params.name)}: server {backend.server!r} has no such tool"
            )
        arguments = params.arguments or {}
        problem = argument_problem(tool[1], arguments)
        if problem is not None:
            return _tool_error(f"invalid arguments for {params.name}: {problem}")
        result = {"tool": params.name, "server": backend.server, "arguments": arguments}
        text = json.dumps(result, ensure_ascii=False)
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=text)]
        if backend.pad:
            content.append(types.TextContent(type="text", text="x" * backend.pad))
        return types.CallToolResult(content=content, structured_content=result)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI for `/servers/{slug}/mcp`: refuse what this server would not serve, then serve it."""
        slug = scope["path_params"]["slug"]
        backend = self.backends.get(slug)
        if backend is None:
            rejection: Response | None = _rpc_error(
                404, f"unknown server {clip(slug)}: no server has that slug"
            )
        else:
            backend.requests += 1
            await anyio.sleep(backend.delay)
            rejection = self._rejection(backend, Headers(scope=scope))
        if rejection is not None:
            await rejection(scope, receive, send)
        else:
            await self.manager.handle_request(scope, receive, send)

    def _rejection(self, backend: ServedServer, headers: Headers) -> Response | None:
        if backend.down:
            return _rpc_error(503, f"server {backend.server!r} is down (set through the control API)")
        if backend.garble:
            return GARBLED[backend.garble]
        if not backend.requires_jwt:
            return None
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if not scheme:
            return _unauthorized("this server requires Authorization: Bearer <JWT>")
        if scheme.lower() != "bearer" or not token.strip():
            return _unauthorized("the Authorization header must be Bearer <JWT>", "invalid_request")
        settings = self.settings
        try:
            claims = jwt.decode(
                token.strip(),
                settings.jwt_secret or "",  # never empty here: the settings refuse that
                algorithms=["HS256"],
                audience=settings.jwt_audience,
                options={"verify_aud": settings.jwt_audience is not None},
            )
        except jwt.InvalidTokenError as exc:
            problem = next((text for kind, text in _TOKEN_PROBLEMS if isinstance(exc, kind)), None)
            return _unauthorized(problem or "the token is invalid", "invalid_token")
        if backend.allowed_subjects is not None and claims.get("sub") not in backend.allowed_subjects:
            message = f"subject {clip(claims.get('sub'))} may not use server {backend.server!r}"
            return _rpc_error(403, message, {"WWW-Authenticate": 'Bearer error="insufficient_scope"'})
        return None


async def _json_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)  # the only exception class it is registered for
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(catalog: list[CatalogTool], settings: CatalogServerSettings) -> Starlette:
    """The ASGI app serving every server of `catalog`; raises CatalogError for a bad catalog."""
    service = _CatalogService(catalog, settings)

    async def healthz(request: Request) -> Response:
        tools = sum(len(backend.tools) for backend in service.backends.values())
        return JSONResponse({"status": "ok", "servers": len(service.backends), "tools": tools})

    # `service` is an object, not a function, so Starlette hands it the raw ASGI call
    routes = [Route("/healthz", healthz, methods=["GET"]), Route("/servers/{slug}/mcp", service)]
    if settings.control:
        control = Control(service.backends)
        routes.append(Route("/control/servers", control.state, methods=["GET"]))
        routes.append(Route("/control/servers/{slug}/calls", control.calls, methods=["GET"]))
        routes.append(Route("/control/servers/{slug}/{action}", control.act, methods=["POST"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.manager.run():
            yield

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _json_error})


async def _refuse_discover(ctx: ServerRequestContext[Any], params: types.RequestParams) -> Any:
    raise MCPError(types.METHOD_NOT_FOUND, "this server speaks the initialize handshake only (--sessions)")


class _Uvicorn(uvicorn.Server):
    """uvicorn that says where it listens once its socket is bound (port 0 picks a free one)."""

    def __init__(self, config: uvicorn.Config, banner: str) -> None:
        super().__init__(config)
        self._banner = banner

    async def startup(self, sockets: list[Any] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
            print(f"catalog server listening on {url} ({self._banner})", file=sys.stderr, flush=True)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `toolsearch catalog-server`."""
    parser = subparsers.add_parser(
        "catalog-server",
        help="serve every server of a catalog file as an MCP endpoint",
        description="Serve each server of a catalog (JSON Lines of MCP tools) at /servers/<slug>/mcp; "
        "tool calls validate their arguments and echo them back.",
    )
    add = parser.add_argument
    add("--catalog", type=Path, required=True, help="the catalog file (JSON Lines)")
    add("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    add("--port", type=int, default=9100, help="port to listen on, 0 for any free one (default: 9100)")
    add("--page-size", type=int, default=100, help="tools per tools/list page (default: 100)")
    jwt_help = "servers (names or slugs, * for all) that require Authorization: Bearer <JWT>, HS256"
    add("--require-jwt", nargs="+", action="extend", default=[], metavar="SERVER", help=jwt_help)
    secret_help = f"environment variable holding the HS256 secret (default: {DEFAULT_SECRET_ENV})"
    add("--jwt-secret-env", default=DEFAULT_SECRET_ENV, metavar="NAME", help=secret_help)
    add("--jwt-audience", help="audience tokens must name in aud (default: not checked)")
    add("--allowed-subjects", nargs="+", action="extend", metavar="SUB", help="the only subjects let in")
    add("--control", action="store_true", help="serve the /control API (testing and demos; no auth)")
    add("--sessions", action="store_true", help="the initialize handshake only, a session per client")
    add("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    """Run `toolsearch catalog-server`; returns the exit code."""
    secret = os.environ.get(args.jwt_secret_env) if args.require_jwt else None
    try:
        if args.require_jwt and not secret:
            raise ValueError(
                f"--require-jwt needs the HS256 secret in the environment variable {args.jwt_secret_env}"
            )
        catalog = load_catalog(args.catalog)
        if not catalog:
            raise CatalogError(f"{args.catalog}: the catalog has no tools")
        subjects = args.allowed_subjects
        settings = CatalogServerSettings(
            page_size=args.page_size,
            require_jwt=frozenset(args.require_jwt),
            jwt_secret=secret,
            jwt_audience=args.jwt_audience,
            allowed_subjects=frozenset(subjects) if subjects is not None else None,
            control=args.control,
            sessions=args.sessions,
        )
        app = create_app(catalog, settings)
    except ValueError as exc:  # CatalogError is one
        print(f"toolsearch catalog-server: {exc}", file=sys.stderr)
        return 2
    if args.control and args.host not in ("127.0.0.1", "localhost", "::1"):
        print("toolsearch catalog-server: warning: the control API has no authentication", file=sys.stderr)
    configure_tracing("toolsearch-catalog-server", os.environ)  # its MCP server's spans, with OTEL_*
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
    )
    server = _Uvicorn(config, f"{len(group_by_server(catalog))} servers, {len(catalog)} tools")
    server.run()
    return 0 if server.started else 1
