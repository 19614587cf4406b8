"""A 2026-07-28 request to a backend: one POST, stamped as that protocol has every request stamped.

A 2026-07-28 backend keeps no session: each request says in its `_meta` which protocol it speaks,
who asks and what the client can answer, and in its headers its protocol, method and name (for a
load balancer that routes on them), and the trace it belongs to in `_meta` too. The router posts
such requests itself (router/upstream/wire/backend_messages.py), as it does inside a handshake-era
backend session, so the backend's answer reaches the client as it came: the SDK's client would
check the result against its own idea of the schema first, and refuse one that omits an optional
field (`resultType`, which some servers leave out).

The router offers the backend what a 2026-07-28 client declared it can answer (sampling,
elicitation, roots): the backend asks for them with an input-required result, which reaches the
client as it came, and the client's retry carries its answers and the backend's request state back
in its params, which the router passes on untouched (the backend checks the state's integrity).
A handshake-era client is offered as nothing here: it would not know such a result (it is asked
in a handshake session instead, router/upstream/calls/eras.py). Log messages are asked for only on a
request whose client gets them (a relay with a level): at the client's level.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.shared.inbound import MCP_METHOD_HEADER, MCP_NAME_HEADER, NAME_BEARING_METHODS, encode_header_value
from mcp_types import (
    CLIENT_CAPABILITIES_META_KEY,
    CLIENT_INFO_META_KEY,
    LOG_LEVEL_META_KEY,
    PROTOCOL_VERSION_META_KEY,
)
from opentelemetry import propagate

from router.exchange import Exchange
from toolsearch.outgoing import ROUTER_CLIENT_NAME, VERSION_HEADER, client_info


def modern_request(
    method: str, params: Mapping[str, Any], version: str, exchange: Exchange
) -> tuple[dict[str, Any], dict[str, str]]:
    """`params` with the request's `_meta` stamp (offering what the exchange's client answers, at
    its log level), and the headers of its POST."""
    meta = dict(params.get("_meta") or {})
    meta[PROTOCOL_VERSION_META_KEY] = version
    meta[CLIENT_INFO_META_KEY] = client_info(ROUTER_CLIENT_NAME)
    meta[CLIENT_CAPABILITIES_META_KEY] = exchange.offered_per_request
    if exchange.log_floor is not None:
        meta[LOG_LEVEL_META_KEY] = exchange.log_floor
    # the trace's context where an MCP server reads it, as the SDK's client puts it (W3C keys in
    # `_meta`); nothing when no trace is recorded
    propagate.inject(meta)
    headers = {VERSION_HEADER: version, MCP_METHOD_HEADER: method}
    name_key = NAME_BEARING_METHODS.get(method)
    if name_key is not None and isinstance(name := params.get(name_key), str):
        headers[MCP_NAME_HEADER] = encode_header_value(name)
    return {**params, "_meta": meta}, headers
