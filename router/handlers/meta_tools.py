"""`find_tool` and `call_tool`: the handlers of the only two tools a client sees (their schemas are
router/handlers/meta_tool_schemas.py).

call_tool's way to a backend: the name resolved, the arguments checked, the backend called with
the request's `Exchange` (router/exchange.py). The tool's resolution mostly comes with the session
check the request made already (the session layer asks `GetSession` to resolve the `tool_name` it
sees); `ResolveTool` is asked only when the name did not resolve there, and says why. The call
itself, in the client session's backend session and with what the backend asks the client carried
across the eras, is upstream's (`BackendRequests.calling`, `BackendCaller.call_tool`).

Router errors become MCP answers here and only here: a mistake the model can correct (a wrong
argument, an unknown tool, a failing backend) is a tool result with `isError` and a message saying
how to correct it; a fault of the router's own (the indexer down) is a JSON-RPC error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import mcp_types as types
from mcp.server.context import HandlerResult, ServerRequestContext

from router.caller import Caller
from router.error_answers import mcp_error, text_result, tool_result_for
from router.errors import BackendAnswered, InvalidRequest, RouterError
from router.exchange import Exchange, exchange_of
from router.handlers.arguments import parse_call_tool, parse_find_tool
from router.handlers.meta_tool_schemas import (
    CALL_TOOL,
    CALL_TOOL_DESCRIPTION,
    CALL_TOOL_INPUT_SCHEMA,
    FIND_TOOL,
    FIND_TOOL_OUTPUT_SCHEMA,
    META_TOOLS,
    find_tool_input_schema,
)
from router.handlers.passthrough import PassedThrough, answer
from router.handlers.schemas import SchemaValidators
from router.upstream.session_wide.backend_requests import BackendRequests
from toolsearch.answers import render_answer
from toolsearch.sections.indexer_settings import Search
from toolsearch.sessions import Offered

logger = logging.getLogger(__name__)

INDEX_META_KEY = "toolsearch/index"


def _listed(definition_json: str) -> types.Tool:
    """A pinned tool as tools/list advertises it: its definition as the backend gave it."""
    return types.Tool.model_validate(json.loads(definition_json))


def _retry(params: types.CallToolRequestParams) -> dict[str, Any]:
    """What a client's retry of an input-required call carries back to the backend, as it came."""
    return params.model_dump(
        mode="json", by_alias=True, exclude_none=True, include={"input_responses", "request_state"}
    )


class MetaTools:
    """The handlers behind `tools/list` and `tools/call`; `max_arguments_bytes` 0 sets no size limit."""

    def __init__(
        self,
        requests: BackendRequests,
        search: Search,
        max_arguments_bytes: int = 0,
        pinned: Sequence[str] = (),
    ) -> None:
        self.requests = requests
        self.indexer = requests.indexer
        self.pinned = list(pinned)  # "backend/tool" or "backend/*": advertised beside the meta-tools
        self.max_limit = search.max_limit
        self.compact = search.compact
        self.max_arguments_bytes = max_arguments_bytes
        self.validators = SchemaValidators()
        self.schemas = {FIND_TOOL: find_tool_input_schema(search), CALL_TOOL: CALL_TOOL_INPUT_SCHEMA}
        self.tools = [
            types.Tool(
                name=FIND_TOOL,
                description=search.find_tool_description,
                input_schema=self.schemas[FIND_TOOL],
                output_schema=FIND_TOOL_OUTPUT_SCHEMA,
                annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
            ),
            types.Tool(
                name=CALL_TOOL, description=CALL_TOOL_DESCRIPTION, input_schema=CALL_TOOL_INPUT_SCHEMA
            ),
        ]

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """A meta-tool's input schema by name (the SDK checks `Mcp-Param-*` headers against it)."""
        return self.schemas.get(name)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if not self.pinned:
            return types.ListToolsResult(tools=self.tools)
        caller = exchange_of(ctx).caller
        if not caller.session_id:
            # a sessionless (2026-07-28) listing: pinned tools belong to a session's backends
            return types.ListToolsResult(tools=self.tools)
        try:
            pinned = await self.indexer.pinned_tools(
                caller.session_id, caller.identity.principal, self.pinned
            )
        except RouterError as exc:
            tool_result_for(exc)  # raises the JSON-RPC error for the router's own faults
            return types.ListToolsResult(tools=self.tools)
        extra = [_listed(definition) for definition in pinned]
        return types.ListToolsResult(tools=[*self.tools, *(t for t in extra if t.name not in META_TOOLS)])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> HandlerResult:
        """`tools/call`: run find_tool or call_tool for the request the session layer let in (only a
        streamed answer, the session layer's choice, relays what comes before the result)."""
        exchange = exchange_of(ctx)
        try:
            if params.name == FIND_TOOL:
                return await self.find_tool(exchange.caller, params.arguments)
            # the backend's result is answered as it came (router/handlers/passthrough.py)
            if params.name == CALL_TOOL:
                return PassedThrough(await self._call(exchange, params, params.arguments))
            if self.pinned:
                # a pinned tool called by its own name: the same path as call_tool, health included
                arguments = {"tool_name": params.name, "parameters": params.arguments or {}}
                try:
                    return PassedThrough(await self._call(exchange, params, arguments))
                except BackendAnswered as exc:
                    # called as the client would call its backend, it gets the backend's JSON-RPC
                    # error as one too (a refused request state, say), not a tool result
                    raise mcp_error(exc) from None
        except RouterError as exc:
            return tool_result_for(exc)
        return text_result(
            f"unknown tool {params.name}: this server has two tools, find_tool and call_tool. To run "
            f"{params.name}, call call_tool with tool_name {json.dumps(params.name)}.",
            is_error=True,
        )

    async def answer_directly(
        self, exchange: Exchange, params: types.CallToolRequestParams
    ) -> dict[str, Any]:
        """find_tool or call_tool answered in front of the SDK's server, as JSON to a handshake-era
        client (router/frontdoor/direct_calls.py): the tool result the SDK's path gives, a backend's
        passed through as it came. A find's session-check errors and the router's own faults
        propagate, for the session layer to answer as it answers a failed check; a call's go
        where `call_tool` sends them (a tool result, or `MCPError` for a JSON-RPC error)."""
        caller = exchange.caller
        if params.name == FIND_TOOL:
            try:
                return await self.find_tool(caller, params.arguments)
            except InvalidRequest as exc:  # arguments the model got wrong: it reads why
                # found before the search could check the session: checked here, so that a request
                # in a session that does not exist is answered 404 whatever its arguments
                await self.indexer.get_session(caller.session_id, caller.identity.principal)
                return tool_result_for(exc)
        try:
            result = await self._call(exchange, params, params.arguments)
        except RouterError as exc:
            return tool_result_for(exc)
        return answer(PassedThrough(result), {}, None)  # the handshake era's envelope: none

    async def _call(
        self, exchange: Exchange, params: types.CallToolRequestParams, arguments: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """call_tool with `arguments`: a retry of an input round answered from it; else the name
        resolved in the caller's session, the arguments checked, the backend called; the backend's
        result as it came (with a note when its backend session was replaced or not kept)."""

        async def call(exchange: Exchange) -> dict[str, Any]:
            args = parse_call_tool(arguments, self.max_arguments_bytes)
            caller = exchange.caller
            # resolved with the session check from the same `tool_name`, unless it did not resolve there
            tool = caller.resolved or await self.indexer.resolve_tool(
                caller.session_id, caller.identity.principal, args.name
            )
            if tool.conditional:  # the policy decides by the arguments: the indexer is asked with them
                item = Offered("tool", tool.name, tool.backend_id)
                await self.indexer.authorize_call(
                    caller.session_id, caller.identity.principal, item, args.parameters
                )
            problem = self.validators.problem(tool.input_schema_json, args.parameters)
            if problem is not None:
                raise InvalidRequest(
                    f"invalid parameters for {args.name}: {problem}. Fix the parameters to match the "
                    "tool's inputSchema (find_tool shows it) and call again."
                )
            name = tool.original_name or args.name
            return await self.requests.backends.call_tool(tool.target, name, args.parameters, exchange)

        return await self.requests.calling(replace(exchange, retry=_retry(params)), call)

    async def find_tool(self, caller: Caller, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """Search the caller's session; the answer is the same JSON as structured content and as text."""
        args = parse_find_tool(arguments, self.max_limit)
        compact = self.compact if args.compact is None else args.compact
        found = await self.indexer.find_tools(
            caller.session_id,
            caller.identity.principal,
            args.description,
            args.keywords,
            args.limit,
            compact=compact,
        )
        structured, text = render_answer(found, compact)
        result = text_result(text, is_error=False)
        result["structuredContent"] = structured
        result["_meta"] = {
            INDEX_META_KEY: {"version": found.version.number, "fingerprint": found.version.fingerprint}
        }
        return result
