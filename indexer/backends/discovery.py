"""Listing a backend's tools over MCP: every page, with given credentials, within a deadline.

The SDK reports an HTTP error status only as a generic JSON-RPC error, so a response hook records
the status of every answer; a 401 or 403 becomes `BackendRejected`, which decides whether a session
leaves the backend out or ends. Health probes keep one `ProbeClient` per backend across listings
and pin the protocol version it answered in (`pinned_mode`). Every answer is read under the
backend's `max_response_bytes` (toolsearch/responses.py): a larger page leaves the backend out
instead of filling the indexer's memory. Every backend is listed over Streamable HTTP (a legacy
SSE server at the bridge, which speaks its transport).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import Implementation, ServerCapabilities
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from indexer.errors import BackendRejected, BackendUnavailable
from indexer.state.listings import Listing, Offers, ServerInfo
from toolsearch.responses import BoundedTransport
from toolsearch.sections.settings import DEFAULT_MAX_RESPONSE_BYTES

# A server that pages forever must not hang discovery.
MAX_PAGES = 1000
# how the SDK reports an answer it could not read as JSON-RPC, and the validator's words for bad JSON
_UNPARSED = "Failed to parse JSON response"
_INVALID_JSON = re.compile(r"Invalid JSON: ([^\[\n]*)")
_NOT_JSONRPC = "answered JSON that is not a JSON-RPC message"


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
        message = first.error.message
        if message.startswith(_UNPARSED):
            # the SDK's text is the validator's, over several lines: what it found is enough
            found = _INVALID_JSON.search(message)
            return f"answered invalid JSON ({found.group(1).strip()})" if found else _NOT_JSONRPC
        return _one_line(f"MCP error: {message}")
    return _one_line(f"{type(first).__name__}: {first}")


def _one_line(reason: str) -> str:
    """A reason as one log line of at most 200 characters: a backend's text may hold line breaks."""
    return " ".join(reason.split())[:200]


def pinned_mode(protocol_version: str) -> str:
    """The client `mode` that speaks `protocol_version` again without negotiating; "auto" if unknown."""
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        return protocol_version
    if protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
        return "legacy"  # the initialize handshake, without the server/discover request "auto" tries first
    return "auto"


def _too_large(backend_id: str, limit: int) -> BackendUnavailable:
    return BackendUnavailable(
        backend_id,
        f"answered tools/list with more than {limit} bytes; raise backends[].max_response_bytes "
        "if its tool list is that large",
    )


class ProbeClient:
    """One backend's HTTP client, kept from one health probe to the next.

    Building a client per probe cost about as much CPU as the probe's requests. The client carries
    the headers, timeout and size bound it was built with (`fits` tells whether they still apply); a
    shared transport is only borrowed, so `aclose` closes what the client owns and never the shared
    pool. One listing uses it at a time (its owner sets `busy`): the status recorder and the bounded
    transport's verdict belong to that listing.
    """

    def __init__(
        self,
        headers: Mapping[str, str],
        timeout: float,
        transport: httpx2.AsyncBaseTransport | None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self.headers = dict(headers)
        self.timeout = timeout
        self.busy = False
        self.recorder = _StatusRecorder()
        self._own: httpx2.AsyncHTTPTransport | None = None
        if transport is None:
            transport = self._own = httpx2.AsyncHTTPTransport()
        self.bounded = BoundedTransport(transport, max_response_bytes)
        self.http = httpx2.AsyncClient(
            headers=self.headers,
            timeout=httpx2.Timeout(timeout),
            transport=self.bounded,
            event_hooks={"response": [self.recorder]},
        )

    def fits(self, headers: Mapping[str, str], timeout: float, max_response_bytes: int) -> bool:
        """Whether a listing with these headers, timeout and size bound may use this client."""
        return (
            self.timeout == timeout
            and self.headers == dict(headers)
            and self.bounded.limit == max_response_bytes
        )

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.http.aclose()
            if self._own is not None:
                await self._own.aclose()


async def list_tools(
    backend_id: str,
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    transport: httpx2.AsyncBaseTransport | None = None,
    mode: str = "auto",
    client: ProbeClient | None = None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> Listing:
    """List every tool of one backend; raises `BackendRejected` or `BackendUnavailable`.

    With a `client` (one that `fits` these settings, and that this listing alone uses) its HTTP
    client is used and left open; without one, a client is built for this listing and closed after it.
    Each answer may weigh `max_response_bytes` at most.
    """
    started = time.perf_counter()
    own: httpx2.AsyncHTTPTransport | None = None
    if client is not None:
        client.recorder.rejected = None
        client.bounded.exceeded = False
        client.http.cookies.clear()  # each listing starts as a fresh client would
        recorder, http, bounded = client.recorder, client.http, client.bounded
    else:
        recorder = _StatusRecorder()
        if transport is None:
            transport = own = httpx2.AsyncHTTPTransport()
        bounded = BoundedTransport(transport, max_response_bytes)
        http = httpx2.AsyncClient(
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout),
            transport=bounded,
            event_hooks={"response": [recorder]},
        )
    tools: list[Mapping[str, Any]] = []
    try:
        with anyio.fail_after(timeout):
            connection = streamable_http_client(url, http_client=http, max_sse_event_size=bounded.limit)
            async with Client(connection, mode=mode) as session:
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
                server = _server_info(session.server_info, session.instructions)
                offers = _offers(session.server_capabilities)
    except TimeoutError:
        raise BackendUnavailable(backend_id, f"did not answer tools/list within {timeout:g}s") from None
    except (BackendUnavailable, BackendRejected):
        raise
    except Exception as exc:
        if bounded.exceeded:
            raise _too_large(backend_id, bounded.limit) from None
        if recorder.rejected is not None:
            raise BackendRejected(backend_id, recorder.rejected) from None
        raise BackendUnavailable(backend_id, _describe(exc)) from None
    finally:
        if client is None:
            with anyio.CancelScope(shield=True):
                await http.aclose()  # the bounded transport only borrows: a shared pool stays open
                if own is not None:
                    await own.aclose()
    return Listing(
        tools=tuple(tools),
        protocol_version=version,
        latency=time.perf_counter() - started,
        server=server,
        offers=offers,
    )


def _offers(capabilities: ServerCapabilities | None) -> Offers:
    """What a server offers beside tools, as its capabilities declare it."""
    if capabilities is None:
        return Offers()
    return Offers(
        resources=capabilities.resources is not None,
        prompts=capabilities.prompts is not None,
        completions=capabilities.completions is not None,
    )


def _server_info(info: Implementation | None, instructions: str | None) -> ServerInfo:
    """What a server said of itself at initialize, kept with its listing for the index and answers."""
    if info is None:
        return ServerInfo(instructions=instructions or "")
    return ServerInfo(
        name=info.name or "",
        title=info.title or "",
        description=info.description or "",
        instructions=instructions or "",
    )
