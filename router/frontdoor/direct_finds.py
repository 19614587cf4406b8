"""find_tool answered in front of the SDK's server: the request agents send most often, made cheap.

A handshake-era `tools/call` of find_tool that asks for no progress needs nothing of what the SDK's
server does for a request: no stream (find_tool asks no backend and logs nothing), no request of the
client, no shaping of a backend's result. The session layer hands such a request here instead of
checking its session first, since the indexer's FindTools checks the session itself: an unknown or
foreign session fails with `SessionNotFound`, which the session layer answers `404` as it answers a
failed check, and an unreachable indexer the same way too. The answer is the JSON the SDK would
write: the tool result under the request's id, without the 2026-07-28 `resultType`.

That spares every find one indexer round trip (the session check) and the SDK server's parsing,
validation and dispatch: half the router's CPU per find_tool, and a third of the indexer's
(docs/performance.md, section 6). Anything that is not plainly such a request (params the SDK's
model refuses, an `Accept` header that takes no JSON) goes the usual way, where the SDK answers it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.streamable_http import check_accept_headers
from mcp_types import CallToolRequestParams
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.caller import Caller
from router.frontdoor.messages import JsonRpcMessage
from router.handlers.meta_tools import FIND_TOOL

# find_tool's tool result for a caller (the meta-tools' `answer_find_tool`, observed as every
# tools/call is); raises the router's errors that the session layer answers itself
FindTool = Callable[[Caller, CallToolRequestParams], Awaitable[dict[str, Any]]]


class DirectFinds:
    """Answers a handshake session's find_tool calls without the SDK's server."""

    def __init__(self, find_tool: FindTool) -> None:
        self._find_tool = find_tool

    def params(self, scope: Scope, message: JsonRpcMessage) -> CallToolRequestParams | None:
        """The call's params when `message` is a find_tool call to answer here; None: the usual way."""
        if not message.is_request or message.method != "tools/call" or message.called != FIND_TOOL:
            return None
        if message.wants_progress or not check_accept_headers(Request(scope))[0]:
            return None
        try:
            return CallToolRequestParams.model_validate(message.params)
        except ValidationError:
            return None  # the SDK says what is wrong with them, in its words

    async def answer(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        caller: Caller,
        params: CallToolRequestParams,
        request_id: Any,
    ) -> None:
        """Run the find and write its answer; the router's errors propagate to the session layer."""
        result = await self._find_tool(caller, params)
        # the handshake era's results carry no resultType (the SDK leaves it out the same way)
        shaped = {key: value for key, value in result.items() if key != "resultType"}
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": shaped}, ensure_ascii=False)
        await Response(body, media_type="application/json")(scope, receive, send)
