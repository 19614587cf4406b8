"""Calling backend tools over MCP (Streamable HTTP), with pooled connections and a deadline per call.

Arguments are checked against the tool's input schema first (`SchemaValidators`), so a call the
backend would refuse never leaves the router.

Each backend has its own connection pool (router/pools.py) for as long as the application runs;
each call wraps its backend's pool in a lightweight `httpx2.AsyncClient` carrying that call's
headers and timeout, through a `BoundedTransport` (toolsearch/responses.py) that cuts the answer at
the backend's `max_response_bytes` while it is read. The SDK leaves a client it was given open, and
the per-call client is never closed either: the pool is the application's.

A backend that spoke 2026-07-28 at discovery is called with one request; any other goes through the
initialize handshake and has its session ended afterwards, so backends do not collect idle sessions.
The SDK reports an HTTP error status only as a generic JSON-RPC error, so a response hook records the
status for the error message.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio
import httpx2
import mcp_types as types
from jsonschema import exceptions as schema_errors
from jsonschema.validators import validator_for
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from router.errors import (
    BackendError,
    BackendRejected,
    BackendTimeout,
    BackendTooLarge,
    BackendUnavailable,
    MissingCredentials,
)
from router.pools import BackendPools
from toolsearch.responses import BoundedTransport
from toolsearch.v1 import indexer_pb2 as pb

logger = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="toolsearch-router", version="0.1.0")


def outgoing_headers(
    backend_id: str, auth: pb.BackendAuth, secrets: Mapping[str, str], bearer_token: str | None
) -> dict[str, str]:
    """The headers that authenticate a call to a backend; raises `MissingCredentials`."""
    header = auth.header or "Authorization"
    if auth.type == "header":
        value = secrets.get(auth.value_env)
        if not value:
            raise MissingCredentials(
                backend_id, f"cannot be called: the router has no value for its credential ({auth.value_env})"
            )
        return {header: value}
    if auth.type == "passthrough":
        if not bearer_token:
            raise MissingCredentials(backend_id, "requires the caller's bearer token")
        return {header: f"Bearer {bearer_token}"}
    return {}


class SchemaValidators:
    """Compiled JSON Schema validators, cached by schema text (compiling costs far more than checking)."""

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def _validator(self, schema_json: str) -> Any:
        if schema_json in self._cache:
            self._cache.move_to_end(schema_json)
            return self._cache[schema_json]
        validator: Any = None
        try:
            schema = json.loads(schema_json)
            cls = validator_for(schema)
            cls.check_schema(schema)
            validator = cls(schema)
        except (ValueError, TypeError, schema_errors.SchemaError) as exc:
            # An unusable schema must not block calls: the backend still checks its own arguments.
            logger.debug("input schema not usable for validation: %s", exc)
        self._cache[schema_json] = validator
        if len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return validator

    def problem(self, schema_json: str, parameters: Mapping[str, Any]) -> str | None:
        """What is wrong with `parameters` under the schema, naming the field; None when they fit."""
        if not schema_json:
            return None
        validator = self._validator(schema_json)
        if validator is None:
            return None
        try:
            error = schema_errors.best_match(validator.iter_errors(parameters))
        except Exception as exc:  # e.g. a $ref that does not resolve: let the backend judge
            logger.debug("input schema validation failed: %r", exc)
            return None
        if error is None:
            return None
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
        return f"parameters{path}: {message}"


class _StatusRecorder:
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


def _without_server_info(result: types.CallToolResult) -> types.CallToolResult:
    # The serverInfo stamp names whoever answers the client, which is the router, not the backend.
    meta = result.meta
    if meta and types.SERVER_INFO_META_KEY in meta:
        stripped = {k: v for k, v in meta.items() if k != types.SERVER_INFO_META_KEY}
        return result.model_copy(update={"meta": stripped or None})
    return result


class BackendCaller:
    """Calls tools on backend MCP servers, each through its own backend's connection pool."""

    def __init__(self, pools: BackendPools) -> None:
        self._pools = pools

    async def call_tool(
        self,
        *,
        backend_id: str,
        url: str,
        protocol_version: str,
        timeout_seconds: float,
        name: str,
        arguments: Mapping[str, Any],
        headers: Mapping[str, str],
        max_response_bytes: int,
    ) -> types.CallToolResult:
        """Run `name` on the backend at `url` and return its result as it came.

        Raises `BackendTimeout` after `timeout_seconds`, `BackendRejected` on HTTP 401/403,
        `BackendTooLarge` for an answer over `max_response_bytes`, and `BackendUnavailable` or
        `BackendError` for anything else that keeps a result from coming back.
        """
        recorder = _StatusRecorder()
        bounded = BoundedTransport(self._pools.for_backend(backend_id), max_response_bytes)
        http = httpx2.AsyncClient(
            transport=bounded,
            headers=dict(headers),
            timeout=httpx2.Timeout(timeout_seconds),
            event_hooks={"response": [recorder]},
        )
        modern = protocol_version in MODERN_PROTOCOL_VERSIONS
        params = types.CallToolRequestParams(name=name, arguments=dict(arguments))
        request = types.CallToolRequest(params=params)
        result: types.CallToolResult | None = None
        try:
            with anyio.fail_after(timeout_seconds):
                # the SDK's own cap on one SSE event (1 MiB) would cut an answer the limit allows
                transport = streamable_http_client(
                    url,
                    http_client=http,
                    terminate_on_close=not modern,
                    max_sse_event_size=max_response_bytes,
                )
                mode = protocol_version if modern else "legacy"
                async with Client(transport, mode=mode, cache=None, client_info=CLIENT_INFO) as client:
                    # The session's own call_tool lists the backend's tools to check structured output;
                    # the router passes results through unchecked, so it sends the request itself.
                    result = await client.session.send_request(request, types.CallToolResult)
        except Exception as exc:
            if result is not None:
                # The call answered; only ending the backend's session failed.
                logger.debug("backend %s: ending the session failed: %r", backend_id, exc)
                return _without_server_info(result)
            raise _translate(backend_id, timeout_seconds, exc, recorder.status, bounded) from None
        if result is None:
            raise BackendUnavailable(backend_id, "closed the connection without answering")
        return _without_server_info(result)
