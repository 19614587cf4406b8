"""Listing a backend's tools over MCP: every page, with given credentials, within a deadline.

The SDK reports an HTTP error status only as a generic JSON-RPC error, so a response hook records
the status of every answer; a 401 or 403 becomes `BackendRejected`, which decides whether a session
leaves the backend out or ends. Health probes keep one `ProbeClient` per backend across listings
and pin the protocol version it answered in (`pinned_mode`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from indexer.errors import BackendRejected, BackendUnavailable
from indexer.state.listings import Listing

# A server that pages forever must not hang discovery.
MAX_PAGES = 1000


class _StatusRecorder:
    """Remembers the last rejecting HTTP status a backend answered with."""

    def __init__(self) -> None:
        self.rejected: int | None = None

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            self.rejected = response.status_code


def _leaf_errors(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaf_errors(sub)]
    return [exc]


def _describe(exc: BaseException) -> str:
    leaves = _leaf_errors(exc)
    first = leaves[0] if leaves else exc
    if isinstance(first, httpx2.ConnectError):
        return "connection refused"
    if isinstance(first, httpx2.TimeoutException):
        return "timed out"
    if isinstance(first, MCPError):
        return f"MCP error: {first.error.message}"
    return f"{type(first).__name__}: {first}"[:200]


def pinned_mode(protocol_version: str) -> str:
    """The client `mode` that speaks `protocol_version` again without negotiating; "auto" if unknown."""
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        return protocol_version
    if protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
        return "legacy"  # the initialize handshake, without the server/discover request "auto" tries first
    return "auto"


class _Borrowed(httpx2.AsyncBaseTransport):
    """A shared transport lent to one client: closing the client leaves the pool open for the others."""

    def __init__(self, transport: httpx2.AsyncBaseTransport) -> None:
        self._transport = transport

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await self._transport.handle_async_request(request)

    async def aclose(self) -> None:
        pass


class ProbeClient:
    """One backend's HTTP client, kept from one health probe to the next.

    Building a client per probe cost about as much CPU as the probe's requests. The client carries
    the headers and timeout it was built with (`fits` tells whether they still apply); a shared
    transport is only borrowed, so `aclose` closes what the client owns and never the shared pool.
    One listing uses it at a time (its owner sets `busy`): the status recorder belongs to that listing.
    """

    def __init__(
        self, headers: Mapping[str, str], timeout: float, transport: httpx2.AsyncBaseTransport | None
    ) -> None:
        self.headers = dict(headers)
        self.timeout = timeout
        self.busy = False
        self.recorder = _StatusRecorder()
        self.http = httpx2.AsyncClient(
            headers=self.headers,
            timeout=httpx2.Timeout(timeout),
            transport=None if transport is None else _Borrowed(transport),
            event_hooks={"response": [self.recorder]},
        )

    def fits(self, headers: Mapping[str, str], timeout: float) -> bool:
        """Whether a listing with these headers and timeout may use this client."""
        return self.timeout == timeout and self.headers == dict(headers)

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.http.aclose()


async def list_tools(
    backend_id: str,
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    transport: httpx2.AsyncBaseTransport | None = None,
    mode: str = "auto",
    client: ProbeClient | None = None,
) -> Listing:
    """List every tool of one backend; raises `BackendRejected` or `BackendUnavailable`.

    With a `client` (one that `fits` these headers, and that this listing alone uses) its HTTP
    client is used and left open; without one, a client is built for this listing and closed after it.
    """
    started = time.perf_counter()
    if client is not None:
        client.recorder.rejected = None
        client.http.cookies.clear()  # each listing starts as a fresh client would
        recorder, http = client.recorder, client.http
    else:
        recorder = _StatusRecorder()
        http = httpx2.AsyncClient(
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout),
            transport=transport,
            event_hooks={"response": [recorder]},
        )
    tools: list[Mapping[str, Any]] = []
    try:
        with anyio.fail_after(timeout):
            async with Client(streamable_http_client(url, http_client=http), mode=mode) as session:
                cursor: str | None = None
                for _ in range(MAX_PAGES):
                    page = await session.list_tools(cursor=cursor, cache_mode="bypass")
                    tools.extend(
                        tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in page.tools
                    )
                    cursor = page.next_cursor
                    if not cursor:
                        break
                else:
                    raise BackendUnavailable(backend_id, f"more than {MAX_PAGES} pages of tools")
                version = session.protocol_version
    except TimeoutError:
        raise BackendUnavailable(backend_id, f"did not answer tools/list within {timeout:g}s") from None
    except (BackendUnavailable, BackendRejected):
        raise
    except Exception as exc:
        if recorder.rejected is not None:
            raise BackendRejected(backend_id, recorder.rejected) from None
        raise BackendUnavailable(backend_id, _describe(exc)) from None
    finally:
        if client is None and transport is None:
            with anyio.CancelScope(shield=True):
                await http.aclose()
    return Listing(tools=tuple(tools), protocol_version=version, latency=time.perf_counter() - started)
