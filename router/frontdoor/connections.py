"""The router's client connections, bounded: how many, how long a request may take to arrive, idle expiry.

uvicorn bounds neither the time a request's head may take nor the connections it holds (its
`limit_concurrency` answers 503 only once a request has arrived, and logs a warning for each), so
a client that opens connections and sends nothing, or sends its headers a byte at a time
(slowloris), holds a file descriptor for ever; at the process's descriptor limit every other client
times out. `GuardedProtocol`, uvicorn's h11 protocol extended, adds (the values in `FrontDoor`,
router/frontdoor/bounds.py):

- `router.max_connections` (1000): a new connection beyond it takes the place of the longest idle
  one, which is closed; with none idle, it is answered `503` at once, with a JSON-RPC error,
  `Retry-After: 1` and `Connection: close`, before any request is read, and its request is read and
  dropped for a moment so the client reads the answer. Connections to the health port
  (`router.health_listen`) are never refused.
- `router.header_timeout` (10 s): a request's head must have arrived in full this long after the
  connection opened, or, on a kept connection, after the head's first byte: however slowly it
  trickles, the deadline is never moved. Otherwise the connection is closed (with `408` when part
  of a head came).
- `router.body_timeout` (30 s): a request's body must have arrived in full this long after its
  head; otherwise the app sees the client gone and the client gets `408`.
- `router.keep_alive_timeout` (120 s): an idle connection between requests is closed; each answer
  says so in `Keep-Alive: timeout=N` (docs/reliability.md says why it is longer than clients').
- a close while the client is still sending its request lingers (router/frontdoor/lingering.py).

Refusals and cut connections are logged once per burst (router/frontdoor/bursts.py), and so are uvicorn's own
warnings about one request each (an invalid request, an unsupported upgrade), which a flood of bad
requests would otherwise turn into a flood of lines. Heads over h11's 16 KiB are refused by h11 with
400.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
from mcp_types import INTERNAL_ERROR
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from router.error_answers import jsonrpc_error_body
from router.frontdoor.bounds import FrontDoor
from router.frontdoor.lingering import LingeringTransport

LINGER = 1.0  # seconds a refused connection is read (and dropped) so its client reads the 503
MAX_LINGERING = 256  # connections lingering at once (router/frontdoor/lingering.py); more are closed
LINGER_BYTES = 64 * 1024 * 1024  # bytes one lingering connection may send before it is closed anyway


def _raw_response(status: str, message: str, retry_after: bool = False) -> bytes:
    body = jsonrpc_error_body(INTERNAL_ERROR, message).decode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    head += "retry-after: 1\r\n" if retry_after else ""
    return (head + "connection: close\r\n\r\n" + body).encode()


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
    """uvicorn's h11 protocol with a connection limit, deadlines on a request's arrival, idle
    connections given up at the limit, and closes that linger while the client still sends."""

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
        # head, idle (between requests), body, app (the request arrived), refused, or lingering
        self._phase = "head"
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._lingering = False
        self._dropped = 0  # bytes read and dropped while lingering
        self._socket: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        front = self.front
        self._socket = transport
        # the health port's connections (the kubelet's probes) are never refused: a router busy at
        # its limit is alive, and restarting it would only add to the load
        health = front.health_port is not None and _local_port(transport) == front.health_port
        if not health and len(self.connections) >= front.max_connections and not front.give_up_idle():
            self._phase, self.transport = "refused", transport
            front.refused.note()
            message = f"the router is at its connection limit ({front.max_connections}): retry shortly"
            transport.write(_raw_response("503 Service Unavailable", message, retry_after=True))
            self._linger(LINGER)
            return
        super().connection_made(LingeringTransport(transport, self))
        self._enter("head")

    def data_received(self, data: bytes) -> None:
        if self._phase in ("refused", "lingering"):
            self._dropped += len(data)  # answered already: read so the client reads the answer
            if self._dropped > LINGER_BYTES and self._socket is not None:
                self._socket.close()
            return
        if self._phase == "idle":
            self._enter("head")  # the next request's first byte: its head has header_timeout from now
        if self._phase == "head":
            self._head_bytes += len(data)
        super().data_received(data)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.front.idle.pop(self, None)
        if self._lingering:
            self._lingering = False
            self.front.lingering -= 1
        if self._phase == "refused":
            return
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def shutdown(self) -> None:
        if self._lingering and self._socket is not None:
            self._socket.close()  # answered already: nothing for a stop to wait for
            return
        super().shutdown()

    def lingers(self) -> bool:
        return self._lingering

    def close_transport(self) -> None:
        """uvicorn's close: lingering while the client may still be sending its request, else at once."""
        state = self.conn.their_state
        if state is h11.SEND_BODY or state is h11.ERROR:
            self._linger(self.front.body_timeout)
        elif self._socket is not None:
            self._socket.close()

    def give_up(self) -> None:
        """Close an idle connection to make room for a new one."""
        self.front.idle.pop(self, None)
        if self._socket is not None and not self._socket.is_closing():
            self._socket.close()

    def _linger(self, seconds: float) -> None:
        """Send what is written and our side's end, then read and drop until the client closes, at most
        `seconds` (at once when too many linger already or the transport cannot half-close)."""
        socket, front = self._socket, self.front
        if socket is None or socket.is_closing():
            return
        if self._lingering or front.lingering >= MAX_LINGERING or not socket.can_write_eof():
            socket.close()
            return
        try:
            socket.write_eof()
        except OSError:  # the client reset the connection already: nobody is left to read the answer
            socket.close()
            return
        if self._phase != "refused":
            self._phase = "lingering"
        front.lingering += 1
        self._lingering = True
        self._cancel()
        socket.resume_reading()  # uvicorn may have paused it for a body the app did not read
        self._deadline = self.loop.call_later(seconds, socket.close)

    def _follow(self) -> None:
        """Set the deadline of the phase the connection is in now."""
        if self._lingering:
            return  # the lingering close has its own bound
        if self.transport.is_closing():
            self._cancel()
            return
        state = self.conn.their_state
        if state is h11.IDLE and self.conn.our_state is h11.IDLE:
            if self._phase not in ("head", "idle"):
                # between requests: idle until keep_alive_timeout (uvicorn's timer), unless the
                # next head has begun already (pipelined)
                self._head_bytes = len(self.conn.trailing_data[0])
                if self._head_bytes:
                    self._enter("head")
                else:
                    self._cancel()
                    self._phase = "idle"
                    self.front.idle[self] = None
        elif state is h11.SEND_BODY:
            if self._phase != "body":
                self._enter("body")
        elif self._phase != "app":
            self._phase = "app"  # the request is in: the app's own bounds apply from here
            self._cancel()

    def _enter(self, phase: str) -> None:
        self._cancel()
        self.front.idle.pop(self, None)
        self._phase = phase
        seconds = self.front.header_timeout if phase == "head" else self.front.body_timeout
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        socket = self._socket
        if socket is None or socket.is_closing():
            return
        if self._phase == "body":
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.disconnected = True  # the app's receive() now says the client is gone
                cycle.message_event.set()
                message = f"the request body did not arrive within {self.front.body_timeout:g}s"
                socket.write(_raw_response("408 Request Timeout", message))
            self.front.cut.note("body")
        elif self._head_bytes:
            message = f"the request head did not arrive within {self.front.header_timeout:g}s"
            socket.write(_raw_response("408 Request Timeout", message))
            self.front.cut.note("head")
        # a new connection that never sent a byte is closed quietly, as keep-alive expiry does;
        # a late or stalled client gets no lingering: the deadline is the bound
        socket.close()


def _local_port(transport: asyncio.Transport) -> int | None:
    address = transport.get_extra_info("sockname")
    return int(address[1]) if isinstance(address, tuple) and len(address) >= 2 else None


def protocol_for(front: FrontDoor) -> type[GuardedProtocol]:
    """The protocol class uvicorn builds each connection with, bound to `front`."""
    return type("RouterProtocol", (GuardedProtocol,), {"front": front})
