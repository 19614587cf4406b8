"""Calls in a connection of their own, through the SDK's clients: 2026-07-28 backends and legacy SSE ones.

A 2026-07-28 backend needs no session (one request per call); a legacy HTTP+SSE backend's session is
its open event stream, which no request of a stateless router outlives, so each call opens one. The
SDK reports an HTTP error status only as a generic JSON-RPC error, so a response hook
(`StatusRecorder`) records the status for the error message, and `_translate` turns what the SDK
raised into the router's backend errors.
"""

from __future__ import annotations

import logging

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from router.backend_messages import CLIENT_INFO as MESSAGE_CLIENT_INFO
from router.errors import (
    BackendError,
    BackendRejected,
    BackendTimeout,
    BackendTooLarge,
    BackendUnavailable,
)
from router.relays import NotificationRelay
from toolsearch.responses import BoundedTransport, lent_client

logger = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name=MESSAGE_CLIENT_INFO["name"], version=MESSAGE_CLIENT_INFO["version"])


class StatusRecorder:
    """Remembers the last HTTP error status a backend answered with."""

    def __init__(self) -> None:
        self.status: int | None = None

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.status = response.status_code


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _translate(
    backend_id: str, timeout: float, exc: BaseException, status: int | None, bounded: BoundedTransport
) -> BackendError:
    if bounded.exceeded:  # before the status: the router's own stand-in answer carries a 502
        return BackendTooLarge(backend_id, bounded.limit)
    if isinstance(exc, TimeoutError):
        return BackendTimeout(backend_id, timeout)
    if status in (401, 403):
        return BackendRejected(backend_id, status)
    if status is not None:
        return BackendUnavailable(backend_id, f"answered HTTP {status}")
    first = _leaves(exc)[0]
    if isinstance(first, httpx2.TimeoutException):
        return BackendTimeout(backend_id, timeout)
    if isinstance(first, httpx2.ConnectError):
        return BackendUnavailable(backend_id, "refused the connection")
    if isinstance(first, httpx2.TransportError):
        return BackendUnavailable(backend_id, "dropped the connection")
    if isinstance(first, MCPError):
        return BackendError(backend_id, f"answered with an error: {first.error.message}")
    if isinstance(first, ValidationError):
        return BackendError(backend_id, "answered with something that is not a tool result")
    logger.warning("backend %s: unexpected failure", backend_id, exc_info=exc)
    return BackendUnavailable(backend_id, f"failed ({type(first).__name__})")


def without_server_info(result: types.CallToolResult) -> types.CallToolResult:
    # The serverInfo stamp names whoever answers the client, which is the router, not the backend.
    meta = result.meta
    if meta and types.SERVER_INFO_META_KEY in meta:
        stripped = {k: v for k, v in meta.items() if k != types.SERVER_INFO_META_KEY}
        return result.model_copy(update={"meta": stripped or None})
    return result


async def call_by_sdk(
    http: httpx2.AsyncClient,
    bounded: BoundedTransport,
    recorder: StatusRecorder,
    backend_id: str,
    url: str,
    protocol_version: str,
    transport: str,
    timeout_seconds: float,
    params: types.CallToolRequestParams,
    relay: NotificationRelay | None,
) -> types.CallToolResult:
    """One call in a connection of its own (`http`, which carries the headers, bound and recorder)."""
    max_response_bytes = bounded.limit
    modern = protocol_version in MODERN_PROTOCOL_VERSIONS
    request = types.CallToolRequest(params=params)
    result: types.CallToolResult | None = None
    try:
        with anyio.fail_after(timeout_seconds):
            connection = (
                sse_client(
                    url,
                    timeout=timeout_seconds,
                    sse_read_timeout=timeout_seconds,
                    httpx_client_factory=lent_client(http),
                )
                if transport == "sse"
                # the SDK's own cap on one SSE event (1 MiB) would cut an answer the limit allows
                else streamable_http_client(
                    url, http_client=http, terminate_on_close=False, max_sse_event_size=max_response_bytes
                )
            )
            mode = protocol_version if modern else "legacy"
            logging = relay.log if relay is not None else None
            progress = relay.progress if relay is not None and relay.progress_token is not None else None
            async with Client(
                connection, mode=mode, cache=None, client_info=CLIENT_INFO, logging_callback=logging
            ) as client:
                # The session's own call_tool lists the backend's tools to check structured output;
                # the router passes results through unchecked, so it sends the request itself.
                result = await client.session.send_request(
                    request, types.CallToolResult, progress_callback=progress
                )
    except Exception as exc:
        if result is not None:
            # The call answered; only closing the connection failed.
            logger.debug("backend %s: closing the connection failed: %r", backend_id, exc)
            return without_server_info(result)
        raise _translate(backend_id, timeout_seconds, exc, recorder.status, bounded) from None
    if result is None:
        raise BackendUnavailable(backend_id, "closed the connection without answering")
    return without_server_info(result)
