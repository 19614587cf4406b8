"""The router's client connections, bounded: how many, how long a request may take to arrive, idle expiry.

uvicorn bounds neither the time a request's head may take nor the connections it holds (its
`limit_concurrency` answers 503 only once a request has arrived, and logs a warning for each), so
a client that opens connections and sends nothing, or sends its headers a byte at a time
(slowloris), holds a file descriptor for ever; at the process's descriptor limit every other client
times out. `GuardedProtocol`, uvicorn's httptools protocol (the C parser llhttp) extended, adds (the
values in `FrontDoor`, router/frontdoor/bounds.py):

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
- a request head over `MAX_HEAD_BYTES` (16 KiB) is refused with `400`: llhttp sets no bound of its
  own, and buffers a header line however long it grows; so is an HTTP/1.1 head without `Host`.
- a close while the client is still sending its request lingers (router/frontdoor/lingering.py).

Where a request is (its head, its body, answered) is followed from the parser's callbacks: llhttp
parses whatever arrives, a pipelined request's head included, while h11 would hold it unread until
the answer before it is complete; so a head that begins while an answer is still running has its
deadline from that answer's end, as it would have had.

Refusals and cut connections are logged once per burst (router/frontdoor/bursts.py), and so are uvicorn's own
warnings about one request each (an invalid request, an unsupported upgrade), which a flood of bad
requests would otherwise turn into a flood of lines.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from mcp_types import INTERNAL_ERROR
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from router.error_answers import jsonrpc_error_body
from router.frontdoor.bounds import ConnectionLog, FrontDoor
from router.frontdoor.lingering import LingeringTransport

LINGER = 1.0  # seconds a refused connection is read (and dropped) so its client reads the 503
MAX_LINGERING = 256  # connections lingering at once (router/frontdoor/lingering.py); more are closed
LINGER_BYTES = 64 * 1024 * 1024  # bytes one lingering connection may send before it is closed anyway
MAX_HEAD_BYTES = 16 * 1024  # a request's line and headers, at most (h11's bound, kept)
INVALID = "Invalid HTTP request received."  # uvicorn's words for a request it refuses with 400


def _raw_response(status: str, message: str, retry_after: bool = False) -> bytes:
    body = jsonrpc_error_body(INTERNAL_ERROR, message).decode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
    head += "retry-after: 1\r\n" if retry_after else ""
    return (head + "connection: close\r\n\r\n" + body).encode()


class InvalidHead(Exception):
    """Raised from a parser callback (a head too large, an HTTP/1.1 head without Host): llhttp
    stops, and uvicorn answers 400 as for any request it cannot parse."""


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection limit, deadlines on a request's arrival, idle
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
        self.logger = ConnectionLog(self.logger, self.front)  # type: ignore[assignment]
        # head, idle (between requests), body, app (the request arrived), refused, or lingering
        self._phase = "head"
        # the parser's last message: "" (none begun yet), "head", "body" (its head complete) or "done"
        self._message = ""
        self._deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # bytes received while in the head phase
        self._head_size = 0  # the parsed message's line and headers
        self._broken = False  # refused as invalid: what the client still sends is never read
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
        super().connection_made(LingeringTransport(transport, self, self.loop))
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
        if self._phase == "head" and self._message in ("", "head") and self._head_bytes > MAX_HEAD_BYTES:
            # a head still arriving past the bound: llhttp would buffer a header line without end
            self.logger.warning(INVALID)
            self.send_400_response(INVALID)
            return
        self._follow()

    # the parser's callbacks: where the request is

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message, self._head_size = "head", 0

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.parser.get_http_version() == "1.1" and not any(n == b"host" for n, _ in self.headers):
            raise InvalidHead  # HTTP/1.1 requires Host (RFC 9112, 3.2), as h11 did
        self._message = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message = "done"
        super().on_message_complete()

    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD_BYTES:
            raise InvalidHead  # llhttp stops; uvicorn answers 400 (`send_400_response`)

    def send_400_response(self, msg: str) -> None:
        self._broken = True  # before its close, which then lingers
        super().send_400_response(msg)

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
        if self._broken or self._message == "body":
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
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.pipeline or (self._message == "head" and answering):
            phase = "app"  # an answer still running: a request behind it waits, unread or queued
        elif self._message in ("head", "body"):
            phase = self._message
        elif self._message == "done":
            phase = "app" if answering else "idle"
        else:
            return  # no request begun yet: the first head's deadline runs from the connection's opening
        if phase == self._phase:
            return
        if phase == "head":  # a pipelined head begun during the answer before it: timed from its end
            self._enter("head")
            self._head_bytes = 1
        elif phase == "body":
            self._enter("body")
        elif phase == "idle":  # between requests: idle until keep_alive_timeout (uvicorn's timer)
            self._cancel()
            self._phase, self._head_bytes = "idle", 0
            self.front.idle[self] = None
        else:
            self._phase = "app"  # the request is in: the app's own bounds apply from here
            self._cancel()

    def _enter(self, phase: str) -> None:
        self._cancel()
        self.front.idle.pop(self, None)
        self._phase = phase
        if phase == "head":
            self._head_bytes = 0
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
