"""Router errors as a client reads them: the one translation of each, for each way a client is answered.

A failure is raised once, where it is first seen (router/errors.py); what the client gets for it is
decided here and nowhere else:

- `http_answer`: an HTTP response, for a request refused before the SDK's handlers run (the session
  layer), or a client's answer the backend that asked did not take: 401, 404, 429, 502, 503 and so
  on, each with a JSON-RPC error body.
- `tool_result_for`: a call_tool or find_tool result with `isError`, for a mistake the model can
  correct (an unknown tool, a bad argument, a backend's failure); the router's own faults, a
  capability the client lacks (`-32021`, the client's to mend) and a retry's request state that
  names no round (`-32602`, the client's too) are raised as `MCPError` instead.
- `mcp_error`: the JSON-RPC error of a request other than a tool call (resources, prompts): a
  request the client got wrong is invalid params (`-32602`).

`jsonrpc_error_body` is the body all of them and the front door's own refusals send.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST
from starlette.responses import Response

from router.errors import (
    SESSION_GONE,
    BackendAnswered,
    BackendError,
    CapabilityMissing,
    IndexerFailed,
    IndexerUnavailable,
    InvalidRequest,
    InvalidRequestState,
    RouterError,
    SessionNotFound,
    SessionsFull,
    ToolNotFound,
    TooManySessions,
    Unauthenticated,
)

logger = logging.getLogger(__name__)


def jsonrpc_error_body(code: int, message: str, request_id: Any = None, data: Any = None) -> bytes:
    """The JSON-RPC error message every refusal of the router carries as its body."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


def jsonrpc_error_response(
    status: int, code: int, message: str, request_id: Any = None, headers: dict[str, str] | None = None
) -> Response:
    """An HTTP response whose body is one JSON-RPC error."""
    body = jsonrpc_error_body(code, message, request_id)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def http_answer(exc: RouterError, request_id: Any = None) -> Response:
    """The HTTP response for a router error that ends a request before the tool handlers run."""
    if isinstance(exc, Unauthenticated):
        headers = {"WWW-Authenticate": exc.www_authenticate}
        return jsonrpc_error_response(401, INVALID_REQUEST, str(exc), request_id, headers)
    if isinstance(exc, SessionNotFound):
        return jsonrpc_error_response(404, INVALID_REQUEST, SESSION_GONE, request_id)
    if isinstance(exc, TooManySessions | SessionsFull):
        # the caller's own cap is its doing (429); the cap on everyone's sessions is the service's (503)
        status = 429 if isinstance(exc, TooManySessions) else 503
        retry = {"Retry-After": str(exc.retry_after)}
        return jsonrpc_error_response(status, INVALID_REQUEST, f"too many sessions: {exc}", request_id, retry)
    if isinstance(exc, InvalidRequest):
        return jsonrpc_error_response(400, INVALID_REQUEST, str(exc), request_id)
    if isinstance(exc, IndexerUnavailable):
        return jsonrpc_error_response(503, INTERNAL_ERROR, str(exc), request_id, {"Retry-After": "1"})
    if isinstance(exc, IndexerFailed):
        return jsonrpc_error_response(502, INTERNAL_ERROR, str(exc), request_id)
    if isinstance(exc, BackendError):  # a client's answer that its backend did not take
        return jsonrpc_error_response(502, INTERNAL_ERROR, str(exc), request_id)
    logger.error("unexpected router error before the handlers: %r", exc)
    return jsonrpc_error_response(500, INTERNAL_ERROR, "internal error", request_id)


def text_result(text: str, *, is_error: bool) -> dict[str, Any]:
    """A tool result of one text block."""
    return {"content": [{"type": "text", "text": text}], "isError": is_error, "resultType": "complete"}


def tool_result_for(exc: RouterError) -> dict[str, Any]:
    """The tool result for an error the model can act on; raises `MCPError` for the router's own faults."""
    if isinstance(exc, ToolNotFound):
        return text_result(not_found_message(exc), is_error=True)
    if isinstance(exc, CapabilityMissing | InvalidRequestState):
        raise mcp_error(exc)  # the spec's errors: the client, not the model, is to mend them
    if isinstance(exc, InvalidRequest | BackendError):
        return text_result(str(exc), is_error=True)
    raise mcp_error(exc)


def mcp_error(exc: RouterError) -> MCPError:
    """The JSON-RPC error a client gets for a router error outside a tool result."""
    if isinstance(exc, BackendAnswered):
        return MCPError(exc.code, str(exc), exc.data)
    if isinstance(exc, SessionNotFound):
        return MCPError(INVALID_REQUEST, SESSION_GONE)
    if isinstance(exc, InvalidRequest):
        return MCPError(INVALID_PARAMS, str(exc))
    return MCPError(INTERNAL_ERROR, str(exc))


def not_found_message(exc: ToolNotFound) -> str:
    """What call_tool answers an unknown name: why, the closest names with their servers, find_tool."""
    if exc.reason:
        # the same first words as any unknown name, then why: its backend is down right now
        return (
            f"tool not found: {exc.name}. {exc.reason}. "
            "Use find_tool to search for another tool that can do it."
        )
    text = f"tool not found: {exc.name}."
    if exc.suggestions:
        named = ", ".join(
            f"{name} (server {backend}{f', {title}' if title and title != backend else ''})"
            for name, backend, title in exc.suggestions
        )
        text += f" Closest names: {named}."
    return text + " Use find_tool to search for the tool you need."
