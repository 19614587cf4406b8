"""The router application: MCP Streamable HTTP at `/mcp`, health at `/healthz` and `/readyz`, `/metrics`.

`create_app` builds a plain Starlette app (the SDK's own framework); its lifespan opens what every
request shares (the gRPC channel to the indexer, the HTTP connection pool to the backends, the SDK's
stateless session manager behind the session layer), hands it to requests as lifespan state, and
closes it on shutdown. `serve` runs the app under uvicorn (`toolsearch router --config FILE`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypedDict

import httpx2
import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import CallToolRequestParams
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from router.auth import AnonymousAuthenticator, Authenticator, authenticator_for
from router.backends import BackendCaller, create_transport
from router.errors import AuthConfigError
from router.indexer_client import IndexerClient
from router.meta_tools import MetaTools
from router.metrics import RequestObserver, RouterMetrics
from router.session_layer import SessionLayer
from toolsearch.config import Config, RouterAuth
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security

logger = logging.getLogger(__name__)

INSTRUCTIONS = (
    "This server fronts many tools through two: find_tool searches them by what you need done and "
    "returns the best matches with their input schemas; call_tool runs one of them by name."
)
# The two meta-tools never change while the router runs, so clients may keep the list a while.
_TOOLS_LIST_HINT = CacheHint(ttl_ms=600_000, scope="public")


def build_server(tools: MetaTools, metrics: RouterMetrics | None = None) -> Server[Any]:
    """The MCP server behind `/mcp`: `tools/list` and `tools/call` answered by the meta-tools.

    With `metrics`, every `tools/call` is counted and timed.
    """
    server: Server[Any] = Server(
        "toolsearch",
        version="0.1.0",
        instructions=INSTRUCTIONS,
        cache_hints={"tools/list": _TOOLS_LIST_HINT},
        get_tool_input_schema=tools.input_schema,
        on_list_tools=tools.list_tools,
    )
    # Registered directly so the handler may return the wire dict it built (find_tool's answer).
    handler = metrics.observe_tool_calls(tools.call_tool) if metrics is not None else tools.call_tool
    server.add_request_handler("tools/call", CallToolRequestParams, handler)
    return server


class RouterState(TypedDict):
    """What the lifespan opens for every request, handed to requests as Starlette lifespan state.

    An ASGI server copies it into each request's `scope["state"]`; handlers read `request.state`.
    """

    indexer: IndexerClient
    sessions: SessionLayer  # `/mcp`: the session layer in front of the SDK's handler


class _Mcp:
    """`/mcp`: the session layer the lifespan built.

    An object rather than a function: Starlette routes an object as an ASGI app, a function as a
    request handler.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: RouterState = scope["state"]
        await state["sessions"](scope, receive, send)


async def _healthz(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def _readyz(request: Request[RouterState]) -> JSONResponse:
    statuses = await request.state["indexer"].check_health()
    if "SERVING" in statuses.values():
        return JSONResponse({"status": "ready", "indexer": statuses})
    reason = "no indexer answers the health check with SERVING"
    return JSONResponse({"status": "not ready", "reason": reason, "indexer": statuses}, status_code=503)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    # Routing's 404 and 405 answer JSON, as everything else the router says does.
    assert isinstance(exc, HTTPException)  # the only exception it is registered for
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def create_app(
    config: Config,
    secrets: Mapping[str, str],
    authenticator: Authenticator | None = None,
    backend_transport: httpx2.AsyncBaseTransport | None = None,
    indexer_security: ChannelSecurity | None = None,
) -> Starlette:
    """The router app for `config`.

    `secrets` holds the values of backends' `header` credentials and of the indexer's shared secret
    (entry points pass the environment); `authenticator` decides who callers are (default: everyone
    is anonymous); `backend_transport` replaces the pooled HTTP transport to the backends (the app
    then leaves closing it to the caller); `indexer_security` is the link to the indexer's protection
    (default: read from `config` and `secrets`, raising `TransportConfigError`).
    """
    settings = config.router
    security = indexer_security or channel_security(settings, secrets)
    metrics = RouterMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[RouterState]:
        indexer = IndexerClient(
            settings.indexer,
            settings.indexer_timeout,
            interceptors=[metrics.indexer_interceptor()],
            security=security,
            open_session_timeout=settings.open_session_timeout,
        )
        transport = backend_transport or create_transport()
        tools = MetaTools(
            indexer,
            BackendCaller(transport),
            config.indexer.search,
            secrets,
            max_arguments_bytes=settings.max_arguments_bytes,
        )
        manager = StreamableHTTPSessionManager(
            build_server(tools, metrics),
            stateless=True,
            json_response=True,
            max_request_body_size=settings.max_body_bytes,
        )
        sessions = SessionLayer(
            manager.handle_request,
            indexer,
            authenticator or AnonymousAuthenticator(),
            settings.max_body_bytes,
        )
        try:
            async with manager.run():
                yield {"indexer": indexer, "sessions": sessions}
        finally:
            if backend_transport is None:
                await transport.aclose()
            await indexer.close()

    async def prometheus_metrics(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return Starlette(
        routes=[
            Route("/mcp", _Mcp()),
            Route("/healthz", _healthz),
            Route("/readyz", _readyz),
            Route("/metrics", prometheus_metrics),
        ],
        middleware=[Middleware(RequestObserver, metrics=metrics)],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )


class _Server(uvicorn.Server):
    """uvicorn, saying where it listens once it does, and exiting 0 after a drained SIGTERM."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"router listening on http://{host}:{port}/mcp", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured signal once it has shut down, so the process would die by
        # SIGTERM after draining: a graceful stop is a clean exit, so that one is not re-raised.
        with super().capture_signals():
            yield
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def configured_authenticator(settings: RouterAuth, environ: Mapping[str, str]) -> Authenticator:
    """The authenticator of `router.auth`, its key material read from `environ` and the JWKS file."""
    if settings.mode == "anonymous":
        return AnonymousAuthenticator()
    secret = None
    if settings.hs256_secret_env:
        secret = environ.get(settings.hs256_secret_env)
        if not secret:
            name = settings.hs256_secret_env
            raise AuthConfigError(f"router.auth.hs256_secret_env: the environment variable {name} is not set")
    jwks = None
    if settings.jwks_file is not None:
        try:
            jwks = json.loads(settings.jwks_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise AuthConfigError(
                f"router.auth.jwks_file: cannot read {settings.jwks_file} ({exc.strerror})"
            ) from None
        except ValueError:
            raise AuthConfigError(f"router.auth.jwks_file: {settings.jwks_file} is not JSON") from None
        if not isinstance(jwks, dict):
            raise AuthConfigError(f"router.auth.jwks_file: {settings.jwks_file} is not a JSON Web Key Set")
    return authenticator_for(settings, secret, jwks)


def serve(config: Config, environ: Mapping[str, str], log_level: str, log_format: str) -> int:
    """Serve `config` under uvicorn until interrupted; returns the exit code.

    `environ` holds the key material the configuration names (entry points pass the environment).
    """
    try:
        authenticator = configured_authenticator(config.router.auth, environ)
        security = channel_security(config.router, environ)
    except (AuthConfigError, TransportConfigError) as exc:
        print(f"router: {exc}", file=sys.stderr)
        return 2
    host, _, port = config.router.listen.rpartition(":")
    server = _Server(
        uvicorn.Config(
            create_app(config, environ, authenticator, indexer_security=security),
            host=host,
            port=int(port),
            log_level=log_level,
            access_log=log_level in ("debug", "trace"),
            # uvicorn types it as int; a float works the same (an asyncio timeout)
            timeout_graceful_shutdown=config.router.shutdown_grace,  # type: ignore[arg-type]
            # JSON lines: uvicorn's loggers reach the root handler instead of uvicorn's own text ones
            log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        )
    )
    server.run()
    return 0 if server.started else 1
