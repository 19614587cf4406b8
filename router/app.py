"""The router application: MCP Streamable HTTP at `/mcp`, health at `/healthz` and `/readyz`, `/metrics`.

`create_app` builds the FastAPI app; its lifespan opens what every request shares (the gRPC channel
to the indexer, the HTTP connection pool to the backends, the SDK's stateless session manager) and
closes them on shutdown. `serve` runs it under uvicorn (`toolsearch router --config FILE`).
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
from typing import Any

import httpx2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INTERNAL_ERROR, CallToolRequestParams
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from router.auth import AnonymousAuthenticator, authenticator_for
from router.backends import BackendCaller, create_transport
from router.errors import AuthConfigError
from router.indexer_client import IndexerClient
from router.meta_tools import MetaTools
from router.metrics import RequestObserver, RouterMetrics
from router.session_layer import Authenticator, SessionLayer, jsonrpc_error
from toolsearch.config import Config, RouterAuth
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security

__all__ = ["build_server", "create_app", "serve"]

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


class _Endpoint:
    """The `/mcp` route: delegates to the session layer the lifespan builds."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            response = jsonrpc_error(
                503, INTERNAL_ERROR, "router starting, retry shortly", headers={"Retry-After": "1"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(
    config: Config,
    secrets: Mapping[str, str],
    authenticator: Authenticator | None = None,
    backend_transport: httpx2.AsyncBaseTransport | None = None,
    indexer_security: ChannelSecurity | None = None,
) -> FastAPI:
    """The router app for `config`.

    `secrets` holds the values of backends' `header` credentials and of the indexer's shared secret
    (entry points pass the environment); `authenticator` decides who callers are (default: everyone
    is anonymous); `backend_transport` replaces the pooled HTTP transport to the backends (the app
    then leaves closing it to the caller); `indexer_security` is the link to the indexer's protection
    (default: read from `config` and `secrets`, raising `TransportConfigError`).
    """
    settings = config.router
    security = indexer_security or channel_security(settings, secrets)
    endpoint = _Endpoint()
    metrics = RouterMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
        app.state.indexer = indexer
        try:
            async with manager.run():
                endpoint.app = SessionLayer(
                    manager.handle_request,
                    indexer,
                    authenticator or AnonymousAuthenticator(),
                    settings.max_body_bytes,
                )
                yield
        finally:
            endpoint.app = None
            if backend_transport is None:
                await transport.aclose()
            await indexer.close()

    app = FastAPI(
        title="toolsearch router", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None
    )
    app.router.routes.append(Route("/mcp", endpoint=endpoint))
    app.add_middleware(RequestObserver, metrics=metrics)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        indexer: IndexerClient = request.app.state.indexer
        statuses = await indexer.check_health()
        if "SERVING" in statuses.values():
            return JSONResponse({"status": "ready", "indexer": statuses})
        reason = "no indexer answers the health check with SERVING"
        return JSONResponse({"status": "not ready", "reason": reason, "indexer": statuses}, status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return app


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
