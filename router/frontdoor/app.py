"""The router application: MCP Streamable HTTP at `/mcp`, health at `/healthz` and `/readyz`, `/metrics`,
and the status page at `/status` and `/status.json` (router/observe/status_page.py). With
`router.health_listen`, the three health routes are also served on a port of their own, outside
the Host and Origin guard (router/frontdoor/health_port.py).

`create_app` builds a plain Starlette app (the SDK's own framework); its lifespan opens what every
request shares (the gRPC channel to the indexer, the backends' connection pools, the SDK's
stateless session managers behind the session layer: JSON answers, and SSE for calls that
ask for progress or log messages), hands it to requests as lifespan state, and
closes it on shutdown. Every request first passes the Host and Origin guard (router/frontdoor/origins.py).
In `jwt` mode the app also serves its OAuth protected resource metadata
(router/frontdoor/resource_metadata.py).
`serve` runs the app under uvicorn with the front door's bounds (router/frontdoor/server.py;
`toolsearch router --config FILE`).
"""

from __future__ import annotations

import gc
import logging
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TypedDict

import anyio
import httpx2
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from router.caller import Authenticator
from router.errors import AuthConfigError
from router.frontdoor.auth import AnonymousAuthenticator, configured_authenticator
from router.frontdoor.bodies import DRAIN_FACTOR
from router.frontdoor.direct_calls import DirectCalls
from router.frontdoor.health_port import HealthPort
from router.frontdoor.mcp_server import build_server
from router.frontdoor.origins import HostPolicy, OriginGuard
from router.frontdoor.resource_metadata import ResourceMetadata
from router.frontdoor.server import ShutdownGuard, bind_all, router_server
from router.frontdoor.session_layer import Handoffs, SessionLayer
from router.frontdoor.streams.held import Stopping
from router.frontdoor.streams.standalone import StandaloneStreams
from router.handlers.listens import Listens
from router.handlers.log_levels import LogLevels
from router.handlers.meta_tools import MetaTools
from router.handlers.notifications import Notifications
from router.handlers.prompts import Prompts
from router.handlers.resources import Resources
from router.link.indexer_client import IndexerClient
from router.observe.access_log import AccessInterceptor, AccessLog
from router.observe.latency_window import FindToolLatency
from router.observe.metrics import RequestObserver, RouterMetrics
from router.observe.status_page import StatusPage
from router.upstream.calls.backends import BackendCaller
from router.upstream.rounds.input_rounds import InputRounds
from router.upstream.session_wide.backend_listens import BackendListens
from router.upstream.session_wide.backend_notices import BackendNotices
from router.upstream.session_wide.backend_requests import BackendRequests
from router.upstream.session_wide.backend_streams import BackendStreams
from router.upstream.wire.pools import BackendPools
from toolsearch.config import Config
from toolsearch.sections.settings import port_of
from toolsearch.transport import ChannelSecurity, TransportConfigError, channel_security

logger = logging.getLogger(__name__)


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
    stopping: Stopping | None = None,
) -> Starlette:
    """The router app for `config`.

    `secrets` holds the values of backends' `header` credentials and of the indexer's shared secret
    (entry points pass the environment); `authenticator` decides who callers are (default: everyone
    is anonymous); `backend_transport` replaces the backends' connection pools with one transport
    (the app then leaves closing it to the caller); `indexer_security` is the link to the indexer's
    protection (default: read from `config` and `secrets`, raising `TransportConfigError`);
    `stopping` ends the standalone streams when the server begins to stop.
    """
    settings = config.router
    security = indexer_security or channel_security(settings, secrets)
    metrics = RouterMetrics()
    resource_metadata = ResourceMetadata(settings.auth) if settings.auth.mode == "jwt" else None
    authenticator = authenticator or AnonymousAuthenticator()
    latency = FindToolLatency()
    status_page = StatusPage(authenticator, latency)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[RouterState]:
        indexer = IndexerClient(
            settings.indexer,
            settings.indexer_timeout,
            interceptors=[metrics.indexer_interceptor(), AccessInterceptor()],
            security=security,
            open_session_timeout=settings.open_session_timeout,
        )
        pools = BackendPools(settings.max_connections_per_backend, backend_transport)
        backends = BackendCaller(pools, indexer, secrets)
        requests = BackendRequests(indexer, backends)
        tools = MetaTools(
            requests, config.indexer.search, settings.max_arguments_bytes, pinned=settings.pinned
        )
        streams = BackendStreams(indexer, backends)
        backend_listens = BackendListens(backends)
        notifications = Notifications(requests, streams, backend_listens)
        standalone = StandaloneStreams(notifications, stopping)
        listens = Listens(
            requests,
            backend_listens,
            notifications,
            settings.pinned,
            standalone.stopping.wait,
        )
        server = build_server(
            tools, metrics, Resources(requests), Prompts(requests), LogLevels(requests), listens
        )
        manager = StreamableHTTPSessionManager(
            server, stateless=True, json_response=True, max_request_body_size=settings.max_body_bytes
        )
        # the same server, answering with an SSE stream: for calls that asked for progress
        streaming = StreamableHTTPSessionManager(
            server, stateless=True, json_response=False, max_request_body_size=settings.max_body_bytes
        )
        # direct calls are observed as the SDK's tools/call handler is (build_server)
        direct = DirectCalls(AccessLog.observe_tool_calls(metrics.observe_tool_calls(tools.answer_directly)))
        handoffs = Handoffs(streaming.handle_request, BackendNotices(requests), standalone, direct)
        sessions = SessionLayer(
            manager.handle_request,
            indexer,
            authenticator,
            settings.max_body_bytes,
            resource_metadata,
            handoffs,
        )
        try:
            async with manager.run(), streaming.run(), anyio.create_task_group() as rounds:
                # where the calls a backend may ask a 2026-07-28 client something run; they end
                # with the app (router/upstream/rounds/input_rounds.py)
                requests.rounds = InputRounds(indexer, backends, rounds)
                yield {"indexer": indexer, "sessions": sessions}
                rounds.cancel_scope.cancel()
        finally:
            await pools.aclose()
            await indexer.close()

    async def prometheus_metrics(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    health_routes = [
        Route("/healthz", _healthz),
        Route("/readyz", _readyz),
        Route("/metrics", prometheus_metrics),
    ]
    # the health port's own app (router/frontdoor/health_port.py): the three routes, no Host guard
    health_port = (
        [
            Middleware(
                HealthPort,
                port=port_of(settings.health_listen),
                health=Starlette(
                    routes=health_routes,
                    middleware=[Middleware(RequestObserver, metrics=metrics)],
                    exception_handlers={HTTPException: _http_error},
                ),
            )
        ]
        if settings.health_listen is not None
        else []
    )
    return Starlette(
        routes=[
            Route("/mcp", _Mcp()),
            *health_routes,
            *status_page.routes(),
            *(resource_metadata.routes() if resource_metadata is not None else []),
        ],
        middleware=[
            *health_port,
            Middleware(RequestObserver, metrics=metrics),
            Middleware(AccessLog, listeners=[latency.observe]),
            Middleware(ShutdownGuard, grace=settings.shutdown_grace),
            Middleware(
                OriginGuard,
                policy=HostPolicy.for_listen(
                    settings.listen, settings.allowed_hosts, settings.allowed_origins
                ),
                drain_limit=DRAIN_FACTOR * settings.max_body_bytes,
            ),
        ],
        exception_handlers={HTTPException: _http_error},
        lifespan=lifespan,
    )


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
    stopping = Stopping()
    app = create_app(config, environ, authenticator, indexer_security=security, stopping=stopping)
    server = router_server(app, config.router, log_level, log_format, stopping)
    sockets = None
    if config.router.health_listen is not None:
        # both listeners bound here, and served by the one server (router/frontdoor/health_port.py)
        try:
            sockets = bind_all([config.router.listen, config.router.health_listen])
        except OSError as exc:
            print(f"router: {exc}", file=sys.stderr)
            return 1
    # What start-up made lives as long as the process (the modules, their classes and schemas, the
    # app): frozen, the collector no longer walks it on each full collection, a tenth of the
    # router's CPU under load (docs/performance.md, section 6)
    gc.collect()
    gc.freeze()
    server.run(sockets=sockets)
    return 0 if server.started else 1
