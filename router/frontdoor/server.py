"""The server the router runs under: uvicorn with the front door's bounds, and a clean stop.

`router_server` builds uvicorn's settings from `router.*`: the listen address, the connection
protocol of router/frontdoor/connections.py (uvicorn's httptools protocol under the connection limit,
header and body deadlines, keep-alive expiry), uvloop's event loop, and `router.shutdown_grace` as
uvicorn's graceful-shutdown timeout. httptools (the C parser llhttp) and uvloop (libuv) in place
of h11 and asyncio's own loop: docs/performance.md, section 6, has what they save. `RouterServer`
says where it listens once it does and exits 0 after a drained SIGTERM. With `router.health_listen`
it serves two listeners, bound beforehand by `bind_all`: the MCP port and the health port.

When the grace period ends, uvicorn cancels the requests still running; without more, each would
end in a bare 500 and a traceback in the log. `ShutdownGuard` answers such a request itself, with a
503 whose body is a JSON-RPC error (the request's own id when it was read) saying the router stopped
and the request may be sent again, and logs nothing more for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from types import FrameType

import uvicorn
from mcp_types import INTERNAL_ERROR
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from router.error_answers import jsonrpc_error_body
from router.frontdoor.bounds import FrontDoor, raise_fd_limit
from router.frontdoor.connections import protocol_for
from router.frontdoor.session_layer import JSONRPC_ID_KEY
from router.frontdoor.streams.held import Stopping
from toolsearch.sections.router_settings import Router


def _only_cancellation(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancellation(inner) for inner in exc.exceptions)
    return isinstance(exc, asyncio.CancelledError)


class ShutdownGuard:
    """ASGI: a request cancelled at the end of the shutdown grace gets a JSON-RPC error, not a 500."""

    def __init__(self, app: ASGIApp, grace: float) -> None:
        self.app = app
        self.grace = grace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except BaseException as exc:
            if started or not _only_cancellation(exc):
                raise
            # Answered here, the cancellation ends here: the task was being discarded anyway.
            request_id = scope.get("state", {}).get(JSONRPC_ID_KEY)
            message = (
                f"the router stopped before this request finished (router.shutdown_grace is "
                f"{self.grace:g}s): send it again, to this router once it is back or to another"
            )
            headers = [
                (b"content-type", b"application/json"),
                (b"retry-after", b"1"),
                (b"connection", b"close"),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send(
                {
                    "type": "http.response.body",
                    "body": jsonrpc_error_body(INTERNAL_ERROR, message, request_id),
                }
            )


class RouterServer(uvicorn.Server):
    """uvicorn, saying where it listens once it does, and exiting 0 after a drained SIGTERM."""

    def __init__(self, config: uvicorn.Config, front: FrontDoor, stopping: Stopping | None = None) -> None:
        super().__init__(config)
        self.front = front
        self.stopping = stopping  # set at the signal to stop: standalone streams end then

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopping is not None:
            self.stopping.set()
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"router listening on http://{host}:{port}/mcp", file=sys.stderr, flush=True)
            for server in self.servers[1:]:
                host, port = server.sockets[0].getsockname()[:2]
                print(f"router health and metrics on http://{host}:{port}", file=sys.stderr, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        self.front.close()  # the last burst's count goes to the log

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured signal once it has shut down, so the process would die by
        # SIGTERM after draining: a graceful stop is a clean exit, so that one is not re-raised.
        with super().capture_signals():
            yield
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def bind_all(listens: list[str]) -> list[socket.socket]:
    """A listening socket for each HOST:PORT, as uvicorn binds its own; none is left open on an error."""
    bound: list[socket.socket] = []
    try:
        for listen in listens:
            host = listen.rpartition(":")[0].strip("[]")
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, int(listen.rpartition(":")[2])))
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {listen} ({exc.strerror})") from None
            sock.set_inheritable(True)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def router_server(
    app: ASGIApp, settings: Router, log_level: str, log_format: str, stopping: Stopping | None = None
) -> RouterServer:
    """uvicorn serving `app` on `router.listen`, under the front door's bounds; `stopping` is set
    when it begins to stop (the app's standalone streams end then)."""
    host, _, port = settings.listen.rpartition(":")
    front = FrontDoor.of(settings, raise_fd_limit(settings.max_connections))
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        http=protocol_for(front),
        loop="uvloop",
        log_level=log_level,
        # how long an idle connection is kept, for clients that read it (Node's fetch, for one)
        headers=[("keep-alive", f"timeout={max(1, int(settings.keep_alive_timeout))}")],
        access_log=log_level in ("debug", "trace"),
        # uvicorn types it as int; a float works the same (an asyncio timeout)
        timeout_graceful_shutdown=settings.shutdown_grace,  # type: ignore[arg-type]
        # JSON lines: uvicorn's loggers reach the root handler instead of uvicorn's own text ones
        log_config=None if log_format == "json" else uvicorn.config.LOGGING_CONFIG,
    )
    return RouterServer(config, front, stopping)
