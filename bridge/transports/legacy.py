"""A legacy HTTP+SSE server (protocol 2024-11-05), one session per open event stream, as the bridge holds it.

The legacy transport ties a session to one GET event stream: the server names a POST endpoint on it
and answers every request there, so a session lives exactly as long as its stream. A stateless
router cannot keep one open between requests; the bridge can, one for each of its own sessions.

`Dial` is what opening one needs: the backend, the SSE endpoint, the call timeout and the largest
event. `LegacyConnection.run` opens the stream with the SDK's SSE client, sending the headers the
bridge session's `initialize` carried (the backend's auth header, which the router and the indexer
compute as for any backend: the bridge holds no secret), each event bounded by the backend's
`max_response_bytes` (`BoundedTransport` per event), and yields the pair of streams a
`ClientSession` runs on, as `ServerProcess.run` does for a stdio server. A server that refuses the
stream fails the start with its HTTP status (a 401 or 403 reaches the caller as that status); a
stream that ends, or stays silent past the read timeout, ends the link with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectSendStream
from mcp.client.sse import sse_client
from mcp.shared.message import SessionMessage

from bridge.transports.links import Link, Reads, StartFailed, Writes
from toolsearch.responses import BoundedTransport, ResponseTooLarge
from toolsearch.sections.backend_settings import Backend

IDLE_MARGIN = 60.0  # seconds a stream may stay silent beyond the longest wait a session allows


@dataclass(frozen=True, slots=True)
class Dial:
    """Everything needed to open one session of a legacy SSE server."""

    backend_id: str
    url: str  # the SSE endpoint
    timeout: float  # seconds to connect and for each POST
    read_timeout: float  # seconds the stream may stay silent before it is given up

    what: ClassVar[str] = "legacy SSE server"
    many: ClassVar[str] = "legacy SSE server sessions"

    def describe(self) -> str:
        """The endpoint, without its query (which may carry a key)."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))

    def open(
        self, max_message_bytes: int, headers: Mapping[str, str]
    ) -> AbstractAsyncContextManager[tuple[Link, Reads, Writes]]:
        return LegacyConnection.run(self, max_message_bytes, headers)


def dial_of(backend: Backend, idle_timeout: float) -> Dial:
    """The dial of a legacy SSE backend whose sessions end after `idle_timeout` seconds unused."""
    if backend.sse_url is None:
        raise ValueError(f"backend {backend.id} is not a legacy SSE server")
    silent = max(idle_timeout, backend.timeout) + IDLE_MARGIN
    return Dial(backend.id, backend.sse_url, backend.timeout, silent)


class LegacyConnection:
    """One open legacy session: whether, and how, its stream ended."""

    pid: int | None = None  # a connection has no process

    def __init__(self, dial: Dial) -> None:
        self.dial = dial
        self.ended = anyio.Event()
        self.problem = ""  # how the stream ended

    def exit_reason(self) -> str:
        return self.problem if self.ended.is_set() else ""

    def noise_note(self) -> str:
        return ""  # the SDK's client drops what is not a message

    async def settle(self, timeout: float) -> None:
        return None  # the reason is known the moment the stream ends

    @classmethod
    @asynccontextmanager
    async def run(
        cls, dial: Dial, max_event_bytes: int, headers: Mapping[str, str]
    ) -> AsyncIterator[tuple[Link, Reads, Writes]]:
        connection = cls(dial)
        transport = httpx2.AsyncHTTPTransport()
        http = httpx2.AsyncClient(
            transport=BoundedTransport(transport, max_event_bytes, per_event=True),
            headers=dict(headers),
            timeout=httpx2.Timeout(dial.timeout, read=dial.read_timeout),
        )
        to_session, from_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.push_async_callback(http.aclose)
                opened = sse_client(
                    dial.url,
                    timeout=dial.timeout,
                    sse_read_timeout=dial.read_timeout,
                    httpx_client_factory=lent_client(http),
                )
                try:
                    incoming, writes = await stack.enter_async_context(opened)
                except Exception as exc:  # every way a connection fails, in words
                    raise _start_failed(dial, exc) from None
                tasks = await stack.enter_async_context(anyio.create_task_group())
                tasks.start_soon(connection._relay, incoming, to_session)
                try:
                    yield connection, from_stream, writes
                finally:
                    tasks.cancel_scope.cancel()
        finally:
            connection._end(connection.problem or "closed its event stream")
            to_session.close()
            from_stream.close()
            await transport.aclose()

    async def _relay(self, incoming: Reads, out: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """Pass the stream's messages on; note why it ended when it does."""
        async with out:
            try:
                async for message in incoming:
                    if isinstance(message, Exception):  # the stream broke: its reason, not a traceback
                        self.problem = _why(message)
                        break
                    await out.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                pass
        self._end(self.problem or "closed its event stream")

    def _end(self, reason: str) -> None:
        if not self.ended.is_set():
            self.problem = reason
            self.ended.set()


def lent_client(http: httpx2.AsyncClient) -> Callable[..., httpx2.AsyncClient]:
    """An httpx client factory for the SDK's SSE client that hands it `http` (headers, bound, timeouts).

    The SDK's SSE client builds its own httpx client unless given a factory; lending ours keeps the
    per-event bound and the session's headers on the stream and its POSTs.
    """

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        return http

    return factory


def _leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _start_failed(dial: Dial, error: Exception) -> StartFailed:
    leaf = _leaf(error)
    if isinstance(leaf, httpx2.HTTPStatusError):
        status = leaf.response.status_code
        return StartFailed(f"refused its event stream with HTTP {status}", status)
    if isinstance(leaf, httpx2.HTTPError | OSError):
        return StartFailed(f"could not be reached at {dial.describe()} ({type(leaf).__name__})")
    return StartFailed(f"did not open a legacy SSE session at {dial.describe()} ({leaf!r:.200})")


def _why(error: Exception) -> str:
    if isinstance(error, ResponseTooLarge):
        return f"sent an event larger than backends[].max_response_bytes ({error})"
    if isinstance(error, httpx2.ReadTimeout):
        return "sent nothing for longer than the bridge waits on an event stream"
    if isinstance(error, httpx2.TransportError):
        return f"ended its event stream ({type(error).__name__})"
    return f"sent an event that is not a JSON-RPC message ({error!r:.200})"
