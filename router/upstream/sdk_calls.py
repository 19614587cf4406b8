"""Calls in a connection of their own, through the SDK's client: legacy HTTP+SSE backends.

A legacy HTTP+SSE backend's session is its open event stream, which no request of a stateless router
outlives, so each call opens one. Results are read as plain objects, as the backend sent them. The
SDK reports an HTTP error status only as a generic JSON-RPC error, so a response hook
(`StatusRecorder`) records the status for the error message, and `_translate` turns what the SDK
raised into the router's backend errors. Tool calls (`call_by_sdk`) and the other requests the
router forwards (`request_by_sdk`: resources, prompts, completions) share one exchange (`SdkLink`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, RootModel, ValidationError

from router.errors import (
    BackendAnswered,
    BackendError,
    BackendRejected,
    BackendTimeout,
    BackendTooLarge,
    BackendUnavailable,
)
from router.upstream.relays import NotificationRelay
from toolsearch.outgoing import ROUTER_CLIENT_NAME, VERSION
from toolsearch.responses import BoundedTransport, lent_client

logger = logging.getLogger(__name__)

_R = TypeVar("_R")

CLIENT_INFO = types.Implementation(name=ROUTER_CLIENT_NAME, version=VERSION)


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
        return BackendAnswered(backend_id, first.error.code, first.error.message)
    if isinstance(first, ValidationError):
        return BackendError(backend_id, "answered with something that is not a valid result")
    logger.warning("backend %s: unexpected failure", backend_id, exc_info=exc)
    return BackendUnavailable(backend_id, f"failed ({type(first).__name__})")


# The SDK's client checks a result against the negotiated version's schema before anything else
# (an older era's: lenient); read as a plain object, the result keeps every field the backend sent.
class _Raw(RootModel[dict[str, Any]]):
    """A result as a plain object."""


# The requests the router forwards to a backend besides tools/call, with the model of their params
_FORWARDED: dict[str, tuple[type[Any], type[BaseModel]]] = {
    "resources/list": (types.ListResourcesRequest, types.PaginatedRequestParams),
    "resources/templates/list": (types.ListResourceTemplatesRequest, types.PaginatedRequestParams),
    "resources/read": (types.ReadResourceRequest, types.ReadResourceRequestParams),
    "prompts/list": (types.ListPromptsRequest, types.PaginatedRequestParams),
    "prompts/get": (types.GetPromptRequest, types.GetPromptRequestParams),
    "completion/complete": (types.CompleteRequest, types.CompleteRequestParams),
}


async def call_by_sdk(
    link: SdkLink, name: str, arguments: Mapping[str, Any], relay: NotificationRelay | None
) -> dict[str, Any]:
    """One call in a connection of its own (the link's client carries the headers, bound and
    recorder); its result as the wire has it."""
    progress = relay.progress if relay is not None and relay.progress_token is not None else None
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=dict(arguments)))

    async def send(client: Client) -> dict[str, Any]:
        # The session's own call_tool lists the backend's tools to check structured output;
        # the router passes results through unchecked, so it sends the request itself.
        answer = await client.session.send_request(request, _Raw, progress_callback=progress)
        return answer.root

    return await link.exchange(send, relay)


async def request_by_sdk(link: SdkLink, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """One request of `_FORWARDED` in a connection of its own; its result as the wire has it."""
    request_type, params_type = _FORWARDED[method]
    try:
        request = request_type(params=params_type.model_validate(dict(params)))
    except ValidationError:
        raise BackendError(
            link.backend_id, f"cannot be sent this {method} request: its params are not valid"
        ) from None

    async def send(client: Client) -> dict[str, Any]:
        answer = await client.session.send_request(request, _Raw)
        return answer.root

    return await link.exchange(send, None)


class SdkLink:
    """How to reach one backend through the SDK's client, for one exchange in a connection of its own."""

    def __init__(
        self,
        http: httpx2.AsyncClient,
        bounded: BoundedTransport,
        recorder: StatusRecorder,
        backend_id: str,
        url: str,
        protocol_version: str,
        transport: str,
        timeout_seconds: float,
    ) -> None:
        self.http = http  # carries the headers, the size bound and the status recorder
        self.bounded = bounded
        self.recorder = recorder
        self.backend_id = backend_id
        self.url = url
        self.protocol_version = protocol_version
        self.transport = transport
        self.timeout_seconds = timeout_seconds

    async def exchange(self, send: Callable[[Client], Awaitable[_R]], relay: NotificationRelay | None) -> _R:
        """Connect, run `send` on the client, disconnect; SDK failures become router errors."""
        timeout_seconds = self.timeout_seconds
        modern = self.protocol_version in MODERN_PROTOCOL_VERSIONS
        result: _R | None = None
        try:
            with anyio.fail_after(timeout_seconds):
                connection = (
                    sse_client(
                        self.url,
                        timeout=timeout_seconds,
                        sse_read_timeout=timeout_seconds,
                        httpx_client_factory=lent_client(self.http),
                    )
                    if self.transport == "sse"
                    # the SDK's own cap on one SSE event (1 MiB) would cut an answer the limit allows
                    else streamable_http_client(
                        self.url,
                        http_client=self.http,
                        terminate_on_close=False,
                        max_sse_event_size=self.bounded.limit,
                    )
                )
                mode = self.protocol_version if modern else "legacy"
                logging = relay.log if relay is not None else None
                async with Client(
                    connection, mode=mode, cache=None, client_info=CLIENT_INFO, logging_callback=logging
                ) as client:
                    result = await send(client)
        except Exception as exc:
            if result is not None:
                # The exchange answered; only closing the connection failed.
                logger.debug("backend %s: closing the connection failed: %r", self.backend_id, exc)
                return result
            raise _translate(
                self.backend_id, timeout_seconds, exc, self.recorder.status, self.bounded
            ) from None
        if result is None:
            raise BackendUnavailable(self.backend_id, "closed the connection without answering")
        return result
