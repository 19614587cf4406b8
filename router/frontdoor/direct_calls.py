"""find_tool and call_tool answered in front of the SDK's server, for the requests agents send most.

A handshake-era `tools/call` of a meta-tool whose answer is JSON (no progress asked, nothing that
needs a stream: session_layer.py decides) needs nothing of what the SDK's server does for a
request: no stream, no request of the client, and a backend's result is passed through as it came
anyway (router/handlers/passthrough.py). The session layer hands such a call here, and it is
answered as the SDK's server would answer it, through the meta-tools' own `answer_directly`:

- **find_tool** comes here before the session check, since the indexer's FindTools checks the
  session itself: an unknown or foreign session fails with `SessionNotFound`, which the session
  layer answers `404` as it answers a failed check (and an unreachable indexer `503` the same way).
  One indexer round trip a find instead of two.
- **call_tool** comes here after the check, which resolved the tool it names.

Each is spanned as the SDK spans a request (`tools/call <tool>`, under the request's span), and its
JSON-RPC error, where the router's own fault makes one, is answered as the SDK answers it: under the
request's id, with status 200. What is not plainly such a call (params beyond name, arguments and
`_meta`, or ones the SDK's model refuses, an `Accept` header that takes no JSON) goes the usual way,
where the SDK answers it.
docs/performance.md, sections 2 and 6, has what this saves.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from mcp.server.streamable_http import check_accept_headers
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolRequestParams
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.error_answers import jsonrpc_error_body
from router.exchange import Exchange
from router.frontdoor.messages import JsonRpcMessage
from router.handlers.meta_tool_schemas import META_TOOLS

# a meta-tool's tool result for a request (`MetaTools.answer_directly`, observed as every tools/call
# is); raises the router's errors the session layer answers itself, and `MCPError` for a JSON-RPC
# error answer
MetaToolCall = Callable[[Exchange, CallToolRequestParams], Awaitable[dict[str, Any]]]

_tracer = trace.get_tracer("toolsearch.router")
_PLAIN = frozenset({"name", "arguments", "_meta"})  # the params of a plain call


class DirectCalls:
    """Answers a handshake session's find_tool and call_tool calls without the SDK's server."""

    def __init__(self, call: MetaToolCall) -> None:
        self._call = call

    def params(self, scope: Scope, message: JsonRpcMessage, tool: str) -> CallToolRequestParams | None:
        """The params of `message` when it is a call of the meta-tool `tool` to answer here; None:
        the usual way."""
        if not message.is_request or message.method != "tools/call" or message.called != tool:
            return None
        if tool not in META_TOOLS or message.wants_progress or not check_accept_headers(Request(scope))[0]:
            return None
        if not isinstance(message.params, dict) or not _PLAIN.issuperset(message.params):
            return None  # a task-augmented call, say: the SDK's server knows what to make of it
        try:
            return CallToolRequestParams.model_validate(message.params)
        except ValidationError:
            return None  # the SDK says what is wrong with them, in its words

    async def answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        params: CallToolRequestParams,
        message: JsonRpcMessage,
    ) -> None:
        """Run the call and write its answer; the router's errors propagate to the session layer."""
        try:
            with _span(params.name, message) as span:
                result = await self._call(exchange, params)
                if result.get("isError") is True:
                    span.set_attribute("error.type", "tool_error")
                    span.set_status(StatusCode.ERROR)
        except MCPError as exc:
            body = jsonrpc_error_body(exc.error.code, exc.error.message, message.id, exc.error.data)
            await Response(body, media_type="application/json")(scope, receive, send)
            return
        # the handshake era's results carry no resultType (the SDK leaves it out the same way)
        shaped = {key: value for key, value in result.items() if key != "resultType"}
        answer = {"jsonrpc": "2.0", "id": message.id, "result": shaped}
        await Response(_encoded(answer), media_type="application/json")(scope, receive, send)


def _encoded(answer: dict[str, Any]) -> bytes:
    """The answer as JSON, encoded by orjson (a find's answer is most of the router's encoding work,
    and orjson's is about a tenth of the standard library's); a value it does not take (an integer
    beyond 64 bits in a backend's result, say) falls back to the standard library's encoder."""
    try:
        return orjson.dumps(answer)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(answer, ensure_ascii=False).encode()


@contextmanager
def _span(tool: str, message: JsonRpcMessage) -> Iterator[trace.Span]:
    """The span the SDK's server opens for a request, with its name and its attributes."""
    attributes: dict[str, Any] = {
        "mcp.method.name": "tools/call",
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
    }
    if message.id is not None:
        attributes["jsonrpc.request.id"] = str(message.id)
    # a trace context the client put in the request's _meta is the span's parent, as for the SDK
    carrier = message.meta
    parent = propagate.extract(carrier) if "traceparent" in carrier else None
    with _tracer.start_as_current_span(
        f"tools/call {tool}", context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield span
