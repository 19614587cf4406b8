"""The bridge: every stdio and legacy SSE backend of a configuration, each served as Streamable HTTP.

`create_app` builds, per such backend, the forwarding server (bridge/speaking/forwarding.py), the SDK's
stateful session manager in front of it, the endpoint that picks the upstream server
(bridge/serving/endpoints.py), and its keeper: for a stdio backend, `Supervisor` for `isolation: shared`,
`ProcessPool` for `per_session` (with a `Supervisor` of its own as its lister); for a legacy SSE
backend, a `ProcessPool` of event streams, one per session (bridge/transports/legacy.py). A stdio backend of
`protocol: 2026-07-28` has no session manager nor forwarding server: its `Supervisor` keeps a
`ModernUpstream`, and a `ModernEndpoint` passes each request on (bridge/serving/modern_endpoint.py). Besides
`/<backend id>/mcp` it serves `/healthz`
(the bridge answers; every backend's state, as JSON) and `/readyz` (200 once each shared backend's
and each lister's first start has succeeded or failed, so the indexer's first listing does not
race the servers' start; a legacy SSE backend starts nothing before its first session).

Bounds: `bridge.max_sessions` sessions per backend (503 beyond) and `bridge.session_idle_timeout`
(a per_session backend's sessions: its `idle_timeout`; a legacy SSE backend's open streams: at most
`bridge.max_sessions`), the SDK's 4 MiB request bodies, each
backend's call `timeout` and `max_response_bytes`, and the connections uvicorn takes. Hosts: the
listen address, the configured URL's host and loopback, and an Origin of one of them
(DNS rebinding).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from bridge.keeping.first_starts import FirstStarts
from bridge.keeping.listeners import Listeners
from bridge.keeping.pool import ProcessPool
from bridge.keeping.supervisor import Supervisor
from bridge.serving.endpoints import PerSessionEndpoint, SharedEndpoint
from bridge.serving.modern_endpoint import ModernEndpoint
from bridge.speaking.forwarding import build_server
from bridge.speaking.modern_upstream import ModernUpstream
from bridge.speaking.upstream import Notify, Upstream, UpstreamSettings
from bridge.transports.legacy import dial_of
from bridge.transports.links import Opener
from bridge.transports.process import Launch, launch_of
from toolsearch.config import Config
from toolsearch.sections.backend_settings import Backend, Bridge

MAX_CONNECTIONS = 1000  # open HTTP connections; uvicorn answers 503 beyond
KEEP_ALIVE = 5  # seconds an idle connection stays open

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Served:
    """One backend as the bridge serves it."""

    backend: Backend
    opener: Opener
    manager: StreamableHTTPSessionManager | None  # None: a 2026-07-28 backend, which has no sessions
    keeper: Supervisor[Upstream] | Supervisor[ModernUpstream] | ProcessPool
    endpoint: ASGIApp  # `/<backend id>/mcp`

    def state(self) -> dict[str, object]:
        keeper = self.keeper
        if isinstance(keeper, Supervisor):
            return {
                "isolation": "shared",
                "protocol": self.backend.protocol,
                "state": keeper.state,
                "pid": keeper.pid,
                "starts": keeper.starts,
                "last_error": keeper.last_error,
            }
        lister = keeper.lister
        if lister is None:
            return {"transport": "sse", "sessions": len(keeper), "starts": keeper.starts}
        return {
            "isolation": "per_session",
            "pids": keeper.pids(),
            "max_processes": keeper.max_processes,
            "starts": keeper.starts,
            "lister": {
                "state": lister.state,
                "pid": lister.pid,
                "starts": lister.starts,
                "last_error": lister.last_error,
            },
        }


def allowed_hosts(bridge: Bridge) -> list[str]:
    """The Host headers the bridge answers: its listen address, its URL's host, and loopback."""
    port = bridge.listen.rpartition(":")[2]
    hosts = {bridge.listen, f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
    if bridge.url is not None:
        url = urlsplit(bridge.url)
        hosts.add(url.netloc)  # a URL without a port: Host carries none either
    return sorted(hosts)


def security_of(bridge: Bridge) -> TransportSecuritySettings:
    """The DNS rebinding guard of the bridge's MCP endpoints."""
    hosts = allowed_hosts(bridge)
    # a browser sends an Origin: the bridge's own is the one it takes (DNS rebinding sends another)
    origins = [f"{scheme}://{host}" for host in hosts for scheme in ("http", "https")]
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def _serve(backend: Backend, bridge: Bridge, environ: Mapping[str, str], firsts: FirstStarts) -> Served:
    settings = UpstreamSettings(
        start_timeout=bridge.start_timeout,
        call_timeout=backend.timeout,
        max_line_bytes=backend.max_response_bytes,
    )
    if backend.sse_url is not None:
        return _serve_legacy(backend, bridge, settings)
    launch = launch_of(backend, environ)
    if backend.protocol in MODERN_PROTOCOL_VERSIONS:
        listeners = Listeners(backend.id, 1, bridge.session_idle_timeout)  # none: no sessions
        modern = Supervisor(launch, settings, listeners, bridge.max_restart_delay, _modern, firsts)
        return Served(
            backend, launch, None, modern, ModernEndpoint(modern, security_of(bridge), bridge.max_sessions)
        )
    per_session = backend.isolation == "per_session"
    idle = backend.idle_timeout if per_session else bridge.session_idle_timeout
    manager = StreamableHTTPSessionManager(
        build_server(backend.id),
        security_settings=security_of(bridge),
        session_idle_timeout=idle,
        max_sessions=bridge.max_sessions,
    )
    if per_session:
        # the lister answers sessions' listings until their own processes run: no one hears it
        lister = Supervisor(
            launch, settings, Listeners(backend.id, 1, idle), bridge.max_restart_delay, Upstream.open, firsts
        )
        pool = ProcessPool(launch, settings, backend.max_processes, backend.idle_timeout, lister)
        return Served(backend, launch, manager, pool, PerSessionEndpoint(pool, manager, security_of(bridge)))
    listeners = Listeners(backend.id, bridge.max_sessions, bridge.session_idle_timeout)
    shared = Supervisor(launch, settings, listeners, bridge.max_restart_delay, Upstream.open, firsts)
    return Served(backend, launch, manager, shared, SharedEndpoint(shared, manager))


def _modern(
    launch: Launch, settings: UpstreamSettings, notify: Notify
) -> AbstractAsyncContextManager[ModernUpstream]:
    # a 2026-07-28 server has no sessions to notify: its changes go to listens
    # (bridge/speaking/modern_upstream.py)
    return ModernUpstream.open(launch, settings)


def _serve_legacy(backend: Backend, bridge: Bridge, settings: UpstreamSettings) -> Served:
    """A legacy SSE backend: an event stream per session, ended with the session."""
    idle = bridge.session_idle_timeout
    manager = StreamableHTTPSessionManager(
        build_server(backend.id),
        security_settings=security_of(bridge),
        session_idle_timeout=idle,
        max_sessions=bridge.max_sessions,
    )
    dial = dial_of(backend, idle)
    pool = ProcessPool(dial, settings, bridge.max_sessions, idle, None, "bridge.max_sessions")
    # the header of a session's opening request its legacy server gets too: the backend's auth
    forwarded = () if backend.auth.type == "none" else (backend.auth.header,)
    return Served(
        backend, dial, manager, pool, PerSessionEndpoint(pool, manager, security_of(bridge), forwarded)
    )


def create_app(config: Config, environ: Mapping[str, str]) -> Starlette:
    """The bridge of a configuration's stdio and legacy SSE backends; raises `LaunchError` for an
    unset variable."""
    # the servers readiness waits for: a shared backend's, a per_session one's lister (a legacy SSE
    # backend starts nothing before a session opens)
    firsts = FirstStarts()
    served = [_serve(b, config.bridge, environ, firsts) for b in config.backends if b.bridged]
    routes = []
    for one in served:
        # an object, not a function: Starlette hands it the raw ASGI call
        routes.append(Route(f"/{one.backend.id}/mcp", one.endpoint, methods=["GET", "POST", "DELETE"]))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "backends": {s.backend.id: s.state() for s in served}})

    async def readyz(request: Request) -> Response:
        # one server that never answers holds nobody's readiness (bridge/keeping/first_starts.py)
        status, code = ("ready", 200) if firsts.ready() else ("starting", 503)
        return JSONResponse({"status": status, "starting": firsts.starting()}, code)

    routes += [Route("/healthz", healthz, methods=["GET"]), Route("/readyz", readyz, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The keepers outlive the session managers: sessions end first, then the servers stop.
        firsts.begin()
        async with anyio.create_task_group() as keepers:
            for one in served:
                keepers.start_soon(one.keeper.run)
            try:
                async with contextlib.AsyncExitStack() as managers:
                    for one in served:
                        if one.manager is not None:
                            await managers.enter_async_context(one.manager.run())
                    for one in served:
                        kind: str = "legacy SSE" if one.backend.sse_url else one.backend.isolation
                        kind += f", protocol {one.backend.protocol}" if one.backend.stdio else ""
                        logger.info("backend %s: %s, %s", one.backend.id, one.opener.describe(), kind)
                    yield
            finally:
                keepers.cancel_scope.cancel()

    return Starlette(routes=routes, lifespan=lifespan)


def serve(config: Config, environ: Mapping[str, str], log_level: str, log_format: str) -> int:
    """Serve the bridge of `config` until SIGTERM or SIGINT; returns the exit code.

    `environ` is what `${NAME}` in the backends' env values is looked up in. Raises `LaunchError`
    before anything starts when one names a variable it lacks.
    """
    app = create_app(config, environ)
    host, _, port = config.bridge.listen.rpartition(":")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host.strip("[]"),
            port=int(port),
            log_level=log_level,
            access_log=log_level == "debug",
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=KEEP_ALIVE,
            # uvicorn types it as int; a float works the same (an asyncio timeout)
            timeout_graceful_shutdown=config.bridge.shutdown_grace,  # type: ignore[arg-type]
            log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        )
    )
    # The SDK logs every session's whole id at info; an id is a capability, so keep them out.
    for name in ("mcp.server.streamable_http", "mcp.server.streamable_http_manager"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    # A SIGHUP (a reload, to the other processes) would end the bridge without stopping its servers.
    signal.signal(signal.SIGHUP, _on_hangup)
    # start-up's objects live as long as the process: frozen, full collections skip them (as the
    # router's and the indexer's do)
    gc.collect()
    gc.freeze()
    server.run()
    return 0 if server.started else 1


def _on_hangup(signum: int, frame: object) -> None:
    logger.warning("the bridge does not reread its configuration: restart it to apply a change")
