"""A connection's close, made so that its client reads the answer: a lingering close.

A server that closes a connection while the client is still sending makes the kernel answer the
unread bytes with a reset, and a client that writes its whole request before it reads (urllib,
httpx, most others) then sees the reset instead of the answer already on its way. So when uvicorn
closes a connection whose request is still arriving (a refusal with `Connection: close`, a body
beyond the bound the app drains, an invalid request), the close lingers instead: the answer goes
out with the end of our side (a half-close), and what the client still sends is read and dropped
until it closes its side, up to a bound in time and bytes (then the connection is closed anyway).
How many connections linger at once is bounded too (router/frontdoor/connections.py).

`LingeringTransport` stands between uvicorn and the socket's transport so that each of uvicorn's
closes asks the connection first (`Closer`); the connection's own deadlines close the socket at
once, through `inner`.

It also joins what uvicorn writes in one turn of the event loop into one write: an answer's head
and its body (uvicorn writes each as the app sends it) then leave in one send, so the client
wakes once for them and reads them in one piece, not twice.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class Closer(Protocol):
    """The connection a transport belongs to, asked how to close it."""

    def close_transport(self) -> None: ...

    def lingers(self) -> bool: ...


class LingeringTransport(asyncio.Transport):
    """The socket's transport, whose `close` the connection decides: at once, or lingering."""

    def __init__(self, inner: asyncio.Transport, closer: Closer, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.inner = inner
        self._closer = closer
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []  # written in this turn, not yet sent

    def flush(self) -> None:
        """Send what was written in this turn of the loop, as one write."""
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        if not self.inner.is_closing():
            self.inner.write(data)

    def close(self) -> None:
        self.flush()
        if self.inner.is_closing():
            return
        self._closer.close_transport()

    def is_closing(self) -> bool:
        return self.inner.is_closing() or self._closer.lingers()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def can_write_eof(self) -> bool:
        return self.inner.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self.inner.write_eof()

    def abort(self) -> None:
        self._pending = []
        self.inner.abort()

    def pause_reading(self) -> None:
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.inner.resume_reading()

    def is_reading(self) -> bool:
        return self.inner.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.inner.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self.inner.get_write_buffer_size() + sum(len(data) for data in self._pending)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.inner.set_write_buffer_limits(high, low)
