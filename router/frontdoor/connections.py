"""The router's client connections, bounded: how many, how long a request may take to arrive, idle expiry.

uvicorn bounds neither the time a request's head may take nor the connections it holds (its
`limit_concurrency` answers 503 only once a request has arrived, and logs a warning for each), so
a client that opens connections and sends nothing, or sends its headers a byte at a time
(slowloris), holds a file descriptor for ever; at the process's descriptor limit every other client
times out. `GuardedProtocol`, uvicorn's h11 protocol extended, adds:

- `router.max_connections` (1000): a connection beyond it is answered `503` at once, with a
  JSON-RPC error, `Retry-After: 1` and `Connection: close`, before any request is read; its request
  is read and dropped for a moment so the client reads the answer.
- `router.header_timeout` (10 s): a request's head must have arrived in full this long after the
  connection opened or the previous response ended; otherwise the connection is closed (with `408`
  when part of a head came).
- `router.body_timeout` (30 s): a request's body must have arrived in full this long after its
  head; otherwise the app sees the client gone and the client gets `408`.
- `router.keep_alive_timeout` (5 s): an idle connection between requests is closed.

Refusals and cut connections are logged once per burst (router/frontdoor/bursts.py), and so are uvicorn's own
warnings about one request each (an invalid request, an unsupported upgrade), which a flood of bad
requests would otherwise turn into a flood of lines. Heads over h11's 16 KiB are refused by h11 with
400. `raise_fd_limit` makes room for `max_connections` in the process's
file-descriptor limit at start.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
from mcp_types import INTERNAL_ERROR
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from router.error_answers import jsonrpc_error_body
from router.frontdoor.bursts import BurstLog
from toolsearch.router_settings import Router

logger = logging.getLogger(__name__)

FD_RESERVE = 512  # descriptors kept for backend and indexer connections, logs and files
LINGER = 1.0  # seconds a refused connection is read (and dropped) so its client reads the 503
MAX_LINGERING = 256  # refused connections lingering at once; more are closed right away


def _raw_response(status: str, message: str, retry_after: bool = False) -> bytes:
    body = jsonrpc_error_body(INTERNAL_ERROR, message).decode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    head += "retry-after: 1\r\n" if retry_after else ""
    return (head + "connection: close\r\n\r\n" + body).encode()


@dataclass
class FrontDoor:
    """The bounds one server's connections share, and the burst logs of what they refuse."""

    max_connections: int
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: float
    lingering: int = 0
    refused: BurstLog = field(init=False)
    cut: BurstLog = field(init=False)
    uvicorn_warnings: dict[str, BurstLog] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.refused = BurstLog(
            logger,
            f"refused connections beyond router.max_connections ({self.max_connections}) with 503",
            "raise router.max_connections if the clients are legitimate",
        )
        self.cut = BurstLog(
            logger,
            "closed connections whose request did not arrive in time (router.header_timeout "
            f"{self.header_timeout:g}s, router.body_timeout {self.body_timeout:g}s)",
            "a slow or stalled client, or a slowloris",
        )

    @classmethod
    def of(cls, settings: Router, max_connections: int | None = None) -> FrontDoor:
        return cls(
            max_connections=max_connections or settings.max_connections,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            keep_alive_timeout=settings.keep_alive_timeout,
        )

    def warnings(self, message: str) -> BurstLog:
        """The burst log of one of uvicorn's per-request warnings."""
        if message not in self.uvicorn_warnings:
            self.uvicorn_warnings[message] = BurstLog(logger, message.rstrip("."), "uvicorn, per request")
        return self.uvicorn_warnings[message]

    def close(self) -> None:
        for log in (self.refused, self.cut, *self.uvicorn_warnings.values()):
            log.close()


class _ProtocolLog:
    """uvicorn's logger for one connection, its per-request warnings logged once per burst."""

    def __init__(self, inner: logging.Logger, front: FrontDoor) -> None:
        self._inner = inner
        self._front = front

    def warning(self, message: str, *args: Any) -> None:
        self._front.warnings(message % args if args else message).note()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with a connection limit and deadlines on a request's arrival."""

    front: ClassVar[FrontDoor]  # set on the subclass `protocol_for` makes

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.timeout_keep_alive = self.front.keep_alive_timeout  # type: ignore[assignment]  # a float works
        self.logger = _ProtocolLog(self.logger, self.front)  # type: ignore[assignment]
        self._phase = "head"  # head, body, app (the request arrived), or refused
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        front = self.front
        if len(self.connections) >= front.max_connections:
            self._phase, self.transport = "refused", transport
            front.refused.note()
            message = f"the router is at its connection limit ({front.max_connections}): retry shortly"
            transport.write(_raw_response("503 Service Unavailable", message, retry_after=True))
            if front.lingering >= MAX_LINGERING or not transport.can_write_eof():
                transport.close()
                return
            front.lingering += 1
            self._lingering = True
            transport.write_eof()  # the answer is sent; reading on lets the client read it
            self._deadline = self.loop.call_later(LINGER, transport.close)
            return
        super().connection_made(transport)
        self._enter("head")

    def data_received(self, data: bytes) -> None:
        if self._phase == "refused":
            return  # dropped: it is answered already
        if self._phase == "head":
            self._head_bytes += len(data)
        super().data_received(data)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        if self._phase == "refused":
            if self._lingering:
                self._lingering = False
                self.front.lingering -= 1
            return
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def _follow(self) -> None:
        """Set the deadline of the phase the connection is in now."""
        if self.transport.is_closing():
            self._cancel()
            return
        state = self.conn.their_state
        if state is h11.IDLE and self.conn.our_state is h11.IDLE:
            if self._phase != "head":
                self._head_bytes = 0
                self._enter("head")
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._enter("body")
        elif self._phase != "app":
            self._phase = "app"  # the request is in: the app's own bounds apply from here
            self._cancel()

    def _enter(self, phase: str) -> None:
        self._cancel()
        self._phase = phase
        seconds = self.front.header_timeout if phase == "head" else self.front.body_timeout
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._phase == "body":
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.disconnected = True  # the app's receive() now says the client is gone
                cycle.message_event.set()
                message = f"the request body did not arrive within {self.front.body_timeout:g}s"
                self.transport.write(_raw_response("408 Request Timeout", message))
            self.front.cut.note("body")
        elif self._head_bytes:
            message = f"the request head did not arrive within {self.front.header_timeout:g}s"
            self.transport.write(_raw_response("408 Request Timeout", message))
            self.front.cut.note("head")
        # an idle connection that never sent a byte is closed quietly, as keep-alive expiry does
        self.transport.close()


def protocol_for(front: FrontDoor) -> type[GuardedProtocol]:
    """The protocol class uvicorn builds each connection with, bound to `front`."""
    return type("RouterProtocol", (GuardedProtocol,), {"front": front})


def raise_fd_limit(max_connections: int) -> int:
    """Make room for `max_connections` under the descriptor limit; returns how many fit."""
    wanted = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fits = max(1, soft - FD_RESERVE)
    logger.warning(
        "router.max_connections %d lowered to %d: the file-descriptor limit is %d (raise `ulimit -n`)",
        max_connections,
        fits,
        soft,
    )
    return fits
