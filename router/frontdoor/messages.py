"""A posted JSON-RPC message as the session layer routes on it: sniffed once, never parsed twice.

The session layer reads only what routing needs (router/frontdoor/session_layer.py): the method, the
id, whether the params ask for progress, what an initialize declares, the tool a call names, and a
posted response whole (a client's answer to a relayed request). `parse_message` refuses what is not
one JSON-RPC message with a `ClientError` saying what to send instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp_types import INVALID_REQUEST, PARSE_ERROR
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.datastructures import Headers

from toolsearch.outgoing import VERSION_HEADER


class ClientError(Exception):
    """Raised when a request is malformed; carries the HTTP status and the JSON-RPC error code."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class JsonRpcMessage:
    """The parts of a posted JSON-RPC message the layer routes on."""

    method: str | None  # None for a posted response
    id: Any  # None for a notification or a response without one
    is_request: bool
    wants_progress: bool = False  # its params carry `_meta.progressToken`
    params: Any = None  # as posted
    answer: Mapping[str, Any] | None = None  # a posted response, whole

    @property
    def meta(self) -> dict[str, Any]:
        """Its params' `_meta`, where a 2026-07-28 request says what its client declares."""
        meta = self.params.get("_meta") if isinstance(self.params, dict) else None
        return meta if isinstance(meta, dict) else {}

    @property
    def declared_capabilities(self) -> str:
        """The capabilities an initialize request declares, as JSON ("" when it declares none)."""
        declared = self.params.get("capabilities") if isinstance(self.params, dict) else None
        return json.dumps(declared, separators=(",", ":")) if isinstance(declared, dict) else ""

    @property
    def called(self) -> str:
        """The tool a `tools/call` names (a meta-tool, or a pinned tool by its own name)."""
        params = self.params
        name = params.get("name") if self.method == "tools/call" and isinstance(params, dict) else None
        return name if isinstance(name, str) else ""

    @property
    def named_tool(self) -> str:
        """The `tool_name` a `tools/call` passes (call_tool's), looked up with the session check."""
        params = self.params
        if self.method != "tools/call" or not isinstance(params, dict):
            return ""
        arguments = params.get("arguments")
        name = arguments.get("tool_name") if isinstance(arguments, dict) else None
        return name if isinstance(name, str) else ""


def parse_message(body: bytes) -> JsonRpcMessage:
    """Sniff one JSON-RPC message; raises `ClientError` (400) for bad JSON, batches and non-messages."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        raise ClientError(400, PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    if isinstance(decoded, list):
        raise ClientError(
            400, INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per request"
        )
    if not isinstance(decoded, dict) or decoded.get("jsonrpc") != "2.0":
        raise ClientError(
            400, INVALID_REQUEST, "Invalid request: the body must be a JSON-RPC 2.0 message object"
        )
    request_id = decoded.get("id")
    if "method" in decoded:
        if not isinstance(decoded["method"], str):
            raise ClientError(400, INVALID_REQUEST, "Invalid request: 'method' must be a string")
        params = decoded.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        wants_progress = isinstance(meta, dict) and meta.get("progressToken") is not None
        return JsonRpcMessage(decoded["method"], request_id, "id" in decoded, wants_progress, params)
    if "result" in decoded or "error" in decoded:
        return JsonRpcMessage(None, request_id, False, answer=decoded)
    raise ClientError(400, INVALID_REQUEST, "Invalid request: a JSON-RPC message needs 'method' or 'result'")


def is_handshake_era(headers: Headers) -> bool:
    """Whether a request speaks the handshake protocol: no version header, or a handshake version."""
    version = headers.get(VERSION_HEADER)
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS
